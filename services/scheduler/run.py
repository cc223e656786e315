"""`pai-scheduler`: the Celery worker on queue `scheduler`, the thread that
answers the doorbell (shared/state/passwake.py), and the repair loop."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from services.scheduler.nodes import REPAIR_SECONDS
from services.scheduler.pacing import new_work_delay
from services.scheduler.service import Scheduler
from services.scheduler.worker import create_scheduler_app
from shared.infra.config import load_settings
from shared.infra.links import BLOCK_CHUNK_SECONDS
from shared.infra.logs import setup_logging
from shared.infra.supervise import serve, work_beside
from shared.state import passwake, telemetry
from shared.state.clock import start_sync_thread

log = logging.getLogger("pai.scheduler")

RECONCILE_SECONDS = REPAIR_SECONDS
RETRY_SECONDS = 1.0


def wake_loop(scheduler: Scheduler, stop: threading.Event,
              block_seconds: float = BLOCK_CHUNK_SECONDS) -> None:
    """Answer the doorbell until `stop`: a pass for each ring taken (the pass
    gate folds those that come during a pass into one more), one for new
    work paced by services/scheduler/pacing.py. A lost link is waited out;
    the repair loop's passes go on meanwhile."""
    r = scheduler.store.r
    while not stop.is_set():
        try:
            ring = passwake.wait(r, block_seconds)
            if ring == passwake.NEW_WORK:
                passwake.wait_for_capacity(r, new_work_delay(
                    scheduler.last_pass, time.monotonic(),
                    scheduler.settings.new_work_pass_seconds))
            if ring is not None:
                scheduler.request_pass()
        except RedisError as error:  # Redis down or unreachable: one line a try
            log.warning("pass request not taken (%s); trying again in %.0f s", error,
                        RETRY_SECONDS)
            stop.wait(RETRY_SECONDS)
        except Exception:
            log.exception("pass request not taken; trying again in %.0f s", RETRY_SECONDS)
            stop.wait(RETRY_SECONDS)


def repair_loop(scheduler_reconcile: Callable[[], None], stop: threading.Event,
                heartbeat: Callable[[], None] | None = None) -> None:
    """Periodic repair, never only events: lost nodes, stuck launches, stops.

    Each pass that completes is this replica's heartbeat (what Prometheus'
    "scheduler down" alert watches): a scheduler that cannot repair is down.
    """
    while not stop.wait(RECONCILE_SECONDS):
        try:
            scheduler_reconcile()
            if heartbeat is not None:
                heartbeat()
        except Exception:
            log.exception("reconcile failed; trying again in %.0f s", RECONCILE_SECONDS)


def worker() -> None:
    settings = load_settings()
    setup_logging("scheduler", settings.log_level, settings.log_format)
    app, scheduler = create_scheduler_app(settings)
    stop = threading.Event()
    start_sync_thread(scheduler.store.r, stop)  # one clock with the nodes (Redis TIME)
    threading.Thread(target=wake_loop, args=(scheduler, stop), daemon=True, name="wake").start()
    name = telemetry.scheduler_name()
    work_beside(app, ["worker", "-Q", "scheduler", "--pool", "solo", "-n", "scheduler@%h",
                      "--without-gossip", "--without-mingle", "--without-heartbeat",
                      "--loglevel", settings.log_level],
                lambda stop: repair_loop(scheduler.reconcile, stop,
                                         lambda: scheduler.heartbeat(name)),
                "repair")


def main() -> None:
    """`pai-scheduler`: the worker under a supervisor that starts it again if it
    crashes (shared/infra/supervise.py)."""
    serve("scheduler", "services.scheduler.run", worker)


if __name__ == "__main__":
    main()
