"""``emberfs admin``: show and steer a cluster through its admin REST API.

::

    emberfs admin status            # cluster summary
    emberfs admin nodes|targets|chains|sessions
    emberfs admin offline ID        # take a target offline (needs the token)
    emberfs admin drain ID          # move a target's chain membership (needs the token)
    emberfs admin gc [--run]        # pending GC items; --run sweeps now (needs the token)
    emberfs admin scrub [status]    # each target's scrub progress
    emberfs admin scrub start|pause # start a pass now / pause scrubbing (needs the token)
    emberfs admin token create --uid U --gid G [--groups 1,2] [--name N]
    emberfs admin token list        # client tokens (needs the token)
    emberfs admin token revoke ID|NAME

The API address comes from ``--admin`` or ``EMBERFS_ADMIN`` (default
``http://127.0.0.1:9401``), the token from ``--token`` or
``EMBERFS_ADMIN_TOKEN``. Tables are printed with rich; ``--json`` prints the
API's JSON instead. Errors are one line on stderr and exit status 1 (2 for
usage errors).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from emberfs.client import config

DEFAULT_ADMIN = "http://127.0.0.1:9401"
TIMEOUT = 10.0

STATE_STYLES = {
    "serving": "green",
    "syncing": "blue",
    "waiting": "yellow",
    "lastsrv": "dark_orange",
    "offline": "red",
    "healthy": "green",
    "degraded": "dark_orange",
    "unavailable": "red",
}


class AdminError(Exception):
    """A request failed: the message is the one line to show."""


class AdminClient:
    """A small client of the admin REST API.

    Parameters
    ----------
    base_url : str
        ``http://host:port`` of the metaserver's admin API.
    token : str or None, default None
        Bearer token for steering requests.
    timeout : float, default 10.0
        Seconds per request.
    tls_ca : str or None
        CA certificate (PEM) of an https admin API.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = TIMEOUT,
        tls_ca: str | None = None,
    ):
        if "://" not in base_url:
            base_url = "http://" + base_url
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        # an https admin API's certificate is checked against this CA (default: the system's)
        self._ssl = ssl.create_default_context(cafile=tls_ca) if tls_ca else None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request; the decoded JSON answer, or :class:`AdminError`."""
        with self._open(method, path, body, "application/json", self.timeout) as resp:
            try:
                return json.loads(resp.read() or b"null")
            except ValueError:
                raise AdminError(f"{self.base_url}{path} did not answer JSON") from None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def stream(self, method: str, path: str, timeout: float | None = None) -> Iterator[Any]:
        """Send one request whose answer is JSON lines; each decoded line as it arrives."""
        with self._open(
            method, path, None, "application/x-ndjson", timeout or self.timeout
        ) as resp:
            try:
                for line in resp:
                    if line.strip():
                        yield json.loads(line)
            except ValueError:
                raise AdminError(f"{self.base_url}{path} did not answer JSON lines") from None
            except OSError as exc:
                raise AdminError(f"the admin API at {self.base_url} broke off: {exc}") from None

    @contextlib.contextmanager
    def _open(self, method: str, path: str, body: Any, accept: str, timeout: float):
        """The open answer to one request; :class:`AdminError` when there is none."""
        headers = {"Accept": accept}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(
            self.base_url + path, data=data, headers=headers, method=method
        )
        try:
            resp = urllib.request.urlopen(req, timeout=timeout, context=self._ssl)
        except urllib.error.HTTPError as exc:
            raise AdminError(f"{exc.code} {_detail(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AdminError(f"cannot reach the admin API at {self.base_url}: {reason}") from None
        with resp:
            yield resp


def add_api_arguments(p: argparse.ArgumentParser, token_help: str) -> None:
    """``--admin`` and ``--token``, with their environment defaults."""
    p.add_argument(
        "--admin",
        default=config.setting("admin", "EMBERFS_ADMIN", DEFAULT_ADMIN),
        help=f"admin API URL (default: $EMBERFS_ADMIN, the client config's admin, or "
        f"{DEFAULT_ADMIN})",
    )
    p.add_argument(
        "--token",
        default=config.setting("admin_token", "EMBERFS_ADMIN_TOKEN"),
        help=f"admin token {token_help} (default: $EMBERFS_ADMIN_TOKEN or the client "
        "config's admin_token)",
    )
    p.add_argument(
        "--tls-ca",
        default=config.setting("tls_ca"),
        help="CA certificate of an https admin API (default: the client config's tls_ca)",
    )


def _detail(exc: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(exc.read())
    except (ValueError, OSError):
        return exc.reason or "error"
    if isinstance(payload, dict) and payload.get("detail"):
        return str(payload["detail"])
    if isinstance(payload, dict) and payload.get("reason"):
        return str(payload["reason"])
    return exc.reason or "error"


def _styled(value: str) -> str:
    style = STATE_STYLES.get(value)
    return f"[{style}]{value}[/{style}]" if style else value


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def show_status(c: dict, console: Console) -> None:
    t = Table(title=f"EmberFS cluster: {_styled(c['health'])}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    targets = c["targets"]
    chains = c["chains"]
    t.add_row("version", f"{c['version']} (routing {c['routing_version']})")
    t.add_row("nodes", str(c["nodes"]))
    t.add_row(
        "targets",
        f"{targets['total']}: "
        + ", ".join(
            f"{targets[s]} {_styled(s)}"
            for s in ("serving", "syncing", "waiting", "lastsrv", "offline")
            if targets[s]
        )
        + (f", {targets['full']} [red]full[/red]" if targets.get("full") else ""),
    )
    t.add_row(
        "chains",
        f"{chains['total']}: "
        + ", ".join(
            f"{chains[h]} {_styled(h)}" for h in ("healthy", "degraded", "unavailable") if chains[h]
        ),
    )
    pct = 100 * c["used"] / c["capacity"] if c["capacity"] else 0.0
    t.add_row("capacity", f"{_bytes(c['used'])} used of {_bytes(c['capacity'])} ({pct:.1f}%)")
    t.add_row("I/O", f"{_bytes(c['bytes_read'])} read, {_bytes(c['bytes_written'])} written")
    ns = c.get("namespace")
    if ns:
        t.add_row(
            "namespace",
            f"{ns['files']} files, {ns['directories']} directories, {ns['symlinks']} symlinks, "
            f"{ns['sessions']} open for write",
        )
    t.add_row("gc pending", str(c["gc_pending"]))
    if c.get("store", "rocksdb") != "rocksdb":
        t.add_row("metadata", f"{c['store']} (leader {c.get('leader') or 'none yet'})")
    for d in c["drains"]:
        t.add_row(
            "drain",
            f"target {d['target']} -> {d['replacement']} in chain {d['chain']} "
            f"({_styled(d['replacement_state'])})",
        )
    console.print(t)


def show_targets(targets: list[dict], console: Console) -> None:
    t = Table(title="Targets")
    for col in ("id", "node", "address", "state", "chain", "chunks", "used", "capacity"):
        t.add_column(col, justify="right" if col in ("id", "chain", "chunks") else "left")
    for x in targets:
        t.add_row(
            str(x["id"]),
            escape(x["node"]),
            escape(x["address"]),
            _styled(x["state"]) + (" [red]full[/red]" if x.get("full") else ""),
            str(x["chain"] or "-"),
            str(x["chunks"]),
            _bytes(x["used"]),
            _bytes(x["capacity"]),
        )
    console.print(t)


def show_chains(chains: list[dict], console: Console) -> None:
    t = Table(title="Chains")
    t.add_column("id", justify="right")
    t.add_column("version", justify="right")
    t.add_column("targets (head first)")
    for c in chains:
        members = "  ".join(f"{m['id']}:{_styled(m['state'])}" for m in c["targets"])
        t.add_row(str(c["id"]), str(c["version"]), members)
    console.print(t)


def show_nodes(nodes: list[dict], console: Console) -> None:
    t = Table(title="Nodes")
    for col in ("id", "address", "grpc address", "targets", "up", "last heartbeat"):
        t.add_column(col)
    for n in nodes:
        age = n["last_heartbeat_seconds"]
        t.add_row(
            escape(n["id"]),
            escape(n["address"]),
            escape(n["grpc_address"]),
            ", ".join(str(x) for x in n["targets"]),
            "[green]yes[/green]" if n["up"] else "[red]no[/red]",
            "-" if age is None else f"{age:.1f} s ago",
        )
    console.print(t)


def show_sessions(sessions: list[dict], console: Console) -> None:
    t = Table(title="Write sessions")
    for col in ("inode", "session", "client", "since (ns)"):
        t.add_column(col)
    for s in sessions:
        t.add_row(str(s["inode"]), str(s["session_id"]), escape(s["client_id"]), str(s["since"]))
    console.print(t)


def show_gc(items: list[dict], console: Console) -> None:
    t = Table(title=f"Pending GC items: {len(items)}")
    for col in ("gc id", "inode", "chains", "acked", "waiting for"):
        t.add_column(col)
    for i in items:
        t.add_row(
            str(i["gc_id"]),
            str(i["inode"]),
            ", ".join(map(str, i["chains"])),
            ", ".join(map(str, i["acked"])) or "-",
            ", ".join(map(str, i["waiting"])) or "-",
        )
    console.print(t)


def _when(ns: int) -> str:
    """A wall-clock time in nanoseconds as local time (``-`` for 0)."""
    if not ns:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def show_scrub(s: dict, console: Console) -> None:
    console.print(f"scrubbing is {'[yellow]paused[/]' if s['paused'] else '[green]on[/]'}")
    table = Table(
        "target",
        "node",
        "pass",
        "started",
        "last full pass",
        "verified",
        "errors",
        "repairs",
        "passes",
    )
    for t in s["targets"]:
        table.add_row(
            str(t["id"]),
            escape(t["node"]),
            "running" if t["running"] else "idle",
            _when(t["pass_started"]),
            _when(t["last_full_pass"]),
            f"{_bytes(t['bytes_verified'])} in {t['chunks_verified']} chunks",
            f"[red]{t['errors']}[/red]" if t["errors"] else "0",
            str(t["repairs"]),
            str(t["passes"]),
        )
    console.print(table)


def show_tokens(data: dict, console: Console) -> None:
    t = Table(title=f"Client tokens: {len(data['tokens'])}")
    for col in ("id", "name", "uid", "gid", "groups", "created"):
        t.add_column(col, justify="right" if col in ("uid", "gid") else "left")
    for x in data["tokens"]:
        t.add_row(
            x["id"],
            escape(x["name"]) or "-",
            str(x["uid"]),
            str(x["gid"]),
            ", ".join(map(str, x["groups"])) or "-",
            _when(x["created"]),
        )
    console.print(t)


def _identity(d: dict) -> str:
    groups = ",".join(map(str, d["groups"])) or "-"
    name = f" ({escape(d['name'])})" if d["name"] else ""
    return f"token {d['id']}{name}: uid {d['uid']}, gid {d['gid']}, groups {groups}"


def show_created(d: dict, console: Console) -> None:
    """The token string alone on the first line (``| head -1`` takes it), then what it is."""
    console.print(d["token"], markup=False, highlight=False, soft_wrap=True)
    console.print(_identity(d), highlight=False, soft_wrap=True)


def show_revoked(d: dict, console: Console) -> None:
    console.print(f"revoked {_identity(d)}", highlight=False, soft_wrap=True)


def _group_list(text: str) -> list[int]:
    """``--groups``: comma-separated group ids (empty: none)."""
    try:
        return [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of group ids: {text!r}"
        ) from None


def _add_token_parser(sub) -> None:
    """The ``token`` commands, added to ``sub`` (what ``add_subparsers`` returned)."""
    token = sub.add_parser(
        "token", help="client tokens: identities for the metaserver's permission checks"
    )
    actions = token.add_subparsers(dest="token_action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a token (its string is shown only now)")
    create.add_argument("--uid", type=int, required=True, help="user id the token acts as")
    create.add_argument("--gid", type=int, required=True, help="its primary group id")
    create.add_argument(
        "--groups", type=_group_list, default=[], help="supplementary group ids, e.g. 10,20"
    )
    create.add_argument("--name", default="", help="a unique name to find it by")
    listing = actions.add_parser("list", help="every live token (never their secrets)")
    revoke = actions.add_parser("revoke", help="revoke a token")
    revoke.add_argument("which", metavar="ID|NAME", help="the token's id or name")
    for p in (create, listing, revoke):
        # SUPPRESS: without it, the subcommand's default would undo ``admin --json token ...``
        p.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
        )


def _token_request(client: AdminClient, args: argparse.Namespace) -> tuple[Any, Any]:
    """The answer of ``emberfs admin token ACTION`` and the function that shows it."""
    if args.token_action == "create":
        body = {"uid": args.uid, "gid": args.gid, "groups": args.groups, "name": args.name}
        return client.post("/api/v1/tokens", body), show_created
    if args.token_action == "revoke":
        which = urllib.parse.quote(args.which, safe="")
        return client.delete(f"/api/v1/tokens/{which}"), show_revoked
    return client.get("/api/v1/tokens"), show_tokens


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="emberfs admin", description="Show and steer an EmberFS cluster (admin REST API)."
    )
    add_api_arguments(p, "for steering")
    p.add_argument("--json", action="store_true", help="print the API's JSON instead of tables")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("status", help="cluster summary")
    sub.add_parser("nodes", help="storage nodes")
    sub.add_parser("targets", help="storage targets")
    sub.add_parser("chains", help="replication chains")
    sub.add_parser("sessions", help="open write sessions")
    for name, text in (
        ("offline", "take a target offline until its storage server restarts"),
        ("drain", "move a target's chain membership to a free target"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("target", type=int, help="target id")
    gc = sub.add_parser("gc", help="pending GC items")
    gc.add_argument("--run", action="store_true", help="run a GC sweep on the metaserver now")
    scrub = sub.add_parser("scrub", help="the storage servers' scrubbers")
    scrub.add_argument(
        "action",
        nargs="?",
        default="status",
        choices=("status", "start", "pause"),
        help="status (default); start a pass now; pause until the next start",
    )
    _add_token_parser(sub)
    return p.parse_args(argv)


def run(args: argparse.Namespace, console: Console) -> None:
    """Carry out one parsed command; :class:`AdminError` on failure."""
    client = AdminClient(args.admin, args.token, tls_ca=args.tls_ca)
    cmd = args.command
    if cmd == "status":
        data, show = client.get("/api/v1/cluster"), show_status
    elif cmd in ("nodes", "targets", "chains", "sessions"):
        data = client.get(f"/api/v1/{cmd}")
        show = {
            "nodes": show_nodes,
            "targets": show_targets,
            "chains": show_chains,
            "sessions": show_sessions,
        }[cmd]
    elif cmd == "offline":
        data = client.post(f"/api/v1/targets/{args.target}/offline")

        def show(d, con):
            con.print(f"target {d['id']} is {_styled(d['state'])} (chain {d['chain'] or '-'})")

    elif cmd == "drain":
        data = client.post(f"/api/v1/targets/{args.target}/drain")

        def show(d, con):
            con.print(
                f"draining target {d['target']} of chain {d['chain']}: target "
                f"{d['replacement']} replaces it ({_styled(d['replacement_state'])})"
            )

    elif cmd == "gc" and args.run:
        data = client.post("/api/v1/gc/run")

        def show(d, con):
            con.print(f"removed {d['removed']} GC items, {d['pending']} pending")

    elif cmd == "scrub":
        if args.action == "status":
            data = client.get("/api/v1/scrub")
        else:
            data = client.post(f"/api/v1/scrub/{args.action}")
        show = show_scrub
    elif cmd == "token":
        data, show = _token_request(client, args)
    else:
        data, show = client.get("/api/v1/gc"), show_gc
    if args.json:
        console.print_json(data=data)
    else:
        show(data, console)
    if cmd == "token" and args.token_action == "create":
        print("emberfs admin: keep the token now: it is not shown again", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run ``emberfs admin``; the exit code."""
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    console = Console()
    try:
        run(args, console)
    except AdminError as exc:
        print(f"emberfs admin: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
