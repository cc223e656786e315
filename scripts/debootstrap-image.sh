# Sourced by scripts/build-base-image.sh and scripts/build-ssh-test-image.sh:
# where their debootstrapped root file systems come from and are cached, and
# the steps of such an image, which differ between them only in what they put
# in it. The steps use IMAGE, TARBALL, LABEL and RECIPE, and image-recipe.sh's
# say and die, as the scripts set them.
# shellcheck shell=bash

SUITE=bookworm
MIRROR=${PAI_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${PAI_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pai}

# A minbase root file system of SUITE in a new folder, ROOTFS, under CACHE
# (removed if the script ends before pack_rootfs); debootstrap's log in
# CACHE/$1, its extra arguments $2...
debootstrap_rootfs() {
    local log=$CACHE/$1
    shift
    mkdir -p "$CACHE"
    ROOTFS=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    # shellcheck disable=SC2064  # expand now: the trap must remove this directory
    trap "rm -rf '$ROOTFS'" EXIT
    say "debootstrap --variant=minbase ${*:+$* }$SUITE from $MIRROR (a few minutes; cached in $CACHE)"
    debootstrap --variant=minbase "$@" "$SUITE" "$ROOTFS" "$MIRROR" >"$log" 2>&1 || {
        tail -n 20 "$log" >&2
        die "debootstrap failed (log above, full log in $log)"
    }
}

# ROOTFS without the package lists, caches, logs and temporary files no image
# keeps, packed into TARBALL (whole or not at all), then removed.
pack_rootfs() {
    rm -rf "${ROOTFS:?}"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
        "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/log/*.log "$ROOTFS"/tmp/*
    tar --numeric-owner -C "$ROOTFS" -czf "$TARBALL.partial" .
    mv -f "$TARBALL.partial" "$TARBALL"
    rm -rf "$ROOTFS"
    trap - EXIT
    say "root file system cached in $TARBALL ($(du -h "$TARBALL" | cut -f1))"
}

# TARBALL imported as IMAGE, running bash, labelled with its RECIPE; $1 says
# what the image is (docker import's message).
import_rootfs() {
    say "importing $IMAGE from $TARBALL"
    docker import \
        --change 'CMD ["/bin/bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
        --change "LABEL $LABEL=$RECIPE" \
        --message "$1" \
        "$TARBALL" "$IMAGE" >/dev/null
}
