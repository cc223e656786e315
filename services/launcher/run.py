"""`pai-launcher`: this node's Celery worker on queue `launcher.<node>` (stops,
preemptions), the feeds of its starts (services/launcher/starts.py) and of
its calls, execs and terminal sessions (services/launcher/calls.py), and the
heartbeat thread that keeps the node's lease."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from services.launcher.calls import launcher_calls
from services.launcher.service import Launcher
from services.launcher.starts import StartFeed
from services.launcher.worker import create_launcher_app
from shared.infra.config import Settings
from shared.infra.messaging import launcher_queue
from shared.infra.nodeaddress import node_service_settings
from shared.infra.supervise import EXIT_REFUSED, serve
from shared.node.health import storage_check
from shared.node.identity import engine_identity
from shared.state import storageid
from shared.state.clock import start_sync_thread
from shared.state.leases import Holder, Role, release
from shared.state.nodeagent import NameRefused, claim_name, new_holder
from shared.state.starts import StartReader

log = logging.getLogger("pai.launcher")

# Container creation blocks on Docker (and image pulls); threads let one slow
# pull not hold up the node's other launches.
CONCURRENCY = 8


def worker_argv(node: str, log_level: str = "INFO") -> list[str]:
    return [
        "worker", "-Q", launcher_queue(node), "--pool", "threads",
        "--concurrency", str(CONCURRENCY), "-n", f"launcher@{node}",
        "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", log_level,
    ]


def worker() -> None:
    settings = node_service_settings("launcher")
    app, launcher = create_launcher_app(settings)
    stop = threading.Event()
    launcher.holder = hold_name(settings, launcher, stop)
    start_sync_thread(launcher.store.r, stop)
    watch_storage(settings, launcher, stop)

    def name_lost(reason: str) -> None:
        """Another machine's agent took the name: take no more starts or messages."""
        log.error("launcher of node %s stopping: %s", settings.node_name, reason)
        stop.set()
        os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown

    threading.Thread(target=launcher.heartbeat_loop, args=(stop, name_lost), daemon=True,
                     name="heartbeat").start()
    feed = StartFeed(StartReader(launcher.store.r, settings.node_name), launcher.start_task)
    threading.Thread(target=feed.run, args=(stop,), daemon=True, name="starts").start()
    calls = launcher_calls(launcher)
    threading.Thread(target=calls.run, args=(stop,), daemon=True, name="calls").start()
    try:
        app.worker_main(worker_argv(settings.node_name, settings.log_level))
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            release(launcher.store, launcher.holder)


def watch_storage(settings: Settings, launcher: Launcher, stop: threading.Event) -> None:
    """Check, every half minute on a thread of its own, that the storage roots
    and the log tree are the cluster's shared storage (shared/node/health.py);
    the launcher starts no container while they are not."""
    folders = list(dict.fromkeys((*settings.storage_roots, *settings.platform_dirs)))
    if not folders:
        return
    check = storage_check(folders, lambda: storageid.cluster_id(launcher.store))
    check.run_once()
    # A failing check is asked again before a start is refused: the control
    # plane may have written the storage's identity since (every service of
    # a box started at once), and one stale answer would send a job away.
    launcher.storage_problem = lambda: check.problem and check.run_once()
    threading.Thread(target=check.loop, args=(stop,), daemon=True,
                     name="storage-check").start()


def hold_name(settings: Settings, launcher: Launcher, stop: threading.Event) -> Holder:
    """Claim the node's name for this launcher, before it takes any message;
    exit (for good: the supervisor does not start it again) when another
    machine's agent holds it."""
    engine = engine_identity(launcher.runtime.client, settings.node_ip, stop)
    if engine is None:
        raise SystemExit(0)
    holder = new_holder(settings.node_name, engine, Role.LAUNCHER)
    try:
        claim_name(launcher.store, holder, settings, peer="", stop=stop)
    except NameRefused as error:
        log.error("launcher refused: %s", error)
        raise SystemExit(EXIT_REFUSED) from None
    return holder


def main() -> None:
    """`pai-launcher`: the worker under a supervisor that starts it again if it
    crashes (shared/infra/supervise.py)."""
    serve("launcher", "services.launcher.run", worker)


if __name__ == "__main__":
    main()
