"""Fuzzing of the live servers: the data port, every gRPC method and the admin REST API.

Run from the repository root::

    python -m benchmarks.fuzz                                     # 20,000 inputs per surface
    python -m benchmarks.fuzz --surface data --inputs 400000 --seed 7
    python -m benchmarks.fuzz --surface grpc,rest --inputs 300000 --json > fuzz.json

It starts a :class:`~emberfs.cli.localcluster.LocalCluster` (a metaserver and 3 storage
servers, authentication on) in a temporary directory, writes a check file, and then runs
``--inputs`` generated inputs against each surface from several threads:

* ``data``: frames sent to every storage server's data port: random bytes, valid frames
  with lying contents (ranges past a chunk's end, wrong chains, targets and chain
  versions, huge update versions, sync and replace flags, bad chunk sizes, truncation
  steps) and mutations of valid frames (bit flips, truncations, trailing bytes, lengths
  that lie with and without a matching signature, wrong header CRC, magic or version,
  unknown ops, the response bit), each without credentials, with a client capability
  (valid, expired, forged, for another inode) or a server credential (valid, off the
  clock, malformed); and frames that stop half-sent or trickle in, which the server must
  drop within its ``--frame-timeout``. Many inputs share a connection while the server
  keeps it open.
* ``grpc``: every method of MetaService, ClusterService and StorageService, with
  protobuf messages of random and boundary values (0, the largest u32/u64, negative ints,
  huge and non-ASCII strings, long repeated fields) and raw bytes (random, mutated
  encodings, invalid UTF-8, overlong varints, lengths past the end, deep groups), sent
  without credentials, with a wrong or malformed token, with the admin token and with a
  server credential.
* ``rest``: every route of the admin API's OpenAPI document (``GET /openapi.json``), with
  random and boundary path, query and body values (wrong types, missing and extra fields,
  bad JSON), with no token, a wrong one and the admin token; plus routes outside the
  document and malformed HTTP.

Credentials that could change state are kept away from it: server credentials write and
truncate only chunks of inodes from 2**40 up, remove only their chunks, acknowledge GC
only of ids from 2**40 up; RegisterNode, Heartbeat and SyncDone get no server credential;
the admin token changes the namespace only under ``/fuzz-scratch`` (a symlink made there
points inside it), takes offline or drains only target ids that no target has. An input
that would break these rules is replaced by another (counted as ``guarded``).

While a surface runs, a prober checks every second that every server answers within a
few seconds (an authenticated PING on every data port, gRPC Ping, GetRouting and
TargetStats, ``GET /healthz``) and that no server process has exited; each input's own
answer has a deadline too (an input that the server neither answers nor closes on in
time is a hang). After the last surface, the check file written before the first must
read back identical, with its replicas' versions and checksums unchanged.

The output is a JSON report (``--json``; else a summary): per surface the inputs, their
rate, the answers by status, the inputs by kind, crashes, hangs, server errors (an HTTP
5xx, a gRPC UNKNOWN or INTERNAL other than an undecodable request, a data INTERNAL or a
malformed answer) with up to 20 examples each that hold the input, and the resident
memory of every server process before and after. Exit code 0 when no server crashed or
hung and the check file is intact, 1 otherwise, 2 when the run could not be made.

The package: :mod:`.cli` (the command line), :mod:`.runner` (the run: the cluster, each
surface in threads under the monitor), :mod:`.surface` (what a surface is, and the one worker
that runs any surface's inputs), one module per surface and one for its inputs
(:mod:`.data`/:mod:`.datainputs` and :mod:`.stalls`, :mod:`.grpcsurface`/:mod:`.grpcinputs`,
:mod:`.rest`/:mod:`.restinputs`), and the pieces they share: :mod:`.cluster`, :mod:`.check`,
:mod:`.monitor`, :mod:`.tally`, :mod:`.report`, :mod:`.guards`, :mod:`.frames`,
:mod:`.values`, :mod:`.scratch` and :mod:`.timeouts`.
"""

from emberfs.common.auth import SERVER_SECTION_SIZE

from . import timeouts
from .cli import main, parse_args
from .cluster import PAGE, CouldNotRun
from .frames import FrameParts, RawSection, patch_header
from .grpcinputs import all_methods
from .guards import changes_real_chunks, grpc_safe, rest_safe
from .report import failures, summary
from .runner import SURFACES, Options, run
from .scratch import SCRATCH_DIR, SCRATCH_INODE

__all__ = [
    "PAGE",
    "SCRATCH_DIR",
    "SCRATCH_INODE",
    "SERVER_SECTION_SIZE",
    "SURFACES",
    "CouldNotRun",
    "FrameParts",
    "Options",
    "RawSection",
    "all_methods",
    "changes_real_chunks",
    "failures",
    "grpc_safe",
    "main",
    "parse_args",
    "patch_header",
    "rest_safe",
    "run",
    "summary",
    "timeouts",
]
