"""Client tokens: the store (create, resolve, list, revoke, its cache) and its admin API routes."""

from __future__ import annotations

import hashlib
import json
import re
import threading

import pytest
from fastapi.testclient import TestClient

from emberfs.metaserver.api import create_app
from emberfs.metaserver.clustermgr.gcqueue import GCQueue
from emberfs.metaserver.clustermgr.manager import ClusterManager
from emberfs.metaserver.store import keys
from emberfs.metaserver.store.kv import MemoryEngine
from emberfs.metaserver.tokens import (
    CACHE_ENTRIES,
    AmbiguousName,
    Identity,
    NameTaken,
    TokenInfo,
    TokenStore,
    split_token,
)

ADMIN_TOKEN = "the-admin-token"
TOKEN_RE = re.compile(r"^emb1\.([0-9a-f]{12})\.([A-Za-z0-9_-]{43})$")


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingEngine(MemoryEngine):
    """A memory engine that counts point reads, to see when the store is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0

    def get(self, key: bytes) -> bytes | None:
        self.gets += 1
        return super().get(key)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine() -> CountingEngine:
    return CountingEngine()


@pytest.fixture
def store(engine, clock) -> TokenStore:
    return TokenStore(engine, admin_token=ADMIN_TOKEN, clock=clock)


def token_records(engine: MemoryEngine) -> dict[bytes, bytes]:
    return dict(engine.scan_prefix(keys.TOKEN))


# ------------------------------------------------------------------ the store


def test_create_and_resolve(store):
    info, token = store.create(1000, 100, [10, 20], name="ci")
    m = TOKEN_RE.match(token)
    assert m, token
    assert info.token_id == m.group(1)
    assert (info.name, info.uid, info.gid, info.groups) == ("ci", 1000, 100, (10, 20))
    assert info.created_ns > 0
    assert store.resolve(token) == Identity(1000, 100, (10, 20), "ci", info.token_id)
    other_info, other = store.create(7, 8)
    assert other_info.name == "" and other_info.groups == ()
    assert other_info.token_id != info.token_id
    assert store.resolve(other) == Identity(7, 8, (), "", other_info.token_id)


def test_a_wrong_secret_does_not_resolve(store):
    info, token = store.create(1, 1)
    secret = split_token(token)[1]
    flipped = ("A" if secret[0] != "A" else "B") + secret[1:]
    assert store.resolve(f"emb1.{info.token_id}.{flipped}") is None
    _, other = store.create(2, 2)
    # the secret of one token under the id of another
    assert store.resolve(f"emb1.{info.token_id}.{split_token(other)[1]}") is None
    assert store.resolve(token) is not None


def test_secrets_are_not_stored_in_clear(store, engine):
    info, token = store.create(1000, 1000, [5], name="secretive")
    secret = split_token(token)[1]
    records = token_records(engine)
    raw = records[keys.token_key(info.token_id)]
    everything = b"".join(k + v for k, v in engine.scan(b"", None))
    assert secret.encode() not in everything
    assert token.encode() not in everything
    record = json.loads(raw)
    assert record["secret_sha256"] == hashlib.sha256(secret.encode()).hexdigest()
    assert (record["name"], record["uid"], record["gid"], record["groups"]) == (
        "secretive",
        1000,
        1000,
        [5],
    )
    # one record per token, besides the guard
    assert set(records) == {keys.token_guard_key(), keys.token_key(info.token_id)}


def test_list_is_oldest_first_and_shows_no_secret(store):
    made = [store.create(i, i, name=f"t{i}")[0] for i in range(5)]
    listed = store.list()
    assert listed == sorted(made, key=lambda i: (i.created_ns, i.token_id))
    assert [i.name for i in listed] == ["t0", "t1", "t2", "t3", "t4"]
    assert all(isinstance(i, TokenInfo) for i in listed)
    assert TokenStore(MemoryEngine()).list() == []


def test_revoke_by_id_and_by_name(store):
    a, token_a = store.create(1, 1, name="alpha")
    b, token_b = store.create(2, 2, name="beta")
    c, token_c = store.create(3, 3)
    for token in (token_a, token_b, token_c):
        assert store.resolve(token) is not None  # cached positive answers
    assert store.revoke(a.token_id) == a
    assert store.resolve(token_a) is None
    assert store.revoke("beta") == b
    assert store.resolve(token_b) is None
    assert store.resolve(token_c) is not None
    assert store.list() == [c]
    with pytest.raises(KeyError):
        store.revoke(a.token_id)
    with pytest.raises(KeyError):
        store.revoke("beta")
    with pytest.raises(KeyError):
        store.revoke("")  # an unnamed token is revoked by its id only
    assert store.revoke(c.token_id) == c
    assert store.list() == []


def test_names_are_unique_among_live_tokens(store):
    first, _ = store.create(1, 1, name="build")
    with pytest.raises(NameTaken):
        store.create(2, 2, name="build")
    with pytest.raises(ValueError, match="build"):
        store.create(2, 2, name="build")
    store.create(3, 3)
    store.create(4, 4)  # several unnamed tokens are fine
    store.revoke("build")
    again, _ = store.create(5, 5, name="build")  # the name is free once revoked
    assert again.token_id != first.token_id


class RacingEngine(MemoryEngine):
    """Runs ``meanwhile`` once, right after the first scan of the token records read them."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile = None

    def scan(self, start, end, limit=None):
        items = super().scan(start, end, limit)
        if self.meanwhile is not None and start.startswith(keys.TOKEN):
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()
        return items


def test_two_creations_of_one_name_racing_make_one_token():
    """A creation that found the name free conflicts with one that took it in the meantime."""
    engine = RacingEngine()
    store = TokenStore(engine)
    other = TokenStore(engine)  # another caller, between our name check and our commit
    raced: list[TokenInfo] = []
    engine.meanwhile = lambda: raced.append(other.create(2, 2, name="race")[0])
    with pytest.raises(NameTaken):
        store.create(1, 1, name="race")
    assert store.list() == raced and raced[0].uid == 2


def test_concurrent_creations_of_one_name_make_one_token(engine):
    store = TokenStore(engine)
    barrier = threading.Barrier(8)
    outcomes: list[object] = []
    lock = threading.Lock()

    def make() -> None:
        barrier.wait()
        try:
            result: object = store.create(1, 1, name="race")[0]
        except NameTaken as exc:
            result = exc
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(o, TokenInfo) for o in outcomes) == 1
    assert [i.name for i in store.list()] == ["race"]


def test_revoking_an_ambiguous_name_is_refused(store, engine):
    one, _ = store.create(1, 1, name="twin")
    two, _ = store.create(2, 2, name="other")
    # two records of one name, as no creation makes them: write the second by hand
    raw = json.loads(engine.get(keys.token_key(two.token_id)))
    raw["name"] = "twin"
    engine.write({keys.token_key(two.token_id): json.dumps(raw).encode()})
    with pytest.raises(AmbiguousName) as caught:
        store.revoke("twin")
    assert isinstance(caught.value, ValueError)
    assert one.token_id in str(caught.value) and two.token_id in str(caught.value)
    assert len(store.list()) == 2
    store.revoke(one.token_id)
    assert store.revoke("twin").token_id == two.token_id


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"uid": -1, "gid": 0}, "uid"),
        ({"uid": 2**32, "gid": 0}, "uid"),
        ({"uid": 0, "gid": 2**32}, "gid"),
        ({"uid": "1", "gid": 0}, "uid"),
        ({"uid": True, "gid": 0}, "uid"),
        ({"uid": 1.0, "gid": 0}, "uid"),
        ({"uid": 0, "gid": 0, "groups": [1, -2]}, "group"),
        ({"uid": 0, "gid": 0, "groups": [2**32]}, "group"),
        ({"uid": 0, "gid": 0, "groups": list(range(65))}, "64"),
        ({"uid": 0, "gid": 0, "groups": "12"}, "groups"),
        ({"uid": 0, "gid": 0, "name": "x" * 129}, "128"),
        ({"uid": 0, "gid": 0, "name": "tab\there"}, "printable"),
        ({"uid": 0, "gid": 0, "name": "nul\0"}, "printable"),
        ({"uid": 0, "gid": 0, "name": "0123456789ab"}, "token id"),
        ({"uid": 0, "gid": 0, "name": 5}, "string"),
    ],
)
def test_validation(store, engine, kwargs, match):
    with pytest.raises(ValueError, match=match):
        store.create(**kwargs)
    assert token_records(engine) == {}


def test_limits_are_inclusive(store):
    info, token = store.create(2**32 - 1, 0, list(range(64)), name="é" * 128)
    assert info.uid == 2**32 - 1 and len(info.groups) == 64
    assert store.resolve(token).name == "é" * 128


def test_malformed_tokens_do_not_touch_the_store(store, engine):
    info, token = store.create(1, 1)
    token_id, secret = split_token(token)
    malformed = [
        "",
        "emb1",
        f"emb2.{token_id}.{secret}",
        f"EMB1.{token_id}.{secret}",
        f"emb1.{token_id}.{secret}.",
        f"emb1.{token_id}{secret}",
        f"emb1.{token_id[:-1]}.{secret}",
        f"emb1.{token_id}0.{secret}",
        f"emb1.{token_id.upper()}.{secret}" if token_id != token_id.upper() else "emb1..x",
        f"emb1.{token_id}.{secret[:-1]}",
        f"emb1.{token_id}.{secret}A",
        f"emb1.{token_id}.{secret[:-1]}=",
        f"emb1.{token_id}.{secret[:-1]}é",
        f"emb1.{token_id[:-1]}é.{secret}",
        "emb1." + "a" * 300,
        token + "x" * 300,
        "\udcff" * 10,
        None,
        b"emb1",
    ]
    before = engine.gets
    for bad in malformed:
        assert store.resolve(bad) is None, bad
    assert engine.gets == before


def test_the_admin_token_is_root(engine):
    store = TokenStore(engine, admin_token=ADMIN_TOKEN)
    assert store.resolve(ADMIN_TOKEN) == Identity(0, 0, (), "admin", "admin")
    assert store.resolve(ADMIN_TOKEN + "x") is None
    assert store.resolve(ADMIN_TOKEN[:-1]) is None
    assert engine.gets == 0
    # without one configured, nothing resolves to the administrator
    for configured in (None, ""):
        bare = TokenStore(engine, admin_token=configured)
        assert bare.resolve(ADMIN_TOKEN) is None
        assert bare.resolve("") is None
    # an admin token longer than a client token's limit still resolves
    long_admin = "k" * 400
    assert TokenStore(engine, admin_token=long_admin).resolve(long_admin).uid == 0


def test_resolve_is_cached_until_the_ttl_passes(store, engine, clock):
    info, token = store.create(1, 1)
    unknown = f"emb1.{'f' * 12}.{'A' * 43}"
    before = engine.gets
    assert store.resolve(token).uid == 1
    assert store.resolve(unknown) is None
    assert engine.gets == before + 2
    clock.now += 1.9
    for _ in range(5):
        assert store.resolve(token).uid == 1
        assert store.resolve(unknown) is None
    assert engine.gets == before + 2  # both answers came from the cache
    clock.now += 0.2
    assert store.resolve(token).uid == 1
    assert store.resolve(unknown) is None
    assert engine.gets == before + 4  # expired: read again


def test_a_revocation_elsewhere_is_seen_once_the_cache_expires(engine, clock):
    here = TokenStore(engine, clock=clock)
    there = TokenStore(engine, clock=clock)  # another process on the same store
    info, token = here.create(1, 1)
    assert there.resolve(token) is not None
    here.revoke(info.token_id)
    assert here.resolve(token) is None  # this process at once
    assert there.resolve(token) is not None  # the other one still has it cached
    clock.now += 2.01
    assert there.resolve(token) is None


def test_revoke_clears_the_cache_at_once(store, clock):
    info, token = store.create(1, 1, name="soon-gone")
    assert store.resolve(token) is not None
    store.revoke("soon-gone")
    assert store.resolve(token) is None  # no time has passed


def test_a_lookup_racing_a_revocation_is_not_cached(clock):
    """A resolve that read the record just before a revocation does not cache it past it."""

    class Engine(MemoryEngine):
        after_get = None

        def get(self, key):
            value = super().get(key)
            if self.after_get is not None and key.startswith(keys.TOKEN):
                after, self.after_get = self.after_get, None
                after()
            return value

    engine = Engine()
    store = TokenStore(engine, clock=clock)
    info, token = store.create(1, 1)
    engine.after_get = lambda: store.revoke(info.token_id)
    assert store.resolve(token) is not None  # read before the revocation
    assert store.resolve(token) is None  # but not kept


def test_a_new_token_is_not_hidden_by_a_cached_miss(store, clock):
    assert store.resolve(f"emb1.{'0' * 12}.{'A' * 43}") is None
    _, token = store.create(1, 1)
    assert store.resolve(token) is not None


def test_a_zero_ttl_reads_every_time(engine):
    store = TokenStore(engine, cache_ttl=0)
    _, token = store.create(1, 1)
    before = engine.gets
    for _ in range(3):
        assert store.resolve(token) is not None
    assert engine.gets == before + 3


def test_the_cache_is_bounded(engine, clock):
    store = TokenStore(engine, clock=clock)
    _, token = store.create(1, 1)
    assert store.resolve(token) is not None
    for i in range(CACHE_ENTRIES + 10):
        assert store.resolve(f"emb1.{i:012x}.{'A' * 43}") is None
    assert store.cached() <= CACHE_ENTRIES
    before = engine.gets
    assert store.resolve(token) is not None  # the oldest entry went first
    assert engine.gets == before + 1


def test_resolve_from_many_threads(store):
    made = [store.create(i, i, name=f"n{i}") for i in range(8)]
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for round_ in range(300):
                info, token = made[(n + round_) % len(made)]
                assert store.resolve(token).uid == info.uid
                if round_ % 50 == 0:
                    store.clear_cache()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_the_store_outlives_a_restart(engine):
    info, token = TokenStore(engine).create(42, 43, [44], name="kept")
    again = TokenStore(engine)
    assert again.resolve(token) == Identity(42, 43, (44,), "kept", info.token_id)
    assert again.list() == [info]


# --------------------------------------------------------------------- the API


def make_app(tokens: TokenStore | None, admin_token: str | None = ADMIN_TOKEN):
    cm = ClusterManager(MemoryEngine(), replicas=3)
    return create_app(cm, GCQueue(cm), admin_token=admin_token, tokens=tokens)


@pytest.fixture
def api(engine) -> tuple[TokenStore, TestClient]:
    store = TokenStore(engine, admin_token=ADMIN_TOKEN)
    return store, TestClient(make_app(store))


AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

ROUTES = [
    ("post", "/api/v1/tokens", {"uid": 1, "gid": 1}),
    ("get", "/api/v1/tokens", None),
    ("delete", "/api/v1/tokens/someone", None),
]


@pytest.mark.parametrize(("method", "url", "body"), ROUTES)
def test_every_route_needs_the_admin_token(api, engine, method, url, body):
    store, client = api
    store.create(5, 5, name="someone")
    before = token_records(engine)
    resp = client.request(method, url, json=body)
    assert resp.status_code == 401, resp.text
    assert resp.headers["www-authenticate"] == "Bearer"
    resp = client.request(method, url, json=body, headers={"Authorization": "Bearer nope"})
    assert resp.status_code == 403 and resp.json() == {"detail": "wrong admin token"}
    assert token_records(engine) == before  # nothing applied
    # a client token is no admin token
    _, client_token = store.create(0, 0)
    before = token_records(engine)
    resp = client.request(
        method, url, json=body, headers={"Authorization": f"Bearer {client_token}"}
    )
    assert resp.status_code == 403
    assert token_records(engine) == before  # nothing applied


@pytest.mark.parametrize(("method", "url", "body"), ROUTES)
def test_routes_without_a_configured_admin_token(engine, method, url, body):
    client = TestClient(make_app(TokenStore(engine), admin_token=None))
    resp = client.request(method, url, json=body, headers=AUTH)
    assert resp.status_code == 403 and resp.json() == {"detail": "no admin token configured"}


@pytest.mark.parametrize(("method", "url", "body"), ROUTES)
def test_routes_without_a_token_store(method, url, body):
    client = TestClient(make_app(None))
    resp = client.request(method, url, json=body)
    assert resp.status_code == 401  # the admin token is checked first
    resp = client.request(method, url, json=body, headers=AUTH)
    assert resp.status_code == 503
    assert resp.json() == {"detail": "token store not available"}


def test_create_list_revoke_through_the_api(api):
    store, client = api
    resp = client.post(
        "/api/v1/tokens",
        json={"uid": 1000, "gid": 100, "groups": [7, 8], "name": "ci"},
        headers=AUTH,
    )
    assert resp.status_code == 201, resp.text
    created = resp.json()
    assert set(created) == {"id", "name", "uid", "gid", "groups", "created", "token"}
    assert TOKEN_RE.match(created["token"]).group(1) == created["id"]
    assert (created["name"], created["uid"], created["gid"], created["groups"]) == (
        "ci",
        1000,
        100,
        [7, 8],
    )
    assert store.resolve(created["token"]) == Identity(1000, 100, (7, 8), "ci", created["id"])

    resp = client.post("/api/v1/tokens", json={"uid": 5, "gid": 6}, headers=AUTH)
    assert resp.status_code == 201
    unnamed = resp.json()
    assert unnamed["name"] == "" and unnamed["groups"] == []

    listed = client.get("/api/v1/tokens", headers=AUTH)
    assert listed.status_code == 200
    tokens = listed.json()["tokens"]
    assert [t["id"] for t in tokens] == [created["id"], unnamed["id"]]
    assert all(set(t) == {"id", "name", "uid", "gid", "groups", "created"} for t in tokens)
    assert created["token"] not in listed.text
    assert split_token(created["token"])[1] not in listed.text

    resp = client.delete("/api/v1/tokens/ci", headers=AUTH)
    assert resp.status_code == 200
    assert resp.json() == {k: v for k, v in created.items() if k != "token"}
    assert store.resolve(created["token"]) is None
    resp = client.delete(f"/api/v1/tokens/{unnamed['id']}", headers=AUTH)
    assert resp.status_code == 200 and resp.json()["id"] == unnamed["id"]
    assert client.get("/api/v1/tokens", headers=AUTH).json() == {"tokens": []}


def test_revoke_unknown_is_404(api):
    _, client = api
    for which in ("nobody", "0123456789ab"):
        resp = client.delete(f"/api/v1/tokens/{which}", headers=AUTH)
        assert resp.status_code == 404
        assert which in resp.json()["detail"]


def test_revoke_a_name_with_a_slash(api):
    store, client = api
    info, _ = store.create(1, 1, name="team/build")
    resp = client.delete("/api/v1/tokens/team%2Fbuild", headers=AUTH)
    assert resp.status_code == 200 and resp.json()["id"] == info.token_id


def test_duplicate_and_ambiguous_names_are_409(api, engine):
    store, client = api
    body = {"uid": 1, "gid": 1, "name": "dup"}
    assert client.post("/api/v1/tokens", json=body, headers=AUTH).status_code == 201
    resp = client.post("/api/v1/tokens", json=body, headers=AUTH)
    assert resp.status_code == 409 and "dup" in resp.json()["detail"]
    other, _ = store.create(2, 2, name="other")
    raw = json.loads(engine.get(keys.token_key(other.token_id)))
    raw["name"] = "dup"
    engine.write({keys.token_key(other.token_id): json.dumps(raw).encode()})
    resp = client.delete("/api/v1/tokens/dup", headers=AUTH)
    assert resp.status_code == 409 and "several" in resp.json()["detail"]
    assert len(store.list()) == 2


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"uid": 1},
        {"gid": 1},
        {"uid": -1, "gid": 1},
        {"uid": 1, "gid": 2**32},
        {"uid": "abc", "gid": 1},
        {"uid": 1, "gid": 1, "groups": [-1]},
        {"uid": 1, "gid": 1, "groups": list(range(65))},
        {"uid": 1, "gid": 1, "groups": "1,2"},
        {"uid": 1, "gid": 1, "name": "x" * 129},
        {"uid": 1, "gid": 1, "name": "line\nbreak"},
        {"uid": 1, "gid": 1, "name": "abcdef012345"},
        {"uid": 1, "gid": 1, "name": 3},
    ],
)
def test_invalid_bodies_are_422(api, engine, body):
    _, client = api
    resp = client.post("/api/v1/tokens", json=body, headers=AUTH)
    assert resp.status_code == 422, resp.text
    assert isinstance(resp.json()["detail"], str) and resp.json()["detail"]
    assert token_records(engine) == {}


def test_the_routes_are_documented(api):
    _, client = api
    spec = client.get("/openapi.json").json()
    assert set(spec["paths"]["/api/v1/tokens"]) == {"get", "post"}
    assert set(spec["paths"]["/api/v1/tokens/{which}"]) == {"delete"}
    post = spec["paths"]["/api/v1/tokens"]["post"]["responses"]
    assert {"201", "401", "403", "409", "422", "503"} <= set(post)
    assert "TokenCreatedPublic" in spec["components"]["schemas"]
