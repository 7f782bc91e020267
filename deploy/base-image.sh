#!/usr/bin/env bash
# Build the local base image emberfs-base:bookworm from Debian packages.
#
# For machines whose Docker engine cannot pull from a registry: debootstrap
# makes a minimal Debian bookworm root file system with python3, python3-venv,
# etcd (etcd-server, etcd-client: the same image runs the etcd members of the
# HA cluster) and fuse3 (fusermount3 and libfuse3: `emberfs mount` in the
# compose cluster's client container), and `docker import` turns it into an
# image. The Debian mirror is read at run time from this machine's apt sources
# (one-line *.list files or deb822 *.sources files), so no mirror host is
# written anywhere in the repository.
#
# usage: deploy/base-image.sh [--force] [--image NAME] [--mirror URL]
#        deploy/base-image.sh --print-mirror   (the Debian archive it would use)
#
# The image is reused while it exists and was made by the same recipe (the
# suite, the packages and the build steps below, whose digest the image
# carries as the label org.emberfs.base-recipe); otherwise, or with --force,
# it is built again.
set -euo pipefail

IMAGE="${EMBERFS_BASE_IMAGE:-emberfs-base:bookworm}"
SUITE="bookworm"
PACKAGES="python3,python3-venv,ca-certificates,etcd-server,etcd-client,fuse3"
RECIPE_LABEL="org.emberfs.base-recipe"
FORCE=0
MIRROR=""
PRINT_MIRROR=0

# The comment block at the top of this file.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --force) FORCE=1 ;;
        --image) IMAGE="$2"; shift ;;
        --mirror) MIRROR="$2"; shift ;;
        --print-mirror) PRINT_MIRROR=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "base-image.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

log() { echo "[base-image] $*" >&2; }

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

# The root file system in $1, from the mirror $2 (its log in $3).
build_rootfs() {
    local rootfs="$1" mirror="$2" logfile="$3"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$mirror" \
        >"$logfile" 2>&1 || {
        tail -n 30 "$logfile" >&2
        echo "base-image.sh: debootstrap failed" >&2
        return 1
    }
    # Keep the image small: package lists and caches are not needed at run time.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
}

# Turn the root file system in $1 into the image $IMAGE, labelled with recipe $2.
import_rootfs() {
    tar -C "$1" -c . | docker import \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        --change "LABEL $RECIPE_LABEL=$2" \
        - "$IMAGE" >/dev/null
}

# The digest of what makes the image: the suite, the packages, the build steps
# (the function bodies, without comments), so that a changed recipe rebuilds it.
recipe() {
    { echo "$SUITE"; echo "$PACKAGES"; declare -f build_rootfs import_rootfs; } \
        | sha256sum | cut -d' ' -f1
}

if [[ "$PRINT_MIRROR" -eq 1 ]]; then
    MIRROR="${MIRROR:-$(find_mirror | head -n 1)}"
    [[ -n "$MIRROR" ]] || { echo "base-image.sh: no Debian $SUITE main archive in the apt sources" >&2; exit 1; }
    echo "$MIRROR"
    exit 0
fi

RECIPE="$(recipe)"
OLD_ID="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
if [[ -n "$OLD_ID" && "$FORCE" -eq 0 ]]; then
    have="$(docker image inspect -f "{{index .Config.Labels \"$RECIPE_LABEL\"}}" "$IMAGE" || true)"
    if [[ "$have" == "$RECIPE" ]]; then
        log "$IMAGE exists (use --force to rebuild)"
        exit 0
    fi
    log "$IMAGE was made by another recipe; building it again"
fi

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

start=$(date +%s)
log "debootstrap $SUITE ($PACKAGES) into $WORK/rootfs"
build_rootfs "$WORK/rootfs" "$MIRROR" "$WORK/debootstrap.log"
log "importing as $IMAGE"
import_rootfs "$WORK/rootfs" "$RECIPE"
# The image it replaces, unless an image built on it still needs it.
if [[ -n "$OLD_ID" && "$OLD_ID" != "$(docker image inspect -f '{{.Id}}' "$IMAGE")" ]]; then
    docker rmi "$OLD_ID" >/dev/null 2>&1 || true
fi
log "done in $(( $(date +%s) - start )) s: $(docker image inspect -f '{{.Size}}' "$IMAGE") bytes"
