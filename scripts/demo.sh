#!/usr/bin/env bash
# `make demo` (after `make up`): log in with the pai CLI as the bootstrap
# admin, submit examples/hello-world.json, follow it to its end and print
# its log. Each run submits under a fresh name.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PAI=$ROOT/.venv/bin/pai
url=http://${PAI_API_HOST:-127.0.0.1}:${PAI_API_PORT:-9186}
name=hello-world-$(date +%Y%m%d-%H%M%S)

echo "demo: pai login $url (as ${PAI_ADMIN_USER:-admin})"
printf '%s\n' "${PAI_ADMIN_PASSWORD:-admin-password}" |
    "$PAI" login --cluster local --username "${PAI_ADMIN_USER:-admin}" --password-stdin "$url"
echo "demo: pai submit examples/hello-world.json --name $name --wait"
status=0
"$PAI" submit "$ROOT/examples/hello-world.json" --name "$name" --wait || status=$?
echo "demo: pai status $name"
"$PAI" status "$name"
echo "demo: pai logs $name"
"$PAI" logs "$name"
exit "$status"
