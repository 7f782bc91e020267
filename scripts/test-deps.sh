#!/usr/bin/env bash
# System packages the test suite uses beyond Python wheels: a headless browser for the dashboard
# test, debootstrap for the container base image and the etcd server for the metadata store's
# etcd engine and the tests with several metaservers. Installs them with apt-get when running as
# root on Debian; elsewhere it says what is missing and the tests that need them skip.
# Then the inference engines of tests/engines.txt, with pip and without their dependency trees.
#
# With EMBERFS_REQUIRE_ALL_TESTS set (as .ci/run does) nothing may be left out: the script exits
# non-zero when it cannot install what is missing, and when the Docker engine the container tests
# need (which it does not install) is not reachable.
set -euo pipefail
require_all=0
if [ -n "${EMBERFS_REQUIRE_ALL_TESTS:-}" ] && [ "${EMBERFS_REQUIRE_ALL_TESTS}" != 0 ]; then
    require_all=1
fi

missing() {
    local need=()
    command -v chromium >/dev/null 2>&1 || need+=(chromium)
    [ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
    command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
    command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
    command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
    echo "${need[@]}"
}

docker_problem() {
    if ! command -v docker >/dev/null 2>&1; then
        echo "the docker command is not installed"
    elif ! docker info >/dev/null 2>&1; then
        echo "the Docker engine is not reachable (docker info failed)"
    elif ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
        echo "neither 'docker compose' nor 'docker-compose' is installed"
    fi
}

read -r -a need <<<"$(missing)"
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test-deps: installing ${need[*]}" >&2
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
        read -r -a need <<<"$(missing)"
        if [ ${#need[@]} -gt 0 ]; then
            echo "test-deps: still missing after apt-get install: ${need[*]}" >&2
            exit 1
        fi
    elif [ "$require_all" = 1 ]; then
        echo "test-deps: missing ${need[*]} and cannot install them (not root or no apt-get);" \
            "EMBERFS_REQUIRE_ALL_TESTS is set, so the tests that need them may not skip" >&2
        exit 1
    else
        echo "test-deps: missing ${need[*]} (not root or no apt-get); the tests that need them will skip" >&2
    fi
fi
if [ "$require_all" = 1 ]; then
    problem="$(docker_problem)"
    if [ -n "$problem" ]; then
        echo "test-deps: $problem; EMBERFS_REQUIRE_ALL_TESTS is set, so the container tests" \
            "(tests/deploy) may not skip" >&2
        exit 1
    fi
fi

engines="${BASH_SOURCE[0]%/*}/../tests/engines.txt"
if ! command -v python >/dev/null 2>&1 || ! python -m pip install -q --no-deps -r "$engines"; then
    if [ "$require_all" = 1 ]; then
        echo "test-deps: could not install the engines of tests/engines.txt;" \
            "EMBERFS_REQUIRE_ALL_TESTS is set, so the KV cache engine tests may not skip" >&2
        exit 1
    fi
    echo "test-deps: could not install the engines of tests/engines.txt; their tests will skip" >&2
fi
