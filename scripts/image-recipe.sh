# Sourced by every scripts/build-*-image.sh, after
# they set NAME (for messages), IMAGE, LABEL and RECIPE: the messages, the
# Docker check, and "nothing to do" when IMAGE was built by this RECIPE.
# shellcheck shell=bash

say() { echo "$NAME: $*" >&2; }
die() { echo "$NAME: $*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 ||
    die "the docker command is missing: run scripts/runtime.sh docker (or install docker.io) first."

have=$(docker image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$IMAGE" \
    2>/dev/null || true)
if [ "$have" = "$RECIPE" ]; then
    say "$IMAGE is already present"
    exit 0
fi
