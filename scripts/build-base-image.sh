#!/usr/bin/env bash
# Build a Debian bookworm base image without a registry: debootstrap a minbase
# root file system and `docker import` it. The compose test builds pai's
# images FROM it (BASE_IMAGE build argument), since no registry is reachable
# here; real users build FROM python:3.11-slim and need none of this.
#
# Idempotent: an image of the current recipe is left alone, and the root file
# system tarball is kept in a cache directory, so a fresh Docker engine (as in
# every CI run) imports it in seconds instead of debootstrapping again.
#
# usage: scripts/build-base-image.sh [IMAGE]      (default pai-test/debian:bookworm)
#   honours DOCKER_HOST; PAI_DEBIAN_MIRROR (default http://deb.debian.org/debian);
#   PAI_IMAGE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/pai); root is needed
#   to debootstrap when the tarball is not cached yet.
set -euo pipefail

IMAGE=${1:-pai-test/debian:bookworm}
# Bump when the root file system below changes, so cached tarballs and images are rebuilt.
RECIPE=1
# shellcheck source=scripts/debootstrap-image.sh
. "$(dirname "$0")/debootstrap-image.sh"
TARBALL=$CACHE/debian-$SUITE-minbase-r$RECIPE.tar.gz

NAME=build-base-image
LABEL=pai.base.recipe
# shellcheck source=scripts/image-recipe.sh
. "$(dirname "$0")/image-recipe.sh"

ensure_debootstrap() {
    command -v debootstrap >/dev/null 2>&1 && return
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing Debian's debootstrap with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
            --no-install-recommends debootstrap >&2
        return
    fi
    die "debootstrap is missing: install it (on Debian/Ubuntu: sudo apt-get install debootstrap)."
}

make_tarball() {
    [ "$(id -u)" = 0 ] || die "debootstrap needs root (or put a tarball at $TARBALL)"
    ensure_debootstrap
    debootstrap_rootfs debootstrap.log
    cat >"$ROOTFS/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb ${MIRROR%/debian}/debian-security $SUITE-security main
EOF
    # As Debian's official images: no recommends, no caches kept in layers.
    cat >"$ROOTFS/etc/apt/apt.conf.d/90pai-image" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
EOF
    pack_rootfs
}

[ -s "$TARBALL" ] || make_tarball

import_rootfs "Debian $SUITE minbase by scripts/build-base-image.sh"
docker run --rm --network host "$IMAGE" sh -c 'test -x /usr/bin/apt-get' ||
    die "$IMAGE was imported but has no apt-get"
say "$IMAGE is ready"
