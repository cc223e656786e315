#!/usr/bin/env bash
# Submit examples/hello-world.json to the running platform, follow it to its
# end and print its log. `make demo` runs `make up` first.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
exec "$ROOT/.venv/bin/python" "$ROOT/scripts/demo.py" "$ROOT/examples/hello-world.json"
