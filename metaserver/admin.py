"""The admin REST API of the metaserver: :func:`create_app` and its schemas.

The application lives in the :mod:`emberfs.metaserver.api` package (one
router per resource, schemas, dependencies, the dashboard); this module keeps
the names the metaserver process and older callers import.
"""

from __future__ import annotations

from emberfs.metaserver.api import create_app
from emberfs.metaserver.api.schemas import (
    ChainMemberPublic,
    ChainPublic,
    ClusterPublic,
    Health,
    NodePublic,
    TargetPublic,
)

__all__ = [
    "create_app",
    "ChainMemberPublic",
    "ChainPublic",
    "ClusterPublic",
    "Health",
    "NodePublic",
    "TargetPublic",
]
