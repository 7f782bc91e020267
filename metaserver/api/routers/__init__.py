"""One APIRouter per resource of the admin API."""
