"""Cluster authentication: the cluster secret, server credentials and chunk capabilities.

Every metaserver and storage server of a cluster holds the same secret (a
key file, :func:`load_secret_file`). Nothing sends the secret itself; three
keys are derived from it, one per use:

* **server frames** (:meth:`ClusterKeys.server_credential`): a frame that one
  server sends another (a forwarded write, a resync copy, a truncation)
  carries, in its auth section, the time it was sent and an HMAC-SHA256 of
  its header, that time, its meta section and its CRC table.
* **server calls** (:class:`ServerCallSigner`, checked by
  :meth:`ClusterKeys.check_call`): a gRPC call between servers carries the
  method, the time, a nonce and an HMAC-SHA256 of those and of the request's
  bytes in its metadata; a nonce is accepted once.
* **chunk capabilities** (:meth:`ClusterKeys.sign_capability`): the
  metaserver hands a client that opens a file a
  :class:`~emberfs.proto.data_pb2.Capability` (inode, read, write, expiry)
  with its HMAC; the client sends it in the auth section of its read and
  write frames, and a storage server checks it without asking anyone.

A key file may hold several secrets, one per line: the first signs, every
one is accepted (rotation: add the new secret second, roll it out, move it
first, roll out, drop the old one). MACs are cut to 16 bytes.
"""

from __future__ import annotations

import hmac
import os
import secrets
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from emberfs.proto import data_pb2

#: environment variable naming the key file (for servers started without ``--secret-file``)
SECRET_FILE_ENV = "EMBERFS_SECRET_FILE"
#: environment variable that, set to 1, makes a server run without authentication
INSECURE_ENV = "EMBERFS_INSECURE"

MAC_SIZE = 16
#: how far a server credential's clock may be from the receiver's (seconds)
CLOCK_WINDOW = 300.0

# auth section kinds (the first byte of a frame's auth section)
SERVER = 1
CAPABILITY = 2

_SERVER_SECTION = struct.Struct("<BQ")  # kind, sent at (Unix ms); the MAC follows
SERVER_SECTION_SIZE = _SERVER_SECTION.size + MAC_SIZE

#: gRPC metadata key of a server call's credential
CALL_KEY = "emberfs-server-auth"
#: gRPC metadata key of a client's token
TOKEN_KEY = "authorization"


class AuthError(Exception):
    """Credentials missing, malformed, wrong or expired."""


def generate_secret() -> str:
    """A new cluster secret (256 random bits, hex)."""
    return secrets.token_hex(32)


def write_secret_file(path: str | os.PathLike, secret: str | None = None) -> str:
    """Write a key file readable by its owner alone; the secret written."""
    secret = secret or generate_secret()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)
    return secret


def load_secret_file(path: str | os.PathLike) -> list[bytes]:
    """The secrets of a key file: one per line, blank lines and ``#`` comments skipped.

    Raises
    ------
    ValueError
        When the file holds no secret, or one shorter than 32 characters.
    """
    found = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if len(line) < 32:
            raise ValueError(f"{path}: a secret must be at least 32 characters long")
        found.append(line.encode())
    if not found:
        raise ValueError(f"{path}: no secret in the key file")
    return found


def _derive(secret: bytes, use: bytes) -> bytes:
    return hmac.digest(secret, b"emberfs/" + use, "sha256")


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.digest(key, b"".join(parts), "sha256")[:MAC_SIZE]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Grant:
    """What a frame's credentials allow: a server may do anything; a client what its capability says."""

    server: bool
    capability: data_pb2.Capability | None = None

    def covers(self, inode: int, write: bool) -> bool:
        """Whether these credentials allow reading (or writing) ``inode``'s chunks."""
        if self.server:
            return True
        cap = self.capability
        if cap is None or cap.inode != inode:
            return False
        return cap.write if write else cap.read


SERVER_GRANT = Grant(server=True)


class _Nonces:
    """Nonces seen within the clock window, so a captured call cannot be replayed."""

    LIMIT = 200_000

    def __init__(self) -> None:
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, nonce: bytes) -> bool:
        now = time.monotonic()
        with self._lock:
            while self._seen:
                oldest, at = next(iter(self._seen.items()))
                if now - at <= 2 * CLOCK_WINDOW and len(self._seen) < self.LIMIT:
                    break
                del self._seen[oldest]
            if nonce in self._seen:
                return False
            self._seen[nonce] = now
            return True


class ClusterKeys:
    """The keys derived from the cluster's secrets (the first signs; all verify).

    Parameters
    ----------
    cluster_secrets : sequence of bytes
        The secrets of the key file, signing one first.
    """

    def __init__(self, cluster_secrets: Sequence[bytes]) -> None:
        if not cluster_secrets:
            raise ValueError("no cluster secret")
        self._frame = [_derive(s, b"frame") for s in cluster_secrets]
        self._cap = [_derive(s, b"capability") for s in cluster_secrets]
        self._call = [_derive(s, b"call") for s in cluster_secrets]
        self._nonces = _Nonces()

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> ClusterKeys:
        return cls(load_secret_file(path))

    # ------------------------------------------------------------- server frames

    def server_credential(self, skew_ms: int = 0) -> ServerCredential:
        """The credential a server puts in the frames it sends.

        ``skew_ms`` sets its clock off by that much (a fuzzer's stale credentials).
        """
        return ServerCredential(self._frame[0], skew_ms)

    def check_frame(self, body: bytes, section: bytes, meta: bytes, table: bytes) -> Grant:
        """What the auth ``section`` of a frame allows (header ``body``, ``meta``, CRC ``table``).

        Raises
        ------
        AuthError
            No section, an unknown kind, a wrong MAC, a stale time or an
            expired or forged capability.
        """
        if not section:
            raise AuthError("the frame carries no credentials")
        kind = section[0]
        if kind == SERVER:
            if len(section) != SERVER_SECTION_SIZE:
                raise AuthError("malformed server credential")
            sent_ms = _SERVER_SECTION.unpack_from(section)[1]
            mac = section[_SERVER_SECTION.size :]
            head = section[: _SERVER_SECTION.size]
            if not any(
                hmac.compare_digest(mac, _mac(key, body, head, meta, table)) for key in self._frame
            ):
                raise AuthError("wrong server credential")
            if abs(sent_ms - now_ms()) > CLOCK_WINDOW * 1000:
                raise AuthError("the server credential is out of date (clocks apart?)")
            return SERVER_GRANT
        if kind == CAPABILITY:
            return Grant(server=False, capability=self.open_capability(section[1:]))
        raise AuthError(f"unknown credential kind {kind}")

    # ------------------------------------------------------------ capabilities

    def sign_capability(self, inode: int, *, read: bool, write: bool, ttl: float) -> bytes:
        """A capability for ``inode`` valid for ``ttl`` seconds: the message, then its MAC."""
        cap = data_pb2.Capability(
            inode=inode, read=read, write=write, expires_ms=now_ms() + int(ttl * 1000)
        ).SerializeToString()
        return cap + _mac(self._cap[0], cap)

    def open_capability(self, token: bytes) -> data_pb2.Capability:
        """The capability of a signed ``token``, checked (AuthError when forged or expired)."""
        if len(token) <= MAC_SIZE:
            raise AuthError("malformed capability")
        body, mac = token[:-MAC_SIZE], token[-MAC_SIZE:]
        if not any(hmac.compare_digest(mac, _mac(key, body)) for key in self._cap):
            raise AuthError("forged capability")
        try:
            cap = data_pb2.Capability.FromString(body)
        except DecodeError:
            raise AuthError("malformed capability") from None
        if cap.expires_ms <= now_ms():
            raise AuthError("the capability has expired")
        return cap

    # ------------------------------------------------------------- server calls

    def call_signer(self) -> ServerCallSigner:
        return ServerCallSigner(self._call[0])

    def check_call(self, method: str, request: bytes, credential: str | None) -> None:
        """Check a server call's credential (its metadata value); AuthError when it fails."""
        if not credential:
            raise AuthError("the call carries no server credential")
        try:
            sent, nonce, mac = credential.split(".")
            sent_ms = int(sent)
            mac_bytes = bytes.fromhex(mac)
        except ValueError:
            raise AuthError("malformed server credential") from None
        head = f"{method}.{sent}.{nonce}".encode()
        if not any(hmac.compare_digest(mac_bytes, _mac(key, head, request)) for key in self._call):
            raise AuthError("wrong server credential")
        if abs(sent_ms - now_ms()) > CLOCK_WINDOW * 1000:
            raise AuthError("the server credential is out of date (clocks apart?)")
        if not self._nonces.first_time(nonce.encode()):
            raise AuthError("a server call was replayed")


class ServerCredential:
    """Signs the frames one server sends another (see :mod:`emberfs.common.framing`)."""

    __slots__ = ("_key", "_skew_ms")
    length = SERVER_SECTION_SIZE

    def __init__(self, key: bytes, skew_ms: int = 0) -> None:
        self._key = key
        self._skew_ms = skew_ms

    def section(self, body: bytes, meta: bytes, table: bytes) -> bytes:
        head = _SERVER_SECTION.pack(SERVER, max(0, now_ms() + self._skew_ms))
        return head + _mac(self._key, body, head, meta, table)


class CapabilityCredential:
    """The auth section of a client's frames: its signed capability for the file."""

    __slots__ = ("_section", "length", "token")

    def __init__(self, token: bytes) -> None:
        self.token = token
        self._section = bytes([CAPABILITY]) + token
        self.length = len(self._section)

    def section(self, body: bytes, meta: bytes, table: bytes) -> bytes:
        return self._section


class ServerCallSigner:
    """Signs the gRPC calls one server makes to another (:meth:`metadata`)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def metadata(self, method: str, request: bytes) -> tuple[str, str]:
        sent = str(now_ms())
        nonce = secrets.token_hex(12)
        mac = _mac(self._key, f"{method}.{sent}.{nonce}".encode(), request)
        return CALL_KEY, f"{sent}.{nonce}.{mac.hex()}"


def add_secret_arguments(p) -> None:
    """``--secret-file``, ``--insecure`` and the TLS files: how a server authenticates."""
    p.add_argument(
        "--secret-file",
        default=os.environ.get(SECRET_FILE_ENV),
        help=f"the cluster's key file, the same on every server (default: ${SECRET_FILE_ENV})",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=os.environ.get(INSECURE_ENV, "") not in ("", "0"),
        help=f"run without authentication: anyone who reaches a port may do anything "
        f"(default: ${INSECURE_ENV}=1)",
    )
    p.add_argument("--tls-cert", help="PEM certificate: serve gRPC (and the admin API) over TLS")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument(
        "--tls-ca",
        help="PEM CA certificate that the other servers' certificates are checked against "
        "(this server's calls to them then use TLS)",
    )


def keys_from_args(p, args) -> ClusterKeys | None:
    """The cluster keys that ``--secret-file`` names (None with ``--insecure``); ``p.error`` else."""
    if args.insecure:
        return None
    if not args.secret_file:
        p.error(
            f"no cluster secret: pass --secret-file (or set {SECRET_FILE_ENV}), "
            "or --insecure to run without authentication"
        )
    try:
        return ClusterKeys.from_file(args.secret_file)
    except (OSError, ValueError) as exc:
        p.error(f"--secret-file: {exc}")


def tls_from_args(p, args):
    """The TLS files of ``--tls-cert``, ``--tls-key`` and ``--tls-ca`` (None: no TLS)."""
    from emberfs.common.grpcauth import TLSFiles

    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert and --tls-key go together")
    for opt in ("tls_cert", "tls_key", "tls_ca"):
        path = getattr(args, opt)
        if path and not os.path.isfile(path):
            p.error(f"--{opt.replace('_', '-')}: no file {path}")
    if not (args.tls_cert or args.tls_ca):
        return None
    return TLSFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
