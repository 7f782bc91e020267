#!/usr/bin/env bash
# System packages the test suite uses beyond Python wheels: a headless browser for the dashboard
# test and debootstrap for the container base image. Installs them with apt-get when running as
# root on Debian; elsewhere it says what is missing and the tests that need them skip.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test-deps: installing ${need[*]}" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
    echo "test-deps: missing ${need[*]} (not root or no apt-get); the tests that need them will skip" >&2
fi
