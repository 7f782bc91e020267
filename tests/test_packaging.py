"""The packaging config lists every package directory, and generated code is current."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = ["common", "proto", "metaserver", "storageserver", "client", "kvcache", "cli"]


def _config():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_directory_is_listed():
    cfg = _config()["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for top in TOP_LEVEL:
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            found.add("emberfs." + ".".join(rel.parts))
    assert found, "no packages found"
    missing = found - listed
    assert not missing, f"package directories not listed in pyproject.toml: {sorted(missing)}"
    for pkg in listed:
        assert pkg in mapping, f"{pkg} has no package-dir entry"
        assert (ROOT / mapping[pkg] / "__init__.py").exists(), f"{mapping[pkg]} is not a package"


def test_the_image_build_takes_every_package_folder():
    # deploy/cluster.sh copies only these folders to build the wheel the images install
    text = (ROOT / "deploy" / "cluster.sh").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("PACKAGE_DIRS="))
    listed = set(line.split("=", 1)[1].strip('"').split())
    mapping = _config()["tool"]["setuptools"]["package-dir"]
    folders = {folder.split("/")[0] for folder in mapping.values()}
    assert listed == folders


def test_no_bare_top_level_modules_are_importable_names():
    # Every package lives under the emberfs namespace; nothing maps to a bare name.
    for pkg in _config()["tool"]["setuptools"]["packages"]:
        assert pkg.startswith("emberfs."), pkg


def test_generated_protobuf_code_is_current():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_generated_modules_import_with_package_paths():
    from emberfs.proto import cluster_pb2_grpc, data_pb2, meta_pb2_grpc, storage_pb2_grpc

    assert meta_pb2_grpc.MetaServiceStub
    assert cluster_pb2_grpc.ClusterServiceStub
    assert storage_pb2_grpc.StorageServiceStub
    assert data_pb2.ChunkReadRequest


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = readme.split("```bash\n")
    commands = [b.split("```")[0].strip() for b in blocks[1:]]
    test_command = next(c for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci, f".ci/run does not run {test_command!r}"
    assert "set -euo pipefail" in ci


def test_readme_run_command_starts_the_cluster():
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e '.[server]' && emberfs up" in readme
