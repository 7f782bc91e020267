"""A process that puts and gets blocks of a shared KV cache at random, checking every byte it gets.

    python worker.py CACHE_PATH KEYS ROUNDS BATCH SEED

Run by the KV cache tests, several at once. The block of key ``i`` is a
function of ``i`` alone (:func:`block_of`), so any process can tell a right
block from a torn one or another key's. Prints one JSON line of counts; exits
1 when a get returned bytes that are not its key's block.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys

from emberfs.kvcache import KVCache, PutStatus


def key_of(i: int) -> bytes:
    return hashlib.sha256(b"key-%d" % i).digest()


def block_of(i: int, block_size: int) -> bytes:
    """Key ``i``'s block: its own bytes, and a length of its own (some blocks are short)."""
    length = block_size - (i % 3) * 1000
    seed = hashlib.sha256(b"block-%d" % i).digest()
    return (seed * (length // len(seed) + 1))[:length]


def main(argv: list[str]) -> int:
    path, keys, rounds, batch, seed = argv[0], *map(int, argv[1:5])
    rng = random.Random(seed)
    cache = KVCache(path)
    bs = cache.block_size
    bufs = [bytearray(bs) for _ in range(batch)]
    counts = {"puts": 0, "stored": 0, "hits": 0, "misses": 0, "wrong": 0, "exists": 0}
    for _ in range(rounds):
        ids = rng.sample(range(keys), batch)
        if rng.random() < 0.5:
            got = cache.batch_put([key_of(i) for i in ids], [block_of(i, bs) for i in ids])
            counts["puts"] += len(ids)
            counts["stored"] += sum(s == PutStatus.STORED for s in got)
            if any(s == PutStatus.FAILED for s in got):
                counts.setdefault("failed", 0)
                counts["failed"] += 1
        else:
            got = cache.batch_get([key_of(i) for i in ids], into=bufs)
            for i, n, buf in zip(ids, got, bufs, strict=True):
                if n is None:
                    counts["misses"] += 1
                elif buf[:n] == block_of(i, bs):
                    counts["hits"] += 1
                else:
                    counts["wrong"] += 1
            # the stored prefix of a run of keys is a number between 0 and the run's length
            n = cache.batch_exists([key_of(i) for i in ids])
            assert 0 <= n <= len(ids)
            counts["exists"] += 1
    print(json.dumps(counts))
    return 1 if counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
