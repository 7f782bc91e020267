#!/usr/bin/env bash
# Run the EmberFS docker compose test cluster (deploy/docker-compose.yml).
#
# usage: deploy/cluster.sh COMMAND [ARGS...]
#
# commands:
#   build         base image (cached), wheels (cached), server image (and the
#                 Prometheus image of a project with monitoring)
#   up [--ha] [--monitoring]
#                 build, start the cluster, wait until every container is
#                 healthy and the metaserver reports every target serving;
#                 --ha: the HA profile (docker-compose.ha.yml: three etcd
#                 members, two metaservers on them), kept for the project
#                 until 'down'; 'up' then also waits for a leader;
#                 --monitoring: also Prometheus (docker-compose.monitoring.yml,
#                 deploy/monitoring/), kept for the project until 'down'
#   down          stop the cluster and remove its containers, network, volumes
#   status        containers and targets
#   logs [ARGS]   compose logs (e.g. logs -f storage1)
#   compose ARGS  any other compose command, with this cluster's settings
#   env           print the settings of this cluster as shell assignments
#
# environment (defaults in brackets):
#   EMBERFS_COMPOSE_PROJECT  compose project name                   [emberfs]
#   EMBERFS_IMAGE            server image tag                       [emberfs:latest]
#   EMBERFS_BASE_IMAGE       base image; emberfs-base:bookworm is built
#                            locally by deploy/base-image.sh, any other
#                            name is used as it is (e.g. python:3.11-slim)
#                                                                   [emberfs-base:bookworm]
#   EMBERFS_META_PORT        metaserver gRPC port on 127.0.0.1      [9400]
#   EMBERFS_ADMIN_PORT       admin API port on 127.0.0.1            [9401]
#   EMBERFS_HA               1: the HA profile (as 'up --ha')       [0]
#   EMBERFS_META2_PORT       metaserver2 gRPC port on 127.0.0.1 (HA) [9410]
#   EMBERFS_ADMIN2_PORT      metaserver2 admin API port (HA)        [9411]
#   EMBERFS_MONITORING       1: with Prometheus (as 'up --monitoring') [0]
#   EMBERFS_PROMETHEUS_PORT  Prometheus's HTTP port on 127.0.0.1     [9090]
#   EMBERFS_PROMETHEUS_IMAGE Prometheus image tag           [emberfs-prometheus:latest]
#   EMBERFS_NET_PREFIX       /24 subnet of the cluster network, as three
#                            octets; picked free when unset         [172.29.83 if free]
#   EMBERFS_TARGETS          targets per storage server             [2]
#   EMBERFS_UP_TIMEOUT       seconds 'up' waits for a healthy cluster [180]
#   EMBERFS_PYTHON           host Python 3.11 that builds the wheels [python3]
set -euo pipefail

DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$DEPLOY_DIR/.." && pwd)"
CACHE="$DEPLOY_DIR/.cache"
COMPOSE_FILE="$DEPLOY_DIR/docker-compose.yml"
HA_FILE="$DEPLOY_DIR/docker-compose.ha.yml"
MONITORING_FILE="$DEPLOY_DIR/docker-compose.monitoring.yml"
PROMETHEUS_SERVICE=prometheus
STORAGE_SERVICES=(storage1 storage2 storage3)
CLIENT_SERVICE=client  # mounts EmberFS at /mnt/emberfs (FUSE)
ETCD_SERVICES=(etcd1 etcd2 etcd3)

PROJECT="${EMBERFS_COMPOSE_PROJECT:-emberfs}"
BASE_IMAGE="${EMBERFS_BASE_IMAGE:-emberfs-base:bookworm}"
PYTHON="${EMBERFS_PYTHON:-python3}"
UP_TIMEOUT="${EMBERFS_UP_TIMEOUT:-180}"
STATE_FILE="$CACHE/clusters/$PROJECT.env"
# the cluster's key file, admin token and client config (a directory only its owner reads)
SECRETS_DIR="$CACHE/clusters/$PROJECT.secrets"

# Temporary files and directories, removed when the script exits.
CLEANUP=()
trap 'rm -rf "${CLEANUP[@]}"' EXIT

log() { echo "[cluster] $*" >&2; }
die() { echo "cluster.sh: $*" >&2; exit 1; }

# The comment block at the top of this file.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

if docker compose version >/dev/null 2>&1; then
    COMPOSE_BIN=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    COMPOSE_BIN=(docker-compose)
else
    COMPOSE_BIN=()
fi

compose() {
    [[ ${#COMPOSE_BIN[@]} -gt 0 ]] || die "neither 'docker compose' nor 'docker-compose' is installed"
    export EMBERFS_CLUSTER_KEY="${EMBERFS_CLUSTER_KEY:-$SECRETS_DIR/cluster.key}"
    export EMBERFS_INSECURE="${EMBERFS_INSECURE:-0}"
    if [[ -z "${EMBERFS_ADMIN_TOKEN:-}" && -s "$SECRETS_DIR/admin.token" ]]; then
        EMBERFS_ADMIN_TOKEN="$(cat "$SECRETS_DIR/admin.token")"
        export EMBERFS_ADMIN_TOKEN
    fi
    local files=(-f "$COMPOSE_FILE")
    if ha; then files+=(-f "$HA_FILE"); fi
    if monitoring; then files+=(-f "$MONITORING_FILE"); fi
    "${COMPOSE_BIN[@]}" -p "$PROJECT" "${files[@]}" "$@"
}

# Whether this cluster runs the HA profile (known after load_settings).
ha() { [[ "${EMBERFS_HA:-0}" == 1 ]]; }

# Whether this cluster runs Prometheus (known after load_settings).
monitoring() { [[ "${EMBERFS_MONITORING:-0}" == 1 ]]; }

# The metaservers, one "service host-gRPC-port host-admin-port last-octet" line each.
metaservers() {
    echo "metaserver $EMBERFS_META_PORT $EMBERFS_ADMIN_PORT 10"
    if ha; then echo "metaserver2 $EMBERFS_META2_PORT $EMBERFS_ADMIN2_PORT 20"; fi
}

# Every service of this cluster, one a line.
services() {
    if ha; then printf '%s\n' "${ETCD_SERVICES[@]}"; fi
    metaservers | cut -d' ' -f1
    printf '%s\n' "${STORAGE_SERVICES[@]}"
    echo "$CLIENT_SERVICE"
    if monitoring; then echo "$PROMETHEUS_SERVICE"; fi
}

# ---------------------------------------------------------------- locking

# Builds share deploy/.cache and the image tag, and clusters pick subnets: one
# cluster.sh at a time does either.
LOCKED=0
lock() {
    [[ "$LOCKED" -eq 0 ]] || return 0
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    if ! flock -w 1800 9; then die "another cluster.sh has held $CACHE/.lock for 30 minutes"; fi
    LOCKED=1
}
unlock() {
    [[ "$LOCKED" -eq 1 ]] || return 0
    flock -u 9
    exec 9>&-
    LOCKED=0
}

# ---------------------------------------------------------------- settings

# Print the first /24 (as three octets) of 172.29.0.0/16 that overlaps no host
# route and no Docker network, starting at 172.29.83.
pick_net_prefix() {
    local used
    used="$( { ip -4 route show 2>/dev/null | awk '{print $1}'
              docker network ls -q | xargs -r docker network inspect \
                  -f '{{range .IPAM.Config}}{{.Subnet}} {{end}}' 2>/dev/null | tr ' ' '\n'
            } | grep -E '^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+(/[0-9]+)?$' || true)"
    USED="$used" "$PYTHON" - <<'EOF'
import ipaddress, os, sys
used = [ipaddress.ip_network(n, strict=False) for n in os.environ["USED"].split()]
for k in list(range(83, 256)) + list(range(0, 83)):
    net = ipaddress.ip_network(f"172.29.{k}.0/24")
    if not any(net.overlaps(u) for u in used):
        print(f"172.29.{k}")
        sys.exit(0)
sys.exit("no free /24 in 172.29.0.0/16; set EMBERFS_NET_PREFIX")
EOF
}

# Load this project's saved settings, then fill in what is still unset.
load_settings() {
    if [[ -f "$STATE_FILE" ]]; then
        local key value
        while IFS='=' read -r key value; do
            [[ -n "$key" ]] || continue
            # Explicit environment wins over the saved settings.
            if [[ -z "${!key:-}" ]]; then export "$key=$value"; fi
        done <"$STATE_FILE"
    fi
    export EMBERFS_IMAGE="${EMBERFS_IMAGE:-emberfs:latest}"
    export EMBERFS_META_PORT="${EMBERFS_META_PORT:-9400}"
    export EMBERFS_ADMIN_PORT="${EMBERFS_ADMIN_PORT:-9401}"
    export EMBERFS_TARGETS="${EMBERFS_TARGETS:-2}"
    export EMBERFS_HA="${EMBERFS_HA:-0}"
    export EMBERFS_META2_PORT="${EMBERFS_META2_PORT:-9410}"
    export EMBERFS_ADMIN2_PORT="${EMBERFS_ADMIN2_PORT:-9411}"
    export EMBERFS_MONITORING="${EMBERFS_MONITORING:-0}"
    export EMBERFS_PROMETHEUS_PORT="${EMBERFS_PROMETHEUS_PORT:-9090}"
    export EMBERFS_PROMETHEUS_IMAGE="${EMBERFS_PROMETHEUS_IMAGE:-emberfs-prometheus:latest}"
}

save_settings() {
    mkdir -p "$(dirname "$STATE_FILE")"
    {
        echo "EMBERFS_IMAGE=$EMBERFS_IMAGE"
        echo "EMBERFS_META_PORT=$EMBERFS_META_PORT"
        echo "EMBERFS_ADMIN_PORT=$EMBERFS_ADMIN_PORT"
        echo "EMBERFS_NET_PREFIX=$EMBERFS_NET_PREFIX"
        echo "EMBERFS_TARGETS=$EMBERFS_TARGETS"
        echo "EMBERFS_INSECURE=${EMBERFS_INSECURE:-0}"
        echo "EMBERFS_HA=$EMBERFS_HA"
        if ha; then
            echo "EMBERFS_META2_PORT=$EMBERFS_META2_PORT"
            echo "EMBERFS_ADMIN2_PORT=$EMBERFS_ADMIN2_PORT"
        fi
        echo "EMBERFS_MONITORING=$EMBERFS_MONITORING"
        if monitoring; then
            echo "EMBERFS_PROMETHEUS_PORT=$EMBERFS_PROMETHEUS_PORT"
            echo "EMBERFS_PROMETHEUS_IMAGE=$EMBERFS_PROMETHEUS_IMAGE"
        fi
    } >"$STATE_FILE"
}

# ---------------------------------------------------------------- build

# The folders of the emberfs packages (pyproject.toml's package-dir; a test keeps them equal),
# used unquoted: one word each.
PACKAGE_DIRS="common proto metaserver storageserver client kvcache cli"

# Files that make the emberfs wheel (tracked or new, not ignored).
source_files() {
    local f
    if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git -C "$ROOT" ls-files -co --exclude-standard -z -- \
            pyproject.toml README.md LICENSE $PACKAGE_DIRS
    else
        (cd "$ROOT" && find pyproject.toml README.md LICENSE $PACKAGE_DIRS \
            -type f ! -name '*.pyc' -print0 2>/dev/null)
    fi | while IFS= read -r -d '' f; do
        [[ -f "$ROOT/$f" ]] && printf '%s\0' "$f"
    done
}

build_wheels() {
    local wheels="$CACHE/wheels" src key pyver
    pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    if [[ "$BASE_IMAGE" == "emberfs-base:bookworm" || "$BASE_IMAGE" == python:3.11* ]] \
        && [[ "$pyver" != "3.11" ]]; then
        die "the image runs Python 3.11 but $PYTHON is $pyver; set EMBERFS_PYTHON to a Python 3.11"
    fi
    mkdir -p "$wheels/deps" "$wheels/emberfs"
    src="$(mktemp -d /tmp/emberfs-src.XXXXXX)"
    CLEANUP+=("$src")
    # Build from a clean copy: no stale build/ tree can leak into the wheel.
    (cd "$ROOT" && source_files | tar -cf - --null -T -) | tar -C "$src" -xf -

    key="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
    if [[ "$(cat "$wheels/deps/.key" 2>/dev/null)" != "$key" ]]; then
        log "building dependency wheels"
        rm -f "$wheels"/deps/*.whl "$wheels/deps/.key"
        "$PYTHON" -m pip wheel -q --no-build-isolation --wheel-dir "$wheels/deps" "$src[server]"
        rm -f "$wheels"/deps/emberfs-*.whl
        echo "$key" >"$wheels/deps/.key"
    else
        log "dependency wheels cached"
    fi

    key="$(cd "$src" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
    if [[ "$(cat "$wheels/emberfs/.key" 2>/dev/null)" != "$key" ]]; then
        log "building the emberfs wheel"
        rm -f "$wheels"/emberfs/*.whl "$wheels/emberfs/.key"
        "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation --wheel-dir "$wheels/emberfs" "$src"
        echo "$key" >"$wheels/emberfs/.key"
    else
        log "emberfs wheel cached"
    fi
}

# The Prometheus image (deploy/Dockerfile.prometheus): Debian's prometheus package on
# the base image, from the Debian archive of this machine's apt sources when the base
# is the local one. Docker's layer cache keeps it until the base or the recipe changes.
build_prometheus() {
    local mirror="" out
    if [[ "$BASE_IMAGE" == "emberfs-base:bookworm" ]]; then
        mirror="$("$DEPLOY_DIR/base-image.sh" --print-mirror)"
    fi
    out="$(mktemp /tmp/emberfs-build.XXXXXX)"
    CLEANUP+=("$out")
    if ! docker build --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "APT_MIRROR=$mirror" \
        -t "$EMBERFS_PROMETHEUS_IMAGE" - <"$DEPLOY_DIR/Dockerfile.prometheus" >"$out" 2>&1; then
        tail -n 40 "$out" >&2
        die "docker build of the Prometheus image failed"
    fi
    docker image prune -f --filter "label=org.emberfs.image=prometheus" >/dev/null
}

cmd_build() {
    local t0 t held=$LOCKED
    load_settings
    lock
    t0=$(date +%s)
    if [[ "$BASE_IMAGE" == "emberfs-base:bookworm" ]]; then
        "$DEPLOY_DIR/base-image.sh" --image "$BASE_IMAGE"
    elif ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        log "base image $BASE_IMAGE is not present locally; docker build will try to pull it"
    fi
    t=$(date +%s); log "base image ready ($((t - t0)) s)"
    build_wheels
    t=$(date +%s); log "wheels ready ($((t - t0)) s)"
    local out
    out="$(mktemp /tmp/emberfs-build.XXXXXX)"
    CLEANUP+=("$out")
    if ! docker build -f "$DEPLOY_DIR/Dockerfile" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        -t "$EMBERFS_IMAGE" "$ROOT" >"$out" 2>&1; then
        tail -n 40 "$out" >&2
        die "docker build failed"
    fi
    # Earlier builds, now untagged: server images, and install stages but the newest
    # (it holds the cached dependency layer of the next build).
    docker image prune -f --filter "label=org.emberfs.image=server" >/dev/null
    docker images -q --no-trunc --filter dangling=true --filter "label=org.emberfs.image=install" \
        | tail -n +2 | xargs -r docker rmi >/dev/null 2>&1 || true
    t=$(date +%s)
    log "image $EMBERFS_IMAGE ready ($((t - t0)) s, $(docker image inspect -f '{{.Size}}' "$EMBERFS_IMAGE") bytes)"
    if monitoring; then
        build_prometheus
        t=$(date +%s)
        log "image $EMBERFS_PROMETHEUS_IMAGE ready ($((t - t0)) s)"
    fi
    [[ "$held" -eq 1 ]] || unlock
}

# ---------------------------------------------------------------- security

# The cluster key and the admin token: made on the first 'up' of a project and
# kept until 'down'. EMBERFS_ADMIN_TOKEN, when set, is the admin token instead.
# EMBERFS_INSECURE=1 runs the servers without authentication.
ensure_secrets() {
    export EMBERFS_CLUSTER_KEY="$SECRETS_DIR/cluster.key"
    export EMBERFS_INSECURE="${EMBERFS_INSECURE:-0}"
    (umask 077 && mkdir -p "$SECRETS_DIR")
    chmod 700 "$SECRETS_DIR"
    if [[ ! -s "$EMBERFS_CLUSTER_KEY" ]]; then
        "$PYTHON" -c 'import secrets; print(secrets.token_hex(32))' >"$EMBERFS_CLUSTER_KEY.tmp"
        mv "$EMBERFS_CLUSTER_KEY.tmp" "$EMBERFS_CLUSTER_KEY"
    fi
    # the servers run as an unprivileged user of the image: the file is readable, the
    # directory above it is not
    chmod 644 "$EMBERFS_CLUSTER_KEY"
    if [[ -z "${EMBERFS_ADMIN_TOKEN:-}" ]]; then
        if [[ ! -s "$SECRETS_DIR/admin.token" ]]; then
            (umask 077 && "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(32))' \
                >"$SECRETS_DIR/admin.token")
        fi
        EMBERFS_ADMIN_TOKEN="$(cat "$SECRETS_DIR/admin.token")"
    fi
    export EMBERFS_ADMIN_TOKEN
}

# The client config of this cluster, in the secrets directory and (unless
# EMBERFS_CLIENT_CONFIG=none) where clients on this host look for it.
write_client_config() {
    local target="${EMBERFS_CLIENT_CONFIG:-${EMBERFS_CONFIG:-${XDG_CONFIG_HOME:-$HOME/.config}/emberfs/client.toml}}"
    (
        umask 077
        {
            echo "meta = \"$(meta_addresses)\""
            echo "admin = \"$(admin_url)\""
            if [[ "$EMBERFS_INSECURE" != 1 ]]; then
                echo "token = \"$EMBERFS_ADMIN_TOKEN\""
                echo "admin_token = \"$EMBERFS_ADMIN_TOKEN\""
            fi
        } >"$SECRETS_DIR/client.toml"
        if [[ "$target" != none ]]; then
            mkdir -p "$(dirname "$target")"
            cp "$SECRETS_DIR/client.toml" "$target"
        fi
    )
    CLIENT_CONFIG="$target"
}

# ---------------------------------------------------------------- run

# The admin API of the (first) metaserver, and of every metaserver as "service=URL".
admin_url() { echo "http://127.0.0.1:$EMBERFS_ADMIN_PORT"; }
admin_urls() { metaservers | awk '{ print $1 "=http://127.0.0.1:" $3 }'; }

# The metaservers' gRPC addresses on this host, comma-separated (what clients are given).
meta_addresses() { metaservers | awk '{ printf "%s127.0.0.1:%s", (NR > 1 ? "," : ""), $2 }'; }

# Exit status 0 when the admin API lists at least $1 targets, all serving.
# Prints a one-line summary either way. The first metaserver that answers tells.
targets_serving() {
    URLS="$(admin_urls)" WANT="$1" "$PYTHON" - <<'EOF'
import json, os, sys, urllib.request
errors = []
for entry in os.environ["URLS"].split():
    name, url = entry.split("=", 1)
    try:
        with urllib.request.urlopen(url + "/api/v1/targets", timeout=3) as r:
            body = json.load(r)
        break
    except Exception as exc:  # not up yet, or stopped
        errors.append(f"{name}: {exc}")
else:
    print(f"admin API: {'; '.join(errors)}")
    sys.exit(1)
targets = body.get("targets", body) if isinstance(body, dict) else body
states = [str(t.get("state", "")).lower() for t in targets]
print(f"targets: {len(states)}, serving: {states.count('serving')}")
sys.exit(0 if len(states) >= int(os.environ["WANT"]) and set(states) == {"serving"} else 1)
EOF
}

# Exit status 0 when one metaserver leads and every other that answers names it
# (with "all" as $1: and every metaserver answers). Prints a one-line summary either way.
leader_known() {
    URLS="$(admin_urls)" ALL="${1:-}" "$PYTHON" - <<'EOF'
import json, os, sys, urllib.request
views, down = {}, []
for entry in os.environ["URLS"].split():
    name, url = entry.split("=", 1)
    try:
        with urllib.request.urlopen(url + "/api/v1/leader", timeout=3) as r:
            views[name] = json.load(r)
    except Exception as exc:
        down.append(f"{name}: {exc}")
leading = [name for name, v in views.items() if v.get("leading")]
named = {(v.get("leader") or {}).get("id") for v in views.values()}
ok = len(leading) == 1 and named == {views[leading[0]]["id"]}
ok = ok and not (os.environ["ALL"] == "all" and down)
summary = "leader: none"
if leading:
    v = views[leading[0]]
    summary = f"leader: {leading[0]} (term {v.get('term')})"
followers = [name for name in views if name not in leading]
if followers:
    summary += f", following: {' '.join(followers)}"
if down:
    summary += f", not answering: {'; '.join(down)}"
print(summary)
sys.exit(0 if ok else 1)
EOF
}

# Health of every service container, one "service status" line each.
service_health() {
    local svc id status
    for svc in $(services); do
        id="$(compose ps -q "$svc" 2>/dev/null || true)"
        if [[ -z "$id" ]]; then
            status="missing"
        else
            status="$(docker inspect -f '{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id")"
        fi
        echo "$svc $status"
    done
}

wait_ready() {
    local deadline=$((SECONDS + UP_TIMEOUT)) health summary want
    want=$((${#STORAGE_SERVICES[@]} * EMBERFS_TARGETS))
    while :; do
        health="$(service_health)"
        if ! grep -qv ' running/healthy$' <<<"$health"; then
            if summary="$(targets_serving "$want")"; then
                if ! ha; then
                    log "$summary"
                    return 0
                fi
                local leader
                if leader="$(leader_known all)"; then
                    log "$summary; $leader"
                    return 0
                fi
                summary="$summary; $leader"
            fi
        else
            summary="$(tr '\n' ' ' <<<"$health")"
        fi
        if grep -qE ' (exited|dead)/' <<<"$health"; then
            compose logs --tail 30 >&2 || true
            die "a container stopped: $(tr '\n' ' ' <<<"$health")"
        fi
        if ((SECONDS >= deadline)); then
            compose logs --tail 30 >&2 || true
            die "cluster not ready after $UP_TIMEOUT s: $summary"
        fi
        sleep 1
    done
}

cmd_up() {
    local want_ha="${EMBERFS_HA:-}" saved_ha
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --ha) want_ha=1 ;;
            --monitoring) export EMBERFS_MONITORING=1 ;;
            *) die "up: unknown argument $1 (see --help)" ;;
        esac
        shift
    done
    # A project keeps its profile until 'down': the HA one has other services and stores.
    saved_ha="$(sed -n 's/^EMBERFS_HA=//p' "$STATE_FILE" 2>/dev/null || true)"
    if [[ -f "$STATE_FILE" && -n "$want_ha" && "$want_ha" != "${saved_ha:-0}" ]]; then
        die "project $PROJECT runs $([[ "${saved_ha:-0}" == 1 ]] && echo with || echo without)" \
            "the HA profile; take it down first ($0 down)"
    fi
    if [[ -n "$want_ha" ]]; then export EMBERFS_HA="$want_ha"; fi
    load_settings
    lock
    if [[ -z "${EMBERFS_NET_PREFIX:-}" ]]; then
        EMBERFS_NET_PREFIX="$(pick_net_prefix)"
        export EMBERFS_NET_PREFIX
    fi
    save_settings
    ensure_secrets
    cmd_build
    if ha && ! docker run --rm --entrypoint etcd "$EMBERFS_IMAGE" --version >/dev/null 2>&1; then
        die "the HA profile runs etcd from $EMBERFS_IMAGE, which has none (base $BASE_IMAGE);" \
            "the base deploy/base-image.sh builds has it"
    fi
    local t0=$SECONDS
    log "starting project $PROJECT on ${EMBERFS_NET_PREFIX}.0/24$(if ha; then echo ' (HA profile)'; fi)"
    if ! compose up -d --no-build --quiet-pull 2>&1 | sed 's/^/[compose] /' >&2; then
        die "compose up failed"
    fi
    unlock
    wait_ready
    write_client_config
    log "cluster ready in $((SECONDS - t0)) s"
    local security="admin token $EMBERFS_ADMIN_TOKEN (acts as root)
  cluster key      $EMBERFS_CLUSTER_KEY"
    if [[ "$EMBERFS_INSECURE" == 1 ]]; then
        security="NONE (EMBERFS_INSECURE=1): anyone who reaches a port may do anything"
    fi
    local servers svc port aport octet prometheus=""
    if monitoring; then
        prometheus="
  prometheus       http://127.0.0.1:$EMBERFS_PROMETHEUS_PORT/  (in the cluster network: ${EMBERFS_NET_PREFIX}.50:9090), its HTTP API: /api/v1/alerts
                   Grafana dashboard to import: $DEPLOY_DIR/monitoring/emberfs-dashboard.json"
    fi
    if ha; then
        servers="  etcd             ${EMBERFS_NET_PREFIX}.31:2379 (etcd1)  ${EMBERFS_NET_PREFIX}.32:2379 (etcd2)  ${EMBERFS_NET_PREFIX}.33:2379 (etcd3)"
        while read -r svc port aport octet; do
            servers+="
  $(printf '%-16s' "$svc") gRPC 127.0.0.1:$port, admin API http://127.0.0.1:$aport/  (in the cluster network: ${EMBERFS_NET_PREFIX}.$octet:9400)"
        done < <(metaservers)
        servers+="
  $(leader_known || true); either admin API serves the whole API (/docs, /api/v1/leader)"
    else
        servers="  metaserver gRPC  127.0.0.1:$EMBERFS_META_PORT  (in the cluster network: ${EMBERFS_NET_PREFIX}.10:9400)
  admin API        $(admin_url)/  (/docs, /api/v1/targets, /metrics)"
    fi
    cat <<EOF
EmberFS cluster '$PROJECT' is up.
$servers
  storage servers  ${EMBERFS_NET_PREFIX}.11:9510  ${EMBERFS_NET_PREFIX}.12:9520  ${EMBERFS_NET_PREFIX}.13:9530
  client           EmberFS mounted at /mnt/emberfs: $0 compose exec client ls -l /mnt/emberfs
  security         $security
  client config    $CLIENT_CONFIG  (also $SECRETS_DIR/client.toml)$prometheus
Use it from this host (the client config holds the address and the token):
  emberfs put ./file /file && emberfs ls /
  python -c "import fsspec; print(fsspec.filesystem('emberfs').ls('/'))"
Stop it and remove its data:  $0 down
EOF
}

cmd_down() {
    load_settings
    export EMBERFS_NET_PREFIX="${EMBERFS_NET_PREFIX:-172.29.83}"
    compose down -v --remove-orphans --timeout 10 2>&1 | sed 's/^/[compose] /' >&2
    rm -f "$STATE_FILE"
    rm -rf "$SECRETS_DIR"
}

cmd_status() {
    load_settings
    export EMBERFS_NET_PREFIX="${EMBERFS_NET_PREFIX:-172.29.83}"
    compose ps
    service_health
    targets_serving $((${#STORAGE_SERVICES[@]} * EMBERFS_TARGETS)) || true
    if ha; then leader_known || true; fi
}

cmd_compose() {
    load_settings
    export EMBERFS_NET_PREFIX="${EMBERFS_NET_PREFIX:-172.29.83}"
    compose "$@"
}

cmd_env() {
    load_settings
    echo "EMBERFS_COMPOSE_PROJECT=$PROJECT"
    echo "EMBERFS_META=$(meta_addresses)"
    echo "EMBERFS_ADMIN_URL=$(admin_url)"
    if monitoring; then echo "EMBERFS_PROMETHEUS_URL=http://127.0.0.1:$EMBERFS_PROMETHEUS_PORT"; fi
    echo "EMBERFS_CLUSTER_KEY=$SECRETS_DIR/cluster.key"
    if [[ -s "$SECRETS_DIR/admin.token" ]]; then
        echo "EMBERFS_ADMIN_TOKEN=$(cat "$SECRETS_DIR/admin.token")"
    fi
    cat "$STATE_FILE" 2>/dev/null || true
}

case "${1:-}" in
    build) shift; cmd_build "$@" ;;
    up) shift; cmd_up "$@" ;;
    down) shift; cmd_down "$@" ;;
    status) shift; cmd_status "$@" ;;
    logs) shift; cmd_compose logs "$@" ;;
    compose) shift; cmd_compose "$@" ;;
    env) shift; cmd_env "$@" ;;
    -h|--help|help) usage ;;
    *) usage >&2; exit 2 ;;
esac
