"""``emberfs migrate``: a cluster's metadata moved from RocksDB to etcd and back.

The whole move runs through real processes: a cluster on RocksDB gets files,
a hardlink, a symlink and a client token, is stopped, and its store is copied
into a fresh prefix of the suite's etcd by ``emberfs migrate``; the same data
directory and storage servers then come up with the metaserver on etcd and
serve every file, the counts and the token as before; and the store goes back
into a fresh RocksDB that a third start of the cluster serves. The refusals
(a running metaserver on either store, a destination that is not empty, an
empty or missing source) are made by the command too. The batching within
etcd's limits, the keys left out and rebuilt, and a copy that does not verify
are checked in-process on small stores.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from emberfs.cli import migrate as migrate_cli
from emberfs.cli.localcluster import LocalCluster
from emberfs.cli.processes import emberfs_command
from emberfs.client.fs import EmberFileSystem
from emberfs.metaserver.fs import inodecounts, records
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.etcd import EtcdEngine
from emberfs.metaserver.store.kv import Conflict, MemoryEngine, RocksEngine
from emberfs.metaserver.store.migration.errors import StoreInUse, TooLarge
from emberfs.metaserver.store.migration.migrate import migrate, plan, run
from emberfs.metaserver.store.migration.stores import leader_on
from emberfs.metaserver.store.migration.tally import copied, survey
from emberfs.proto import common_pb2, meta_pb2

MiB = 1024 * 1024
SHA_LINE = re.compile(r"^(source|destination) sha256 ([0-9a-f]{64}) keys (\d+) bytes (\d+)$", re.M)
TOKEN_LINE = re.compile(r"^emb1\.[0-9a-f]{12}\.[A-Za-z0-9_-]{43}$", re.M)


def run_emberfs(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*emberfs_command(), *args], capture_output=True, text=True, timeout=timeout
    )


def checksums(output: str) -> dict[str, tuple[str, int, int]]:
    """``{"source"|"destination": (sha256, keys, bytes)}`` of the command's output."""
    return {m[1]: (m[2], int(m[3]), int(m[4])) for m in SHA_LINE.finditer(output)}


def stored(engine) -> list[tuple[bytes, bytes]]:
    """Every pair of a store's keyspace, in key order."""
    return list(engine.scan(b"", None))


def without_counts(items: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    prefix = keys.config_key(keys.INODE_COUNTS)
    return [(k, v) for k, v in items if not k.startswith(prefix)]


def inodes_by_type(items: list[tuple[bytes, bytes]]) -> dict[int, int]:
    counts = dict.fromkeys(inodecounts.TYPES, 0)
    for key, value in items:
        if key.startswith(keys.INODE):
            counts[records.decode_inode(value).type] += 1
    return counts


def snapshot(fs: EmberFileSystem) -> dict[str, object]:
    """Every path of the namespace with its type, size, owner, mode, link count and inode."""
    out = {}
    for path, info in fs.find("/", withdirs=True, detail=True).items():
        out[path] = tuple(info[k] for k in ("type", "size", "uid", "gid", "mode", "nlink", "ino"))
    return out


def wait_until_no_leader(url: str, timeout: float = 15.0) -> None:
    """Until the leader key is gone (a metaserver stopped gives it up; a killed one's lapses)."""
    engine = EtcdEngine(url)
    try:
        deadline = time.monotonic() + timeout
        while leader_on(engine) is not None:
            assert time.monotonic() < deadline, "the leader key stayed after the cluster stopped"
            time.sleep(0.2)
    finally:
        engine.close()


def hardlink(fs: EmberFileSystem, src: str, dst: str) -> None:
    meta = fs.client.meta
    meta.meta("Hardlink", meta_pb2.HardlinkRequest(ctx=meta.context(), src=src, dst=dst), dst)


def fill(fs: EmberFileSystem, alice: EmberFileSystem) -> dict[str, bytes]:
    """Directories, files with data, a hardlink, a symlink and a file of alice's; the files."""
    files = {
        "/data/a/big.bin": os.urandom(9 * MiB + 5),  # three chunks of 4 MiB
        "/data/a/b/small.txt": b"hello, etcd\n",
        "/data/empty.txt": b"",
    }
    files.update({f"/data/many/{i:03d}.json": os.urandom(i + 1) for i in range(150)})
    fs.makedirs("/data/a/b")
    fs.makedirs("/data/many")
    fs.makedirs("/data/nothing/here")
    fs.pipe(files)
    hardlink(fs, "/data/a/big.bin", "/data/link.bin")
    files["/data/link.bin"] = files["/data/a/big.bin"]
    fs.client.meta.symlink("/data/sym", "/data/a/b/small.txt")
    fs.makedirs("/home/alice")
    fs.client.meta.setattr("/home/alice", uid=1000, gid=1000, mode=0o700)
    files["/home/alice/notes.txt"] = b"alice's notes\n" * 1000
    alice.pipe_file("/home/alice/notes.txt", files["/home/alice/notes.txt"])
    return files


def check_served(fs: EmberFileSystem, alice: EmberFileSystem, files, before) -> None:
    """Every file reads back identical, links and counts are as they were, the token works."""
    assert snapshot(fs) == before["tree"]
    assert fs.cat(sorted(files)) == files
    assert fs.info("/data/link.bin")["ino"] == fs.info("/data/a/big.bin")["ino"]
    assert fs.info("/data/link.bin")["nlink"] == 2
    sym = next(e for e in fs.ls("/data", detail=True) if e["name"] == "/data/sym")
    assert sym["islink"] and sym["destination"] == "/data/a/b/small.txt"
    assert fs.cat_file("/data/sym") == files["/data/a/b/small.txt"]
    statfs = fs.statfs()
    for field in ("inodes", "files", "directories"):
        assert statfs[field] == before["statfs"][field], (field, statfs, before["statfs"])
    assert alice.cat_file("/home/alice/notes.txt") == files["/home/alice/notes.txt"]
    with pytest.raises(PermissionError):
        alice.ls("/data")  # not root: the token is alice's, not the admin's
    with pytest.raises(PermissionError):
        alice.pipe_file("/data/alice.txt", b"no")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cluster_moves_from_rocksdb_to_etcd_and_back(private_cluster, etcd_url, tmp_path):
    c = private_cluster()
    meta_dir = c.data_dir / "meta"  # the metaserver's --data-dir; its store is meta/meta
    made = run_emberfs("admin", "--admin", c.admin_url, "token", "create", "--uid", "1000",
                       "--gid", "1000", "--name", "alice")  # fmt: skip
    assert made.returncode == 0, made.stderr
    alice_token = TOKEN_LINE.search(made.stdout)[0]
    fs = EmberFileSystem(c.meta_address, skip_instance_cache=True)
    alice = EmberFileSystem(c.meta_address, token=alice_token, skip_instance_cache=True)
    try:
        files = fill(fs, alice)
        # alice may neither list nor write /data (root's, mode 700)
        fs.client.meta.setattr("/data", mode=0o700)
        before = {"tree": snapshot(fs), "statfs": fs.statfs()}
        assert before["statfs"]["files"] == len(files) - 1  # the hardlink is one file

        # the metaserver holds its RocksDB's lock: refused, nothing written to etcd
        busy = run_emberfs("migrate", "--from", f"rocksdb:{meta_dir}", "--to", etcd_url)
        assert busy.returncode == 2, busy.stdout + busy.stderr
        assert "seems to run on it" in busy.stderr
    finally:
        fs.close()
        alice.close()
    c.stop()
    etcd = EtcdEngine(etcd_url)
    try:
        assert stored(etcd) == []

        dry = run_emberfs("migrate", "--from", f"rocksdb:{meta_dir}", "--to", etcd_url, "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert "nothing written" in dry.stdout
        assert stored(etcd) == []

        done = run_emberfs("migrate", "--from", f"rocksdb:{meta_dir}", "--to", etcd_url)
        assert done.returncode == 0, done.stdout + done.stderr
        sums = checksums(done.stdout)
        assert sums["source"] == sums["destination"] == checksums(dry.stdout)["source"]
        assert "verified" in done.stdout

        # the copy, pair by pair: the same keyspace, plus the inode counts etcd needs
        rocks = RocksEngine(meta_dir / "meta")
        try:
            source_pairs = stored(rocks)
        finally:
            rocks.close()
        copied = stored(etcd)
        assert without_counts(copied) == source_pairs
        assert sums["source"][1] == len(source_pairs) > 2 * etcd.max_txn_ops
        assert inodecounts.totals(etcd) == inodes_by_type(source_pairs)
        assert not any(k.startswith(keys.LEADER) for k, _ in copied)

        # a second copy into the same prefix is refused: it is not empty
        again = run_emberfs("migrate", "--from", f"rocksdb:{meta_dir}", "--to", etcd_url)
        assert again.returncode == 2 and "not empty" in again.stderr, again.stderr
        assert stored(etcd) == copied
    finally:
        etcd.close()

    # the same data directory and storage servers, the metaserver on etcd
    on_etcd = LocalCluster(c.data_dir, kv=etcd_url, storage_ports=c.storage_ports,
                           heartbeat_timeout=2.0)  # fmt: skip
    back = tmp_path / "back"
    try:
        on_etcd.start(timeout=90)
        fs = EmberFileSystem(on_etcd.meta_address, skip_instance_cache=True)
        alice = EmberFileSystem(on_etcd.meta_address, token=alice_token, skip_instance_cache=True)
        try:
            check_served(fs, alice, files, before)
            alice.pipe_file("/home/alice/on-etcd.txt", b"written on etcd")
            files["/home/alice/on-etcd.txt"] = b"written on etcd"
            assert alice.info("/home/alice/on-etcd.txt")["uid"] == 1000
            before = {"tree": snapshot(fs), "statfs": fs.statfs()}
        finally:
            fs.close()
            alice.close()
        # a metaserver leads on etcd: refused, and no RocksDB made
        busy = run_emberfs("migrate", "--from", etcd_url, "--to", f"rocksdb:{back}")
        assert busy.returncode == 2 and "a metaserver runs on the source" in busy.stderr
        assert not back.exists()
    finally:
        on_etcd.stop()
    wait_until_no_leader(etcd_url)

    # and back: into a fresh RocksDB where the cluster's metaserver keeps it
    os.rename(meta_dir, c.data_dir / "meta-before-etcd")
    done = run_emberfs("migrate", "--from", etcd_url, "--to", f"rocksdb:{meta_dir}")
    assert done.returncode == 0, done.stdout + done.stderr
    sums = checksums(done.stdout)
    assert sums["source"] == sums["destination"]
    etcd, rocks = EtcdEngine(etcd_url), RocksEngine(meta_dir / "meta")
    try:
        returned = stored(rocks)
        assert returned == without_counts(stored(etcd))
        assert survey(rocks).sha256 == sums["destination"][0]
        assert not any(k.startswith(keys.config_key(keys.INODE_COUNTS)) for k, _ in returned)
    finally:
        etcd.close()
        rocks.close()

    again = LocalCluster(c.data_dir, storage_ports=c.storage_ports, heartbeat_timeout=2.0)
    try:
        again.start(timeout=90)
        fs = EmberFileSystem(again.meta_address, skip_instance_cache=True)
        alice = EmberFileSystem(again.meta_address, token=alice_token, skip_instance_cache=True)
        try:
            check_served(fs, alice, files, before)
        finally:
            fs.close()
            alice.close()
    finally:
        again.stop()


def test_an_empty_or_missing_source_is_refused(etcd_url, tmp_path):
    empty = run_emberfs("migrate", "--from", etcd_url, "--to", f"rocksdb:{tmp_path / 'dst'}")
    assert empty.returncode == 2 and "holds nothing to copy" in empty.stderr, empty.stderr
    assert not (tmp_path / "dst").exists()

    missing = run_emberfs("migrate", "--from", f"rocksdb:{tmp_path / 'nope'}", "--to", etcd_url)
    assert missing.returncode == 2 and "no metadata store" in missing.stderr, missing.stderr
    assert not (tmp_path / "nope").exists()


def small_store(engine) -> None:
    """A root, a directory, a file and a symlink, a token, counters and a key of no known prefix."""
    attrs = [
        common_pb2.InodeAttr(inode=1, type=common_pb2.DIRECTORY, mode=0o755, nlink=3),
        common_pb2.InodeAttr(inode=2, type=common_pb2.DIRECTORY, mode=0o755, nlink=2),
        common_pb2.InodeAttr(inode=3, type=common_pb2.FILE, mode=0o644, nlink=1, size=10),
        common_pb2.InodeAttr(inode=4, type=common_pb2.SYMLINK, symlink_target="/d/f"),
    ]
    puts = {keys.inode_key(a.inode): records.encode_inode(a) for a in attrs}
    puts[keys.dentry_key(1, "d")] = records.encode_dentry(2, common_pb2.DIRECTORY)
    puts[keys.dentry_key(2, "f")] = records.encode_dentry(3, common_pb2.FILE)
    puts[keys.dentry_key(1, "l")] = records.encode_dentry(4, common_pb2.SYMLINK)
    puts[keys.token_key("0123456789ab")] = b'{"name": "ci"}'
    puts[keys.config_key(keys.NEXT_INODE)] = records.encode_counter(5)
    puts[b"ZZZZunknown"] = b"\x00\xff"  # a prefix this version does not know is copied too
    engine.write(puts)


def test_batches_stay_within_etcd_limits_and_counts_are_rebuilt(etcd_url, tmp_path, monkeypatch):
    source = MemoryEngine()
    small_store(source)
    # many small keys (batches bound by etcd's 128 operations) and large ones (by its 1.5 MiB)
    source.write({keys.idempotent_key("client", i): b"r" * 40 for i in range(700)})
    source.write({keys.gc_key(i): os.urandom(50_000) for i in range(90)})
    # counts as a shared store kept them, wrong: they are not copied but counted again
    source.write({inodecounts.shard_key(7): b"\x09" * 24})
    destination = EtcdEngine(etcd_url)
    batches = []
    write = EtcdEngine.write

    def recording(self, puts, deletes=None, *, sync=True):
        batches.append((len(puts), sum(len(self.full_key(k)) + len(v) for k, v in puts.items())))
        return write(self, puts, deletes, sync=sync)

    monkeypatch.setattr(EtcdEngine, "write", recording)
    try:
        result = migrate(source, destination)
        assert result.verified, result.problems
        expected = [(k, v) for k, v in stored(source) if copied(k)]
        assert without_counts(stored(destination)) == expected
        assert result.destination.keys == len(expected) == result.source.keys
        assert inodecounts.totals(destination) == {
            common_pb2.FILE: 1,
            common_pb2.DIRECTORY: 2,
            common_pb2.SYMLINK: 1,
        }
        assert destination.get(inodecounts.shard_key(7)) is None
        copy_batches = batches[: len(batches) - 1]  # the last write is the rebuilt count
        assert sum(n for n, _ in copy_batches) == len(expected)
        assert max(n for n, _ in copy_batches) == destination.max_txn_ops
        largest = max(b for _, b in copy_batches)
        assert destination.max_request_bytes // 2 < largest <= destination.max_request_bytes
        count_bound = [n for n, b in copy_batches if n == destination.max_txn_ops]
        bytes_bound = [n for n, b in copy_batches if b > destination.max_request_bytes // 2]
        assert len(count_bound) >= 700 // destination.max_txn_ops
        assert len(bytes_bound) >= 90 * 50_000 // destination.max_request_bytes

        # etcd -> RocksDB: the same pairs, no counts (a local store counts in memory)
        code = migrate_cli.main(["--from", etcd_url, "--to", f"rocksdb:{tmp_path / 'r'}"])
        assert code == 0
        rocks = RocksEngine(tmp_path / "r" / "meta")
        try:
            assert stored(rocks) == expected
        finally:
            rocks.close()
    finally:
        destination.close()


def test_a_value_too_large_for_etcd_is_refused_before_anything_is_written(etcd_url):
    source = MemoryEngine()
    small_store(source)
    source.write({keys.gc_key(1): b"x" * (2 * MiB)})
    destination = EtcdEngine(etcd_url)
    try:
        with pytest.raises(TooLarge, match="max-request-bytes"):
            migrate(source, destination)
        assert stored(destination) == []
    finally:
        destination.close()


def test_a_leader_key_on_the_source_is_a_running_metaserver(etcd_url, tmp_path):
    source = MemoryEngine()
    small_store(source)
    source.write({keys.LEADER: b'{"id": "abc", "address": "10.0.0.1:9400"}'})
    with pytest.raises(StoreInUse, match="metaserver abc at 10.0.0.1:9400"):
        migrate(source, MemoryEngine())


def test_a_destination_that_is_not_empty_or_the_source_itself_is_refused(tmp_path, capsys):
    src, dst = tmp_path / "src", tmp_path / "dst"
    for path in (src, dst):
        engine = RocksEngine(path / "meta")
        small_store(engine)
        engine.close()
    assert migrate_cli.main(["--from", f"rocksdb:{src}", "--to", f"rocksdb:{dst}"]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert migrate_cli.main(["--from", f"rocksdb:{src}", "--to", f"rocksdb:{src}/"]) == 2
    assert "same store" in capsys.readouterr().err
    # the store's own directory instead of the metaserver's data directory: a hint
    assert migrate_cli.main(["--from", f"rocksdb:{src / 'meta'}", "--to", f"rocksdb:{dst}"]) == 2
    assert f"rocksdb:{src}" in capsys.readouterr().err


def test_a_dry_run_writes_nothing_and_creates_no_store(tmp_path, capsys):
    src = tmp_path / "src"
    engine = RocksEngine(src / "meta")
    small_store(engine)
    expected = survey(engine)
    engine.close()
    code = migrate_cli.main(["--from", f"rocksdb:{src}", "--to", f"rocksdb:{tmp_path / 'd'}",
                             "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert checksums(out) == {"source": (expected.sha256, expected.keys, expected.bytes)}
    assert "INOD" in out and "1 files, 2 directories, 1 symlinks" in out
    assert not (tmp_path / "d").exists()


def test_a_copy_that_does_not_verify_exits_1(tmp_path, capsys, monkeypatch):
    src = tmp_path / "src"
    engine = RocksEngine(src / "meta")
    small_store(engine)
    engine.close()
    write = RocksEngine.write
    counter = keys.config_key(keys.NEXT_INODE)

    def corrupting(self, puts, deletes=None, *, sync=True):
        if counter in puts:
            puts = {**puts, counter: records.encode_counter(4)}
        return write(self, puts, deletes, sync=sync)

    monkeypatch.setattr(RocksEngine, "write", corrupting)
    code = migrate_cli.main(["--from", f"rocksdb:{src}", "--to", f"rocksdb:{tmp_path / 'd'}"])
    out = capsys.readouterr()
    assert code == 1
    sums = checksums(out.out)
    assert sums["source"][0] != sums["destination"][0]
    assert sums["source"][1:] == sums["destination"][1:]  # same keys and bytes, other values
    assert "NOT VERIFIED" in out.err and "differs from the source's" in out.err


def test_a_source_that_changes_during_the_copy_does_not_verify():
    source = MemoryEngine()
    small_store(source)
    planned = plan(source, MemoryEngine())
    destination = MemoryEngine()
    source.write({keys.token_key("fedcba987654"): b"{}"})  # a token made after the survey
    result = run(source, destination, planned)
    assert not result.verified
    assert any("the source changed" in p for p in result.problems)


class FlakyScans(MemoryEngine):
    """A store whose first scan of each pass fails half-way, as an etcd member behind does."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    def scan(self, start, end, limit=None):
        items = list(super().scan(start, end, limit))
        if start == b"" and end is None and limit is None and len(items) > 4:
            self.failures += 1
            return self._failing(items[: len(items) // 2])
        return iter(items)

    @staticmethod
    def _failing(items):
        yield from items
        raise Conflict("required revision is a future revision")


def test_a_pass_whose_scan_conflicts_goes_on_after_the_last_key():
    source = FlakyScans()
    small_store(source)
    destination = MemoryEngine()
    result = migrate(source, destination)
    assert source.failures == 3  # the survey, the copy and the verification each resumed
    assert result.verified, result.problems
    plain = MemoryEngine()
    small_store(plain)
    assert stored(destination) == stored(plain)
