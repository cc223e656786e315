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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from docker.errors import APIError, NotFound

from services.launcher.environment import IncompletePlacement, task_environment
from services.launcher.exectty import TtySessions
from services.launcher.mounts import TaskSetupError
from services.launcher.runtime import DockerRuntime, ImageUnavailable
from services.launcher.ssh import SshdOutcome, install_keys, start_sshd
from shared.domain import ssh
from shared.domain.capabilities import refused_capabilities
from shared.domain.completion import NON_RETRYABLE_PREFIX
from shared.domain.models import Job, JobSpec, Node, Task, task_key
from shared.domain.notice import PREEMPTION_FILE, preemption_notice
from shared.domain.states import LIVE_JOB_STATES, JobState, TaskState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger
from shared.node.containers import TaskRef
from shared.state import leases, proxytokens, sshkeys
from shared.state.accounts import Accounts
from shared.state.execs import Claims, ExecRequest, ExecResult, Outcome
from shared.state.leases import Holder, NameLost
from shared.state.nodeagent import live_ms
from shared.state.nodecalls import TaskAt
from shared.state.store import Store, task_is_live
from shared.state.store.jobs import live_task_from, queue_live_task
from shared.state.taskexits import record_task_exit

log = logging.getLogger("pai.launcher")

# Exit codes of tasks whose container never ran (user programs exit 0..255).
EXIT_SETUP_FAILED = -1  # storage missing, Docker refused the container, stopped first
EXIT_IMAGE_UNAVAILABLE = -2  # the image could not be pulled: never retried

REGISTER_SECONDS = 60.0
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
        self.claims = Claims(store.r)
        # Execs run here, not in Celery's threads; beyond the slots: BUSY.
        self.exec_slots = threading.BoundedSemaphore(settings.exec_slots_per_node)
        self.exec_pool = ThreadPoolExecutor(settings.exec_slots_per_node,
                                            thread_name_prefix="exec")
        # Interactive sessions: slots and threads of their own (exectty.py).
        self.tty = TtySessions(settings, store, runtime, node.name, self._running_container)
        # The node agent's hold on the node's name (shared/state/nodeagent.py),
        # once claimed; None for a launcher set up by hand (tests).
        self.holder: Holder | None = None
        # Why this node's storage is not the cluster's shared storage ("": it
        # is, or no check runs), from run.py's storage check: no container
        # starts meanwhile, so no job's output lands on the node's own disk.
        self.storage_problem: Callable[[], str] = lambda: ""

    # ---------------------------------------------------------------- start

    def start_task(self, job_id: str, attempt: int, role: str, index: int) -> None:
        """Start the task's container if it is still this node's to start."""
        what = f"{job_id} attempt {attempt} {role}[{index}]"
        job, tasks, config = self.store.read_launch(job_id, attempt)
        if job is None:
            log.info("not starting %s: the job is gone", what)
            return
        if job.attempt != attempt or job.state not in LIVE_JOB_STATES:
            log.info("not starting %s: the job is %s on attempt %d", what, job.state, job.attempt)
            return
        task = next((t for t in tasks if t.key == task_key(role, index)), None)
        if task is None or task.state != TaskState.LAUNCHING or task.node != self.node.name:
            log.info("not starting %s: the task is %s on node %s", what,
                     task.state if task else "missing", task.node if task else None)
            return
        if config is None:
            log.warning("not starting %s: the job has no config", what)
            return
        spec = JobSpec.from_config(config)
        # Its current container: a task retry (taskRetryCount) gets a new one.
        ref = TaskRef(job_id, attempt, role, index, task.retries, job.submission)
        problem = self.storage_problem()
        if problem:  # the node's fault, not the job's: placed again elsewhere, uncharged
            log.warning("not starting %s: %s", what, problem)
            # Kept from new work first, so that the pass the retry starts
            # does not place the job here again (the monitor's own check
            # reports the problem in the lease within its period).
            leases.mark_node(self.store, self.node.name, problem,
                             now_ms() + int(self.settings.node_settle_seconds * 1000))
            self._settle(ref, EXIT_SETUP_FAILED, f"node {self.node.name}: {problem}",
                         platform_failure=True)
            return
        refused = self._revoked_capabilities(spec)
        if refused:  # admitted at submit; an admin took them back since
            self._settle(ref, EXIT_SETUP_FAILED,
                         f"{NON_RETRYABLE_PREFIX} virtual cluster {spec.virtual_cluster} "
                         f"no longer allows {', '.join(refused)}")
            return
        try:
            env = task_environment(spec, job.username, tasks, role, index,
                                   default_fs_uri=self.settings.default_fs_uri,
                                   renumbered_gpus=self.node.nvidia_runtime, attempt=attempt,
                                   proxy_token=proxytokens.ensure_token(self.store.r, job_id))
            container_id = self.runtime.start(ref, spec, job.username, job.virtual_cluster,
                                              task, env, self.node,
                                              prepare=self._ssh_keys(job_id, spec))
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
        if spec.ssh is not None:
            self._start_sshd(ref, task, container_id)

    # ------------------------------------------------------------------ ssh

    def _ssh_keys(self, job_id: str, spec: JobSpec) -> Callable[[str], None] | None:
        """For an SSH job: what writes its authorized keys into a task's
        container before it starts (services/launcher/ssh.py)."""
        if spec.ssh is None:
            return None
        pair = sshkeys.read_key(self.store.r, job_id) if spec.ssh.job_key else None
        if spec.ssh.job_key and pair is None:
            log.error("job %s asked for SSH but has no key pair: only the user's key (if "
                      "any) is authorized", job_id)
        text = ssh.authorized_keys(spec.ssh, pair.public_key if pair else None)
        return lambda container_id: install_keys(self.runtime.client.api, container_id, text)

    def _start_sshd(self, ref: TaskRef, task: Task, container_id: str) -> None:
        """Start the image's sshd on the task's `ssh` port, and say how it went
        in the job's events (the task's log says it too)."""
        ports = task.ports.get(ssh.PORT_LABEL) or []
        port = ports[0] if ports else None
        if port is None:
            outcome = SshdOutcome(False, "sshd not started: the task has no ssh port")
        else:
            outcome = start_sshd(self.runtime.client.api, container_id, port)
        what = f"{ref.job_id} attempt {ref.attempt} {ref.role}[{ref.index}]"
        (log.info if outcome.started else log.warning)("ssh in %s: %s", what, outcome.message)
        pipe = self.store.pipeline(atomic=False)
        self.store.add_event(pipe, ref.job_id, "ssh", attempt=ref.attempt, role=ref.role,
                             index=ref.index, started=outcome.started, port=port,
                             message=outcome.message)
        pipe.execute()

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
        ref = self._current(job_id, attempt, role, index)
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
        ref = self._current(job_id, attempt, role, index)
        notice = preemption_notice(job.preempted_by, job.preempt_deadline_ms or 0)
        if self.runtime.warn(ref, PREEMPTION_FILE, notice):
            log.info("preempting %s attempt %d %s[%d] for %s", job_id, attempt, role, index,
                     job.preempted_by)
            return
        self._settle_unstarted(ref, f"preempted by {job.preempted_by} before its container "
                                    "started")

    def _current(self, job_id: str, attempt: int, role: str, index: int) -> TaskRef:
        """The task's current container (its latest task retry's, of the job's
        current submission)."""
        task = self.store.get_task(job_id, attempt, role, index)
        submission = self.store.submission_of(job_id)
        return TaskRef(job_id, attempt, role, index, task.retries if task else 0, submission)

    def _settle_unstarted(self, ref: TaskRef, diagnostics: str) -> None:
        """A task of this node stopped before its container ever ran: settle
        it as the platform's doing (nothing of the job's ran)."""
        task = self.store.get_task(ref.job_id, ref.attempt, ref.role, ref.index)
        if task is not None and task_is_live(task) and task.node == self.node.name:
            self._settle(ref, EXIT_SETUP_FAILED, diagnostics, platform_failure=True)

    def _settle(self, ref: TaskRef, exit_code: int, diagnostics: str, *,
                platform_failure: bool = False) -> None:
        """Record the exit of a task that never ran, and tell the scheduler."""
        report = record_task_exit(
            self.store, ref.job_id, ref.attempt, ref.role, ref.index, exit_code=exit_code,
            diagnostics=diagnostics, platform_failure=platform_failure, task_retry=ref.retry,
            relaunch_deadline_ms=now_ms() + int(self.settings.launch_timeout_seconds * 1000),
            submission=ref.submission)
        if report is None:
            return  # already settled by someone else
        if report.relaunched and report.node:  # its role's taskRetryCount covers it
            self.messenger.task_relaunched(ref.job_id, ref.attempt, ref.role, ref.index)
            return
        if report.attempt_ended:  # it frees this task's allocation too (the monitor's _settle)
            self.messenger.attempt_ended(ref.job_id, ref.attempt)
            return
        self.messenger.task_ended(ref.job_id, ref.attempt, ref.role, ref.index)

    # ----------------------------------------------------------------- exec

    def exec_command(self, request_id: str, task: TaskAt | None = None) -> None:
        """Claim an exec request and run it in the pool (shared/state/execs.py).

        The claim takes the request once, and only for this node: a call
        read again finds it taken, one naming another node is left alone. One
        the API stopped waiting for is not run (its caller was told 504). A
        task that does not run here now, in its job's current attempt, gets
        NOT_RUNNING; a full pool, BUSY. The feed of calls (calls.py) goes on
        at once: a command may run for minutes, and the node's other calls
        must not wait behind it.

        The task the call names (`task`) is read beside the claim, in its
        round trip; the request's own task is what counts, and one the call
        did not name is read after.
        """
        def task_reads(pipe: Any) -> None:
            if task is not None:
                queue_live_task(pipe, task.job_id, task.attempt, task.role, task.index)

        request, replies = self.claims.claim(request_id, self.node.name, self.node.name,
                                             task_reads)
        if request is None:
            log.info("exec request %s: not for this node, gone, or taken before", request_id)
            return
        if request.abandoned(now_ms()):
            log.warning("exec request %s by %s in %s: read after the API stopped waiting for "
                        "its answer; not run", request_id, request.user, request.job_id)
            return
        named = TaskAt(request.job_id, request.attempt, request.role, request.index)
        container_id = self._running_container(
            request, live_task_from(request.job_id, *replies) if named == task else None)
        if container_id is None:
            self.claims.answer(request, ExecResult(
                Outcome.NOT_RUNNING, message=f"its container does not run on {self.node.name} "
                                             f"in attempt {request.attempt}"))
            return
        if not self.exec_slots.acquire(blocking=False):
            self.claims.answer(request, ExecResult(Outcome.BUSY))
            return
        try:
            self.exec_pool.submit(self._run_exec, request, container_id)
        except BaseException:
            self.exec_slots.release()
            raise

    def _running_container(self, request: ExecRequest,
                           read: tuple[Job | None, Task | None] | None = None) -> str | None:
        """The id of the request's task container, if the task is RUNNING on
        this node in its job's current attempt: the id its start recorded
        (for this submission and task retry: `mark_task_running`, the one
        way a task becomes RUNNING), taken without asking Docker. A container
        that stopped since is refused by Docker's exec, and the request is
        answered NOT_RUNNING then. `read`: the job and the task as read
        already (beside the claim); else they are read now."""
        job, task = read or self.store.read_live_task(request.job_id, request.attempt,
                                                      request.role, request.index)
        if job is None or job.attempt != request.attempt or job.state != JobState.RUNNING:
            return None
        if task is None or task.state != TaskState.RUNNING or task.node != self.node.name:
            return None
        return task.container_id or None

    def _run_exec(self, request: ExecRequest, container_id: str) -> None:
        what = f"{request.job_id} attempt {request.attempt} {request.role}[{request.index}]"
        try:
            log.info("exec by %s in %s: %s", request.user, what, request.argv)
            try:
                done = self.runtime.exec_in(container_id, request.argv, request.timeout_seconds)
            except (NotFound, APIError) as error:
                log.info("exec in %s refused by Docker: %s", what, error)
                self.claims.answer(request, ExecResult(
                    Outcome.NOT_RUNNING, message=f"its container does not run on "
                                                 f"{self.node.name}: Docker refused: {error}"))
                return
            self.claims.answer(request, ExecResult(
                Outcome.DONE, exit_code=done.exit_code, output=done.output,
                truncated=done.truncated, timed_out=done.timed_out))
            log.info("exec by %s in %s ended: exit %s%s", request.user, what, done.exit_code,
                     ", killed at its timeout" if done.timed_out else "")
        except Exception:
            log.exception("exec in %s failed", what)
        finally:
            self.exec_slots.release()

    # ------------------------------------------------------------ heartbeat

    def heartbeat_loop(self, stop_event: threading.Event,
                       name_lost: Callable[[str], None] | None = None) -> None:
        """Keep the node's lease: its full record every minute (and at start,
        so a restarted launcher reports fresh figures), a renewal between.
        With a holder, every write goes through the lease, so a launcher
        whose name another machine took writes nothing (`name_lost` is told)."""
        registered_at: float | None = None
        while not stop_event.is_set():
            now = time.monotonic()
            due = registered_at is None or now - registered_at >= REGISTER_SECONDS
            try:
                self._renew(due)
                if due:
                    registered_at = now
            except NameLost as error:
                log.error("launcher of node %s: %s", self.node.name, error)
                if name_lost is not None:
                    name_lost(str(error))
                return
            except redis.RedisError as error:
                log.warning("heartbeat of node %s failed: %s", self.node.name, error)
            except Exception:
                log.exception("heartbeat of node %s failed", self.node.name)
            stop_event.wait(self.settings.heartbeat_seconds)

    def _renew(self, with_record: bool) -> None:
        if self.holder is None:
            if with_record:
                self.store.register_node(self.node)
            else:
                self.store.heartbeat(self.node.name)
            return
        leases.renew(self.store, self.holder, live_ms=live_ms(self.settings),
                     inventory=self.node.to_dict() if with_record else None)
