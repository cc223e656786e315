"""The launcher of one node: start and stop its task containers, keep it alive.

Plain methods that re-read Redis on every call ("assert the world"): a
message may arrive twice, late, or for a task that moved on, so each one
first checks the task is still this node's to start (or stop). The monitor
observes the containers; the launcher only settles a task itself when its
container never existed (image unavailable, bad storage, stopped first).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import redis

from services.launcher.environment import (
    PREEMPTION_FILE,
    IncompletePlacement,
    preemption_notice,
    task_environment,
)
from services.launcher.mounts import TaskSetupError
from services.launcher.runtime import DockerRuntime, ImageUnavailable
from shared.accounts import Accounts
from shared.capabilities import refused_capabilities
from shared.completion import NON_RETRYABLE_PREFIX
from shared.config import Settings
from shared.containers import TaskRef
from shared.lifecycle import LIVE_JOB_STATES, record_task_exit
from shared.messaging import Messenger
from shared.models import JobSpec, Node, task_key
from shared.states import TaskState
from shared.store import Store, task_is_live

log = logging.getLogger("pai.launcher")

# Exit codes of tasks whose container never ran (user programs exit 0..255).
EXIT_SETUP_FAILED = -1  # storage missing, Docker refused the container, stopped first
EXIT_IMAGE_UNAVAILABLE = -2  # the image could not be pulled: never retried

REGISTER_SECONDS = 60.0
# Containers one batched start message creates at once (Docker calls block)
START_CONCURRENCY = 8
STOP_TIMEOUT_SECONDS = 10


class Launcher:
    def __init__(
        self, settings: Settings, store: Store, messenger: Messenger, runtime: DockerRuntime,
        node: Node,
    ) -> None:
        self.settings = settings
        self.store = store
        self.messenger = messenger
        self.runtime = runtime
        self.node = node

    # ---------------------------------------------------------------- start

    def start_tasks(self, tasks: Sequence[tuple[str, int, str, int]]) -> None:
        """Start the tasks a pass placed here (one message for them all), up to
        START_CONCURRENCY at once, as separate messages would be; each start
        checks its own task, so a repeated message starts nothing twice."""
        if len(tasks) == 1:
            self.start_task(*tasks[0])
            return
        with ThreadPoolExecutor(min(len(tasks), START_CONCURRENCY),
                                thread_name_prefix="start") as pool:
            for future in [pool.submit(self.start_task, *task) for task in tasks]:
                future.result()  # a start's error is the message's, as it was alone

    def start_task(self, job_id: str, attempt: int, role: str, index: int) -> None:
        """Start the task's container if it is still this node's to start."""
        what = f"{job_id} attempt {attempt} {role}[{index}]"
        job = self.store.get_job(job_id)
        if job is None:
            log.info("not starting %s: the job is gone", what)
            return
        if job.attempt != attempt or job.state not in LIVE_JOB_STATES:
            log.info("not starting %s: the job is %s on attempt %d", what, job.state, job.attempt)
            return
        tasks = self.store.get_tasks(job_id, attempt)
        task = next((t for t in tasks if t.key == task_key(role, index)), None)
        if task is None or task.state != TaskState.LAUNCHING or task.node != self.node.name:
            log.info("not starting %s: the task is %s on node %s", what,
                     task.state if task else "missing", task.node if task else None)
            return
        config = self.store.get_config(job_id)
        if config is None:
            log.warning("not starting %s: the job has no config", what)
            return
        spec = JobSpec.from_config(config)
        ref = TaskRef(job_id, attempt, role, index)
        refused = self._revoked_capabilities(spec)
        if refused:  # admitted at submit; an admin took them back since
            self._settle(ref, EXIT_SETUP_FAILED,
                         f"{NON_RETRYABLE_PREFIX} virtual cluster {spec.virtual_cluster} "
                         f"no longer allows {', '.join(refused)}")
            return
        try:
            env = task_environment(spec, job.username, tasks, role, index,
                                   default_fs_uri=self.settings.default_fs_uri,
                                   renumbered_gpus=self.node.nvidia_runtime, attempt=attempt)
            container_id = self.runtime.start(ref, spec, job.username, job.virtual_cluster,
                                              task, env, self.node)
        except IncompletePlacement as error:
            # A platform bug, not the user's: leave the task to the launch lease.
            log.error("not starting %s: %s", what, error)
            return
        except ImageUnavailable as error:
            log.warning("%s failed: %s", what, error)
            self._settle(ref, EXIT_IMAGE_UNAVAILABLE, f"{NON_RETRYABLE_PREFIX} {error}")
            return
        except TaskSetupError as error:
            log.warning("%s failed: %s", what, error)
            self._settle(ref, EXIT_SETUP_FAILED, str(error))
            return
        log.info("started %s in container %s", what, container_id[:12])

    def _revoked_capabilities(self, spec: JobSpec) -> list[str]:
        """What the job asks for beyond the default set that its VC's allow-list
        no longer names: the allow-list is the admin's, at launch as at submit."""
        if not spec.capabilities:
            return []
        vc = Accounts(self.store).get_vc(spec.virtual_cluster)
        return refused_capabilities(spec.capabilities, vc.allowed_capabilities if vc else [])

    # ----------------------------------------------------------------- stop

    def stop_task(self, job_id: str, attempt: int, role: str, index: int) -> None:
        """Stop the task's container; settle the task if it never had one."""
        ref = TaskRef(job_id, attempt, role, index)
        if self.runtime.stop(ref, timeout=STOP_TIMEOUT_SECONDS):
            log.info("stopped %s attempt %d %s[%d]", job_id, attempt, role, index)
            return  # the monitor records the exit it sees
        self._settle_unstarted(ref, "stopped before its container started")

    def preempt_task(self, job_id: str, attempt: int, role: str, index: int) -> None:
        """Warn a preempted task: the notice file, then SIGTERM. The scheduler
        stops it for good when its grace period ends; one that never started
        is settled now (it has nothing to save)."""
        job = self.store.get_job(job_id)
        if job is None or job.attempt != attempt or not job.preempted_by:
            return
        ref = TaskRef(job_id, attempt, role, index)
        notice = preemption_notice(job.preempted_by, job.preempt_deadline_ms or 0)
        if self.runtime.warn(ref, PREEMPTION_FILE, notice):
            log.info("preempting %s attempt %d %s[%d] for %s", job_id, attempt, role, index,
                     job.preempted_by)
            return
        self._settle_unstarted(ref, f"preempted by {job.preempted_by} before its container "
                                    "started")

    def _settle_unstarted(self, ref: TaskRef, diagnostics: str) -> None:
        """A task of this node stopped before its container ever ran: settle
        it as the platform's doing (nothing of the job's ran)."""
        task = self.store.get_task(ref.job_id, ref.attempt, ref.role, ref.index)
        if task is not None and task_is_live(task) and task.node == self.node.name:
            self._settle(ref, EXIT_SETUP_FAILED, diagnostics, platform_failure=True)

    def _settle(self, ref: TaskRef, exit_code: int, diagnostics: str, *,
                platform_failure: bool = False) -> None:
        """Record the exit of a task that never ran, and tell the scheduler."""
        report = record_task_exit(self.store, ref.job_id, ref.attempt, ref.role, ref.index,
                                  exit_code=exit_code, diagnostics=diagnostics,
                                  platform_failure=platform_failure)
        if report is None:
            return  # already settled by someone else
        self.messenger.task_ended(ref.job_id, ref.attempt, ref.role, ref.index)
        if report.attempt_ended:
            self.messenger.attempt_ended(ref.job_id, ref.attempt)

    # ------------------------------------------------------------ heartbeat

    def heartbeat_loop(self, stop_event: threading.Event) -> None:
        """Keep the node's lease: its full record every minute (and at start,
        so a restarted launcher reports fresh figures), a heartbeat between."""
        registered_at: float | None = None
        while not stop_event.is_set():
            now = time.monotonic()
            try:
                if registered_at is None or now - registered_at >= REGISTER_SECONDS:
                    self.store.register_node(self.node)
                    registered_at = now
                else:
                    self.store.heartbeat(self.node.name)
            except redis.RedisError as error:
                log.warning("heartbeat of node %s failed: %s", self.node.name, error)
            except Exception:
                log.exception("heartbeat of node %s failed", self.node.name)
            stop_event.wait(self.settings.heartbeat_seconds)
