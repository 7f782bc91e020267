#!/usr/bin/env bash
# Build the local base image emberfs-base:bookworm from Debian packages.
#
# For machines whose Docker engine cannot pull from a registry: debootstrap
# makes a minimal Debian bookworm root file system with python3 and
# python3-venv, and `docker import` turns it into an image. The Debian mirror
# is read at run time from this machine's apt sources (one-line *.list files or
# deb822 *.sources files), so no mirror host is written anywhere in the
# repository.
#
# usage: deploy/base-image.sh [--force] [--image NAME] [--mirror URL]
#
# The image is reused when it already exists, unless --force is given.
set -euo pipefail

IMAGE="${EMBERFS_BASE_IMAGE:-emberfs-base:bookworm}"
SUITE="bookworm"
FORCE=0
MIRROR=""

# The comment block at the top of this file.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --force) FORCE=1 ;;
        --image) IMAGE="$2"; shift ;;
        --mirror) MIRROR="$2"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "base-image.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

log() { echo "[base-image] $*" >&2; }

if [[ "$FORCE" -eq 0 ]] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "$IMAGE exists (use --force to rebuild)"
    exit 0
fi

# Print the first Debian main archive URI found in the apt sources, or nothing.
# A Debian main archive serves the suite "bookworm" (not bookworm-security or
# bookworm-updates) with the component "main".
find_mirror() {
    local f
    shopt -s nullglob
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        # deb [options] URI SUITE COMPONENT...
        awk -v suite="$SUITE" '
            /^[[:space:]]*deb[[:space:]]/ {
                i = 2
                if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                uri = $i; s = $(i + 1)
                if (s != suite) next
                for (j = i + 2; j <= NF; j++) if ($j == "main") { print uri; exit }
            }' "$f" | head -n 1
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        # deb822 stanzas separated by blank lines.
        awk -v suite="$SUITE" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") \
                    && (" " comps " ") ~ / main /) {
                    split(uris, u, " "); print u[1]; found = 1; exit
                }
                types = ""; uris = ""; suites = ""; comps = ""
            }
            /^[[:space:]]*#/ { next }
            /^[[:space:]]*$/ { flush(); next }
            {
                key = $1; sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
                if (key == "Types") types = $0
                else if (key == "URIs") uris = $0
                else if (key == "Suites") suites = $0
                else if (key == "Components") comps = $0
            }
            END { if (!found) flush() }' "$f" | head -n 1
    done
    shopt -u nullglob
}

if [[ -z "$MIRROR" ]]; then
    MIRROR="$(find_mirror | head -n 1)"
fi
if [[ -z "$MIRROR" ]]; then
    echo "base-image.sh: no Debian $SUITE main archive found in /etc/apt/sources.list" \
        "or /etc/apt/sources.list.d/; pass --mirror URL" >&2
    exit 1
fi
log "Debian mirror from apt sources: $MIRROR"

if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

WORK="$(mktemp -d /tmp/emberfs-rootfs.XXXXXX)"
cleanup() { rm -rf --one-file-system "$WORK"; }
trap cleanup EXIT
ROOTFS="$WORK/rootfs"

start=$(date +%s)
log "debootstrap $SUITE into $ROOTFS"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
    tail -n 30 "$WORK/debootstrap.log" >&2
    echo "base-image.sh: debootstrap failed" >&2
    exit 1
}
# Keep the image small: package lists and caches are not needed at run time.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
    "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/*
log "importing as $IMAGE"
tar -C "$ROOTFS" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    - "$IMAGE" >/dev/null
log "done in $(( $(date +%s) - start )) s: $(docker image inspect -f '{{.Size}}' "$IMAGE") bytes"
