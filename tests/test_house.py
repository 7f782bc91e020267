"""The house rules of CONTRIBUTING.md that a machine can check.

* every module of the packages is at most :data:`MAX_LINES` lines;
* no object reaches into another's private names (``other._name``, where
  ``other`` is not ``self`` or ``cls``), and nothing imports a private name
  of an EmberFS module;
* every document under ``docs/`` stays under :data:`MAX_DOC_BYTES`;
* the module map of ``docs/architecture.md`` names every module of the
  packages, and nothing else.

Private names that other libraries define as their extension points are
allowed (fsspec's cache ``_fetch`` hook, ``os._exit``), and so are those of
:data:`ALLOWED`, each with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["client", "common", "cli", "kvcache", "metaserver", "storageserver"]
CHECKED = [*PACKAGES, "benchmarks", "scripts", "tests"]
MAX_LINES = 600
MAX_DOC_BYTES = 30_000

# names of other libraries' extension points, reached on their objects
HOOKS = {"_exit", "_fetch", "_fetch_range", "_strip_protocol"}
# (file, expression): why it may reach in
ALLOWED = {
    ("tests/common/test_signals.py", "stop._cond"): (
        "holds threading.Event's own lock, as the main thread does inside Event.wait(),"
        " to show a signal handler never waits for it"
    ),
}


def _python_files(folders: list[str]):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if not path.name.endswith("_pb2.py") and not path.name.endswith("_pb2_grpc.py"):
                yield path


def private_reaches(path: Path) -> list[str]:
    """``file:line: expression`` of every reach into another object's private name."""
    rel = path.relative_to(ROOT).as_posix()
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            name = node.attr
            if not name.startswith("_") or name.startswith("__") or name in HOOKS:
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
                continue
            expr = ast.unparse(node)
            if (rel, expr) not in ALLOWED:
                out.append(f"{rel}:{node.lineno}: {expr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("emberfs"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{rel}:{node.lineno}: from {node.module} import {alias.name}")
    return out


def test_no_module_is_longer_than_the_limit():
    long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in _python_files(PACKAGES)
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def test_no_object_reaches_into_another_ones_private_names():
    found = [line for p in _python_files(CHECKED) for line in private_reaches(p)]
    assert not found, "private names used across objects:\n" + "\n".join(found)


def test_the_check_finds_a_private_reach(tmp_path):
    # the checker itself: a reach is found, self/cls/super and hooks are not
    probe = ROOT / "tests" / f"_house_probe_{tmp_path.name}.py"
    probe.write_text(
        "import os\n"
        "from emberfs.client.fs import _hidden\n"
        "class A:\n"
        "    def f(self, other):\n"
        "        self._mine = other._theirs\n"
        "        super()._base()\n"
        "        os._exit(0)\n"
    )
    try:
        found = private_reaches(probe)
    finally:
        probe.unlink()
    assert [f.split(": ", 1)[1] for f in found] == [
        "from emberfs.client.fs import _hidden",
        "other._theirs",
    ]


def test_every_doc_stays_under_the_limit():
    big = {
        p.name: p.stat().st_size
        for p in (ROOT / "docs").glob("*.md")
        if p.stat().st_size > MAX_DOC_BYTES
    }
    assert not big, f"docs over {MAX_DOC_BYTES} bytes (split them by topic): {big}"


def mapped_modules(text: str) -> set[str]:
    """The module paths the module map of ``docs/architecture.md`` names.

    A ``### `folder/` `` heading sets the folder; in each table cell a name with
    a ``/`` is relative to that folder, one without sits beside the name before it.
    """
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    out: set[str] = set()
    folder = ""
    for line in section.splitlines():
        heading = re.match(r"### `([^`]+/)`", line)
        if heading:
            folder = heading.group(1)
            continue
        if not line.startswith("| `"):
            continue
        cell = line.split("|")[1]
        here = folder
        for name in re.findall(r"`([^`]+\.py)`", cell):
            if "/" in name:
                here = folder + name.rsplit("/", 1)[0] + "/"
                name = name.rsplit("/", 1)[1]
            out.add(here + name)
    return out


def test_the_module_map_matches_the_tree():
    mapped = mapped_modules((ROOT / "docs" / "architecture.md").read_text())
    tree = {
        p.relative_to(ROOT).as_posix() for p in _python_files(PACKAGES) if p.name != "__init__.py"
    }
    assert not tree - mapped, f"modules missing from the map: {sorted(tree - mapped)}"
    assert not mapped - tree, f"the map names modules that do not exist: {sorted(mapped - tree)}"


def test_the_map_reader_follows_folders_and_neighbours():
    text = (
        "## Module map\n\n### `pkg/`: a package\n\n| module | holds |\n| --- | --- |\n"
        "| `a.py`; `b.py` | two |\n| `sub/c.py`; `d.py` | beside c |\n\n## Next\n| `x.py` | no |\n"
    )
    assert mapped_modules(text) == {"pkg/a.py", "pkg/b.py", "pkg/sub/c.py", "pkg/sub/d.py"}
