"""The scheduler's IO shell around the pure core: snapshot, plan, commit, send.

Passes are serialized by a Redis lock and coalesced by a dirty flag
(`gate.py`): any number of requests while a pass runs cost one more pass,
not one each. What a pass reads beyond the snapshot, and keeps between
passes, is `reading.py`'s; which nodes take work, `nodes.py`'s.
Releases, stops and the periodic repair are idempotent, so a redelivered
message or a second replica does no harm.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from services.scheduler import policy
from services.scheduler.core import Cluster, JobRequest, free_view
from services.scheduler.decisions import Placed, Waiting
from services.scheduler.gate import PASS_AGAIN, PASS_BEGUN, PASS_DEFERRED, PassGate
from services.scheduler.heap import paused_gc
from services.scheduler.nodes import NodeWarden
from services.scheduler.pacing import LastPass
from services.scheduler.policy import Las, Preemption, RunningJob
from services.scheduler.reading import PassReader
from shared.domain import gpuhealth
from shared.domain.cluster import NodeFlags, takes_work, vc_policies
from shared.domain.lease import unready_of
from shared.domain.models import (
    Allocation,
    Task,
    attempt_task_key,
    parse_attempt_task_key,
    split_job_id,
)
from shared.domain.states import JobState, TaskState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger
from shared.state import retention, telemetry, usage
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.lifecycle import (
    ModeChange,
    mark_preempted,
    queue_waiting_many,
    renew_stale_launch,
    set_modes,
)
from shared.state.placing import CommitStream, PlacementCommit, commit_placement
from shared.state.starts import send as send_starts
from shared.state.store import QueuedJob, Store, compact_json, task_is_live
from shared.state.taskexits import record_task_exit

log = logging.getLogger("pai.scheduler")

STOP_RESEND_MS = 15_000
MAX_HARD_STOPS = 100_000  # the stops remembered before the memory is cleared
MAX_PASSES_PER_CALL = 50
# Pass requests a worker may leave to the scheduler messages behind them
# (`request_pass(deferrable=True)`) before it passes anyway
MAX_DEFERRED = 64


@dataclass
class _GangBinder:
    """Takes the plan's placements as it makes them (`policy.plan`'s
    `on_placed`): each gang goes to the stream and to `gangs`, in order."""

    stream: CommitStream
    gangs: list[Placed] = field(default_factory=list)

    def __call__(self, placed: Placed) -> None:
        if placed.request.gang:
            self.gangs.append(placed)
            request = placed.request
            self.stream.add(PlacementCommit(
                request.job_id, request.version, request.attempt, placed.placements,
                placed.mode, queue_seq=request.seq, vc=request.vc))


@dataclass
class PassStats:
    placed: int = 0
    waiting: int = 0
    modes_changed: int = 0  # running jobs promoted to their guarantee or demoted from it
    seconds: float = 0.0


class Scheduler:
    def __init__(self, settings: Settings, store: Store, messenger: Messenger) -> None:
        self.settings = settings
        self.store = store
        self.messenger = messenger
        self.accounts = Accounts(store)
        self.las = Las.from_settings(settings)
        self.reader = PassReader(settings, store, self.las)
        self.gate = PassGate(store)
        self._hard_stops: dict[str, int] = {}  # job id -> when its last hard stop was sent
        self._deferred = 0  # pass requests left to the messages behind them, in a row
        # whether the message being handled asked for a pass: per thread, as
        # the doorbell's and the repair loop's threads ask for passes too
        self._handling = threading.local()
        self.warden = NodeWarden(settings, store, self.fail_node_tasks, self.fail_launch)
        self.last_pass: LastPass | None = None  # this replica's (services/scheduler/pacing.py)

    # ------------------------------------------------------------ passes

    def request_pass(self, *, deferrable: bool = False, if_dirty: bool = False) -> None:
        """Run passes until nothing asked for one; or leave it to the holder.

        Two round trips around the passes (`gate.py`'s begin and end): a
        request while another pass holds the lock only marks work to do, and
        the holder, before it lets go, passes again for all such requests at
        once. `deferrable` (a trigger taken from this worker's queue): when
        more scheduler messages wait behind this one, only mark the work and
        leave the pass to the last of them (`message`), so N task exits that
        arrive together cost one pass, not N; at most MAX_DEFERRED times in a
        row, so a queue that never empties still gets its passes. `if_dirty`:
        only if a pass was asked for and has not run yet.
        """
        self._handling.requested = True
        defer = deferrable and self._deferred < MAX_DEFERRED
        token = uuid.uuid4().hex
        began = self.gate.begin(token, defer=defer, if_dirty=if_dirty)
        if began == PASS_DEFERRED:
            self._deferred += 1
            return
        self._deferred = 0
        if began != PASS_BEGUN:
            return  # the holder sees the dirty flag and passes again
        for _ in range(MAX_PASSES_PER_CALL):
            try:
                self.run_pass()
            except BaseException:
                self.gate.end(token, let_go=True)
                raise
            if self.gate.end(token) != PASS_AGAIN:
                return
        # asked again MAX_PASSES_PER_CALL times in a row: let go; the flag stays
        # for the next request (the repair loop makes one every few seconds)
        self.gate.end(token, let_go=True)

    @contextmanager
    def message(self) -> Iterator[None]:
        """Around the handling of one scheduler message: if it asked for no
        pass itself, it runs the pass an earlier message left to it (the
        dirty flag), unless more messages still wait behind it."""
        self._handling.requested = False
        try:
            yield
        finally:
            if not self._handling.requested:
                self.request_pass(deferrable=True, if_dirty=True)

    def run_pass(self) -> PassStats:
        """One pass: read, plan, commit, send. Without cyclic garbage
        collection inside, and what it leaves allocated frozen after it
        (services/scheduler/heap.py): a first pass over thousands of jobs
        allocates so much that the collector walked the whole heap, the
        caches included, several times during it (a sixth of the commit's
        CPU in the placement bench's profile), and again after it."""
        began = time.monotonic()
        with paused_gc(freeze_survivors=True):
            stats = self._pass()
        self.last_pass = LastPass(began, left_waiting=stats.waiting > 0)
        return stats

    def _pass(self) -> PassStats:
        started = time.perf_counter()
        now = now_ms()
        snapshot = self.reader.snapshot()
        # unhealthy GPUs take no work
        nodes = [gpuhealth.healthy_view(n, snapshot.faults) for n in snapshot.nodes]
        flags, allocations = snapshot.flags, snapshot.allocations
        unready = unready_of(snapshot.cluster, int(self.settings.node_lost_seconds * 1000),
                             int(self.settings.node_settle_seconds * 1000))
        live = [n for n in nodes if takes_work(n, flags.get(n.name), now,
                                               self.settings.node_lost_seconds, unready)]
        cluster = Cluster(free_view(node, allocations[node.name]) for node in live)
        running = self.reader.running(allocations)
        self._drain(running, flags, now)
        queue, records = self.reader.queue(snapshot.queued, now)
        vcs = self.accounts.vcs_from(snapshot.vc_records)
        policies = vc_policies({vc.name: vc.gpu_quota for vc in vcs},
                               {vc.name: vc.borrowing for vc in vcs},
                               sum(len(n.gpus) for n in live))
        attained = self.reader.attained(queue)
        self.reader.forget_gone(queue)
        spent, user_spent = self._spent(vcs, allocations, queue, now)
        deadline = now + int(self.settings.launch_timeout_seconds * 1000)
        with self._binding(deadline) as bind:
            plan = policy.plan(cluster, queue, running, policies, now, attained, self.las,
                               spent, user_spent, on_placed=bind)
        gangs_bound = bind.stream.finish()
        self.reader.place_in_las_queues(queue, attained, now)
        stats = PassStats(waiting=len(plan.waiting))
        placed_by_vc = self._commit(bind.gangs, gangs_bound,
                                    [p for p in plan.placed if not p.request.gang],
                                    deadline, stats)
        for preemption in plan.preempt:
            self._preempt(preemption, now)
        attempts = {r.job_id: r.attempt for r in running}
        self.reader.forget(plan.modes)  # a mode is written without a feed entry
        stats.modes_changed = len(set_modes(self.store, [
            ModeChange(job_id, attempts[job_id], mode) for job_id, mode in plan.modes.items()]))
        self._stop_overdue(running, now)
        reasons = self._waiting_reasons(plan.waiting, records)
        stats.seconds = time.perf_counter() - started
        self._write_pass_end(reasons, records, stats.seconds, placed_by_vc)
        if stats.placed or queue:
            log.info("pass: %d placed, %d waiting, %d preempted, %.1f ms", stats.placed,
                     stats.waiting, len(plan.preempt), stats.seconds * 1000)
        return stats

    @contextmanager
    def _binding(self, deadline: int) -> Iterator[_GangBinder]:
        """What the plan hands each placement to: a gang is bound while the
        plan decides the rest (placing.CommitStream). Should the plan raise,
        what it handed over is bound and started all the same (a decision
        the pass made), the stream's threads end, and the plan's error is
        the one raised."""
        binder = _GangBinder(CommitStream(self.store, launch_deadline_ms=deadline))
        try:
            yield binder
        except BaseException:
            try:
                bound = binder.stream.finish()
            except Exception:  # the plan's error is the one raised
                log.exception("binding the gangs of a failed plan")
            else:
                self._send_starts([g for g, won in zip(binder.gangs, bound, strict=True)
                                   if won])
            raise

    def _commit(self, gangs: list[Placed], gangs_bound: list[bool], others: list[Placed],
                deadline: int, stats: PassStats) -> Counter[str]:
        """Bind the rest of what the plan placed (the gangs are bound, as
        `gangs_bound` says: a job without gang allocation some of its tasks
        at a time, each commit on the tasks still waiting), then send each
        node its starts. Returns the jobs bound per VC; one the world moved
        away from waits for the next pass."""
        # each moves (a gang's commit writes no feed entry) or was found moved
        self.reader.forget(one.request.job_id for one in gangs + others)
        bound = gangs_bound + [
            commit_placement(self.store, p.request.job_id, version=p.request.version,
                             attempt=p.request.attempt, placements=p.placements,
                             launch_deadline_ms=deadline, mode=p.mode, gang=False)
            for p in others]
        won = [one for one, ok in zip(gangs + others, bound, strict=True) if ok]
        stats.placed += len(won)
        if stats.placed < len(bound):
            self.gate.look_again()  # some jobs changed under us
        self._send_starts(won)
        return Counter(one.request.vc for one in won)

    def _send_starts(self, bound: list[Placed]) -> None:
        """Each node's starts of the bound jobs' tasks, one entry a node."""
        starts: dict[str, list[tuple[str, int, str, int]]] = {}
        for one in bound:
            for p in one.placements:
                starts.setdefault(p.node, []).append(
                    (one.request.job_id, one.request.attempt, p.role, p.index))
        try:
            send_starts(self.store.r, starts)
        except RedisError as error:  # the placements stand
            log.warning("starts of %d tasks not sent (%s): their launch leases send them "
                        "again", sum(len(t) for t in starts.values()), error)

    def _waiting_reasons(self, waiting: dict[str, Waiting], records: dict[str, QueuedJob]
                         ) -> list[tuple[str, str, str, int]]:
        """Each waiting job's reason where it changed: (job id, message,
        explanation, the version it was decided on)."""
        reasons = []
        explained: dict[int, str] = {}  # most of a long queue shares a few Waitings
        for job_id, why in waiting.items():
            job = records.get(job_id)
            explanation = explained.get(id(why))
            if explanation is None:
                explanation = explained[id(why)] = compact_json(why.to_dict())
            if job is not None and (job.waiting_reason, job.waiting) != (why.message,
                                                                          explanation):
                reasons.append((job_id, why.message, explanation, job.version))
        return reasons

    def _write_pass_end(self, reasons: list[tuple[str, str, str, int]],
                        records: dict[str, QueuedJob], seconds: float,
                        placed_by_vc: Counter[str]) -> None:
        """The waiting jobs' new reasons (compare-and-set on their versions)
        and the pass's metrics for Prometheus (through Redis: see
        shared/state/telemetry.py), in one round trip; the held records then
        say what was written. A pass whose reasons could not be written
        fails as before; its metrics go with them."""
        pipe = self.store.pipeline(atomic=False)
        queue_waiting_many(pipe, reasons)
        telemetry.record(pipe, telemetry.SCHEDULER_PASS, value=seconds)
        for vc, placed in placed_by_vc.items():
            telemetry.record(pipe, telemetry.PLACEMENTS, {"vc": vc}, placed)
        pipe.execute()
        for job_id, message, explanation, _version in reasons:
            # Where the job moved meanwhile nothing was written, and the next
            # snapshot reads its new version whole.
            records[job_id].waiting_reason, records[job_id].waiting = message, explanation

    def _spent(self, vcs: list[VirtualCluster], allocations: dict[str, list[Allocation]],
               queue: list[JobRequest], now: int,
               ) -> tuple[dict[str, usage.Spend], dict[usage.Owner, usage.Spend]]:
        """This period's spend of each VC's budget, and of each user's budget
        within a VC (their own, or the VC's default) for the users with work
        queued or running in it, the only ones the plan weighs: one read for
        the pass, of the budgeted only."""
        budgets: dict[usage.Owner, usage.Budget] = {
            (vc.name, ""): vc.budget for vc in vcs if vc.budget is not None}
        if any(vc.user_gpu_hours_budgets or vc.default_user_gpu_hours_budget is not None
               for vc in vcs):
            active = {(r.vc, split_job_id(r.job_id)[0]) for r in queue} | {
                (a.vc, split_job_id(a.job_id)[0]) for allocs in allocations.values()
                for a in allocs}
            users: dict[str, list[str]] = {}
            for vc_name, user in active:
                users.setdefault(vc_name, []).append(user)
            for vc in vcs:
                budgets.update((owner, budget) for owner, budget
                               in vc.user_budgets(users.get(vc.name, ())).items()
                               if owner in active)
        spends = usage.read_spends(self.store.r, budgets,
                                   [a for allocs in allocations.values() for a in allocs], now)
        return ({vc: s for (vc, user), s in spends.items() if not user},
                {owner: s for owner, s in spends.items() if owner[1]})

    def _drain(self, running: list[RunningJob], flags: dict[str, NodeFlags], now: int) -> None:
        """Jobs with a task on a draining node are preempted (requeued,
        uncharged), as `kubectl drain` evicts: their tasks get the notice, the
        SIGTERM and their grace period, then run again elsewhere."""
        draining = {name for name, f in flags.items() if f.drain}
        if not draining:
            return
        for job in running:
            nodes = sorted({a.node for a in job.allocations} & draining)
            if nodes and not job.preempted_by:
                self._preempt(Preemption(job, f"drain of node {nodes[0]}"), now)

    def _preempt(self, preemption: Preemption, now: int) -> None:
        """Mark the victim (compare-and-set), then warn each of its live tasks."""
        victim = preemption.victim
        job = mark_preempted(self.store, victim.job_id, attempt=victim.attempt,
                             by=preemption.by, deadline_ms=now + victim.grace_ms)
        if job is None:
            return  # it ended or moved on meanwhile: the next pass decides again
        log.info("preempting %s for %s (grace %.0f s)", victim.job_id, preemption.by,
                 victim.grace_ms / 1000)
        try:
            telemetry.record(self.store.r, telemetry.PREEMPTIONS, {"vc": victim.vc})
        except RedisError as error:
            log.warning("cannot count the preemption: %s", error)
        for task in self.store.get_tasks(victim.job_id, victim.attempt):
            if task_is_live(task) and task.node:
                self.messenger.preempt_task(task.node, victim.job_id, victim.attempt,
                                            task.role, task.index)

    def _stop_overdue(self, running: list[RunningJob], now: int) -> None:
        """Preempted jobs whose grace period is over are stopped (SIGKILL after
        the stop timeout); at most once per STOP_RESEND_MS each."""
        for r in running:
            if not r.preempted_by or (r.preempt_deadline_ms or 0) > now:
                continue
            if now - self._hard_stops.get(r.job_id, 0) < STOP_RESEND_MS:
                continue
            self._hard_stops[r.job_id] = now
            log.info("grace period of preempted %s over: stopping it", r.job_id)
            self.stop_attempt(r.job_id, r.attempt)
        if len(self._hard_stops) > MAX_HARD_STOPS:
            self._hard_stops.clear()

    def heartbeat(self, name: str) -> None:
        """Tell the API (and so Prometheus) this replica is alive and repairing."""
        telemetry.record_scheduler_heartbeat(self.store.r, name)

    # ------------------------------------------------------ ends and stops

    def release_if_settled(self, job_id: str, attempt: int, role: str, index: int) -> bool:
        """Whether the task is settled on a node, its GPUs free for a pass:
        its exit's transaction freed its allocation (shared/state/taskexits.py);
        this frees one that a settle of another kind left (a stop)."""
        task = self.store.get_task(job_id, attempt, role, index)
        if task is None or task.node is None or not task.state.is_final:
            return False
        self.store.release_allocation(task.node, attempt_task_key(job_id, attempt, role, index))
        return True

    def task_ended(self, job_id: str, attempt: int, role: str, index: int, *,
                   deferrable: bool = False) -> None:
        if self.release_if_settled(job_id, attempt, role, index):
            self.request_pass(deferrable=deferrable)

    def send_relaunch(self, job_id: str, attempt: int, role: str, index: int) -> None:
        """A task its role's taskRetryCount relaunched on its allocation: send
        its node the start, if the task still launches there (the scheduler
        is the one sender of starts; a repeated message finds it sent)."""
        task = self.store.get_task(job_id, attempt, role, index)
        if task is not None and task.state == TaskState.LAUNCHING and task.node:
            send_starts(self.store.r, {task.node: [(job_id, attempt, role, index)]})

    def stop_attempt(self, job_id: str, attempt: int, *, deferrable: bool = False) -> None:
        """An attempt ended or its job is stopping: stop what still runs.

        A pass follows when a settled task held a node (its GPUs freed now,
        or by its exit), or when the job waits in the queue (a retry);
        otherwise the pass after the last task's release has already seen
        everything this could change.
        """
        freed = False
        for task in self.store.get_tasks(job_id, attempt):
            if task_is_live(task) and task.node:
                self.messenger.stop_task(task.node, job_id, attempt, task.role, task.index)
            elif task.state.is_final and task.node:
                # freed now, or by the task's exit (shared/state/taskexits.py)
                self.store.release_allocation(
                    task.node, attempt_task_key(job_id, attempt, task.role, task.index))
                freed = True
        if freed or self.store.is_queued(job_id):
            self.request_pass(deferrable=deferrable)

    def stop_job(self, job_id: str, *, deferrable: bool = False) -> None:
        job = self.store.get_job(job_id)
        if job is not None and job.state in (JobState.STOPPING, JobState.STOPPED):
            self.stop_attempt(job_id, job.attempt, deferrable=deferrable)

    # ------------------------------------------------------------ repair

    def reconcile(self) -> None:
        """Repair whatever an event missed; safe to run at any time."""
        self.warden.round()
        self.sweep_allocations()
        self.retry_stale_launches()
        self.resend_stops()
        self.request_pass()
        retention.sweep(self.store, self.settings)  # finished jobs: compact, file logs, expire

    def fail_node_tasks(self, nodes: list[str], reason: Callable[[str], str]) -> None:
        """Fail the live tasks of nodes declared lost, as the platform's fault,
        and free what those nodes held. Two round trips to read what they
        hold, then a few per task to fail and allocation to free."""
        for (name, alloc), task in self._held_tasks(nodes):
            if task is not None and task_is_live(task):
                log.warning("node %s lost: failing %s", name, alloc.key)
                report = record_task_exit(
                    self.store, alloc.job_id, alloc.attempt, alloc.role, alloc.index,
                    exit_code=-1, platform_failure=True, diagnostics=f"node {name} {reason(name)}")
                if report is not None and report.attempt_ended:
                    self.stop_attempt(alloc.job_id, alloc.attempt)
            self.store.release_allocation(name, alloc.key)

    def fail_launch(self, job_id: str, attempt: int, role: str, index: int,
                    diagnostics: str) -> None:
        """A launch its node cannot start: the platform's failure, so the job
        is placed again (elsewhere) without being charged."""
        report = record_task_exit(self.store, job_id, attempt, role, index, exit_code=-1,
                                  platform_failure=True, diagnostics=diagnostics)
        if report is not None and report.attempt_ended:
            self.stop_attempt(job_id, attempt)
        elif report is not None:
            self.task_ended(job_id, attempt, role, index)

    def sweep_allocations(self) -> None:
        """Release allocations of settled tasks; stop tasks of ended attempts.

        The reads are a fixed number of round trips (the nodes, their
        allocations, the allocations' tasks, their jobs: a pipeline each),
        so a round costs round trips of its own only for what it changes.
        """
        held = self._held_tasks([node.name for node in self.store.get_nodes()])
        job_ids = sorted({alloc.job_id for (_, alloc), _ in held})
        jobs = dict(zip(job_ids, self.store.job_fields(job_ids, ("state", "attempt")),
                        strict=True))
        for (node, alloc), task in held:
            state, attempt = jobs[alloc.job_id]
            if task is None or state is None or task.state.is_final:
                self.store.release_allocation(node, alloc.key)
            elif int(attempt or 0) != alloc.attempt or state not in (JobState.WAITING,
                                                                      JobState.RUNNING):
                self.messenger.stop_task(node, alloc.job_id, alloc.attempt, alloc.role,
                                         alloc.index)

    def _held_tasks(self, nodes: list[str]) -> list[tuple[tuple[str, Allocation], Task | None]]:
        """Each allocation of these nodes, with its task's record (None: gone):
        two round trips, however many there are."""
        allocations = self.store.all_allocations(nodes)
        held = [(node, alloc) for node in nodes for alloc in allocations[node]]
        tasks = self.store.allocation_tasks([alloc for _, alloc in held])
        return list(zip(held, tasks, strict=True))

    def retry_stale_launches(self) -> None:
        """Launches past their lease: sent again once, the node kept from new
        work meanwhile (a gray failure: it renews but does not start them);
        a launch still not started a second lease after its placement goes
        back to the queue, to be placed elsewhere."""
        now = now_ms()
        timeout_ms = int(self.settings.launch_timeout_seconds * 1000)
        for member in self.store.launching(due_by_ms=now):
            task = renew_stale_launch(self.store, member, now + timeout_ms)
            if task is None or task.node is None:
                continue
            job_id, attempt, role, index = parse_attempt_task_key(member)
            self.warden.overdue(task.node, now)
            if task.launched_ms is not None and now - task.launched_ms >= 2 * timeout_ms:
                log.warning("launch of %s on %s overdue twice: placing its job again",
                            member, task.node)
                self.fail_launch(job_id, attempt, role, index,
                                 f"node {task.node} did not start the task within "
                                 f"{2 * timeout_ms // 1000} s")
                continue
            log.warning("launch of %s overdue: sending it again", member)
            send_starts(self.store.r, {task.node: [(job_id, attempt, role, index)]})

    def resend_stops(self) -> None:
        for job_id in self.store.job_ids_in_state(JobState.STOPPING):
            self.stop_job(job_id)
