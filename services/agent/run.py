"""`pai-node-agent`: this node's launcher and monitor, as one command.

What an operator runs on every GPU machine (docs/multi-node.md), and what
the Compose file and the Kubernetes DaemonSet run in their containers.
Starts `pai-launcher` and `pai-monitor` side by side and lives as long as both
do: when either exits, the other is stopped and the agent exits non-zero, so
the machine's supervisor (systemd, compose `restart:`, a Kubernetes pod)
brings both back together. SIGTERM or SIGINT stops both gracefully. When a
child refused to run (another machine's agent holds the node's name, a
setting that cannot work), the agent exits with that child's code (78), so
a supervisor that knows the code does not start it again.

With `--remove-jobs-on-exit` (the single-box compose file uses it) the agent
then removes this node's job containers, so `docker compose down` leaves no
job running. A DaemonSet must not: a rolling update of the agent would kill
every job on the node.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

from shared.infra.config import load_settings
from shared.infra.supervise import EXIT_REFUSED
from shared.node.containers import LABEL_JOB, LABEL_NODE, docker_client

log = logging.getLogger("pai.node-agent")

CHILDREN = ("pai-launcher", "pai-monitor")
STOP_SECONDS = 40.0  # within the 45 s Compose and `make down` give the agent
EXIT_FAILED_CHILD = 1


def start(program: str) -> subprocess.Popen[bytes]:
    bin_dir = os.path.dirname(sys.executable)
    path = os.path.join(bin_dir, program)
    return subprocess.Popen([path if os.path.exists(path) else program])


def stop_all(children: dict[str, subprocess.Popen[bytes]], seconds: float) -> None:
    """SIGTERM to every child still running, SIGKILL to any left after `seconds`."""
    for proc in children.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + seconds
    for name, proc in children.items():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %.0f s: killing it", name, seconds)
            proc.kill()
            proc.wait()


def remove_job_containers() -> int:
    """Remove every job container of this node; the number removed."""
    settings = load_settings()
    client = docker_client(settings, timeout=30)
    removed = 0
    try:
        filters = {"label": [LABEL_JOB, f"{LABEL_NODE}={settings.node_name}"]}
        for container in client.containers.list(all=True, filters=filters):
            with contextlib.suppress(Exception):  # gone meanwhile, or already being removed
                container.remove(force=True)
                removed += 1
    finally:
        client.close()
    return removed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--remove-jobs-on-exit", action="store_true",
                        help="remove this node's job containers when the agent stops")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    load_settings()  # a bad setting fails here, once, with its message

    stopping = False

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        log.info("received %s: stopping the launcher and the monitor",
                 signal.Signals(signum).name)
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    children = {program: start(program) for program in CHILDREN}
    log.info("started %s", ", ".join(f"{n} (pid {p.pid})" for n, p in children.items()))
    status = 0
    while not stopping:
        exited = [(name, proc.returncode) for name, proc in children.items()
                  if proc.poll() is not None]
        if exited:
            name, code = exited[0]
            log.error("%s exited with status %s: stopping the node agent", name, code)
            status = EXIT_REFUSED if code == EXIT_REFUSED else EXIT_FAILED_CHILD
            break
        time.sleep(0.5)
    stop_all(children, STOP_SECONDS)
    # Only on a requested stop: a crashed child restarts the agent, and its
    # jobs must survive that.
    if args.remove_jobs_on_exit and stopping:
        try:
            log.info("removed %d job container(s) of this node", remove_job_containers())
        except Exception:
            log.exception("could not remove this node's job containers")
            status = status or EXIT_FAILED_CHILD
    return status


if __name__ == "__main__":
    raise SystemExit(main())
