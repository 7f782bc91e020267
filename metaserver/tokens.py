"""Client tokens: identities an administrator creates and revokes.

A token stands for one identity - uid, primary gid and supplementary
groups - that the metaserver's permission checks (:mod:`emberfs.metaserver.fs.access`)
use for the requests that carry it. Its string is ``emb1.<id>.<secret>``:
``id`` is 12 hex digits, ``secret`` 43 URL-safe base64 characters (256 bits).
The store keeps, under ``TOKN`` + id (see :mod:`emberfs.metaserver.store.keys`), the
token's name, identity, creation time and the SHA-256 of its secret, never
the secret itself: the secret is shown once, when the token is created.
Revoking a token deletes its record.

The metaserver's admin token (``--admin-token``) resolves too: to uid 0, gid
0 and no groups, so the administrator acts as root.

:meth:`TokenStore.resolve` runs for every request, from many threads, so it
keeps its answers (known and unknown tokens alike) for ``cache_ttl`` seconds;
a revocation in this process empties that cache at once, so a revoked token
stops resolving here at once and in any other process sharing the store
within ``cache_ttl``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import string
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import KVEngine, Transaction, run_transaction

TOKEN_PREFIX = "emb1"
ID_HEX_DIGITS = 12
SECRET_CHARS = 43  # secrets.token_urlsafe(32)
MAX_TOKEN_CHARS = 256
MAX_GROUPS = 64
MAX_NAME_CHARS = 128
MAX_ID = 2**32 - 1
CACHE_ENTRIES = 10_000
DEFAULT_CACHE_TTL = 2.0
ADMIN = "admin"

_HEX = frozenset("0123456789abcdef")
_URLSAFE = frozenset(string.ascii_letters + string.digits + "-_")


class NameTaken(ValueError):
    """Another live token has the name."""


class AmbiguousName(ValueError):
    """Several live tokens have the name (:meth:`TokenStore.create` never makes such)."""


@dataclass(frozen=True)
class Identity:
    """Who a token speaks for: the credentials of the requests that carry it."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str
    token_id: str


ADMIN_IDENTITY = Identity(0, 0, (), ADMIN, ADMIN)
"""What the admin token resolves to: root."""


@dataclass(frozen=True)
class TokenInfo:
    """A token as listed: everything but its secret."""

    token_id: str
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    created_ns: int

    def identity(self) -> Identity:
        return Identity(self.uid, self.gid, self.groups, self.name, self.token_id)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _check_id(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise ValueError(f"{what} must be an integer from 0 to {MAX_ID}, not {value!r}")
    return value


def _check_groups(groups: Sequence[int]) -> tuple[int, ...]:
    if isinstance(groups, (str, bytes)):
        raise ValueError("groups must be a sequence of integers")
    groups = tuple(groups)
    if len(groups) > MAX_GROUPS:
        raise ValueError(f"at most {MAX_GROUPS} supplementary groups, not {len(groups)}")
    return tuple(_check_id("a group", g) for g in groups)


def looks_like_id(text: str) -> bool:
    """True when ``text`` has the form of a token id (12 lower-case hex digits)."""
    return len(text) == ID_HEX_DIGITS and set(text) <= _HEX


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise ValueError(f"the name must be a string, not {name!r}")
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"the name is longer than {MAX_NAME_CHARS} characters")
    if not name.isprintable():
        raise ValueError("the name holds characters that are not printable")
    if looks_like_id(name):
        raise ValueError(f"the name {name!r} looks like a token id")
    return name


def split_token(token: object) -> tuple[str, str] | None:
    """``(token id, secret)`` of a well-formed token string, else None."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not token.isascii():
        return None
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    token_id, secret = parts[1], parts[2]
    if not looks_like_id(token_id):
        return None
    if len(secret) != SECRET_CHARS or not set(secret) <= _URLSAFE:
        return None
    return token_id, secret


def _encode(info: TokenInfo, digest: str) -> bytes:
    record = {
        "name": info.name,
        "uid": info.uid,
        "gid": info.gid,
        "groups": list(info.groups),
        "created_ns": info.created_ns,
        "secret_sha256": digest,
    }
    return json.dumps(record, separators=(",", ":")).encode()


def _decode(token_id: str, raw: bytes) -> tuple[TokenInfo, str]:
    """The token of a stored record and its secret's digest."""
    record = json.loads(raw)
    info = TokenInfo(
        token_id=token_id,
        name=record["name"],
        uid=int(record["uid"]),
        gid=int(record["gid"]),
        groups=tuple(int(g) for g in record["groups"]),
        created_ns=int(record["created_ns"]),
    )
    return info, record["secret_sha256"]


class TokenStore:
    """Client tokens in the metadata store, and a short-lived cache of their lookups.

    Parameters
    ----------
    engine : KVEngine
        The metadata store.
    admin_token : str or None, default None
        The metaserver's admin token, which resolves to root; None or empty:
        no admin token resolves.
    cache_ttl : float, default 2.0
        Seconds an answer of :meth:`resolve` is reused without reading the
        store (0: never reused).
    clock : callable, default time.monotonic
        Seconds, for the cache's expiry.
    """

    def __init__(
        self,
        engine: KVEngine,
        admin_token: str | None = None,
        cache_ttl: float = DEFAULT_CACHE_TTL,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._admin = admin_token.encode("utf-8", "surrogatepass") if admin_token else None
        self._max_chars = max(MAX_TOKEN_CHARS, len(admin_token or ""))
        self._ttl = cache_ttl
        self._clock = clock
        self._lock = threading.Lock()
        # token string -> (expiry, identity or None); insertion order is age order
        self._cache: dict[str, tuple[float, Identity | None]] = {}
        self._generation = 0  # bumped by every revocation

    # ------------------------------------------------------------ administration

    def create(
        self, uid: int, gid: int, groups: Sequence[int] = (), name: str = ""
    ) -> tuple[TokenInfo, str]:
        """A new token for the identity; its info and its string (shown only now).

        Raises
        ------
        NameTaken
            Another live token has ``name`` (a :class:`ValueError`).
        ValueError
            An id out of 0..2**32-1, more than 64 groups, or a name longer than
            128 characters, not printable, or in the form of a token id.
        """
        uid = _check_id("uid", uid)
        gid = _check_id("gid", gid)
        groups = _check_groups(groups)
        name = _check_name(name)
        secret = secrets.token_urlsafe(32)
        digest = _digest(secret)

        def create(txn: Transaction) -> TokenInfo:
            guard = txn.get(keys.token_guard_key())
            if name and any(info.name == name for info, _ in self._scan(txn)):
                raise NameTaken(f"a token named {name!r} exists")
            token_id = secrets.token_hex(ID_HEX_DIGITS // 2)
            while txn.get(keys.token_key(token_id)) is not None:
                token_id = secrets.token_hex(ID_HEX_DIGITS // 2)
            info = TokenInfo(token_id, name, uid, gid, groups, time.time_ns())
            changes = int.from_bytes(guard or b"\0", "big") + 1
            txn.put(keys.token_guard_key(), changes.to_bytes(8, "big"))
            txn.put(keys.token_key(token_id), _encode(info, digest))
            return info

        info = run_transaction(self._engine, create)
        return info, f"{TOKEN_PREFIX}.{info.token_id}.{secret}"

    def list(self) -> list[TokenInfo]:
        """Every live token, oldest first."""
        found = [info for info, _ in self._scan(self._engine)]
        return sorted(found, key=lambda info: (info.created_ns, info.token_id))

    def revoke(self, which: str) -> TokenInfo:
        """Revoke the token with id or name ``which``; the revoked token.

        An id is looked up first, then a name. This process stops resolving
        the token at once.

        Raises
        ------
        KeyError
            No live token has that id or name.
        AmbiguousName
            Several live tokens have the name (a :class:`ValueError`).
        """

        def revoke(txn: Transaction) -> TokenInfo:
            if looks_like_id(which):
                raw = txn.get(keys.token_key(which))
                if raw is not None:
                    txn.delete(keys.token_key(which))
                    return _decode(which, raw)[0]
            named = [info for info, _ in self._scan(txn) if which and info.name == which]
            if not named:
                raise KeyError(f"no token {which!r}")
            if len(named) > 1:
                ids = ", ".join(info.token_id for info in named)
                raise AmbiguousName(f"several tokens are named {which!r} ({ids}): revoke by id")
            key = keys.token_key(named[0].token_id)
            txn.get(key)  # in the read set: a concurrent revocation conflicts
            txn.delete(key)
            return named[0]

        try:
            return run_transaction(self._engine, revoke)
        finally:
            self.clear_cache()

    # ------------------------------------------------------------ lookup

    def resolve(self, token: str) -> Identity | None:
        """The identity of a token; None when it is malformed, unknown or revoked."""
        if not isinstance(token, str) or len(token) > self._max_chars:
            return None
        if self._admin is not None and hmac.compare_digest(
            token.encode("utf-8", "surrogatepass"), self._admin
        ):
            return ADMIN_IDENTITY
        parts = split_token(token)
        if parts is None:
            return None
        now = self._clock()
        with self._lock:
            cached = self._cache.get(token)
            generation = self._generation
        if cached is not None and cached[0] > now:
            return cached[1]
        identity = self._lookup(*parts)
        self._remember(token, identity, now + self._ttl, generation)
        return identity

    def clear_cache(self) -> None:
        """Forget every cached answer of :meth:`resolve`."""
        with self._lock:
            self._cache.clear()
            self._generation += 1

    def cached(self) -> int:
        """How many answers of :meth:`resolve` the cache holds (at most ``CACHE_ENTRIES``)."""
        with self._lock:
            return len(self._cache)

    def _lookup(self, token_id: str, secret: str) -> Identity | None:
        raw = self._engine.get(keys.token_key(token_id))
        if raw is None:
            return None
        info, digest = _decode(token_id, raw)
        if not hmac.compare_digest(_digest(secret).encode(), digest.encode()):
            return None
        return info.identity()

    def _remember(
        self, token: str, identity: Identity | None, expiry: float, generation: int
    ) -> None:
        """Cache an answer, unless a revocation came since the store was read."""
        if self._ttl <= 0:
            return
        with self._lock:
            if generation != self._generation:
                return
            self._cache.pop(token, None)
            while len(self._cache) >= CACHE_ENTRIES:
                del self._cache[next(iter(self._cache))]
            self._cache[token] = (expiry, identity)

    @staticmethod
    def _scan(reader: KVEngine | Transaction) -> list[tuple[TokenInfo, str]]:
        """Every token record and its secret's digest (the guard skipped)."""
        found = []
        for key, raw in reader.scan_prefix(keys.TOKEN):
            if key == keys.token_guard_key():
                continue
            found.append(_decode(keys.token_id_of(key), raw))
        return found
