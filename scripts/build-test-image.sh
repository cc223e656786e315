#!/usr/bin/env bash
# Build the local image pai-test/busybox:latest without a registry: a rootfs
# holding Debian's static busybox with a symlink per applet, imported with
# `docker import`. Tests, examples/ and `make up` use it. Idempotent: an image
# of the current recipe version is left alone.
#
# usage: scripts/build-test-image.sh [IMAGE]   (honours DOCKER_HOST; PAI_BUSYBOX=path overrides)
set -euo pipefail

IMAGE=${1:-pai-test/busybox:latest}
# Bump when the rootfs below changes, so existing images get rebuilt.
RECIPE=1
# Applets the tests rely on; the build fails if this busybox lacks one.
REQUIRED_APPLETS="sh echo env sleep cat ls mkdir touch test [ printf nc wget grep sed true false
seq hostname head tail wc kill date yes awk id rm cut tr sort"

NAME=build-test-image
LABEL=pai.test.recipe
# shellcheck source=scripts/image-recipe.sh
. "$(dirname "$0")/image-recipe.sh"

is_static() { [ -x "$1" ] && ! ldd "$1" >/dev/null 2>&1; }

find_busybox() {
    if [ -n "${PAI_BUSYBOX:-}" ]; then
        is_static "$PAI_BUSYBOX" || die "PAI_BUSYBOX=$PAI_BUSYBOX is not a static executable"
        echo "$PAI_BUSYBOX"
        return
    fi
    if ! dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q 'ok installed'; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            say "installing Debian's busybox-static with apt-get"
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
                --no-install-recommends busybox-static >&2
        fi
    fi
    local candidate
    for candidate in /bin/busybox /usr/bin/busybox; do
        if is_static "$candidate"; then
            echo "$candidate"
            return
        fi
    done
    die "no static busybox found: install it (on Debian/Ubuntu: sudo apt-get install busybox-static) or set PAI_BUSYBOX=/path/to/static/busybox."
}

busybox=$(find_busybox)
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT

applets=$("$busybox" --list)
for applet in $REQUIRED_APPLETS; do
    grep -qxF -- "$applet" <<<"$applets" || die "$busybox has no '$applet' applet"
done

mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,etc,root,home,proc,sys,dev,tmp,var/tmp,work}
chmod 1777 "$rootfs/tmp" "$rootfs/var/tmp"
chmod 700 "$rootfs/root"
cp "$busybox" "$rootfs/bin/busybox"
while read -r applet; do
    [ "$applet" = busybox ] || ln -s busybox "$rootfs/bin/$applet"
done <<<"$applets"
# For scripts that start with #!/usr/bin/env sh.
ln -s ../../bin/busybox "$rootfs/usr/bin/env"
cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF

say "importing $IMAGE from $busybox"
tar --numeric-owner --owner=0 --group=0 -C "$rootfs" -cf - . |
    docker import \
        --change 'CMD ["/bin/sh"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change "LABEL $LABEL=$RECIPE" \
        --message "pai test image from $busybox" \
        - "$IMAGE" >/dev/null
docker run --rm --network host "$IMAGE" sh -c 'echo ok' | grep -qx ok ||
    die "$IMAGE was imported but cannot run sh"
say "$IMAGE is ready"
