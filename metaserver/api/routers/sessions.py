"""``/api/v1/sessions``: open write sessions."""

from __future__ import annotations

from fastapi import APIRouter

from emberfs.metaserver.api.deps import NamespaceDep
from emberfs.metaserver.api.schemas import ERROR_RESPONSES, SessionPublic

router = APIRouter(prefix="/api/v1", tags=["sessions"], responses=ERROR_RESPONSES)


@router.get("/sessions", response_model=list[SessionPublic])
def list_sessions(namespace: NamespaceDep) -> list[SessionPublic]:
    """Files open for writing: inode, session id, client, opening time and lease expiry."""
    return [SessionPublic(**s) for s in namespace.sessions()]
