#!/usr/bin/env bash
# What `docker compose up` needs on a machine that reaches no Docker registry
# (this repository's CI): every image the compose file would pull is built
# locally from Debian's packages instead, and docker-compose itself is
# installed from Debian when missing.
#
#   pai-test/debian:bookworm     debootstrap'd base (scripts/build-base-image.sh),
#                                the BASE_IMAGE of pai's own image
#   pai-test/redis:compose       Debian's redis-server         (REDIS_IMAGE)
#   pai-test/prometheus:compose  Debian's prometheus           (PROMETHEUS_IMAGE)
#   build/extra-ca.pem           this machine's CA bundle, for pip inside the build (EXTRA_CA)
#
# Grafana is not packaged by Debian: the `dashboards` profile needs its upstream image.
# The compose variables that select these are printed (or written to ENV_FILE).
# Idempotent: existing images are kept (Docker's layer cache), so a second run
# takes seconds.
#
# usage: scripts/compose-offline-images.sh [ENV_FILE]      (honours DOCKER_HOST)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE=pai-test/debian:bookworm
REDIS=pai-test/redis:compose
PROMETHEUS=pai-test/prometheus:compose
CA_BUNDLE=${PAI_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

say() { echo "compose-offline-images: $*" >&2; }
die() { echo "compose-offline-images: $*" >&2; exit 1; }

ensure_compose() {
    if docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; then
        return
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "no Docker Compose: installing Debian's docker-compose (1.29) with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
            --no-install-recommends docker-compose >&2
        return
    fi
    die "Docker Compose is missing: install the compose plugin or Debian's docker-compose."
}

# build IMAGE DOCKERFILE: a stand-in image FROM the debootstrap'd base.
build() {
    say "building $1 from $2"
    local log
    if ! log=$(docker build --quiet --network host --tag "$1" --file "$ROOT/$2" \
        --build-arg "BASE_IMAGE=$BASE" "$ROOT/deploy/compose" 2>&1 >/dev/null); then
        printf '%s\n' "$log" >&2
        die "building $1 failed (output above)"
    fi
}

ensure_compose
bash "$ROOT/scripts/build-base-image.sh" "$BASE"
build "$REDIS" deploy/compose/redis.Dockerfile
build "$PROMETHEUS" deploy/compose/prometheus.Dockerfile

extra_ca=deploy/image/no-extra-ca.pem
if [ -s "$CA_BUNDLE" ]; then
    mkdir -p "$ROOT/build"
    cp "$CA_BUNDLE" "$ROOT/build/extra-ca.pem"
    extra_ca=build/extra-ca.pem
fi

settings="BASE_IMAGE=$BASE
EXTRA_CA=$extra_ca
REDIS_IMAGE=$REDIS
PROMETHEUS_IMAGE=$PROMETHEUS"
if [ -n "${1:-}" ]; then
    printf '%s\n' "$settings" >"$1"
    say "compose settings written to $1"
else
    printf '%s\n' "$settings"
fi
