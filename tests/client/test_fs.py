"""EmberFileSystem methods against a real cluster."""

from __future__ import annotations

import datetime
import errno
import os
import time

import fsspec
import httpx
import pytest
from fsspec.callbacks import Callback

from emberfs.client import paths
from emberfs.client.fs import EmberFileSystem

MiB = 1024 * 1024


def test_strip_protocol_and_url_kwargs():
    strip = paths.strip_protocol
    assert strip("emberfs://10.0.0.1:9400/a/b/") == "/a/b"
    assert strip("ember:///a//b") == "/a/b"
    assert strip("a/b") == "/a/b"
    assert strip("/") == "/"
    assert strip("emberfs://h:1") == "/"
    assert strip(["/x/", "emberfs:///y"]) == ["/x", "/y"]
    assert paths.meta_of_url("emberfs://h:9/a") == "h:9"
    assert paths.meta_of_url("emberfs:///a") is None
    # fsspec finds the filesystem and its metaserver in a URL through the same rules
    fs, path = fsspec.core.url_to_fs("emberfs://h:9/a//b/", skip_instance_cache=True)
    assert isinstance(fs, EmberFileSystem) and fs.meta == "h:9" and path == "/a/b"
    fs, path = fsspec.core.url_to_fs("ember:///c", meta="h:8", skip_instance_cache=True)
    assert fs.meta == "h:8" and path == "/c"


def test_default_meta_from_environment(monkeypatch):
    monkeypatch.setenv("EMBERFS_META", "192.0.2.1:1234")
    fs = EmberFileSystem(skip_instance_cache=True)
    assert fs.meta == "192.0.2.1:1234"
    monkeypatch.delenv("EMBERFS_META")
    assert EmberFileSystem(skip_instance_cache=True).meta == "127.0.0.1:9400"


def test_options_override_class_defaults():
    fs = EmberFileSystem("h:1", readahead_depth=3, max_connections=2, skip_instance_cache=True)
    assert (fs.readahead_depth, fs.max_connections) == (3, 2)
    assert EmberFileSystem.readahead_depth == 8


def test_url_open_and_instance_cache(fs, base, cluster):
    url = f"emberfs://{cluster.meta_address}{base}/u.bin"
    with fsspec.open(url, "wb") as f:
        f.write(b"via url")
    with fsspec.open(url, "rb") as f:
        assert f.read() == b"via url"
    other, path = fsspec.core.url_to_fs(url)
    assert isinstance(other, EmberFileSystem)
    assert other.meta == cluster.meta_address and path == f"{base}/u.bin"
    assert other is fsspec.filesystem("emberfs", meta=cluster.meta_address)
    assert other.unstrip_protocol(path) == url


def test_ls_info_and_types(fs, base):
    fs.mkdir(f"{base}/dir")
    fs.pipe_file(f"{base}/file", b"12345")
    listing = fs.ls(base, detail=True)
    by_name = {e["name"]: e for e in listing}
    assert set(by_name) == {f"{base}/dir", f"{base}/file"}
    f = by_name[f"{base}/file"]
    assert f["type"] == "file" and f["size"] == 5 and f["nlink"] == 1
    assert f["ino"] > 0 and f["mtime"] > 0 and f["created"] > 0
    assert by_name[f"{base}/dir"]["type"] == "directory"
    assert sorted(fs.ls(base, detail=False)) == sorted(by_name)
    info = fs.info(f"{base}/file")
    assert {k: info[k] for k in ("name", "size", "type", "ino")} == {
        k: f[k] for k in ("name", "size", "type", "ino")
    }
    assert fs.ls(f"{base}/file", detail=False) == [f"{base}/file"]
    assert fs.isdir(base) and not fs.isfile(base)
    assert fs.isfile(f"{base}/file") and not fs.isdir(f"{base}/file")
    assert fs.exists(f"{base}/file") and not fs.exists(f"{base}/nope")
    assert not fs.exists(f"{base}/file/below")
    assert fs.info("/")["type"] == "directory"


def test_ls_paginates(fs, base):
    small = EmberFileSystem(fs.meta, list_page=7, skip_instance_cache=True)
    for i in range(23):
        fs.touch(f"{base}/f{i:02d}")
    names = small.ls(base, detail=False)
    assert names == [f"{base}/f{i:02d}" for i in range(23)]
    small.close()


def test_mkdir_makedirs_rmdir(fs, base):
    fs.mkdir(f"{base}/a/b/c")  # create_parents=True by default
    assert fs.isdir(f"{base}/a/b/c")
    with pytest.raises(FileExistsError):
        fs.mkdir(f"{base}/a/b/c")
    with pytest.raises(FileNotFoundError):
        fs.mkdir(f"{base}/x/y", create_parents=False)
    fs.makedirs(f"{base}/a/b/c", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs(f"{base}/a/b/c")
    fs.makedirs(f"{base}/m/n")
    fs.rmdir(f"{base}/m/n")
    assert not fs.exists(f"{base}/m/n")
    with pytest.raises(OSError) as e:
        fs.rmdir(f"{base}/a")
    assert e.value.errno == errno.ENOTEMPTY


def test_rm_single_and_recursive(fs, base):
    fs.pipe_file(f"{base}/t/a/1", b"1")
    fs.pipe_file(f"{base}/t/b/2", b"2")
    fs.pipe_file(f"{base}/single", b"s")
    fs.rm(f"{base}/single")
    assert not fs.exists(f"{base}/single")
    fs.rm(f"{base}/t", recursive=True)
    assert not fs.exists(f"{base}/t")
    fs.pipe_file(f"{base}/g/x1", b"")
    fs.pipe_file(f"{base}/g/x2", b"")
    fs.pipe_file(f"{base}/g/y", b"")
    fs.rm(f"{base}/g/x*")
    assert fs.ls(f"{base}/g", detail=False) == [f"{base}/g/y"]
    fs.rm_file(f"{base}/g/y")
    assert fs.ls(f"{base}/g") == []


def test_rm_of_many_paths_is_one_call(fs, base, cluster):
    d = f"{base}/many-rm"
    fs.pipe({f"{d}/f{i:02d}": b"x" for i in range(30)} | {f"{d}/sub/a": b"a", f"{d}/keep": b"k"})
    before = meta_calls(cluster)
    fs.rm([f"{d}/f{i:02d}" for i in range(30)] + [f"{d}/sub"], recursive=True)
    calls = {m: n - before.get(m, 0) for m, n in meta_calls(cluster).items()}
    assert calls.get("BatchRemove") == 1 and not calls.get("Remove")
    assert fs.ls(d, detail=False) == [f"{d}/keep"]
    # every path is attempted, then the first failure in their order is raised
    fs.pipe({f"{d}/a": b"", f"{d}/b": b""})
    with pytest.raises(FileNotFoundError):
        fs.rm([f"{d}/a", f"{d}/missing", f"{d}/b"])
    assert fs.ls(d, detail=False) == [f"{d}/keep"]
    # a glob: deepest first in one call, a directory without recursive refused
    fs.pipe({f"{d}/g/x1": b"", f"{d}/g/x2/y": b"", f"{d}/g/z": b""})
    with pytest.raises(OSError) as err:
        fs.rm(f"{d}/g/x*")
    assert err.value.errno == errno.ENOTEMPTY
    assert fs.ls(f"{d}/g", detail=False) == [f"{d}/g/x2", f"{d}/g/z"]
    fs.rm(f"{d}/g/x*", recursive=True)
    assert fs.ls(f"{d}/g", detail=False) == [f"{d}/g/z"]


def test_removed_chunks_are_written_over_by_new_files(fs, base, cluster):
    """The storage servers keep a removed file's chunk files and write new chunks over them."""
    root = cluster.data_dir

    def spares() -> set[int]:
        return {p.stat().st_ino for p in root.glob("storage-*/target-*/spare/*")}

    def chunk_files() -> set[int]:
        return {p.stat().st_ino for p in root.glob("storage-*/target-*/chunks/*/*")}

    def gc_settled() -> bool:  # every target dropped the chunks of files removed before
        items = httpx.get(f"{cluster.admin_url}/api/v1/gc", timeout=10).json()
        return all(not item["waiting"] for item in items)

    # files removed by earlier tests must not turn into spares while this one watches
    deadline = time.monotonic() + 30
    while not gc_settled():
        assert time.monotonic() < deadline, "earlier removals were not collected"
        time.sleep(0.2)
    first = os.urandom(3 * 4 * 1024 * 1024 + 123)
    fs.pipe_file(f"{base}/first", first)
    assert fs.info(f"{base}/first")["chunk_size"] == 4 * 1024 * 1024
    kept = spares()
    fs.rm(f"{base}/first")
    deadline = time.monotonic() + 30
    while len(spares() - kept) < 9:  # 3 chunks x 3 replicas, dropped by the GC
        assert time.monotonic() < deadline, "the removed file's chunks were not kept as spares"
        time.sleep(0.2)
    retired = spares() - kept
    second = os.urandom(len(first))
    fs.pipe_file(f"{base}/second", second)
    taken = retired - spares()
    assert taken and taken <= chunk_files()
    assert fs.cat_file(f"{base}/second") == second


def test_mv_file_and_directory(fs, base):
    fs.pipe_file(f"{base}/src", b"data")
    fs.mv(f"{base}/src", f"{base}/dst")
    assert not fs.exists(f"{base}/src") and fs.cat_file(f"{base}/dst") == b"data"
    fs.pipe_file(f"{base}/d1/inner/f", b"tree")
    fs.mv(f"{base}/d1", f"{base}/d2")
    assert fs.cat_file(f"{base}/d2/inner/f") == b"tree" and not fs.exists(f"{base}/d1")
    fs.mkdir(f"{base}/into")
    fs.mv(f"{base}/dst", f"{base}/into")
    assert fs.cat_file(f"{base}/into/dst") == b"data"
    fs.mv(f"{base}/into/dst", f"{base}/new/parents/dst")
    assert fs.cat_file(f"{base}/new/parents/dst") == b"data"


def test_copy_streams_large_file(fs, base):
    data = os.urandom(9 * MiB + 77)
    fs.pipe_file(f"{base}/a", data)
    fs.copy(f"{base}/a", f"{base}/b")
    assert fs.cat_file(f"{base}/b") == data
    fs.cp_file(f"{base}/a", f"{base}/c/d")
    assert fs.cat_file(f"{base}/c/d") == data
    assert fs.info(f"{base}/a")["ino"] != fs.info(f"{base}/b")["ino"]


def test_cat_file_ranges(fs, base):
    data = os.urandom(5 * MiB + 3)
    fs.pipe_file(f"{base}/r", data)
    assert fs.cat_file(f"{base}/r") == data
    assert fs.cat_file(f"{base}/r", start=10, end=20) == data[10:20]
    assert (
        fs.cat_file(f"{base}/r", start=4 * MiB - 5, end=4 * MiB + 5)
        == data[4 * MiB - 5 : 4 * MiB + 5]
    )
    assert fs.cat_file(f"{base}/r", start=-100) == data[-100:]
    assert fs.cat_file(f"{base}/r", start=len(data) + 10) == b""
    assert fs.cat_file(f"{base}/r", start=0, end=-1) == data[:-1]
    assert fs.cat(f"{base}/r") == data


def test_cat_ranges_concurrent_and_errors(fs, base):
    a, b = os.urandom(6 * MiB), os.urandom(1000)
    fs.pipe_file(f"{base}/a", a)
    fs.pipe_file(f"{base}/b", b)
    paths = [f"{base}/a", f"{base}/b", f"{base}/a", f"{base}/missing"]
    out = fs.cat_ranges(paths, [0, 10, 4 * MiB - 1, 0], [5 * MiB, 20, 6 * MiB, 5])
    assert out[0] == a[: 5 * MiB] and out[1] == b[10:20] and out[2] == a[4 * MiB - 1 :]
    assert isinstance(out[3], FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        fs.cat_ranges(paths, [0] * 4, [1] * 4, on_error="raise")


def meta_calls(cluster) -> dict[str, float]:
    """The metaserver's count of served ``MetaService`` calls, by method."""
    text = httpx.get(f"{cluster.admin_url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("emberfs_meta_requests_total{") and 'service="MetaService"' in line:
            method = line.split('method="', 1)[1].split('"', 1)[0]
            out[method] = out.get(method, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_cat_of_many_files_opens_them_in_one_call(fs, base, cluster):
    d = f"{base}/many"
    blobs = {f"{d}/f{i:02d}": os.urandom(i * 997) for i in range(30)}
    blobs[f"{d}/big"] = os.urandom(9 * MiB + 5)  # three chunks
    for path, data in blobs.items():
        fs.pipe_file(path, data)
    fs.mkdir(f"{d}/sub")

    before = meta_calls(cluster)
    assert fs.cat(sorted(blobs)) == blobs
    after = meta_calls(cluster)
    assert after.get("BatchOpen", 0) - before.get("BatchOpen", 0) == 1
    assert after.get("Open", 0) == before.get("Open", 0)

    assert fs.cat(sorted(blobs), start=3, end=2000) == {p: b[3:2000] for p, b in blobs.items()}
    # a glob that also matches a directory
    with pytest.raises(IsADirectoryError):
        fs.cat(f"{d}/*")
    assert fs.cat(f"{d}/*", on_error="omit") == blobs
    got = fs.cat(f"{d}/*", on_error="return")
    assert isinstance(got.pop(f"{d}/sub"), IsADirectoryError) and got == blobs
    # missing files, and a path through a file
    wanted = [f"{d}/nope", f"{d}/f05", f"{d}/f05/x"]
    with pytest.raises(NotADirectoryError):  # the first failure in sorted order, as fsspec's
        fs.cat(wanted)
    assert fs.cat(wanted, on_error="omit") == {f"{d}/f05": blobs[f"{d}/f05"]}
    got = fs.cat(wanted, on_error="return")
    assert isinstance(got[f"{d}/nope"], FileNotFoundError)
    assert isinstance(got[f"{d}/f05/x"], NotADirectoryError)
    # one path stays a plain cat_file
    assert fs.cat(f"{d}/f07") == blobs[f"{d}/f07"]


def test_pipe_of_many_files_opens_and_closes_them_in_one_call_each(fs, base, cluster):
    d = f"{base}/piped"
    blobs = {f"{d}/f{i:02d}": os.urandom(i * 1009) for i in range(40)}
    blobs.update({f"{d}/deep/er/n{i}": os.urandom(100 + i) for i in range(8)})  # one new parent
    blobs[f"{d}/deep/big"] = os.urandom(9 * MiB + 7)  # three chunks
    fs.mkdir(d)
    before = meta_calls(cluster)
    fs.pipe(blobs)
    after = meta_calls(cluster)
    calls = {m: after.get(m, 0) - before.get(m, 0) for m in after}
    # the files under the missing parent are opened again once it is made
    assert calls.get("BatchWriteOpen") == 2 and calls.get("BatchClose") == 1
    assert not calls.get("Open") and not calls.get("Close")
    assert fs.cat(sorted(blobs)) == blobs
    infos = {p: fs.info(p) for p in blobs}
    assert {p: i["size"] for p, i in infos.items()} == {p: len(b) for p, b in blobs.items()}
    sessions = httpx.get(f"{cluster.admin_url}/api/v1/sessions", timeout=10).json()
    assert not {s["inode"] for s in sessions} & {i["ino"] for i in infos.values()}
    # existing files are truncated; any bytes-like value will do
    fs.pipe({f"{d}/f01": b"shorter", f"{d}/f02": bytearray(b"a bytearray")})
    assert fs.cat([f"{d}/f01", f"{d}/f02"]) == {f"{d}/f01": b"shorter", f"{d}/f02": b"a bytearray"}
    fs.pipe({f"{d}/same": b"first", f"emberfs://{d}/same": b"last"})
    assert fs.cat_file(f"{d}/same") == b"last"

    # every file is attempted; the first failure in the dict's order is raised
    again = {f"{d}/g0": b"zero", f"{d}/f05/x": b"under a file", f"{d}/g1": b"one"}
    with pytest.raises(NotADirectoryError):
        fs.pipe(again)
    assert fs.cat([f"{d}/g0", f"{d}/g1"]) == {f"{d}/g0": b"zero", f"{d}/g1": b"one"}
    assert not fs.exists(f"{d}/f05/x")
    with pytest.raises(FileExistsError):
        fs.pipe({f"{d}/g0": b"new", f"{d}/g2": b"two"}, mode="create")
    assert fs.cat([f"{d}/g0", f"{d}/g2"]) == {f"{d}/g0": b"zero", f"{d}/g2": b"two"}
    with pytest.raises(ValueError):
        fs.pipe([f"{d}/g0"], b"x")


def test_pipe_reports_a_parent_it_could_not_make_for_its_own_files(fs, base, monkeypatch):
    d = f"{base}/pipe-mkdir"
    real = fs.client.meta.mkdir

    def mkdir(path, *args, **kwargs):
        if path.endswith("/locked"):
            raise PermissionError(13, "not here", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(fs.client.meta, "mkdir", mkdir)
    blobs = {f"{d}/open/a": b"a", f"{d}/locked/b": b"b", f"{d}/open/c": b"c"}
    with pytest.raises(PermissionError):
        fs.pipe(blobs)
    assert fs.cat([f"{d}/open/a", f"{d}/open/c"]) == {f"{d}/open/a": b"a", f"{d}/open/c": b"c"}
    assert not fs.exists(f"{d}/locked")


def test_pipe_file_create_mode(fs, base):
    fs.pipe_file(f"{base}/p", b"one", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file(f"{base}/p", b"two", mode="create")
    assert fs.cat_file(f"{base}/p") == b"one"
    fs.pipe_file(f"{base}/p", b"three")
    assert fs.cat_file(f"{base}/p") == b"three"
    fs.pipe({f"{base}/m1": b"1", f"{base}/m2": b"22"})
    assert fs.cat([f"{base}/m1", f"{base}/m2"]) == {f"{base}/m1": b"1", f"{base}/m2": b"22"}


def test_touch_truncate_and_keep(fs, base):
    fs.touch(f"{base}/t")
    assert fs.info(f"{base}/t")["size"] == 0
    fs.pipe_file(f"{base}/t", b"content")
    before = fs.info(f"{base}/t")["mtime"]
    fs.touch(f"{base}/t", truncate=False)
    info = fs.info(f"{base}/t")
    assert info["size"] == 7 and info["mtime"] >= before
    assert fs.cat_file(f"{base}/t") == b"content"
    fs.touch(f"{base}/t")
    assert fs.cat_file(f"{base}/t") == b""


def test_du_find_glob_walk(fs, base):
    fs.pipe_file(f"{base}/w/a", b"x" * 10)
    fs.pipe_file(f"{base}/w/s/b", b"y" * 20)
    fs.pipe_file(f"{base}/w/s/t/c.txt", b"z" * 30)
    assert fs.du(f"{base}/w") == 60
    assert fs.du(f"{base}/w", total=False)[f"{base}/w/s/b"] == 20
    assert fs.find(f"{base}/w") == [f"{base}/w/a", f"{base}/w/s/b", f"{base}/w/s/t/c.txt"]
    assert f"{base}/w/s" in fs.find(f"{base}/w", withdirs=True)
    assert fs.glob(f"{base}/w/**/*.txt") == [f"{base}/w/s/t/c.txt"]
    assert fs.glob(f"{base}/w/*") == [f"{base}/w/a", f"{base}/w/s"]
    walked = list(fs.walk(f"{base}/w"))
    assert walked[0] == (f"{base}/w", ["s"], ["a"])
    assert len(walked) == 3


def test_modified_created_ukey_checksum(fs, base):
    fs.pipe_file(f"{base}/k", b"v1")
    m, c = fs.modified(f"{base}/k"), fs.created(f"{base}/k")
    assert isinstance(m, datetime.datetime) and m.tzinfo is not None
    now = datetime.datetime.now(datetime.UTC)
    assert abs((now - m).total_seconds()) < 120 and c <= m
    key, summ = fs.ukey(f"{base}/k"), fs.checksum(f"{base}/k")
    assert fs.ukey(f"{base}/k") == key
    fs.pipe_file(f"{base}/k", b"v2 longer")
    assert fs.ukey(f"{base}/k") != key and fs.checksum(f"{base}/k") != summ


def test_put_get_files_and_trees(fs, base, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    big = os.urandom(5 * MiB + 11)
    (src / "big.bin").write_bytes(big)
    (src / "sub" / "small.txt").write_bytes(b"small")
    fs.put(str(src), f"{base}/up", recursive=True)
    assert fs.cat_file(f"{base}/up/big.bin") == big
    assert fs.cat_file(f"{base}/up/sub/small.txt") == b"small"
    fs.put_file(str(src / "big.bin"), f"{base}/one.bin")
    assert fs.info(f"{base}/one.bin")["size"] == len(big)
    out = tmp_path / "out"
    fs.get(f"{base}/up", str(out), recursive=True)
    assert (out / "big.bin").read_bytes() == big
    assert (out / "sub" / "small.txt").read_bytes() == b"small"
    fs.get_file(f"{base}/one.bin", str(tmp_path / "one.bin"))
    assert (tmp_path / "one.bin").read_bytes() == big


def test_put_and_get_of_many_files_move_them_together(fs, base, cluster, tmp_path):
    src = tmp_path / "src"
    files = {f"d{i % 3}/f{i:03d}": os.urandom(i * 37) for i in range(60)}
    files["big.bin"] = os.urandom(9 * MiB + 3)  # larger than a block: streamed on its own
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    (src / "empty").mkdir()

    before = meta_calls(cluster)
    fs.put(str(src), f"{base}/tree", recursive=True)
    calls = {m: n - before.get(m, 0) for m, n in meta_calls(cluster).items()}
    assert calls.get("BatchWriteOpen") == 1 and calls.get("BatchClose") == 1
    assert calls.get("Open") == 1 and calls.get("Close") == 1  # the big file's
    assert fs.cat([f"{base}/tree/{n}" for n in files]) == {
        f"{base}/tree/{n}": d for n, d in files.items()
    }
    assert fs.isdir(f"{base}/tree/empty")

    out = tmp_path / "out"
    progress = Callback()
    before = meta_calls(cluster)
    fs.get(f"{base}/tree", str(out), recursive=True, callback=progress)
    calls = {m: n - before.get(m, 0) for m, n in meta_calls(cluster).items()}
    assert calls.get("BatchOpen") == 1 and not calls.get("Open")  # the big file's too
    assert {n: (out / n).read_bytes() for n in files} == files
    assert (out / "empty").is_dir()
    assert progress.size == progress.value == len(files) + 5  # and 5 directories, tree too

    class Bytes(Callback):  # a bar of bytes, as `emberfs put/get --progress` shows
        def set_size(self, size):
            pass

        def branched(self, path_1, path_2, **kwargs):
            return self

    moved = Bytes(value=0)
    fs.put(str(src), f"{base}/tree2", recursive=True, callback=moved)
    total = sum(map(len, files.values()))
    assert moved.value == total + len(files) + 5  # each path's bytes, and 1 per path
    moved = Bytes(value=0)
    fs.get(f"{base}/tree2", str(tmp_path / "out2"), recursive=True, callback=moved)
    assert moved.value == total + len(files) + 5

    # every path is attempted, then the first failure in fsspec's order is raised
    fs.pipe_file(f"{base}/blocker", b"x")
    with pytest.raises(NotADirectoryError):
        fs.put(
            [str(src / "d0" / "f000"), str(src / "d1" / "f001")],
            [f"{base}/blocker/a", f"{base}/ok/b"],
        )
    assert fs.cat_file(f"{base}/ok/b") == files["d1/f001"]
    with pytest.raises(FileExistsError):
        fs.put(
            [str(src / "d2" / "f002"), str(src / "d0" / "f003")],
            [f"{base}/ok/b", f"{base}/ok/c"],
            mode="create",
        )
    assert fs.cat([f"{base}/ok/b", f"{base}/ok/c"]) == {
        f"{base}/ok/b": files["d1/f001"],
        f"{base}/ok/c": files["d0/f003"],
    }
    with pytest.raises(FileNotFoundError):
        fs.get([f"{base}/missing", f"{base}/ok/c"], [str(tmp_path / "g1"), str(tmp_path / "g2")])
    assert (tmp_path / "g2").read_bytes() == files["d0/f003"]
    assert not (tmp_path / "g1").exists()


def test_copy_of_many_files_moves_them_together(fs, base, cluster):
    files = {f"d{i % 3}/f{i:03d}": os.urandom(i * 41) for i in range(45)}
    files["big.bin"] = os.urandom(9 * MiB + 5)  # streamed on its own
    fs.pipe({f"{base}/src/{n}": d for n, d in files.items()})
    fs.makedirs(f"{base}/src/empty")

    before = meta_calls(cluster)
    fs.copy(f"{base}/src", f"{base}/dst", recursive=True)
    calls = {m: n - before.get(m, 0) for m, n in meta_calls(cluster).items()}
    assert calls.get("BatchOpen") == 1 and calls.get("BatchWriteOpen") == 1
    assert calls.get("Open") == 1 and calls.get("Close") == 1  # the big file's write
    copied = fs.cat([f"{base}/dst/{n}" for n in files])
    assert copied == {f"{base}/dst/{n}": d for n, d in files.items()}
    assert fs.isdir(f"{base}/dst/empty")

    # on_error as fsspec's: "raise" raises a missing source (after the others are copied),
    # "ignore" skips it
    pair = ([f"{base}/missing", f"{base}/src/d1/f001"], [f"{base}/c/m", f"{base}/c/one"])
    with pytest.raises(FileNotFoundError):
        fs.copy(*pair)
    assert fs.cat_file(f"{base}/c/one") == files["d1/f001"]
    fs.rm(f"{base}/c/one")
    fs.copy(*pair, on_error="ignore")
    assert fs.cat_file(f"{base}/c/one") == files["d1/f001"]
    assert not fs.exists(f"{base}/c/m")
    fs.pipe_file(f"{base}/blocker", b"x")
    with pytest.raises(NotADirectoryError):  # not a missing source: raised even when ignoring
        fs.copy([f"{base}/src/d0/f000"], [f"{base}/blocker/x"], on_error="ignore")


def test_threads_share_one_instance(fs, base):
    from concurrent.futures import ThreadPoolExecutor

    blobs = {f"{base}/th{i}": os.urandom(MiB + i) for i in range(8)}

    def roundtrip(item):
        path, data = item
        fs.pipe_file(path, data)
        return fs.cat_file(path) == data

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(roundtrip, blobs.items()))
