"""Keeping freed memory in the process, for loaders that read whole large files.

A whole-file ``read()`` or ``cat_file`` returns a new ``bytes`` object. glibc's
malloc serves every allocation above its mmap threshold (at most 32 MiB) with a
fresh anonymous mapping and unmaps it when the object is freed, so every
large result is written into pages that the process has never touched. On a
virtual machine whose host takes back the guest's free memory, that first
touch costs more than the copy into the page (``docs/performance.md``: a new
1 GiB result filled at 0.3-0.6 GB/s, one in memory the process kept at 7-10 GB/s).

:func:`keep_freed_memory` sets the process's malloc so that large allocations
come from its heap and freed heap memory stays in the process, so a loader's
next result reuses pages it already has. The price is that the process's
resident memory stays at its peak (up to 2 GiB of free heap is kept). It is
process-wide and stays in force in forked children; the filesystem option
``keep_memory=True`` calls it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

log = logging.getLogger(__name__)

# mallopt parameters of glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8

#: Free memory at the top of the heap kept rather than returned (mallopt takes an int).
KEEP_BYTES = 2**31 - 1

_lock = threading.Lock()
_kept: bool | None = None


def _libc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # noqa: B018 - glibc (and a few others) only
        libc.gnu_get_libc_version  # noqa: B018 - the parameters above are glibc's
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc


def keep_freed_memory() -> bool:
    """Make this process's malloc keep freed memory for reuse; False where it cannot.

    Sets, through ``mallopt``:

    * ``M_MMAP_MAX`` 0: no allocation gets a mapping of its own; large ones
      come from the heap, whose freed space later allocations reuse;
    * ``M_TRIM_THRESHOLD`` :data:`KEEP_BYTES`: the heap keeps that much free
      memory at its top instead of returning it to the kernel;
    * ``M_ARENA_MAX`` 1: threads started afterwards allocate from the same
      heap (a thread's own arena would still map large blocks apart).

    Only glibc's malloc has these settings; elsewhere nothing changes and the
    call returns False. Calling it again does nothing more.
    """
    global _kept
    with _lock:
        if _kept is None:
            libc = _libc()
            ok = libc is not None and all(
                libc.mallopt(param, value) == 1
                for param, value in (
                    (M_MMAP_MAX, 0),
                    (M_TRIM_THRESHOLD, KEEP_BYTES),
                    (M_ARENA_MAX, 1),
                )
            )
            if not ok:
                log.warning("keep_memory: malloc refused the settings; freed memory is not kept")
            _kept = ok
        return _kept
