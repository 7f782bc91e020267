"""The content of a chunk version a write or a truncation stages, with its block CRC32Cs.

Each builder returns ``(content, block crcs, checksum)`` of the new version
from the committed record it starts from; only the blocks the change touches
are checksummed again, the others keep the committed version's CRCs.
"""

from __future__ import annotations

import crc32c

from emberfs.common import framing
from emberfs.storageserver.chunkfiles import ChunkFiles
from emberfs.storageserver.chunkrecords import ChunkRecord


def written_content(
    files: ChunkFiles,
    inode: int,
    index: int,
    base: ChunkRecord | None,
    offset: int,
    view: memoryview,
    *,
    block_size: int,
    full_chunk: bool,
    crcs: list[int] | None,
):
    """The committed content of ``base`` with ``view`` written at ``offset``.

    Exactly ``view`` when ``full_chunk`` (or when it covers the old content);
    ``crcs`` are ``view``'s block CRCs, if known.
    """
    bs = block_size
    n = len(view)
    old_len = base.c_len if base and base.c_version else 0
    if full_chunk or (offset == 0 and n >= old_len):
        block_crcs = crcs
        if block_crcs is None or len(block_crcs) != framing.n_blocks(n, bs):
            block_crcs = framing.block_crcs(view, bs)
        return view, list(block_crcs), framing.combine_crcs(block_crcs, bs, n)
    path = files.path(inode, index, base.c_version, base.c_fid) if old_len else None
    content = files.patched(path, old_len, offset, view)
    new_len = len(content)
    mv = memoryview(content)
    first = min(offset, old_len) // bs
    last = framing.n_blocks(offset + n, bs)
    old = base.c_crcs if base else []
    patched = list(old[:first])
    patched.extend(crc32c.crc32c(mv[i * bs : (i + 1) * bs]) for i in range(first, last))
    patched.extend(old[last : framing.n_blocks(new_len, bs)])
    return content, patched, framing.combine_crcs(patched, bs, new_len)


def cut_content(
    files: ChunkFiles,
    inode: int,
    index: int,
    base: ChunkRecord | None,
    length: int,
    *,
    block_size: int,
):
    """The committed content of ``base`` cut to ``length`` (never extended)."""
    bs = block_size
    old_len = base.c_len if base and base.c_version else 0
    new_len = min(length, old_len)
    if new_len == 0:
        return b"", [], crc32c.crc32c(b"")
    path = files.path(inode, index, base.c_version, base.c_fid)
    content = files.read(path, 0, new_len)
    full = new_len // bs
    crcs = list(base.c_crcs[:full])
    if new_len % bs:
        crcs.append(crc32c.crc32c(memoryview(content)[full * bs :]))
    return content, crcs, framing.combine_crcs(crcs, bs, new_len)
