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
# Bump when the root file system below changes, so cached tarballs and images are rebuilt.
RECIPE=1
# shellcheck source=scripts/debootstrap-image.sh
. "$(dirname "$0")/debootstrap-image.sh"
TARBALL=$CACHE/debian-$SUITE-sshd-r$RECIPE.tar.gz

NAME=build-ssh-test-image
LABEL=pai.sshd.recipe
# shellcheck source=scripts/image-recipe.sh
. "$(dirname "$0")/image-recipe.sh"

make_tarball() {
    [ "$(id -u)" = 0 ] || die "debootstrap needs root (or put a tarball at $TARBALL)"
    command -v debootstrap >/dev/null 2>&1 ||
        die "debootstrap is missing: install it (on Debian/Ubuntu: sudo apt-get install debootstrap)."
    debootstrap_rootfs debootstrap-sshd.log --include=openssh-server
    # No host keys in the image: each container makes its own.
    rm -f "$ROOTFS"/etc/ssh/ssh_host_*
    pack_rootfs
}

[ -s "$TARBALL" ] || make_tarball

import_rootfs "Debian $SUITE minbase with openssh-server by scripts/build-ssh-test-image.sh"
docker run --rm --network host "$IMAGE" sh -c 'test -x /usr/sbin/sshd && command -v ssh-keygen' \
    >/dev/null || die "$IMAGE was imported but has no sshd"
say "$IMAGE is ready"
