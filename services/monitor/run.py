"""`pai-monitor`: the monitor of this node, until SIGTERM or SIGINT.

It reconciles once (an exit that happened while no monitor ran is settled
now), then follows Docker events and reconciles every few seconds, each on
its own thread, as listed by `node_threads`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

import docker

from services.monitor.agent import NodeAgent
from services.monitor.exporter import NodeExporter
from services.monitor.gpuhealth import GpuHealthWatch, stop_container
from services.monitor.lease import LeaseKeeper
from services.monitor.sampling import IdleStop
from services.monitor.service import Monitor
from shared.domain.states import LIVE_JOB_STATES, JobState
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.infra.nodeaddress import node_service_settings
from shared.infra.supervise import EXIT_REFUSED
from shared.node.containers import TaskRef, docker_client
from shared.state import telemetry
from shared.state.lifecycle import request_stop
from shared.state.store import Store

log = logging.getLogger("pai.monitor")

RECONCILE_SECONDS = 10.0
SHUTDOWN_JOIN_SECONDS = 15.0
STOP_SLICE_SECONDS = 0.5  # how long a stop may wait for the reconcile loop to see it


def reconcile_loop(monitor: Monitor, stop: threading.Event, keeper: LeaseKeeper | None = None,
                   interval: float = RECONCILE_SECONDS) -> None:
    """Reconcile every `interval` seconds (events can be missed, this cannot),
    and at once when the lease keeper asks (the node is back from silence):
    after a whole pass it tells the keeper, which may then say READY."""
    requested = keeper.reconcile_requested if keeper is not None else threading.Event()
    due = time.monotonic() + interval
    while not stop.is_set():
        # in slices, so that a stop is seen within one (not after a whole interval)
        if not requested.wait(min(STOP_SLICE_SECONDS, interval)) and time.monotonic() < due:
            continue
        if stop.is_set():
            return
        requested.clear()
        due = time.monotonic() + interval
        generation = keeper.reconcile_generation() if keeper is not None else 0
        try:
            summary = monitor.reconcile()
        except Exception:
            log.exception("reconcile failed; trying again in %.0f s", interval)
            continue
        if keeper is not None:
            keeper.reconciled(generation)
        if summary.vanished:
            log.warning("reconcile: %d task(s) lost their container", summary.vanished)


def gpu_health_watch(monitor: Monitor) -> GpuHealthWatch:
    """The node's GPU health watch, stopping and reporting tasks as the monitor does."""

    def tell(ref: TaskRef, attempt_ended: bool) -> None:
        monitor.messenger.task_ended(ref.job_id, ref.attempt, ref.role, ref.index)
        if attempt_ended:
            monitor.messenger.attempt_ended(ref.job_id, ref.attempt)

    return GpuHealthWatch(monitor.store, monitor.node,
                          lambda ref: stop_container(monitor.docker, ref), tell)


def node_threads(monitor: Monitor, stop: threading.Event, since: float,
                 exporter: NodeExporter | None = None,
                 health: GpuHealthWatch | None = None,
                 keeper: LeaseKeeper | None = None) -> list[threading.Thread]:
    """Everything the monitor runs in the background, each until `stop` is set:
    the event watcher, the reconcile loop, the exporter's sampler, the GPU
    health watch and the lease keeper."""
    threads = [
        threading.Thread(target=monitor.watch_events, args=(stop, since),
                         name="pai-monitor-events", daemon=True),
        threading.Thread(target=reconcile_loop, args=(monitor, stop, keeper),
                         name="pai-monitor-reconcile", daemon=True),
    ]
    if keeper is not None:
        threads.append(threading.Thread(target=keeper.run, args=(stop,),
                                        name="pai-monitor-lease", daemon=True))
    if exporter is not None:
        threads.append(exporter.thread(stop))
    if health is not None:
        threads.append(threading.Thread(
            target=health.run, args=(stop, monitor.settings.gpu_health_seconds),
            name="pai-monitor-gpu-health", daemon=True))
    return threads


def idle_stopper(store: Store, messenger: Messenger) -> IdleStop:
    """Stop a job idling on its GPUs as a user's stop does (the API's
    executionType), its reason in the job's diagnostics and events."""

    def stop_idle(job_id: str, reason: str) -> None:
        before = store.get_job(job_id)
        if before is None or before.state not in LIVE_JOB_STATES:
            return  # ended meanwhile, or already stopping
        job = request_stop(store, job_id, reason)
        if job.state == JobState.STOPPING:
            messenger.stop_job(job_id)
        telemetry.record(store.r, telemetry.IDLE_GPU_STOPS, {"vc": job.virtual_cluster})

    return stop_idle


def start_exporter(settings: Settings, store: Store, client: docker.DockerClient,
                   stop_idle: IdleStop | None = None) -> NodeExporter | None:
    """The node's /metrics; the monitor's lifecycle work goes on without it."""
    exporter = NodeExporter(settings, store, client, stop_idle=stop_idle)
    try:
        exporter.serve()
    except OSError as error:
        log.error("the node exporter cannot listen on %s:%d (%s): no node metrics",
                  settings.monitor_host, settings.monitor_port, error)
        exporter.close()
        return None
    return exporter


def main() -> int:
    settings = node_service_settings("monitor")
    stop = threading.Event()
    exit_reason: list[str] = []

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()

    def exit_process(reason: str) -> None:
        log.error("stopping: %s", reason)
        exit_reason.append(reason)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    store = Store.from_url(settings.redis_url)
    client = docker_client(settings)
    agent = NodeAgent.start(settings, store, client, stop, exit_process)
    if agent is None:
        return EXIT_REFUSED if not stop.is_set() or exit_reason else 0
    messenger = Messenger(make_celery(settings, name="pai-monitor"))
    monitor = Monitor(settings, store, messenger, client, settings.node_name, agent.journal)
    exporter = start_exporter(settings, store, client, idle_stopper(store, messenger))
    log.info("monitor of node %s (%s) starting", settings.node_name, settings.node_ip)
    since = time.time()  # events from here on; the first pass covers what came before
    try:
        summary = monitor.reconcile()
        agent.keeper.reconciled(0)
        log.info("first reconcile: %d running, %d exited, %d vanished",
                 summary.running, summary.exited, summary.vanished)
    except Exception:
        log.exception("the first reconcile failed; the loop tries again")
        agent.keeper.reconcile_requested.set()
    threads = node_threads(monitor, stop, since, exporter, gpu_health_watch(monitor),
                           agent.keeper) + agent.threads(stop)
    for thread in threads:
        thread.start()
    while not stop.wait(1.0):
        pass
    for thread in threads:
        thread.join(SHUTDOWN_JOIN_SECONDS)
    monitor.close()
    agent.close()
    if exporter is not None:
        exporter.close()
    log.info("monitor of node %s stopped", settings.node_name)
    return EXIT_REFUSED if exit_reason else 0


if __name__ == "__main__":
    raise SystemExit(main())
