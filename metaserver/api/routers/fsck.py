"""``/api/v1/fsck``: check the namespace against itself and the storage servers (and repair).

Both routes stream their result as JSON lines (``application/x-ndjson``): one
``{"finding": ...}`` per damage found, then ``{"summary": ...}``, or
``{"error": ...}`` when the check could not finish (see
:mod:`emberfs.metaserver.consistency.fsck`). One check runs at a time (409 otherwise).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from emberfs.metaserver.api.deps import AdminDep
from emberfs.metaserver.api.schemas import ERROR_RESPONSES, STEERING_RESPONSES

router = APIRouter(prefix="/api/v1/fsck", tags=["fsck"], responses=ERROR_RESPONSES)

DeepQuery = Annotated[
    bool, Query(description="read every block of every replica and check its CRC32C")
]


def _stream(request: Request, deep: bool, repair: bool) -> StreamingResponse:
    run = request.app.state.fsck.run(deep=deep, repair=repair)
    first = next(run)  # a running check answers 409 now, not in the middle of a stream

    def lines() -> Iterator[bytes]:
        yield json.dumps(first).encode() + b"\n"
        for item in run:
            yield json.dumps(item).encode() + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.get("", response_class=StreamingResponse)
def fsck(request: Request, deep: DeepQuery = False) -> StreamingResponse:
    """Check and report (changes nothing)."""
    return _stream(request, deep, repair=False)


@router.post("/repair", response_class=StreamingResponse, responses=STEERING_RESPONSES)
def fsck_repair(_: AdminDep, request: Request, deep: DeepQuery = False) -> StreamingResponse:
    """Check, and fix what can be fixed; each finding says whether it was repaired."""
    return _stream(request, deep, repair=True)
