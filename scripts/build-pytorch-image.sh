#!/usr/bin/env bash
# Build pai-test/pytorch:latest without a registry: the Debian base of
# scripts/build-base-image.sh, Debian's Python, the CPU build of PyTorch, what
# the examples need (scikit-learn for its bundled digits dataset, Jupyter for
# the notebook example: deploy/pytorch/requirements.txt) and the examples'
# code (examples/pytorch/ at /opt/pai-examples). examples/pytorch-*.json and
# the tests that train (tests/e2e/test_training.py) run it.
#
# PyTorch comes from a local wheel where this machine has one (pip's
# find-links: PIP_FIND_LINKS or pip's configuration, or PAI_TORCH_WHEEL),
# otherwise from PyTorch's CPU package index (PAI_TORCH_INDEX_URL); only a
# "+cpu" build is ever installed, never the multi-gigabyte CUDA one. The other
# packages come from the package index (PIP_INDEX_URL, default PyPI), trusting
# PAI_CA_BUNDLE as well (default: this machine's bundle) behind a
# TLS-inspecting proxy.
#
# Idempotent: an image of the current recipe (a digest of the Dockerfile, the
# requirements, the examples' code and the PyTorch version) is left alone, and
# Docker's layer cache keeps the installed packages when only an example changes.
#
# usage: scripts/build-pytorch-image.sh [IMAGE]     (default pai-test/pytorch:latest)
#   honours DOCKER_HOST, and PAI_DEBIAN_MIRROR / PAI_IMAGE_CACHE for the base image.
#   Exit status 0: the image is ready; otherwise the last line says why not.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${1:-pai-test/pytorch:latest}
BASE=pai-test/debian:bookworm
TORCH_VERSION=${PAI_TORCH_VERSION:-2.13.0}
TORCH_INDEX_URL=${PAI_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
CA_BUNDLE=${PAI_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
# Debian bookworm's Python is 3.11: the wheel must be for it and this machine.
WHEEL_GLOB="torch-$TORCH_VERSION+cpu-cp311-cp311-*$(uname -m).whl"

recipe() {
    {
        echo "torch $TORCH_VERSION"
        cat "$ROOT/deploy/pytorch/Dockerfile" "$ROOT/deploy/pytorch/requirements.txt"
        for file in "$ROOT"/examples/pytorch/*; do
            echo "$(basename "$file")"
            cat "$file"
        done
    } | sha256sum | cut -c1-16
}

NAME=build-pytorch-image
LABEL=pai.pytorch.recipe
RECIPE=$(recipe)
# shellcheck source=scripts/image-recipe.sh
. "$(dirname "$0")/image-recipe.sh"

# The local wheel, if any: PAI_TORCH_WHEEL, else pip's find-links folders.
find_wheel() {
    if [ -n "${PAI_TORCH_WHEEL:-}" ]; then
        [ -f "$PAI_TORCH_WHEEL" ] || die "PAI_TORCH_WHEEL=$PAI_TORCH_WHEEL is not a file"
        echo "$PAI_TORCH_WHEEL"
        return
    fi
    local links dir wheel
    links="${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true)"
    for dir in $links; do
        dir=${dir#file://}
        [ -d "$dir" ] || continue
        for wheel in "$dir"/$WHEEL_GLOB; do
            [ -f "$wheel" ] && { echo "$wheel"; return; }
        done
    done
}

bash "$ROOT/scripts/build-base-image.sh" "$BASE" || die "the base image $BASE could not be built"

context=$(mktemp -d "${TMPDIR:-/tmp}/pai-pytorch-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/wheels" "$context/examples"
cp "$ROOT/deploy/pytorch/Dockerfile" "$ROOT/deploy/pytorch/requirements.txt" "$context/"
cp "$ROOT"/examples/pytorch/* "$context/examples/"
wheel=$(find_wheel)
if [ -n "$wheel" ]; then
    say "PyTorch from the local wheel $wheel"
    # A hard link where the folders share a file system: the wheel is large.
    ln "$wheel" "$context/wheels/" 2>/dev/null || cp "$wheel" "$context/wheels/"
else
    say "no local PyTorch $TORCH_VERSION wheel ($WHEEL_GLOB): from $TORCH_INDEX_URL"
fi
if [ -s "$CA_BUNDLE" ]; then
    cp "$CA_BUNDLE" "$context/extra-ca.pem"
else
    : >"$context/extra-ca.pem"
fi

say "building $IMAGE (the first time a few minutes: PyTorch, scikit-learn, Jupyter)"
log=$context/build.log
if ! docker build --network host --tag "$IMAGE" --label "$LABEL=$RECIPE" \
    --build-arg "BASE_IMAGE=$BASE" --build-arg "TORCH_VERSION=$TORCH_VERSION" \
    --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL" \
    ${PIP_INDEX_URL:+--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL"} \
    "$context" >"$log" 2>&1; then
    tail -n 25 "$log" >&2
    die "docker build of $IMAGE failed (its output above)"
fi
docker run --rm --network host "$IMAGE" python3 -c \
    'import torch, sklearn; assert torch.__version__.endswith("+cpu"), torch.__version__' ||
    die "$IMAGE was built but cannot import torch and sklearn"
say "$IMAGE is ready ($(docker image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=iec))"
