"""Regenerate the committed protobuf and gRPC modules in proto/.

    python scripts/gen_proto.py          # rewrite proto/*_pb2*.py(i)
    python scripts/gen_proto.py --check  # exit 1 when regenerating would change a file

The include mapping ``-Iemberfs/proto=proto`` makes generated modules import
each other as ``emberfs.proto.x_pb2``, matching the installed package.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc

    sources = sorted(PROTO_DIR.glob("*.proto"))
    args = [
        "protoc",
        f"-Iemberfs/proto={PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
    ] + [f"emberfs/proto/{p.name}" for p in sources]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_dir / "emberfs" / "proto").iterdir())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, change nothing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
        names = {p.name for p in generated}
        stale = [p.name for p in PROTO_DIR.glob("*_pb2*") if p.name not in names]
        changed = [
            p.name
            for p in generated
            if not (PROTO_DIR / p.name).exists() or not filecmp.cmp(p, PROTO_DIR / p.name, False)
        ]
        if args.check:
            for name in changed + stale:
                print(f"out of date: proto/{name}", file=sys.stderr)
            return 1 if changed or stale else 0
        for name in stale:
            (PROTO_DIR / name).unlink()
        for p in generated:
            shutil.copyfile(p, PROTO_DIR / p.name)
        print(f"wrote {len(generated)} files to proto/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
