"""``/api/v1/layouts``: read and set a directory's layout."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from emberfs.metaserver.api.deps import AdminDep, NamespaceDep
from emberfs.metaserver.api.schemas import (
    ERROR_RESPONSES,
    STEERING_RESPONSES,
    LayoutIn,
    LayoutPublic,
)
from emberfs.proto import common_pb2, meta_pb2

router = APIRouter(prefix="/api/v1/layouts", tags=["layouts"], responses=ERROR_RESPONSES)

PathQuery = Annotated[str, Query(min_length=1, max_length=4096, description="a directory")]


def _public(path: str, attr: common_pb2.InodeAttr) -> LayoutPublic:
    return LayoutPublic(
        path=path,
        inode=attr.inode,
        chunk_size=attr.layout.chunk_size,
        stripe=attr.layout.stripe,
        chain_table=list(attr.layout.chain_table),
    )


@router.get("", response_model=LayoutPublic)
def get_layout(path: PathQuery, namespace: NamespaceDep) -> LayoutPublic:
    """The layout stored on a path (chunk size 0: inherited from the parent directory)."""
    attr = namespace.stat(meta_pb2.StatRequest(path=path, follow=True)).attr
    return _public(path, attr)


@router.put("", response_model=LayoutPublic, responses=STEERING_RESPONSES)
def put_layout(
    _: AdminDep, path: PathQuery, layout: LayoutIn, namespace: NamespaceDep
) -> LayoutPublic:
    """Set the layout new files in the directory get (chunk size 0 clears it)."""
    req = meta_pb2.SetLayoutRequest(
        path=path,
        layout=common_pb2.Layout(
            chunk_size=layout.chunk_size, stripe=layout.stripe, chain_table=layout.chain_table
        ),
    )
    return _public(path, namespace.set_layout(req).attr)
