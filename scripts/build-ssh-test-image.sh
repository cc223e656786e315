#!/usr/bin/env bash
# Build pai-test/sshd:latest without a registry: a Debian bookworm minbase root
# file system with openssh-server (debootstrap --include), imported with
# `docker import`. The SSH tests (tests/integration/test_ssh.py) start the
# image's sshd in a task, as a user's image with openssh-server would.
#
# Idempotent: an image of the current recipe is left alone, and the root file
# system tarball is kept in a cache directory, so a fresh Docker engine (as in
# every CI run) imports it in seconds instead of debootstrapping again.
# The image holds no SSH host keys: the launcher makes them (`ssh-keygen -A`)
# in each container, so two tasks never share one.
#
# usage: scripts/build-ssh-test-image.sh [IMAGE]      (default pai-test/sshd:latest)
#   honours DOCKER_HOST; PAI_DEBIAN_MIRROR (default http://deb.debian.org/debian);
#   PAI_IMAGE_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/pai); root is needed
#   to debootstrap when the tarball is not cached yet.
set -euo pipefail

IMAGE=${1:-pai-test/sshd:latest}
SUITE=bookworm
# Bump when the root file system below changes, so cached tarballs and images are rebuilt.
RECIPE=1
MIRROR=${PAI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${PAI_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pai}
TARBALL=$CACHE/debian-$SUITE-sshd-r$RECIPE.tar.gz

NAME=build-ssh-test-image
LABEL=pai.sshd.recipe
# shellcheck source=scripts/image-recipe.sh
. "$(dirname "$0")/image-recipe.sh"

make_tarball() {
    [ "$(id -u)" = 0 ] || die "debootstrap needs root (or put a tarball at $TARBALL)"
    command -v debootstrap >/dev/null 2>&1 ||
        die "debootstrap is missing: install it (on Debian/Ubuntu: sudo apt-get install debootstrap)."
    mkdir -p "$CACHE"
    local rootfs
    rootfs=$(mktemp -d "$CACHE/sshd-rootfs.XXXXXX")
    # shellcheck disable=SC2064  # expand now: the trap must remove this directory
    trap "rm -rf '$rootfs'" EXIT
    say "debootstrap --variant=minbase --include=openssh-server $SUITE from $MIRROR (cached in $CACHE)"
    debootstrap --variant=minbase --include=openssh-server "$SUITE" "$rootfs" "$MIRROR" \
        >"$CACHE/debootstrap-sshd.log" 2>&1 || {
        tail -n 20 "$CACHE/debootstrap-sshd.log" >&2
        die "debootstrap failed (log above, full log in $CACHE/debootstrap-sshd.log)"
    }
    # No host keys in the image (each container makes its own), no caches.
    rm -f "$rootfs"/etc/ssh/ssh_host_*
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log "$rootfs"/tmp/*
    tar --numeric-owner -C "$rootfs" -czf "$TARBALL.partial" .
    mv -f "$TARBALL.partial" "$TARBALL"
    rm -rf "$rootfs"
    trap - EXIT
    say "root file system cached in $TARBALL ($(du -h "$TARBALL" | cut -f1))"
}

[ -s "$TARBALL" ] || make_tarball

say "importing $IMAGE from $TARBALL"
docker import \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    --change "LABEL $LABEL=$RECIPE" \
    --message "Debian $SUITE minbase with openssh-server by scripts/build-ssh-test-image.sh" \
    "$TARBALL" "$IMAGE" >/dev/null
docker run --rm --network host "$IMAGE" sh -c 'test -x /usr/sbin/sshd && command -v ssh-keygen' \
    >/dev/null || die "$IMAGE was imported but has no sshd"
say "$IMAGE is ready"
