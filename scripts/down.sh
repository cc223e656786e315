#!/usr/bin/env bash
# Stop what up.sh started (by PID) and remove the job containers it ran.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUN=${PAI_RUN_DIR:-$ROOT/.run}

for name in api scheduler launcher monitor; do
    pidfile=$RUN/pids/$name.pid
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        # SIGTERM: gunicorn and Celery finish the work in hand (a launch, a
        # request), the monitor its log batch; 45 s, as Compose gives them.
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 1 225); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
        echo "down: $name stopped (pid $pid)"
    fi
    rm -f "$pidfile"
done

# Job containers of this machine's node: make down leaves none behind.
if command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; then
    node=${PAI_NODE_NAME:-$(hostname -s | tr -c 'A-Za-z0-9_.\n-' '-')}
    ids=$(docker ps -aq --filter "label=pai.job" --filter "label=pai.node=$node")
    if [ -n "$ids" ]; then
        # shellcheck disable=SC2086
        docker rm -f $ids >/dev/null && echo "down: removed $(echo "$ids" | wc -l) job container(s)"
    fi
fi
exit 0
