"""The scheduler's IO shell around the pure core: snapshot, plan, commit, send.

Passes are serialized by a Redis lock and coalesced by a dirty flag: any
number of requests while a pass runs cost one more pass, not one each.
Releases, stops and the periodic repair are idempotent, so a redelivered
message or a second replica does no harm.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from services.scheduler import policy
from services.scheduler.core import Cluster, JobRequest, free_view, job_request, paused_gc
from services.scheduler.nodes import NodeWarden
from services.scheduler.policy import Attained, Las, Preemption, RunningJob
from shared.domain import gpuhealth
from shared.domain.cluster import BORROWED, NodeFlags, takes_work, vc_policies
from shared.domain.models import (
    Allocation,
    Attempt,
    Job,
    JobSpec,
    Task,
    attempt_task_key,
    parse_attempt_task_key,
    split_job_id,
    task_key,
)
from shared.domain.priority import PriorityClass, queue_order
from shared.domain.states import LIVE_JOB_STATES, JobState, TaskState
from shared.infra import messaging
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger
from shared.state import keys, retention, telemetry, usage
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.lifecycle import (
    PlacementCommit,
    commit_placement,
    commit_placements,
    drop_stale_from_queue,
    mark_preempted,
    record_task_exit,
    renew_stale_launch,
    set_mode,
    set_waiting_many,
)
from shared.state.store import Store, compact_json, task_is_live

log = logging.getLogger("pai.scheduler")

DIRTY = keys.PREFIX + "scheduler:dirty"
MAX_PASSES_PER_CALL = 50
LOCK_SECONDS = 60
# Pass requests a worker may leave to the scheduler messages behind them
# (`request_pass(deferrable=True)`) before it passes anyway
MAX_DEFERRED = 64
PASS_BEGUN, PASS_HELD, PASS_DEFERRED = 1, 0, 2  # what _BEGIN_PASS answers
PASS_AGAIN = 1  # what _END_PASS answers when asked again during the pass

# A pass request, in one step: the pass-request flag is taken (the pass reads
# the queue after this: the next submit must ask again, see
# lifecycle.take_pass_request); with ARGV[3] = "1" and messages waiting in the
# scheduler's broker queue (KEYS[4]), the work is only marked (DEFERRED);
# else the lock is taken (BEGUN, the dirty flag cleared: this pass sees it
# all) or, held by another, the work marked for its holder (HELD).
# With ARGV[4] = "1" it does nothing unless the dirty flag is set.
# KEYS: lock, dirty flag, pass-request flag, broker queue
# ARGV: token, lock ms, "1" to defer while messages wait, "1" only if dirty
_BEGIN_PASS = """
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('DEL', KEYS[3])
if ARGV[3] == '1' and redis.call('LLEN', KEYS[4]) > 0 then
  redis.call('SET', KEYS[2], '1')
  return 2
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('DEL', KEYS[2])
  return 1
end
redis.call('SET', KEYS[2], '1')
return 0
"""
# After a pass, in one step: asked again meanwhile (the dirty flag) -> clear
# it, keep (or retake) the lock, pass again (1); else let the lock go (0).
# With ARGV[2] = "0" the lock is let go whatever the flag (which stays). A
# lock that expired during the pass and that another took is left to that
# holder, which sees the flag (-1). Atomic with _BEGIN_PASS, so a request is
# either seen here or takes the free lock itself: none is lost.
# KEYS: lock, dirty flag, pass-request flag; ARGV: token, lock ms (or "0")
_END_PASS = """
local mine = redis.call('GET', KEYS[1]) == ARGV[1]
if ARGV[2] == '0' then
  if mine then redis.call('DEL', KEYS[1]) end
  return 0
end
if not mine and not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -1
end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('DEL', KEYS[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
return 0
"""
STOP_RESEND_MS = 15_000
# What the policy needs of a placed job's record (see _running)
RUNNING_FIELDS = ("state", "attempt", "queue_seq", "virtual_cluster", "priority", "mode",
                  "started_ms", "created_ms", "preempted_by", "preempt_deadline_ms")
MAX_CACHED_SPECS = 100_000
# What the caches may hold of gone jobs before they are pruned to the live ones
PRUNE_SLACK = 1_000
# Attained service counts a job's last this many ended attempts (a job retried
# more often is in the last LAS queue long before)
MAX_ATTEMPTS_READ = 32


@dataclass
class PassStats:
    placed: int = 0
    waiting: int = 0
    seconds: float = 0.0


class Scheduler:
    def __init__(self, settings: Settings, store: Store, messenger: Messenger) -> None:
        self.settings = settings
        self.store = store
        self.messenger = messenger
        self.accounts = Accounts(store)
        self._specs: dict[tuple[str, int], JobSpec] = {}  # (job id, queue_seq) -> spec
        self._hard_stops: dict[str, int] = {}  # job id -> when its last hard stop was sent
        # job id -> ((queue_seq, version, attempt), request): a waiting job that
        # did not change since the last pass keeps its request (and the shapes
        # the core worked out for it).
        self._requests: dict[str, tuple[tuple[int, int, int], JobRequest]] = {}
        # (job id, queue_seq, attempt) -> what a queued job's ended attempts
        # attained: they never change (queue_seq tells a reused name apart)
        self._attained: dict[tuple[str, int, int], Attained] = {}
        self._allocations: dict[str, Allocation] = {}  # stored text -> allocation
        self._jobs: dict[str, tuple[str, Job]] = {}  # queued: stamp, record (store._queued_jobs)
        self._specs_used: set[tuple[str, int]] = set()  # the specs this pass needed
        self.las = Las.from_settings(settings)
        self._deferred = 0  # pass requests left to the messages behind them, in a row
        self._requested = False  # the message being handled asked for a pass
        self.warden = NodeWarden(settings, store, self.fail_node_tasks, self.fail_launch)

    # ------------------------------------------------------------ passes

    def request_pass(self, *, deferrable: bool = False, if_dirty: bool = False) -> None:
        """Run passes until nothing asked for one; or leave it to the holder.

        Two round trips around the passes (`_BEGIN_PASS`, `_END_PASS`): a
        request while another pass holds the lock only marks work to do, and
        the holder, before it lets go, passes again for all such requests at
        once. `deferrable` (a trigger taken from this worker's queue): when
        more scheduler messages wait behind this one, only mark the work and
        leave the pass to the last of them (`message`), so N task exits that
        arrive together cost one pass, not N; at most MAX_DEFERRED times in a
        row, so a queue that never empties still gets its passes. `if_dirty`:
        only if a pass was asked for and has not run yet.
        """
        self._requested = True
        defer = deferrable and self._deferred < MAX_DEFERRED
        token = uuid.uuid4().hex
        began = int(self.store.run_script(_BEGIN_PASS, [
            keys.SCHEDULER_LOCK, DIRTY, keys.PASS_REQUESTED,
            messaging.broker_queue_key(messaging.SCHEDULER_QUEUE)],
            [token, str(LOCK_SECONDS * 1000), "1" if defer else "0", "1" if if_dirty else "0"]))
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
                self._end_pass(token, let_go=True)
                raise
            if self._end_pass(token) != PASS_AGAIN:
                return
        # asked again MAX_PASSES_PER_CALL times in a row: let go; the flag stays
        # for the next request (the repair loop makes one every few seconds)
        self._end_pass(token, let_go=True)

    def _end_pass(self, token: str, *, let_go: bool = False) -> int:
        return int(self.store.run_script(
            _END_PASS, [keys.SCHEDULER_LOCK, DIRTY, keys.PASS_REQUESTED],
            [token, "0" if let_go else str(LOCK_SECONDS * 1000)]))

    @contextmanager
    def message(self) -> Iterator[None]:
        """Around the handling of one scheduler message: if it asked for no
        pass itself, it runs the pass an earlier message left to it (the
        dirty flag), unless more messages still wait behind it."""
        self._requested = False
        try:
            yield
        finally:
            if not self._requested:
                self.request_pass(deferrable=True, if_dirty=True)

    def _load_specs(self, jobs: list[tuple[str, int]]) -> None:
        """Parse the configs of these (job id, queue_seq) not parsed before, in
        one round trip. A submission's config never changes (and its
        `queue_seq` is its own), so each is read and parsed once."""
        self._specs_used.update(jobs)
        unparsed = [job for job in jobs if job not in self._specs]
        if not unparsed:
            return
        raws = self.store.r.mget([keys.job_config(job_id) for job_id, _ in unparsed])
        if len(self._specs) + len(unparsed) > MAX_CACHED_SPECS:
            self._specs.clear()
        for job, raw in zip(unparsed, raws, strict=True):
            if raw:
                self._specs[job] = JobSpec.from_config(json.loads(raw))

    def _load_attained(self, queue: list[JobRequest]) -> dict[str, Attained]:
        """What the queued jobs' ended attempts attained (GPUs x run time),
        and since when each waits, from their attempt records: one round trip
        for the retried or preempted jobs not read before (a job that never
        ran attained nothing and is left out)."""
        unread = [q for q in queue if q.attempt and (q.job_id, q.seq, q.attempt)
                  not in self._attained]
        if unread:
            pipe = self.store.r.pipeline(transaction=False)
            for q in unread:
                first = max(0, q.attempt - MAX_ATTEMPTS_READ)
                pipe.hmget(keys.job_attempts(q.job_id),
                           [str(i) for i in range(first, q.attempt + 1)])
            if len(self._attained) + len(unread) > MAX_CACHED_SPECS:
                self._attained.clear()
            for q, raws in zip(unread, pipe.execute(), strict=True):
                attempts = [Attempt.from_dict(json.loads(raw)) if raw else None
                            for raw in raws]
                self._attained[q.job_id, q.seq, q.attempt] = Attained(
                    sum(q.gpus * max(0, (a.completed_ms or 0) - a.started_ms)
                        for a in attempts[:-1] if a is not None and a.started_ms),
                    attempts[-1].created_ms if attempts[-1] is not None else 0)
        return {q.job_id: self._attained[q.job_id, q.seq, q.attempt] for q in queue
                if (q.job_id, q.seq, q.attempt) in self._attained}

    def _place_in_las_queues(self, queue: list[JobRequest], attained: dict[str, Attained],
                             now: int) -> None:
        """Keep each VC's queue index in the order the policy places jobs, so
        the API's `position` counts what goes first: a job that has attained
        service sits in its least-attained-service queue (only such jobs can
        be anywhere but in the first). XX: a job dequeued meanwhile stays out."""
        if not attained:
            return
        pipe = self.store.r.pipeline(transaction=False)
        for request in queue:
            seen = attained.get(request.job_id)
            if seen is not None:
                pipe.zadd(keys.vc_queue(request.vc), {request.job_id: queue_order(
                    request.priority, request.seq, self.las.queue_of(seen, now))}, xx=True)
        pipe.execute()

    def _queue(self, queued: list[tuple[str, Job | None]]
               ) -> tuple[list[JobRequest], dict[str, Job]]:
        """The queued jobs' requests, and their records (`queued`: the queue
        and its records as the pass's snapshot read them).

        A round trip for the configs of the jobs not parsed before (and one
        for the tasks of jobs without gang allocation, which ask only for
        their tasks still waiting).
        """
        jobs, stale = [], []
        now = now_ms()
        for job_id, job in queued:
            # RUNNING and queued: partly placed (no gang allocation), see below
            if job is None or job.state not in LIVE_JOB_STATES:
                stale.append(job_id)
            elif job.retry_after_ms is not None and job.retry_after_ms > now:
                continue  # backing off before a retry; the repair loop's passes look again
            else:
                jobs.append(job)
        self._load_specs([(job.id, job.queue_seq) for job in jobs])
        requests, records = [], {}
        known, self._requests = self._requests, {}
        waiting = self._waiting_tasks(jobs, known)
        for job in jobs:
            spec = self._specs.get((job.id, job.queue_seq))
            if spec is None or (spec.gang_allocation and job.state != JobState.WAITING) \
                    or waiting.get(job.id) == set():
                stale.append(job.id)
                continue
            key = (job.queue_seq, job.version, job.attempt)
            cached = known.get(job.id)
            request = cached[1] if cached is not None and cached[0] == key \
                else job_request(job.id, job.version, job.attempt, spec, job.queue_seq,
                                 waiting.get(job.id))
            self._requests[job.id] = (key, request)
            requests.append(request)
            records[job.id] = job
        if stale:
            drop_stale_from_queue(self.store, stale)  # only those still stale
        return requests, records

    def _waiting_tasks(self, jobs: list[Job],
                       known: dict[str, tuple[tuple[int, int, int], JobRequest]]
                       ) -> dict[str, set[str]]:
        """Job id -> its tasks still waiting for a place, for the queued jobs
        without gang allocation whose request is not cached (one round trip):
        such a job asks only for those."""
        wanted = []
        for job in jobs:
            spec = self._specs.get((job.id, job.queue_seq))
            cached = known.get(job.id)
            if spec is not None and not spec.gang_allocation and (
                    cached is None or cached[0] != (job.queue_seq, job.version, job.attempt)):
                wanted.append(job)
        if not wanted:
            return {}
        pipe = self.store.r.pipeline(transaction=False)
        for job in wanted:
            pipe.hgetall(keys.job_tasks(job.id, job.attempt))
        return {job.id: {key for key, raw in fields.items()
                         if Task.from_dict(json.loads(raw)).state == TaskState.WAITING}
                for job, fields in zip(wanted, pipe.execute(), strict=True)}

    def _running(self, allocations: dict[str, list[Allocation]]) -> list[RunningJob]:
        """The placed jobs as the policy weighs them: one round trip for the
        few fields of their records it needs, and one for configs not seen
        before (a preempted job's grace is its config's)."""
        held: dict[str, list[Allocation]] = {}
        for allocs in allocations.values():
            for alloc in allocs:
                held.setdefault(alloc.job_id, []).append(alloc)
        ids = sorted(held)
        records = self.store.read_fields([keys.job(job_id) for job_id in ids], RUNNING_FIELDS)
        live: list[tuple[str, list[str | None]]] = []
        for job_id, values in zip(ids, records, strict=True):
            state, attempt = values[0], values[1]
            if state in LIVE_JOB_STATES and attempt is not None:
                live.append((job_id, values))
        self._load_specs([(job_id, int(values[2] or 0)) for job_id, values in live])
        running = []
        for job_id, values in live:
            (_, attempt, queue_seq, vc, priority, mode, started, created, preempted_by,
             deadline) = values
            mine = tuple(a for a in held[job_id] if a.attempt == int(attempt or 0))
            if not mine:
                continue  # an old attempt's: the sweep releases it
            spec = self._specs.get((job_id, int(queue_seq or 0)))
            running.append(RunningJob(
                job_id=job_id, vc=vc or "default", priority=PriorityClass.parse(priority),
                mode=mode or BORROWED, started_ms=int(started or created or 0),
                allocations=mine, attempt=int(attempt or 0),
                grace_ms=self.settings.preemption_grace_ms(
                    spec.preemption_grace_seconds if spec else None),
                preempted_by=preempted_by or "",
                preempt_deadline_ms=int(deadline) if deadline else None))
        return running

    def run_pass(self) -> PassStats:
        """One pass: read, plan, commit, send. Without cyclic garbage
        collection inside (as the policy's part already was): a first pass
        over thousands of jobs allocates so much that the collector walked
        the whole heap, the caches included, several times during it (a
        sixth of the commit's CPU in the placement bench's profile)."""
        with paused_gc():
            return self._pass()

    def _forget_gone(self, queue: list[JobRequest]) -> None:
        """Drop what the caches keep of jobs no longer queued or placed (ended,
        deleted, or submitted again: a new submission has a new queue_seq),
        once they hold more of those than of live ones, so a long-running
        scheduler holds about what its cluster and queue hold."""
        if len(self._specs) > 2 * len(self._specs_used) + PRUNE_SLACK:
            self._specs = {k: v for k, v in self._specs.items() if k in self._specs_used}
        self._specs_used = set()
        if len(self._attained) > 2 * len(queue) + PRUNE_SLACK:
            wanted = {(q.job_id, q.seq, q.attempt) for q in queue}
            self._attained = {k: v for k, v in self._attained.items() if k in wanted}

    def _pass(self) -> PassStats:
        started = time.perf_counter()
        now = now_ms()
        snapshot = self.store.snapshot(self._allocations, jobs_known=self._jobs)
        # unhealthy GPUs take no work
        nodes = [gpuhealth.healthy_view(n, snapshot.faults) for n in snapshot.nodes]
        flags, allocations = snapshot.flags, snapshot.allocations
        live = [n for n in nodes if takes_work(n, flags.get(n.name), now,
                                               self.settings.node_lost_seconds,
                                               snapshot.unready)]
        cluster = Cluster(free_view(node, allocations[node.name]) for node in live)
        running = self._running(allocations)
        self._drain(running, flags, now)
        queue, records = self._queue(snapshot.queued)
        vcs = self.accounts.list_vcs()
        policies = vc_policies({vc.name: vc.gpu_quota for vc in vcs},
                               {vc.name: vc.borrowing for vc in vcs},
                               sum(len(n.gpus) for n in live))
        attained = self._load_attained(queue)
        self._forget_gone(queue)
        spent, user_spent = self._spent(vcs, allocations, queue, now)
        plan = policy.plan(cluster, queue, running, policies, now, attained, self.las, spent,
                           user_spent)
        self._place_in_las_queues(queue, attained, now)
        deadline = now + int(self.settings.launch_timeout_seconds * 1000)
        stats = PassStats(waiting=len(plan.waiting))
        placed_by_vc: Counter[str] = Counter()
        # Gangs commit in batches; a job without gang allocation places some
        # of its tasks at a time, each commit on the tasks still waiting.
        gangs = [p for p in plan.placed if p.request.gang]
        commits = [PlacementCommit(p.request.job_id, p.request.version, p.request.attempt,
                                   tuple(p.placements), p.mode, queue_seq=p.request.seq,
                                   vc=p.request.vc) for p in gangs]
        bound = commit_placements(self.store, commits, launch_deadline_ms=deadline)
        bound += [commit_placement(self.store, p.request.job_id, version=p.request.version,
                                   attempt=p.request.attempt, placements=p.placements,
                                   launch_deadline_ms=deadline, mode=p.mode, gang=False)
                  for p in plan.placed if not p.request.gang]
        placed_in_order = gangs + [p for p in plan.placed if not p.request.gang]
        starts: dict[str, list[tuple[str, int, str, int]]] = {}
        for placed, won in zip(placed_in_order, bound, strict=True):
            request = placed.request
            if not won:
                continue
            stats.placed += 1
            placed_by_vc[request.vc] += 1
            for p in placed.placements:
                starts.setdefault(p.node, []).append(
                    (request.job_id, request.attempt, p.role, p.index))
        if stats.placed < len(bound):
            self.store.r.set(DIRTY, "1")  # some jobs changed under us: look again
        try:
            self.messenger.start_tasks(starts)
        except (RedisError, OperationalError) as error:  # the placements stand
            log.warning("start messages of %d tasks not sent (%s): their launch leases "
                        "send them again", sum(len(t) for t in starts.values()), error)
        for preemption in plan.preempt:
            self._preempt(preemption, now)
        attempts = {r.job_id: r.attempt for r in running}
        for job_id, mode in plan.modes.items():
            set_mode(self.store, job_id, attempt=attempts[job_id], mode=mode)
        self._stop_overdue(running, now)
        reasons = []
        explained: dict[int, str] = {}  # most of a long queue shares a few Waitings
        for job_id, why in plan.waiting.items():
            job = records.get(job_id)
            explanation = explained.get(id(why))
            if explanation is None:
                explanation = explained[id(why)] = compact_json(why.to_dict())
            if job is not None and (job.waiting_reason, job.waiting) != (why.message,
                                                                          explanation):
                reasons.append((job_id, why.message, explanation, job.version))
        set_waiting_many(self.store, reasons)
        for job_id, message, explanation, _version in reasons:
            # The held record says what was written (where the job moved meanwhile,
            # nothing was, and the next snapshot reads its new version whole).
            records[job_id].waiting_reason, records[job_id].waiting = message, explanation
        stats.seconds = time.perf_counter() - started
        self._record_pass(stats.seconds, placed_by_vc)
        if stats.placed or queue:
            log.info("pass: %d placed, %d waiting, %d preempted, %.1f ms", stats.placed,
                     stats.waiting, len(plan.preempt), stats.seconds * 1000)
        return stats

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
        if len(self._hard_stops) > MAX_CACHED_SPECS:
            self._hard_stops.clear()

    def _record_pass(self, seconds: float, placed_by_vc: Counter[str]) -> None:
        """Count the pass for Prometheus (through Redis: see shared/state/telemetry.py)."""
        pipe = self.store.r.pipeline(transaction=False)
        telemetry.record(pipe, telemetry.SCHEDULER_PASS, value=seconds)
        for vc, placed in placed_by_vc.items():
            telemetry.record(pipe, telemetry.PLACEMENTS, {"vc": vc}, placed)
        try:
            pipe.execute()
        except RedisError as error:
            log.warning("cannot record the pass's metrics: %s", error)

    def heartbeat(self, name: str) -> None:
        """Tell the API (and so Prometheus) this replica is alive and repairing."""
        telemetry.record_scheduler_heartbeat(self.store.r, name)

    # ------------------------------------------------------ ends and stops

    def release_if_settled(self, job_id: str, attempt: int, role: str, index: int) -> bool:
        """Free a task's allocation once its container is gone (task final)."""
        task = self.store.get_task(job_id, attempt, role, index)
        if task is None or task.node is None or not task.state.is_final:
            return False
        return self.store.release_allocation(task.node, attempt_task_key(job_id, attempt, role,
                                                                         index))

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
            self.messenger.start_task(task.node, job_id, attempt, role, index)

    def stop_attempt(self, job_id: str, attempt: int, *, deferrable: bool = False) -> None:
        """An attempt ended or its job is stopping: stop what still runs.

        A pass follows when this freed something, or when the job waits in the
        queue (a retry); otherwise the pass after the last task's release has
        already seen everything this could change.
        """
        freed = False
        for task in self.store.get_tasks(job_id, attempt):
            if task_is_live(task) and task.node:
                self.messenger.stop_task(task.node, job_id, attempt, task.role, task.index)
            elif task.state.is_final and task.node:
                freed = self.store.release_allocation(
                    task.node, attempt_task_key(job_id, attempt, task.role, task.index)) or freed
        if freed or self.store.r.zscore(keys.QUEUE, job_id) is not None:
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
        pipe = self.store.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), ("state", "attempt"))
        jobs = dict(zip(job_ids, pipe.execute() if job_ids else [], strict=True))
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
        pipe = self.store.r.pipeline(transaction=False)
        for _, alloc in held:
            pipe.hget(keys.job_tasks(alloc.job_id, alloc.attempt),
                      task_key(alloc.role, alloc.index))
        raws = pipe.execute() if held else []
        return [(entry, Task.from_dict(json.loads(raw)) if raw else None)
                for entry, raw in zip(held, raws, strict=True)]

    def retry_stale_launches(self) -> None:
        """Launches past their lease: sent again once, the node kept from new
        work meanwhile (a gray failure: it renews but does not start them);
        a launch still not started a second lease after its placement goes
        back to the queue, to be placed elsewhere."""
        r = self.store.r
        now = now_ms()
        timeout_ms = int(self.settings.launch_timeout_seconds * 1000)
        for member in r.zrangebyscore(keys.LAUNCHING, 0, now):
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
            self.messenger.start_task(task.node, job_id, attempt, role, index)

    def resend_stops(self) -> None:
        for job_id in self.store.r.zrange(keys.state_jobs(JobState.STOPPING), 0, -1):
            self.stop_job(job_id)
