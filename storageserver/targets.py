"""A storage node's targets on disk: their ids, the node's id, and their usage reports."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

from emberfs.proto import cluster_pb2
from emberfs.storageserver.chunkstore import ChunkStore
from emberfs.storageserver.scrub import Scrubber


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so a crash leaves the old or the new content."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_target_id(path: Path) -> int:
    """The target id kept in ``path`` (0: none yet)."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0
    if not text.isdigit():
        raise ValueError(f"{path} does not hold a target id: {text[:40]!r}")
    return int(text)


def load_node_id(data_dir: Path) -> str:
    """The node id kept in ``DATA_DIR/node_id``, made and kept there at first start."""
    path = data_dir / "node_id"
    if path.exists():
        node_id = path.read_text().strip()
        if node_id:
            return node_id
    node_id = f"{socket.gethostname()}-{secrets.token_hex(4)}"
    write_atomic(path, node_id + "\n")
    return node_id


def target_reports(
    local: Sequence[ChunkStore],
    target_ids: Sequence[int],
    io_counters: Callable[[int], tuple[int, int]] | None,
    scrubber: Scrubber | None,
) -> list[cluster_pb2.TargetReport]:
    """The usage report of each local target (``target_ids[k]`` is ``local[k]``'s; 0: none).

    ``io_counters`` gives a target's (bytes read, bytes written) (None: no data server yet).
    """
    # Targets on one filesystem share its capacity: each reports its share, so the
    # cluster's total counts every disk once.
    devices = [os.stat(store.root).st_dev for store in local]
    out = []
    for store, tid, dev in zip(local, target_ids, devices, strict=True):
        st = store.stats()
        read, written = io_counters(tid) if io_counters and tid else (0, 0)
        out.append(
            cluster_pb2.TargetReport(
                target_id=tid,
                capacity=st["capacity"] // devices.count(dev),
                used=st["used"],
                chunks=st["chunks"],
                bytes_read=read,
                bytes_written=written,
                full=st["full"],
            )
        )
        if scrubber is not None and tid:
            out[-1].scrub.CopyFrom(scrubber.report(tid, store.repaired))
    return out
