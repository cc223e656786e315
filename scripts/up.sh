#!/usr/bin/env bash
# Start the platform as local processes: api, scheduler, one launcher and one
# monitor for this machine. Redis and the Docker engine come from runtime.sh
# (the Makefile runs it first and exports .run/env). Every service inherits
# the caller's PAI_* settings; PIDs and logs go to .run/.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUN=${PAI_RUN_DIR:-$ROOT/.run}
BIN=$ROOT/.venv/bin
mkdir -p "$RUN/pids" "$RUN/logs"

export PAI_NODE_IP=${PAI_NODE_IP:-127.0.0.1}
export PAI_NODE_NAME=${PAI_NODE_NAME:-$(hostname -s | tr -c 'A-Za-z0-9_.\n-' '-')}
export PAI_STORAGE_ROOTS=${PAI_STORAGE_ROOTS:-$RUN/storage}
export PAI_NODE_STATE_DIR=${PAI_NODE_STATE_DIR:-$RUN/node}
export PAI_API_HOST=${PAI_API_HOST:-127.0.0.1}
export PAI_API_PORT=${PAI_API_PORT:-9186}
# No Prometheus runs here: the job page's charts show the monitor's samples,
# unless PAI_PROMETHEUS_URL names one that scrapes this monitor (docs/portal.md).
mkdir -p "${PAI_STORAGE_ROOTS%%,*}"
[ -n "${PAI_REDIS_URL:-}" ] || { echo "up: PAI_REDIS_URL is not set (run via make up)" >&2; exit 1; }

start() {  # start NAME COMMAND...: in the background, unless already running
    local name=$1; shift
    local pidfile=$RUN/pids/$name.pid
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "up: $name already running (pid $(cat "$pidfile"))"
        return
    fi
    nohup "$@" >>"$RUN/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    echo "up: $name started (pid $!, log .run/logs/$name.log)"
}

start api "$BIN/pai-api"
start scheduler "$BIN/pai-scheduler"
start launcher "$BIN/pai-launcher"
start monitor "$BIN/pai-monitor"

url=http://$PAI_API_HOST:$PAI_API_PORT
login=$(printf '{"username": "%s", "password": "%s"}' \
    "${PAI_ADMIN_USER:-admin}" "${PAI_ADMIN_PASSWORD:-admin-password}")
node_ready() {  # this machine's node reported in: ask the api, as the admin
    local token
    token=$(curl -fsS -H 'Content-Type: application/json' -d "$login" "$url/api/v1/token" \
        2>/dev/null | sed -n 's/.*"token": *"\([^"]*\)".*/\1/p')
    [ -n "$token" ] && curl -fsS -H "Authorization: Bearer $token" "$url/api/v1/nodes" \
        2>/dev/null | grep -q "\"name\": *\"$PAI_NODE_NAME\"[^}]*\"state\": *\"READY\""
}
for _ in $(seq 1 120); do
    if curl -fsS "$url/healthz" >/dev/null 2>&1 && node_ready; then
        echo "up: pai is ready at $url (node $PAI_NODE_NAME, storage ${PAI_STORAGE_ROOTS})"
        exit 0
    fi
    for name in api scheduler launcher monitor; do
        if ! kill -0 "$(cat "$RUN/pids/$name.pid")" 2>/dev/null; then
            echo "up: $name exited; the end of .run/logs/$name.log:" >&2
            tail -n 20 "$RUN/logs/$name.log" >&2
            exit 1
        fi
    done
    sleep 0.5
done
echo "up: pai did not become ready within 60 s; see .run/logs/" >&2
exit 1
