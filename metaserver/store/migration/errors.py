"""Why a migration refused to run or failed: each error's message says why and what to do."""

from __future__ import annotations


class MigrationError(Exception):
    """The migration could not run or failed; the message says why and what to do."""


class Refused(MigrationError):
    """A check before the copy failed: nothing was written."""


class StoreInUse(Refused):
    """A metaserver may run on the store."""


class NotEmpty(Refused):
    """The destination holds keys already."""


class EmptySource(Refused):
    """The source holds nothing to copy (or does not exist)."""


class SameStore(Refused):
    """Source and destination are one store, or overlap."""


class TooLarge(Refused):
    """A key and its value are larger than the destination takes in one request."""
