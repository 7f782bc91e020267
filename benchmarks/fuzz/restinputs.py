"""The REST surface's inputs: requests to the admin API's routes, and malformed HTTP."""

from __future__ import annotations

import json
import os
import random
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .cluster import Env
from .guards import rest_safe
from .scratch import CHECK_DIR, SCRATCH_DIR
from .tally import EXAMPLE_BYTES, Tally, hexcut
from .values import U64, pick, text


@dataclass(frozen=True)
class Route:
    """One operation of the OpenAPI document."""

    method: str
    template: str
    params: tuple[dict, ...]
    body: dict | None
    slow: bool


def routes_of(schema: dict) -> list[Route]:
    """The operations of an OpenAPI document."""
    out = []
    for template, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            if method not in ("get", "post", "put", "delete", "patch"):
                continue
            body = (
                op.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema")
            )
            out.append(
                Route(
                    method.upper(),
                    template,
                    tuple(op.get("parameters", ())),
                    body,
                    "fsck" in template,
                )
            )
    return out


@dataclass
class RestInput:
    """One HTTP request (or raw bytes on a fresh connection) to the admin API."""

    kind: str
    method: str
    target: str
    headers: dict[str, str]
    body: bytes | None
    credential: str
    slow: bool = False
    raw: bytes | None = None

    @property
    def group(self) -> str:
        """Its time is added up by its kind (its route)."""
        return self.kind

    def example(self) -> dict:
        if self.raw is not None:
            return {"raw_http": hexcut(self.raw)}
        out: dict[str, Any] = {
            "method": self.method,
            "target": self.target,
            "headers": self.headers,
            "credential": self.credential,
        }
        if self.body is not None:
            try:
                out["body"] = self.body[:EXAMPLE_BYTES].decode()
            except UnicodeDecodeError:
                out["body_hex"] = self.body[:EXAMPLE_BYTES].hex()
        return out


class JsonGen:
    """JSON values for a JSON schema: valid, at and past its bounds, of the wrong type."""

    def __init__(self, rng: random.Random, root: dict) -> None:
        self.rng = rng
        self.root = root

    def resolve(self, schema: dict) -> dict:
        while "$ref" in schema:
            node: Any = self.root
            for part in schema["$ref"].lstrip("#/").split("/"):
                node = node[part]
            schema = node
        return schema

    def value(self, schema: dict, depth: int = 0) -> Any:
        rng = self.rng
        schema = self.resolve(schema)
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            return self.value(rng.choice(branches), depth)
        if rng.random() < 0.08 or depth > 4:
            return self.anything()
        kind = schema.get("type")
        if kind == "integer":
            return self.integer(schema)
        if kind == "number":
            return rng.choice((0, -1.5, 1e308, 5e-324, self.integer(schema)))
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "string":
            return self.string(schema)
        if kind == "array":
            return self.array(schema, depth)
        if kind == "object" or "properties" in schema:
            return self.object(schema, depth)
        if kind == "null":
            return None
        return self.anything()

    def integer(self, schema: dict) -> int:
        rng = self.rng
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -(10**6)))
        hi = schema.get("maximum", schema.get("exclusiveMaximum", 10**6))
        return rng.choice(
            (
                lo,
                hi,
                lo - 1,
                hi + 1,
                0,
                -1,
                rng.randint(int(lo), int(hi)),
                10**30,
                -(10**30),
                U64 + 1,
            )
        )

    def string(self, schema: dict) -> str:
        rng = self.rng
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 300)
        n = rng.choice((lo, hi, max(0, lo - 1), hi + 1, rng.randint(lo, hi)))
        return text(rng, min(n, 100_000))

    def array(self, schema: dict, depth: int) -> list:
        rng = self.rng
        hi = schema.get("maxItems", 10)
        n = rng.choice((0, 1, 3, min(hi, 1000), min(hi + 1, 100_000)))
        items = schema.get("items", {})
        return [self.value(items, depth + 1) for _ in range(n)]

    def object(self, schema: dict, depth: int) -> dict:
        rng = self.rng
        required = set(schema.get("required", ()))
        out = {}
        for name, sub in schema.get("properties", {}).items():
            keep = rng.random() < (0.93 if name in required else 0.6)
            if keep:
                out[name] = self.value(sub, depth + 1)
        if rng.random() < 0.1:
            out[text(rng, 8)] = self.anything()
        return out

    def anything(self) -> Any:
        rng = self.rng
        return rng.choice(
            (
                None,
                True,
                0,
                -1,
                10**40,
                1.5,
                "",
                text(rng),
                [],
                [1, "a", None],
                {},
                {"a": {"b": [1]}},
                [[[[[]]]]],
            )
        )


def raw_http(rng: random.Random, host: str) -> bytes:
    """A malformed (or odd) HTTP/1.1 request."""
    h = f"Host: {host}\r\n".encode()
    return rng.choice(
        (
            b"GET /healthz HTTP/1.1\r\n\r\n",
            b"GARBAGE\r\n\r\n",
            b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n" + h + b"\r\n",
            b"GET /healthz HTTP/1.1\r\n" + h + b"X-Big: " + b"b" * 100_000 + b"\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\n" + h + b"X: " * 2000 + b"\r\n\r\n",
            b"POST /api/v1/tokens HTTP/1.1\r\n" + h + b"Content-Length: 100\r\n\r\n{}",
            b"POST /api/v1/gc/run HTTP/1.1\r\n" + h + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"GET /healthz HTTP/1.1\r\n" + h + b"Content-Length: -1\r\n\r\n",
            b"GET /healthz HTTP/1.1\r\n" + h + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"GET /healthz HTTP/1.1\r\n" + h + b"Bad Header\x00: x\r\n\r\n",
            b"GET /api/v1/targets/%zz HTTP/1.1\r\n" + h + b"\r\n",
            b"GET /\xff\xfe HTTP/1.1\r\n" + h + b"\r\n",
            b"GET /healthz HTTP/9.9\r\n" + h + b"\r\n",
            b"GET /healthz\r\n\r\n",
            b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + rng.randbytes(64),
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + rng.randbytes(32),
            (b"GET /healthz HTTP/1.1\r\n" + h + b"\r\n") * 50,
            b"GET /api/v1/cluster HTTP/1.1\r\n" + h + b"Authorization: Bearer\r\n\r\n",
            rng.randbytes(rng.randrange(1, 400)),
            b"GET /healthz HTTP/1.1\r\n" + h,  # never finished
        )
    )


class RestInputs:
    """Makes the REST surface's inputs for one thread."""

    def __init__(self, env: Env, rng: random.Random, tally: Tally, schema: dict) -> None:
        self.env = env
        self.rng = rng
        self.tally = tally
        self.routes = routes_of(schema)
        self.json = JsonGen(rng, schema)
        self.host = env.cluster.admin_address

    def next(self) -> RestInput:
        while True:
            item = self._make()
            if item.raw is not None or rest_safe(
                item.method, item.target, item.credential == "admin"
            ):
                return item
            self.tally.guard()

    def _make(self) -> RestInput:
        rng = self.rng
        r = rng.random()
        if r < 0.04:
            return RestInput("raw_http", "", "", {}, None, "none", raw=raw_http(rng, self.host))
        if r < 0.08:
            return self._off_schema()
        route = rng.choice(self.routes)
        if route.slow and rng.random() < 0.9:  # fsck scans everything: a few of them
            route = rng.choice([x for x in self.routes if not x.slow])
        method = (
            route.method
            if rng.random() < 0.92
            else rng.choice(("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"))
        )
        credential = pick(rng, {"none": 0.25, "wrong": 0.25, "admin": 0.45, "malformed": 0.05})
        target = self._target(route)
        body = self._body(route)
        headers = self._headers(credential, body)
        kind = f"{route.method} {route.template}"
        return RestInput(kind, method, target, headers, body, credential, route.slow)

    def _off_schema(self) -> RestInput:
        rng = self.rng
        target = rng.choice(
            (
                "/",
                "/metrics",
                "/docs",
                "/openapi.json",
                "/static/index.html",
                "/static/../../../../etc/passwd",
                "/static/%2e%2e/%2e%2e/etc/passwd",
                "/api/v2/cluster",
                "/api/v1/" + urllib.parse.quote(text(rng, 20), safe=""),
                "/" + "a/" * 500,
                "/healthz?" + "x=1&" * 2000,
            )
        )
        method = rng.choice(("GET", "GET", "POST", "DELETE", "HEAD", "OPTIONS", "TRACE"))
        credential = pick(rng, {"none": 0.5, "wrong": 0.3, "admin": 0.2})
        return RestInput(
            "off_schema", method, target, self._headers(credential, None), None, credential
        )

    def _target(self, route: Route) -> str:
        rng = self.rng
        path = route.template
        query: list[tuple[str, str]] = []
        for param in route.params:
            where, name = param.get("in"), param.get("name", "")
            if where == "path":
                value = self._param(param.get("schema", {}))
                safe = "/" if ":path" in path or rng.random() < 0.05 else ""
                path = re.sub(
                    r"\{" + re.escape(name) + r"(:[a-z]+)?\}",
                    urllib.parse.quote(value, safe=safe),
                    path,
                )
            elif where == "query" and (param.get("required") or rng.random() < 0.7):
                if param.get("required") and rng.random() < 0.05:
                    continue  # a required parameter missing
                query.append((name, self._query_value(name, param.get("schema", {}))))
                if rng.random() < 0.03:
                    query.append((name, self._param(param.get("schema", {}))))
        if rng.random() < 0.05:
            query.append((text(rng, 6), text(rng, 10)))
        encoded = urllib.parse.urlencode(query)
        if rng.random() < 0.02:
            encoded += "&%zz=%" + rng.choice(("", "0", "g0", "00"))
        return path + ("?" + encoded if encoded else "")

    def _query_value(self, name: str, schema: dict) -> str:
        rng = self.rng
        if name == "path" and rng.random() < 0.6:
            return rng.choice(
                (SCRATCH_DIR, SCRATCH_DIR + "/d", SCRATCH_DIR + "/x/y", CHECK_DIR, "/")
            )
        return self._param(schema)

    def _param(self, schema: dict) -> str:
        """A path or query value as text: of its type mostly, anything sometimes."""
        rng = self.rng
        value = self.json.value(schema)
        if rng.random() < 0.15:
            value = rng.choice(
                ("", "abc", "1.5", "-0", "1e3", "0x10", "٣", "%00", "null", "true", " 1", text(rng))
            )
        if isinstance(value, bool):
            return rng.choice(("true", "false", "1", "0", "yes", "on")) if value else "false"
        if isinstance(value, (dict, list)) or value is None:
            return json.dumps(value)
        return str(value)

    def _body(self, route: Route) -> bytes | None:
        rng = self.rng
        if route.body is None:
            return None if rng.random() < 0.95 else json.dumps(self.json.anything()).encode()
        r = rng.random()
        if r < 0.05:
            return None
        if r < 0.1:
            return rng.choice((b"", b"{", b"{'a': 1}", b"[1,", b"\xff\xfe", b"NaN", b"{" * 50_000))
        if r < 0.13:
            return b"[" * 10_000 + b"]" * 10_000
        return json.dumps(self.json.value(route.body), ensure_ascii=rng.random() < 0.5).encode(
            "utf-8", "surrogatepass"
        )

    def _headers(self, credential: str, body: bytes | None) -> dict[str, str]:
        rng = self.rng
        headers = {}
        if credential == "admin":
            headers["Authorization"] = f"Bearer {self.env.token}"
        elif credential == "wrong":
            headers["Authorization"] = f"Bearer {os.urandom(16).hex()}"
        elif credential == "malformed":
            headers["Authorization"] = rng.choice(
                ("Bearer", "Bearer ", "Basic Zm9vOmJhcg==", "bearer x", "Bearer " + "t" * 9000)
            )
        if body is not None:
            headers["Content-Type"] = pick(
                rng,
                {
                    "application/json": 0.85,
                    "text/plain": 0.05,
                    "multipart/form-data; boundary=x": 0.05,
                    "application/x-www-form-urlencoded": 0.05,
                },
            )
        return headers
