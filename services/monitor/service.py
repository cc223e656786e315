"""The monitor of one node: it turns what Docker shows into task transitions.

A container start marks its task RUNNING (or, when the task is settled or its
attempt is over, the container is an orphan and is stopped); a container
exit settles its task through `record_task_exit` after its log is shipped,
tells the scheduler, and removes the container. Docker events make this
prompt; `reconcile` makes it certain: it runs at start-up and every few
seconds, handles every container of this node whatever events were missed,
and fails, as the platform's fault, a RUNNING task whose container is gone.

Every step is idempotent: a repeated start or exit finds the work done (the
lifecycle functions are compare-and-set), so events, replays after a
reconnect and reconcile passes may overlap freely. Work for one container runs
in the order it was seen (KeyedDispatcher).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.models.containers import Container
from requests.exceptions import RequestException

from services.monitor.dispatch import DispatcherClosed, KeyedDispatcher, backoff_delay
from services.monitor.enginefiles import EngineLogFiles
from services.monitor.fence import FenceJournal
from services.monitor.logs import LogShipping, close_stream
from services.monitor.observations import (
    UNKNOWN_EXIT_CODE,
    ContainerEvent,
    EventKind,
    ExitObservation,
    Phase,
    describe,
    describe_exit,
    exit_from_event_code,
    parse_container_event,
    phase_of,
)
from shared.domain.models import Task, task_key
from shared.domain.states import LIVE_JOB_STATES, TaskState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger
from shared.node.containers import (
    LABEL_JOB,
    LABEL_NODE,
    TaskRef,
    task_ref_from_labels,
)
from shared.node.engine import EngineCalls
from shared.state import passwake
from shared.state.lifecycle import mark_task_running
from shared.state.store import Store
from shared.state.taskexits import ExitReport, record_task_exit

log = logging.getLogger(__name__)

# How long an exit waits for the container's log to reach Redis before
# settling the task anyway.
LOG_DRAIN_SECONDS = 10.0
ORPHAN_STOP_SECONDS = 10
HANDLER_THREADS = 8


def _gone_is_done(what: str, container: Container, action: Callable[[], Any]) -> None:
    """Stop or remove a container: one already gone is done, and an engine
    error is logged, not raised (the next reconcile tries again)."""
    try:
        action()
    except NotFound:
        pass
    except APIError as error:
        log.warning("could not %s container %s: %s", what, container.name, error)


@dataclass(frozen=True)
class ReconcileSummary:
    """What one reconcile pass found on the node."""

    running: int
    exited: int
    vanished: int


class Monitor:
    def __init__(self, settings: Settings, store: Store, messenger: Messenger,
                 docker_client: docker.DockerClient, node_name: str,
                 journal: FenceJournal | None = None) -> None:
        self.settings, self.store, self.messenger = settings, store, messenger
        self.docker, self.node = docker_client, node_name
        # The containers this node stopped by fencing: their exits are the platform's.
        self.journal = journal
        self.engine = EngineCalls(docker_client)
        self.shipping = LogShipping(store, settings.log_max_lines, log_dir=settings.task_log_dir,
                                    max_file_bytes=settings.log_max_bytes_per_task,
                                    log_group=settings.log_group,
                                    files=EngineLogFiles.discover(docker_client,
                                                                  settings.log_engine_files))
        self._dispatch = KeyedDispatcher(HANDLER_THREADS)
        self._events_lock = threading.Lock()
        self._events_stream: Any = None

    # ------------------------------------------------------------ handlers

    def handle_start(self, container: Container) -> bool:
        """A task container runs: mark its task RUNNING and ship its log.

        False when the container is not a live task's: then it is stopped
        (its exit is handled like any other).
        """
        ref = task_ref_from_labels(container.labels)
        if ref is None:
            return False
        if mark_task_running(self.store, ref.job_id, ref.attempt, ref.role, ref.index,
                             str(container.id), task_retry=ref.retry,
                             submission=ref.submission):
            self.shipping.ensure(container, ref)
            return True
        if phase_of(container.status) == Phase.RUNNING:
            log.info("stopping orphan container %s: %s is settled or its attempt is over",
                     container.name, describe(ref))
            _gone_is_done("stop orphan", container,
                          lambda: container.stop(timeout=ORPHAN_STOP_SECONDS))
        return False

    def handle_exit(self, container: Container, *, fresh: bool = False) -> ExitReport | None:
        """A task container ended: ship its log, settle its task, tell the scheduler,
        remove it. Returns the exit report (None when the task was settled before).

        `fresh`: the container was inspected just now (by the die event's
        handler), so it is not inspected again. When the container is already
        gone, the state last read from it still says how it ended; if that
        state is not an exit, reconcile decides.
        """
        ref = task_ref_from_labels(container.labels)
        if ref is None:
            return None
        present = True
        if not fresh:
            try:
                container.reload()
            except NotFound:
                present = False
        state = container.attrs.get("State") or {}
        if phase_of(state.get("Status")) != Phase.EXITED:
            return None
        memory = (container.attrs.get("HostConfig") or {}).get("Memory")
        observation = describe_exit(state, memory, container.labels)
        if present:
            self.shipping.drain(container, ref, LOG_DRAIN_SECONDS)
        else:
            self.shipping.finish(str(container.id), LOG_DRAIN_SECONDS)
        report = self._settle(ref, observation, container_id=str(container.id))
        if present:
            self._remove(container)
        return report

    def handle_clean_exit(self, ref: TaskRef, container_id: str) -> ExitReport | None:
        """A task container exited 0, as its die event says: `handle_exit` without
        inspecting the container first.

        Docker answers that inspect only once it has finished handling the exit
        (40 ms and more on a busy node, docs/performance.md), and a clean exit
        needs nothing from it. (The one thing it would add: that a process in
        the container was killed for memory while the task still exited 0.)
        """
        container = self.docker.containers.prepare_model({"Id": container_id})
        self.shipping.drain(container, ref, LOG_DRAIN_SECONDS)
        report = self._settle(ref, describe_exit({"ExitCode": 0}), container_id=container_id)
        self._remove(container)
        return report

    def handle_removed_exit(self, ref: TaskRef, container_id: str,
                            observation: ExitObservation) -> ExitReport | None:
        """A container died and was removed before its exit was handled."""
        self.shipping.finish(container_id, LOG_DRAIN_SECONDS)
        return self._settle(ref, observation, container_id=container_id)

    def _settle(self, ref: TaskRef, observation: ExitObservation,
                platform_failure: bool = False, container_id: str = "") -> ExitReport | None:
        fenced = self.journal.reason_for(container_id) \
            if self.journal is not None and container_id else None
        if fenced is not None:  # stopped by this node's fence, not by the job
            observation = ExitObservation(observation.exit_code, f"fenced: {fenced}")
            platform_failure = True
        report = record_task_exit(
            self.store, ref.job_id, ref.attempt, ref.role, ref.index,
            exit_code=observation.exit_code, diagnostics=observation.diagnostics,
            platform_failure=platform_failure, task_retry=ref.retry,
            relaunch_deadline_ms=now_ms() + int(self.settings.launch_timeout_seconds * 1000),
            submission=ref.submission, ring=True, node=self.node)
        if report is not None:
            log.info("%s ended: %s -> task %s, job %s%s", describe(ref), observation.diagnostics,
                     report.task_state, report.job_state, " (retried)" if report.retried else
                     " (task retry)" if report.relaunched else "")
        if report is not None and report.relaunched and report.node:
            # Only the call that made the retry asks the scheduler (the one
            # sender of starts) to start it: a repeated exit report is stale.
            self.messenger.task_relaunched(ref.job_id, ref.attempt, ref.role, ref.index)
            return report
        if report is not None and report.attempt_ended and report.live_left:
            # The attempt's end stops its tasks still running (and frees what
            # they hold once they are settled: Scheduler.stop_attempt).
            self.messenger.attempt_ended(ref.job_id, ref.attempt)
            return report
        if report is None or report.relaunched:
            # A repeated report (its first rang in its own transaction; the
            # ring is asked for again, as cheap as it is harmless) or a retry
            # with no node to start on: a pass decides.
            passwake.ring_now(self.store.r)
        # Otherwise the exit's own transaction freed the task's allocation
        # (and queued the retry, if any) and rang for the pass that follows.
        return report

    def handle_created(self, container: Container) -> bool:
        """A container created and never started: True when it was removed.

        While its task launches it is the launcher's (the launch lease sends
        the launch again, and the launcher starts the container it finds by
        name). Once the task is settled or its attempt is over, nothing will
        ever start it: a launcher killed between create and start whose task
        then failed elsewhere (its node declared lost while it restarted, a
        stop) leaves one behind, and it goes here. Settled and over are
        final, so the answer cannot turn stale before the removal."""
        ref = task_ref_from_labels(container.labels)
        if ref is None or self._launch_is_live(ref):
            return False
        log.info("removing container %s, created and never started: %s is settled or its "
                 "attempt is over", container.name, describe(ref))
        self._remove(container)
        return True

    def _launch_is_live(self, ref: TaskRef) -> bool:
        job = self.store.get_job(ref.job_id)
        if job is None or job.attempt != ref.attempt or job.state not in LIVE_JOB_STATES \
                or (ref.submission and job.submission != ref.submission):
            return False
        task = self.store.get_task(ref.job_id, ref.attempt, ref.role, ref.index)
        return task is not None and not task.state.is_final and task.retries == ref.retry

    def _remove(self, container: Container) -> None:
        _gone_is_done("remove", container,
                      lambda: self.engine.remove_container(str(container.id), force=True))

    # ------------------------------------------------------------ reconcile

    def reconcile(self) -> ReconcileSummary:
        """Handle every task container of this node, then every vanished one.

        Container work goes through the same per-container queue as events,
        and this waits for it, so a pass never races an event handler.
        """
        containers = self.engine.list_containers(
            all=True, filters={"label": [LABEL_JOB, f"{LABEL_NODE}={self.node}"]})
        futures: list[Future[Any]] = []
        present: set[str] = set()
        running = exited = 0
        for container in containers:
            present.add(container.name)
            phase = phase_of(container.status)
            if phase == Phase.RUNNING:
                running += 1
                futures.append(self._dispatch.submit(
                    str(container.id), partial(self.handle_start, container)))
            elif phase == Phase.EXITED:
                exited += 1
                futures.append(self._dispatch.submit(
                    str(container.id), partial(self.handle_exit, container)))
            elif phase == Phase.CREATED:
                futures.append(self._dispatch.submit(
                    str(container.id), partial(self.handle_created, container)))
        for future in futures:
            _outcome(future)  # wait; a failure was logged, and the next pass retries
        vanished = self._settle_vanished(present)
        return ReconcileSummary(running, exited, vanished)

    def _settle_vanished(self, present: set[str]) -> int:
        """RUNNING tasks of this node whose container is gone: platform failures."""
        tasks_by_attempt: dict[tuple[str, int], dict[str, Task]] = {}
        settled = 0
        for alloc in self.store.get_allocations(self.store.r, self.node).values():
            attempt_key = (alloc.job_id, alloc.attempt)
            if attempt_key not in tasks_by_attempt:
                tasks_by_attempt[attempt_key] = self.store.read_tasks(
                    self.store.r, alloc.job_id, alloc.attempt)
            task = tasks_by_attempt[attempt_key].get(task_key(alloc.role, alloc.index))
            if task is None or task.state != TaskState.RUNNING:
                continue
            ref = TaskRef(alloc.job_id, alloc.attempt, alloc.role, alloc.index, task.retries)
            name = ref.container_name
            # Listed before the tasks were read: a container started since is
            # RUNNING in Redis but not in the list, so ask Docker by name.
            if name in present or self._container_exists(name):
                continue
            log.warning("%s is RUNNING but its container %s is gone", describe(ref), name)
            key = task.container_id or name
            future = self._dispatch.submit(key, partial(self._settle_lost, ref, key))
            if _outcome(future) is not None:
                settled += 1
        return settled

    def _settle_lost(self, ref: TaskRef, container_id: str) -> ExitReport | None:
        self.shipping.finish(container_id, LOG_DRAIN_SECONDS)
        observation = ExitObservation(UNKNOWN_EXIT_CODE,
                                      f"container vanished from node {self.node}")
        return self._settle(ref, observation, platform_failure=True)

    def _container_exists(self, name: str) -> bool:
        try:
            self.docker.containers.get(name)
        except NotFound:
            return False
        except (DockerException, RequestException) as error:
            log.warning("cannot look up container %s: %s", name, error)
            return True  # unsure: never fail a task on a guess
        return True

    # -------------------------------------------------------------- events

    def event_filters(self) -> dict[str, list[str]]:
        return {"type": ["container"], "label": [LABEL_JOB, f"{LABEL_NODE}={self.node}"],
                "event": [EventKind.START.value, EventKind.DIE.value]}

    def watch_events(self, stop_event: threading.Event, since: float | None = None) -> None:
        """Follow this node's container starts and deaths until `stop_event` is set.

        `since` (epoch seconds; default now) replays what happened from then.
        After the stream breaks it reconnects with a bounded backoff, asking
        for the events since the last one seen, and runs a reconcile pass,
        since events may have been lost meanwhile.
        """
        since_seconds = int(since if since is not None else time.time())
        threading.Thread(target=self._close_events_when_set, args=(stop_event,),
                         name="pai-monitor-events-closer", daemon=True).start()
        failures = 0
        while not stop_event.is_set():
            for raw in self._event_stream(since_seconds, stop_event):
                failures = 0
                event = parse_container_event(raw)
                if event is None:
                    continue
                since_seconds = max(since_seconds, event.time_seconds)
                try:
                    self.dispatch_event(event)
                except DispatcherClosed:
                    return  # closed under us: shutting down
            if stop_event.is_set():
                break
            failures += 1
            delay = backoff_delay(failures, 0.5, 10.0)
            log.warning("the Docker event stream ended; reconnecting in %.1f s", delay)
            if stop_event.wait(delay):
                break
            try:
                self.reconcile()
            except Exception:
                log.exception("reconcile after reconnecting to Docker failed")

    def _event_stream(self, since_seconds: int, stop_event: threading.Event) -> Any:
        """Yield raw events until the stream ends or breaks."""
        try:
            stream = self.engine.follow_events(self.event_filters(), since_seconds)
        except (DockerException, RequestException) as error:
            log.warning("cannot follow Docker events: %s", error)
            return
        with self._events_lock:
            self._events_stream = stream
        try:
            if not stop_event.is_set():
                yield from stream
        except (DockerException, RequestException, OSError, ValueError) as error:
            log.warning("the Docker event stream broke: %s", error)
        finally:
            with self._events_lock:
                self._events_stream = None
            close_stream(stream)

    def _close_events_when_set(self, stop_event: threading.Event) -> None:
        stop_event.wait()
        with self._events_lock:
            stream = self._events_stream
        close_stream(stream)

    def dispatch_event(self, event: ContainerEvent) -> Future[Any]:
        """Queue an event's handling behind earlier work on the same container."""
        if event.kind == EventKind.START:
            return self._dispatch.submit(event.container_id, partial(self._on_start, event))
        return self._dispatch.submit(event.container_id, partial(self._on_die, event))

    def _on_start(self, event: ContainerEvent) -> bool:
        """Mark the task RUNNING from the event itself, then ship its log.

        Not inspecting first matters: Docker answers an inspect of a container
        that exits at once only after handling its exit, which held the task's
        RUNNING (and, queued behind it, its exit) back by 100 ms and more
        under load (docs/performance.md). A container that is no live task's
        is inspected and handled as before.
        """
        ref = event.ref
        if ref is not None and mark_task_running(self.store, ref.job_id, ref.attempt,
                                                 ref.role, ref.index, event.container_id,
                                                 task_retry=ref.retry,
                                                 submission=ref.submission):
            self.shipping.ensure(self.docker.containers.prepare_model({"Id": event.container_id}),
                                 ref)
            return True
        try:
            container = self.docker.containers.get(event.container_id)
        except NotFound:
            return False  # already gone: its die event, or reconcile, settles the task
        return self.handle_start(container)

    def _on_die(self, event: ContainerEvent) -> ExitReport | None:
        if event.ref is not None and event.exit_code == "0":
            return self.handle_clean_exit(event.ref, event.container_id)
        try:
            container = self.docker.containers.get(event.container_id)
        except NotFound:
            if event.ref is None:
                return None
            return self.handle_removed_exit(event.ref, event.container_id,
                                            exit_from_event_code(event.exit_code))
        return self.handle_exit(container, fresh=True)

    # ------------------------------------------------------------- shutdown

    def close(self) -> None:
        """Finish the handlers that run, stop following logs (a restart resumes)."""
        with self._events_lock:
            stream = self._events_stream
        close_stream(stream)
        self._dispatch.shutdown(wait=True)
        self.shipping.close()
        self.engine.close()



def _outcome(future: Future[Any]) -> Any:
    """Wait for a handler; its result, or None when it failed (it logged why)."""
    try:
        return future.result()
    except Exception:  # includes CancelledError: shut down before it ran
        return None
