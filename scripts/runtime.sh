#!/usr/bin/env bash
# The local runtime pai needs: a Redis server and a Docker engine.
#
# Where one is already at hand it is used; where it is missing and we are root
# on Debian/Ubuntu, Debian's package is installed and a private instance is
# started with all its files under .run/ (and we say so); elsewhere we name
# exactly what to install and exit 1.
#
# What was chosen is recorded in .run/env as `export NAME=value` lines, which
# the Makefile sources:  DOCKER_HOST / PAI_DOCKER_HOST  and  PAI_REDIS_URL.
#
# usage: scripts/runtime.sh COMMAND [ARG]
#   redis-binary       make sure redis-server is installed (pytest starts its own)
#   prometheus-binary  make sure prometheus and promtool are installed (the monitoring
#                      tests start their own Prometheus and run promtool)
#   cluster-tools      make sure ip, iptables and nsenter are installed (the multi-host
#                      tier, tests/cluster)
#   redis              PAI_REDIS_URL if it answers, else a private redis-server on
#                      127.0.0.1:16379 (PAI_PRIVATE_REDIS_PORT) with data in .run/redis/
#   docker             PAI_DOCKER_HOST/DOCKER_HOST or /var/run/docker.sock if it answers,
#                      else a private dockerd with everything in PAI_DOCKERD_DIR
#                      (default .run/docker/)
#   stop-redis         stop the private redis-server, by its pidfile
#   stop-docker [DIR]  stop the private dockerd in DIR (default .run/docker/), by its pidfile
#   stop               stop-redis, and stop-docker for every dockerd started from here
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUN=${PAI_RUN_DIR:-$ROOT/.run}
ENV_FILE=$RUN/env
REDIS_DIR=$RUN/redis
DOCKER_DIR=$RUN/docker
STARTED_DIRS=$RUN/dockerd-dirs  # every private dockerd directory started from here
DOCKERD_WAIT_SECONDS=${PAI_DOCKERD_WAIT_SECONDS:-60}

say() { echo "runtime: $*" >&2; }
die() { echo "runtime: $*" >&2; exit 1; }

# --- installing -------------------------------------------------------------

can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

APT_UPDATED=
apt_install() {
    if [ -z "$APT_UPDATED" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq >&2
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
        --no-install-recommends "$@" >&2
}

# ensure_commands PACKAGE "WHAT TO INSTALL" "AFTERWARDS" COMMAND...: every
# COMMAND is on PATH, or Debian's PACKAGE is installed with apt-get (as root),
# or stop and say what to install.
ensure_commands() {
    local package=$1 what=$2 afterwards=$3 missing=0 command
    shift 3
    for command in "$@"; do
        command -v "$command" >/dev/null 2>&1 || missing=1
    done
    [ "$missing" = 0 ] && return
    if can_apt; then
        say "$* missing: installing Debian's $package with apt-get"
        apt_install "$package"
        return
    fi
    die "$* missing: install $what (on Debian/Ubuntu: sudo apt-get install $package)${afterwards} and run this again."
}

ensure_redis_binary() { ensure_commands redis-server "Redis 7" "" redis-server redis-cli; }

# Debian's prometheus package may try to start its own service: the tests never use it.
ensure_prometheus_binary() {
    ensure_commands prometheus "Prometheus 2" "" prometheus promtool
}

# The multi-host test tier (tests/cluster): namespaces, iptables in them,
# nsenter.
ensure_cluster_tools() {
    ensure_commands iproute2 "iproute2" "" ip
    ensure_commands iptables "iptables" "" iptables
    ensure_commands util-linux "util-linux" "" nsenter
}

ensure_docker_package() {
    ensure_commands docker.io "Docker" ", start it (or set DOCKER_HOST)," docker dockerd
}

# --- .run/env ---------------------------------------------------------------

# record_env NAME VALUE: replace NAME's line in .run/env.
record_env() {
    mkdir -p "$RUN"
    local tmp
    tmp=$(mktemp "$RUN/env.XXXXXX")  # mode 0600: it may hold the Redis password
    if [ -f "$ENV_FILE" ]; then grep -v "^export $1=" "$ENV_FILE" >"$tmp" || true; fi
    printf 'export %s=%q\n' "$1" "$2" >>"$tmp"
    mv -f "$tmp" "$ENV_FILE"
}

# forget_env NAME VALUE: drop NAME's line from .run/env if it still says VALUE.
forget_env() {
    [ -f "$ENV_FILE" ] || return 0
    local tmp
    tmp=$(mktemp "$RUN/env.XXXXXX")
    grep -vxF "$(printf 'export %s=%q' "$1" "$2")" "$ENV_FILE" >"$tmp" || true
    mv -f "$tmp" "$ENV_FILE"
}

# Serialize concurrent `make` runs in this tree; children must not inherit fd 9.
take_lock() {
    mkdir -p "$RUN"
    exec 9>"$RUN/runtime.lock"
    flock -w 300 9 || die "another scripts/runtime.sh holds $RUN/runtime.lock for 5 minutes; is it stuck?"
}

# A zombie (killed, not yet reaped) counts as dead.
pid_alive() {
    [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null &&
        ! awk '{ exit $3 != "Z" }' "/proc/$1/stat" 2>/dev/null
}
read_pid() { if [ -f "$1" ]; then tr -dc '0-9' <"$1"; fi; }

# stop_pid PID SECONDS: TERM, wait, then KILL.
stop_pid() {
    local pid=$1 waited=0
    pid_alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    while pid_alive "$pid" && [ "$waited" -lt $(($2 * 5)) ]; do
        sleep 0.2
        waited=$((waited + 1))
    done
    if pid_alive "$pid"; then
        say "pid $pid did not stop in $2 s: killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
}

# --- Redis ------------------------------------------------------------------

redis_answers() { [ "$(timeout 5 redis-cli -u "$1" ping 2>/dev/null)" = PONG ]; }
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() {
    local port
    for port in $(seq 16380 16480); do
        port_in_use "$port" || { echo "$port"; return; }
    done
    die "no free TCP port in 16380-16480 on 127.0.0.1 for a private redis-server"
}

# The private redis-server's ACL (shared/infra/redisacl.py: user `pai` for the
# platform without dangerous commands, user `default` for the operator, both
# with passwords); generated once into $REDIS_DIR/acl (0600), kept across restarts.
redis_credentials() {
    PYTHONPATH=$ROOT python3 -m shared.infra.redisacl "$REDIS_DIR/acl" ||
        die "could not write the Redis ACL under $REDIS_DIR/acl"
}
# redis_url PORT [operator]: a URL that logs in with the generated password.
redis_url() {
    local user=pai file=redis-password
    if [ "${2:-}" = operator ]; then user=default file=redis-operator-password; fi
    echo "redis://$user:$(cat "$REDIS_DIR/acl/$file")@127.0.0.1:$1/0"
}
# redis-cli takes the password from the environment, never from its argv.
redis_answers_on() {
    [ "$(REDISCLI_AUTH=$(cat "$REDIS_DIR/acl/redis-password") timeout 5 \
        redis-cli --user pai -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]
}

start_redis() {
    ensure_redis_binary
    if [ -n "${PAI_REDIS_URL:-}" ]; then
        if redis_answers "$PAI_REDIS_URL"; then
            say "using the Redis of PAI_REDIS_URL"
            record_env PAI_REDIS_URL "$PAI_REDIS_URL"
            return
        fi
        say "PAI_REDIS_URL does not answer: starting a private redis-server instead"
    fi
    take_lock
    mkdir -p "$REDIS_DIR"
    chmod 700 "$REDIS_DIR"
    redis_credentials
    local pidfile=$REDIS_DIR/redis.pid pid port
    pid=$(read_pid "$pidfile")
    port=$(cat "$REDIS_DIR/port" 2>/dev/null || echo "${PAI_PRIVATE_REDIS_PORT:-16379}")
    if pid_alive "$pid"; then
        if redis_answers_on "$port"; then
            say "private redis-server already running (pid $pid) on 127.0.0.1:$port"
            record_env PAI_REDIS_URL "$(redis_url "$port")"
            return
        fi
        # One started before Redis had credentials here: restart it with them.
        say "the private redis-server (pid $pid) does not take the platform's password: restarting it"
        stop_pid "$pid" 30
    fi
    rm -f "$pidfile"
    port=${PAI_PRIVATE_REDIS_PORT:-16379}
    if port_in_use "$port"; then
        local taken=$port
        port=$(free_port)
        say "127.0.0.1:$taken is taken by another program: using port $port"
    fi
    say "starting a private redis-server on 127.0.0.1:$port, data in $REDIS_DIR"
    redis-server --bind 127.0.0.1 --port "$port" --dir "$REDIS_DIR" \
        --protected-mode yes --aclfile "$REDIS_DIR/acl/users.acl" \
        --appendonly yes --daemonize yes --pidfile "$pidfile" \
        --maxmemory "${PAI_REDIS_MAXMEMORY:-2gb}" --maxmemory-policy noeviction \
        --logfile "$REDIS_DIR/redis.log" 9>&-
    echo "$port" >"$REDIS_DIR/port"
    local tries=0
    until redis_answers_on "$port"; do
        tries=$((tries + 1))
        [ "$tries" -lt 50 ] || die "redis-server did not answer in 10 s; see $REDIS_DIR/redis.log"
        sleep 0.2
    done
    say "Redis is up on 127.0.0.1:$port (user pai; passwords in $REDIS_DIR/acl/, operator: user default)"
    record_env PAI_REDIS_URL "$(redis_url "$port")"
}

stop_redis() {
    take_lock
    local pidfile=$REDIS_DIR/redis.pid pid port
    pid=$(read_pid "$pidfile")
    port=$(cat "$REDIS_DIR/port" 2>/dev/null || true)
    if pid_alive "$pid"; then
        say "stopping the private redis-server (pid $pid)"
        stop_pid "$pid" 30
    fi
    rm -f "$pidfile"
    [ -z "$port" ] || [ ! -f "$REDIS_DIR/acl/redis-password" ] ||
        forget_env PAI_REDIS_URL "$(redis_url "$port")"
}

# --- Docker -----------------------------------------------------------------

docker_answers() { DOCKER_HOST=$1 timeout 15 docker info >/dev/null 2>&1; }

use_docker() {
    say "DOCKER_HOST=$1"
    record_env DOCKER_HOST "$1"
    record_env PAI_DOCKER_HOST "$1"
}

# unmount_under DIR: what a dead dockerd left mounted (netns, overlays).
unmount_under() {
    local mnt
    awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r |
        while read -r mnt; do
            umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
        done
    ! awk -v d="$1/" 'index($2, d) == 1 { found = 1 } END { exit !found }' /proc/mounts
}

is_dockerd() { pid_alive "$1" && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = dockerd ]; }

# stop_dockerd DIR: the dockerd whose pidfile is in DIR, and its containerd.
# A directory of our own making (/tmp/pai-docker.*) is removed afterwards.
stop_dockerd() {
    local dir=$1 pid cpid
    pid=$(read_pid "$dir/docker.pid")
    cpid=$(read_pid "$dir/exec/containerd/containerd.pid")
    if is_dockerd "$pid"; then
        say "stopping the private dockerd (pid $pid) in $dir"
        stop_pid "$pid" 45
    fi
    # dockerd stops the containerd it started; one left by a killed dockerd is ours too.
    if pid_alive "$cpid" && tr '\0' ' ' <"/proc/$cpid/cmdline" | grep -qF "$dir/"; then
        stop_pid "$cpid" 10
    fi
    rm -f "$dir/docker.pid" "$dir/docker.sock"
    if unmount_under "$dir"; then
        rm -rf "$dir/exec"  # run-time state only; images stay in data/
    else
        say "some mounts under $dir could not be removed"
    fi
    forget_env DOCKER_HOST "unix://$dir/docker.sock"
    forget_env PAI_DOCKER_HOST "unix://$dir/docker.sock"
    if [ -f "$STARTED_DIRS" ]; then
        grep -vxF "$dir" "$STARTED_DIRS" >"$STARTED_DIRS.new" || true
        mv -f "$STARTED_DIRS.new" "$STARTED_DIRS"
    fi
    case $dir in
        /tmp/pai-docker.*) rm -rf "$dir" ;;
    esac
}

# stop_all_dockerd: every private dockerd started here, wherever its directory.
stop_all_dockerd() {
    local dir
    { echo "$DOCKER_DIR"; cat "$STARTED_DIRS" 2>/dev/null || true; } | sort -u |
        while read -r dir; do
            [ -z "$dir" ] || stop_dockerd "$dir"
        done
}

start_dockerd() {
    local dir=$1 pid waited=0
    mkdir -p "$dir"
    say "starting a private dockerd, all its files in $dir (log: $dir/dockerd.log)"
    # Job containers use host networking only: no bridge, no iptables, no
    # forwarding, so it starts in a sandbox and leaves the host's network alone.
    setsid dockerd \
        --data-root "$dir/data" --exec-root "$dir/exec" \
        --pidfile "$dir/docker.pid" --host "unix://$dir/docker.sock" \
        --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
        --shutdown-timeout 5 \
        </dev/null >"$dir/dockerd.log" 2>&1 9>&- &
    pid=$!
    echo "$dir" >>"$STARTED_DIRS"
    until docker_answers "unix://$dir/docker.sock"; do
        if ! pid_alive "$pid"; then
            tail -n 20 "$dir/dockerd.log" >&2 || true
            die "dockerd exited at start-up (log above, full log in $dir/dockerd.log)"
        fi
        waited=$((waited + 1))
        if [ "$waited" -gt "$DOCKERD_WAIT_SECONDS" ]; then
            tail -n 20 "$dir/dockerd.log" >&2 || true
            stop_dockerd "$dir"
            die "dockerd did not answer within $DOCKERD_WAIT_SECONDS s (log above, full log in $dir/dockerd.log)"
        fi
        sleep 1
    done
    say "private dockerd is up (pid $(read_pid "$dir/docker.pid"))"
}

fresh_docker_dir() {
    local dir
    dir=$(mktemp -d /tmp/pai-docker.XXXXXX)
    say "using a fresh directory $dir instead: stop it with scripts/runtime.sh stop-docker $dir"
    echo "$dir"
}

ensure_docker() {
    local want=${PAI_DOCKER_HOST:-${DOCKER_HOST:-}}
    command -v docker >/dev/null 2>&1 || ensure_docker_package
    if [ -n "$want" ]; then
        if docker_answers "$want"; then use_docker "$want"; return; fi
        say "the Docker engine at $want does not answer: looking for another one"
    fi
    if [ -S /var/run/docker.sock ] && docker_answers unix:///var/run/docker.sock; then
        use_docker unix:///var/run/docker.sock
        return
    fi
    ensure_docker_package
    [ "$(id -u)" = 0 ] ||
        die "no Docker engine answers: start one (e.g. sudo systemctl start docker) and set DOCKER_HOST if it does not listen on /var/run/docker.sock."
    take_lock
    local dir=${PAI_DOCKERD_DIR:-$DOCKER_DIR} pid
    # A unix socket path has at most 107 bytes; containerd's lives deeper in here.
    if [ "${#dir}" -gt 70 ]; then
        say "$dir is too long a path for dockerd's sockets"
        dir=$(fresh_docker_dir)
    fi
    pid=$(read_pid "$dir/docker.pid")
    if is_dockerd "$pid"; then
        if docker_answers "unix://$dir/docker.sock"; then
            say "private dockerd already running (pid $pid)"
            use_docker "unix://$dir/docker.sock"
            return
        fi
        say "a dockerd (pid $pid) owns $dir but does not answer"
        dir=$(fresh_docker_dir)
    elif [ -e "$dir/docker.pid" ] || [ -e "$dir/docker.sock" ] || [ -d "$dir/exec" ]; then
        say "cleaning up what a stopped dockerd left in $dir"
        stop_dockerd "$dir"
        if [ -d "$dir/exec" ]; then
            dir=$(fresh_docker_dir)
        fi
    fi
    start_dockerd "$dir"
    use_docker "unix://$dir/docker.sock"
}

# --- main -------------------------------------------------------------------

case "${1:-}" in
    redis-binary) ensure_redis_binary ;;
    prometheus-binary) ensure_prometheus_binary ;;
    cluster-tools) ensure_cluster_tools ;;
    redis) start_redis ;;
    docker) ensure_docker ;;
    stop-redis) stop_redis ;;
    stop-docker)
        take_lock
        stop_dockerd "${2:-$DOCKER_DIR}"
        ;;
    stop)
        stop_redis
        stop_all_dockerd
        ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
