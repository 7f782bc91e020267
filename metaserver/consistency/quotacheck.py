"""The quota pass of ``emberfs fsck``: each quota's recorded usage against a count of its inodes.

Every inode names its quota realm (:mod:`emberfs.metaserver.fs.quota`), so one scan of the inodes
counts, for each quota, the bytes its files are charged and the inodes below it (each inode adds
to its realm and to every quota above that). A quota whose recorded usage (the sum of its shards)
differs is a ``quota_usage`` finding.

Operations that run during the scan change inodes and usage together, so a count can be off by
what they did. A difference is reported only when a second count agrees with the first and the
recorded usage did not move meanwhile; its repair rewrites the usage in a transaction that reads
every shard, and only while they still hold what the check read.
"""

from __future__ import annotations

from collections.abc import Iterator

from emberfs.metaserver.consistency.findings import Finding
from emberfs.metaserver.fs import quota, records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine, Transaction, run_transaction


def recorded(engine: KVEngine) -> dict[int, tuple[int, int]]:
    """Each quota's usage as its shards add up."""
    out: dict[int, tuple[int, int]] = {}
    for key, _ in engine.scan_prefix(keys.QUOTA):
        directory = keys.quota_directory(key)
        out[directory] = quota.add_up(
            raw for _, raw in engine.scan_prefix(keys.quota_usage_prefix(directory))
        )
    return out


def counted(engine: KVEngine, parents: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Each quota's usage counted from the inodes; ``parents``: quota -> the quota above."""
    sums = {d: [0, 0] for d in parents}
    for _, raw in engine.scan_prefix(keys.INODE):
        attr = records.decode_inode(raw)
        realm, seen = attr.quota_realm, set()
        while realm in sums and realm not in seen:
            seen.add(realm)
            sums[realm][0] += attr.quota_charged
            sums[realm][1] += 1
            realm = parents[realm]
    return {d: (b, i) for d, (b, i) in sums.items()}


class QuotaCheck:
    """The quota pass over ``engine``; :attr:`seen` keeps the usage each finding read."""

    def __init__(self, engine: KVEngine) -> None:
        self.engine = engine
        self.seen: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}

    def check(self) -> Iterator[Finding]:
        parents = {
            keys.quota_directory(k): quota.decode(keys.quota_directory(k), raw).parent
            for k, raw in self.engine.scan_prefix(keys.QUOTA)
        }
        if not parents:
            return
        before = recorded(self.engine)
        first = counted(self.engine, parents)
        if all(first[d] == before.get(d) for d in parents):
            return
        second = counted(self.engine, parents)
        after = recorded(self.engine)
        for d in sorted(parents):
            if (
                first[d] != before.get(d)
                and first[d] == second[d]
                and before.get(d) == after.get(d)
            ):
                self.seen[d] = (after[d], first[d])
                (rb, ri), (cb, ci) = after[d], first[d]
                yield Finding(
                    "quota_usage",
                    d,
                    detail=f"records {rb} bytes and {ri} inodes, holds {cb} bytes and {ci} inodes",
                )

    def repair(self, f: Finding) -> str:
        was, right = self.seen[f.inode]

        def fix(txn: Transaction) -> bool:
            prefix = keys.quota_usage_prefix(f.inode)
            shards = [k for k, _ in txn.scan_prefix(prefix)]
            # tracked reads: an operation that changes a shard meanwhile makes this retry
            total = quota.add_up(raw for raw in map(txn.get, shards) if raw is not None)
            if total != was or txn.get(keys.quota_key(f.inode)) is None:
                return False
            for k in shards:
                txn.delete(k)
            txn.put(keys.quota_usage_key(f.inode, 0), quota.USAGE_FORMAT.pack(*right))
            return True

        return "done" if run_transaction(self.engine, fix) else "not repaired: it changed meanwhile"
