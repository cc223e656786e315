"""What a pass reads beyond the snapshot (the queued jobs' requests, the
placed jobs as the policy weighs them, what ended attempts attained), and
what it keeps of them between passes.

A queued job's request comes from what its record says it asks for
(shared/domain/asks.py), each text parsed once however many jobs share it;
a record without one has its config read. A submission's config never
changes and its `queue_seq` is its own, so each is parsed once; a waiting
job that did not change keeps its request (and the shapes the core worked
out for it); an ended attempt's service never changes. The caches are
pruned to the live jobs once gone ones outnumber them, so a long-running
scheduler holds about what its cluster and queue hold.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable

from services.scheduler.core import JobRequest, job_request
from services.scheduler.policy import Attained, Las, RunningJob
from shared.domain.asks import Ask
from shared.domain.cluster import BORROWED
from shared.domain.models import Allocation, JobSpec, Node
from shared.domain.priority import PriorityClass, queue_order
from shared.domain.states import LIVE_JOB_STATES, JobState, TaskState
from shared.infra.config import Settings
from shared.state import keys
from shared.state.jobfeed import FeedPosition
from shared.state.lifecycle import drop_stale_from_queue
from shared.state.store import QueuedJob, Snapshot, Store
from shared.state.store.jobs import ASK_FIELD

# What the policy needs of a placed job's record (see `running`)
RUNNING_FIELDS = ("state", "attempt", "queue_seq", "virtual_cluster", "priority", "mode",
                  "started_ms", "created_ms", "preempted_by", "preempt_deadline_ms", ASK_FIELD)
MAX_CACHED_SPECS = 100_000
MAX_CACHED_ASKS = 100_000  # distinct texts; jobs submitted alike share one
# What the caches may hold of gone jobs before they are pruned to the live ones
PRUNE_SLACK = 1_000
# Every queued and placed record is asked about at least this often, not only
# those the feed of job changes names (`PassReader.snapshot`)
FULL_READ_SECONDS = 30.0
# Attained service counts a job's last this many ended attempts (a job retried
# more often is in the last LAS queue long before)
MAX_ATTEMPTS_READ = 32

log = logging.getLogger("pai.scheduler")


class PassReader:
    def __init__(self, settings: Settings, store: Store, las: Las) -> None:
        self.settings = settings
        self.store = store
        self.las = las
        self.specs: dict[tuple[str, int], JobSpec] = {}  # (job id, queue_seq) -> spec
        self.asks: dict[str, Ask | None] = {}  # a record's ask text -> it (None: unreadable)
        # job id -> ((queue_seq, version, attempt), request): a waiting job that
        # did not change since the last pass keeps its request (and the shapes
        # the core worked out for it).
        self._requests: dict[str, tuple[tuple[int, int, int], JobRequest]] = {}
        # (job id, queue_seq, attempt) -> what a queued job's ended attempts
        # attained: they never change (queue_seq tells a reused name apart)
        self._attained: dict[tuple[str, int, int], Attained] = {}
        self.allocations: dict[str, Allocation] = {}  # stored text -> allocation
        self.nodes: dict[str, Node] = {}  # a node record's stored text -> it, parsed
        self.jobs: dict[str, tuple[str, QueuedJob]] = {}  # queued: stamp, record (_queued_jobs)
        # where the queue was read in the feed of job changes, and when every
        # queued and placed record was last asked about (`snapshot`)
        self.feed: FeedPosition | None = None
        self._full_read_at = -FULL_READ_SECONDS
        # what the feed named since `running` last read (None: it cannot say)
        self._moved: frozenset[str] | None = None
        # this reader among the scheduler replicas (`Store.snapshot`'s passer)
        self.name = uuid.uuid4().hex
        self._specs_used: set[tuple[str, int]] = set()  # the specs this pass needed
        self._asks_used: set[str] = set()  # the asks' texts this pass needed
        # job id -> (stamp, fields, RunningJob): the running jobs of the last
        # pass, each with its record's stamp (`running`)
        self._running: dict[str, tuple[str, list[str | None], RunningJob]] = {}

    def snapshot(self) -> Snapshot:
        """The nodes, their allocations, flags, faults and the queue, the
        records parsed by earlier passes reused where unchanged.

        Redis is asked only about the queued records the feed of job changes
        names since the last pass (and those not held): a pass over a long
        queue that did not move costs what the moves cost. Every
        FULL_READ_SECONDS, and whenever the feed cannot say, it is asked
        about every one (`Store.snapshot`), so a write the feed missed is
        read within that time: one by a scheduler of an earlier version,
        say, or by hand. The pass's own commits and modes `forget` what
        they wrote; when another replica passed since this one's last pass,
        every record is asked about."""
        now = time.monotonic()
        full = now - self._full_read_at >= FULL_READ_SECONDS
        try:
            snapshot = self.store.snapshot(self.allocations, jobs_known=self.jobs,
                                           nodes_known=self.nodes,
                                           feed=None if full else self.feed, passer=self.name)
        except BaseException:
            # it may have marked this reader the latest passer, over another's
            # name it then never acted on: the next snapshot reads every record
            self.feed, self._moved = None, None
            raise
        self.feed = snapshot.feed
        # what `running` has yet to ask about: all, if either read cannot say
        self._moved = None if self._moved is None or snapshot.moved is None \
            else self._moved | snapshot.moved
        if full:
            self._full_read_at = now
        return snapshot

    def forget(self, job_ids: Iterable[str]) -> None:
        """Read these records whole at the next pass, queued or placed: the
        pass wrote them without a feed entry (a gang's commit, a mode), or found
        them moved."""
        for job_id in job_ids:
            self.jobs.pop(job_id, None)
            self._running.pop(job_id, None)

    def _load_specs(self, jobs: list[tuple[str, int]]) -> None:
        """Parse the configs of these (job id, queue_seq) not parsed before, in
        one round trip. A submission's config never changes (and its
        `queue_seq` is its own), so each is read and parsed once."""
        self._specs_used.update(jobs)
        unparsed = [job for job in jobs if job not in self.specs]
        if not unparsed:
            return
        configs = self.store.read_configs([job_id for job_id, _ in unparsed])
        if len(self.specs) + len(unparsed) > MAX_CACHED_SPECS:
            self.specs.clear()
        for job, config in zip(unparsed, configs, strict=True):
            if config:
                self.specs[job] = JobSpec.from_config(config)

    def attained(self, queue: list[JobRequest]) -> dict[str, Attained]:
        """What the queued jobs' ended attempts attained (GPUs x run time),
        and since when each waits, from their attempt records: one round trip
        for the retried or preempted jobs not read before (a job that never
        ran attained nothing and is left out)."""
        unread = [q for q in queue if q.attempt and (q.job_id, q.seq, q.attempt)
                  not in self._attained]
        if unread:
            read = self.store.read_attempts_many(
                [(q.job_id, range(max(0, q.attempt - MAX_ATTEMPTS_READ), q.attempt + 1))
                 for q in unread])
            if len(self._attained) + len(unread) > MAX_CACHED_SPECS:
                self._attained.clear()
            for q, attempts in zip(unread, read, strict=True):
                self._attained[q.job_id, q.seq, q.attempt] = Attained(
                    sum(q.gpus * max(0, (a.completed_ms or 0) - a.started_ms)
                        for a in attempts[:-1] if a is not None and a.started_ms),
                    attempts[-1].created_ms if attempts[-1] is not None else 0)
        return {q.job_id: self._attained[q.job_id, q.seq, q.attempt] for q in queue
                if (q.job_id, q.seq, q.attempt) in self._attained}

    def place_in_las_queues(self, queue: list[JobRequest], attained: dict[str, Attained],
                             now: int) -> None:
        """Keep each VC's queue index in the order the policy places jobs, so
        the API's `position` counts what goes first: a job that has attained
        service sits in its least-attained-service queue (only such jobs can
        be anywhere but in the first). XX: a job dequeued meanwhile stays out."""
        if not attained:
            return
        self.store.reorder_vc_queues([
            (request.vc, request.job_id,
             queue_order(request.priority, request.seq, self.las.queue_of(seen, now)))
            for request in queue if (seen := attained.get(request.job_id)) is not None])

    def queue(self, queued: list[tuple[str, QueuedJob | None]], now: int
              ) -> tuple[list[JobRequest], dict[str, QueuedJob]]:
        """The queued jobs' requests, and their records (`queued`: the queue
        and its records as the pass's snapshot read them; `now`: the pass's
        time, which a retry's back-off is measured against).

        A round trip for the configs of jobs whose records do not say what
        they ask, not parsed before (and one for the tasks of jobs without
        gang allocation, which ask only for their tasks still waiting).
        """
        jobs, stale = [], []
        for job_id, job in queued:
            # RUNNING and queued: partly placed (no gang allocation), see below
            if job is None or job.state not in LIVE_JOB_STATES:
                stale.append(job_id)
            elif job.retry_after_ms is not None and job.retry_after_ms > now:
                continue  # backing off before a retry; the repair loop's passes look again
            else:
                jobs.append(job)
        asks = self._asks_of([(job.id, job.queue_seq, job.ask) for job in jobs])
        requests, records = [], {}
        known, self._requests = self._requests, {}
        self._without_config(jobs, asks, known)
        waiting = self._waiting_tasks(jobs, asks, known)
        # id(ask) -> a request made of it this pass, whose tasks and shapes the
        # next made of it share (`job_request`'s like; the asks outlive the pass)
        alike: dict[int, JobRequest] = {}
        for job in jobs:
            ask = asks.get(job.id)
            if ask is None or (ask.gang and job.state != JobState.WAITING) \
                    or waiting.get(job.id) == set():
                stale.append(job.id)
                continue
            key = (job.queue_seq, job.version, job.attempt)
            cached = known.get(job.id)
            if cached is not None and cached[0] == key:
                request = cached[1]
            else:
                request = job_request(job.id, job.version, job.attempt, ask, job.queue_seq,
                                      waiting.get(job.id), like=alike.get(id(ask)))
                if job.id not in waiting:
                    alike.setdefault(id(ask), request)
            self._requests[job.id] = (key, request)
            requests.append(request)
            records[job.id] = job
        if stale:
            drop_stale_from_queue(self.store, stale)  # only those still stale
        return requests, records

    def _asks_of(self, jobs: list[tuple[str, int, str | None]]) -> dict[str, Ask]:
        """What each job (id, queue_seq, its record's ask text) asks for: from
        its record, each text parsed once; for a record without one (or one
        unreadable), from its config, read and parsed once. A job with
        neither (its config gone) is left out."""
        asks: dict[str, Ask] = {}
        unread = []
        for job_id, seq, text in jobs:
            ask = self._parsed_ask(text) if text else None
            if ask is None:
                unread.append((job_id, seq))
            else:
                asks[job_id] = ask
        if unread:
            self._load_specs(unread)
            for job in unread:
                spec = self.specs.get(job)
                if spec is not None:
                    asks[job[0]] = Ask.of(spec)
        return asks

    def _without_config(self, jobs: list[QueuedJob], asks: dict[str, Ask],
                        known: dict[str, tuple[tuple[int, int, int], JobRequest]]) -> None:
        """Leave out of `asks` the jobs whose config is gone, of those with no
        request made before (one round trip): a job without its config cannot
        start, and has no business in the queue (`drop_stale_from_queue`)."""
        unmade = [job.id for job in jobs if job.id in asks and (
            (cached := known.get(job.id)) is None
            or cached[0] != (job.queue_seq, job.version, job.attempt))]
        for job_id, found in zip(unmade, self.store.existing(
                [keys.job_config(job_id) for job_id in unmade]), strict=True):
            if not found:
                del asks[job_id]

    def _parsed_ask(self, text: str) -> Ask | None:
        self._asks_used.add(text)
        if text in self.asks:
            return self.asks[text]
        if len(self.asks) >= MAX_CACHED_ASKS:
            self.asks.clear()
        try:
            ask: Ask | None = Ask.from_text(text)
        except ValueError as error:
            log.warning("a job record's ask %.200r: %s; its config is read instead",
                        text, error)
            ask = None
        self.asks[text] = ask
        return ask

    def _waiting_tasks(self, jobs: list[QueuedJob], asks: dict[str, Ask],
                       known: dict[str, tuple[tuple[int, int, int], JobRequest]]
                       ) -> dict[str, set[str]]:
        """Job id -> its tasks still waiting for a place, for the queued jobs
        without gang allocation whose request is not cached (one round trip):
        such a job asks only for those."""
        wanted = []
        for job in jobs:
            ask = asks.get(job.id)
            cached = known.get(job.id)
            if ask is not None and not ask.gang and (
                    cached is None or cached[0] != (job.queue_seq, job.version, job.attempt)):
                wanted.append(job)
        if not wanted:
            return {}
        read = self.store.read_tasks_many([(job.id, job.attempt) for job in wanted])
        return {job.id: {key for key, task in tasks.items() if task.state == TaskState.WAITING}
                for job, tasks in zip(wanted, read, strict=True)}

    def running(self, allocations: dict[str, list[Allocation]]) -> list[RunningJob]:
        """The placed jobs as the policy weighs them: one round trip for the
        few fields of their records it needs, which Redis sends only for a
        record that moved since the last pass (its stamp, `read_stamped_fields`),
        and, for records that do not say what the job asks, one for configs
        not seen before (a preempted job's grace is its ask's). A job whose
        record and allocations did not move keeps the RunningJob of the last
        pass. Of the records held, Redis is asked only about those the feed
        of job changes named since the last pass, when the snapshot could
        tell (`snapshot`); a mode the pass set is `forget`-ten."""
        held: dict[str, list[Allocation]] = {}
        for allocs in allocations.values():
            for alloc in allocs:
                held.setdefault(alloc.job_id, []).append(alloc)
        ids = sorted(held)
        known, self._running, moved = self._running, {}, self._moved
        # a record not asked about is the one held, as one whose stamp held
        asking = [moved is None or job_id not in known or job_id in moved for job_id in ids]
        asked = [job_id for job_id, ask in zip(ids, asking, strict=True) if ask]
        stamps = [known[job_id][0] if job_id in known else "" for job_id in asked]
        answers = iter(self.store.read_stamped_fields([keys.job(job_id) for job_id in asked],
                                                      stamps, RUNNING_FIELDS))
        self._moved = frozenset()  # read up to the snapshot's position
        read = [next(answers) if ask else None for ask in asking]
        # (id, stamp, fields, its allocations, the last pass's RunningJob if it holds)
        live: list[tuple[str, str, list[str | None], tuple[Allocation, ...],
                         RunningJob | None]] = []
        for job_id, got in zip(ids, read, strict=True):
            stamp, values, before = known[job_id] if got is None else (*got, None)
            if values[0] not in LIVE_JOB_STATES or values[1] is None:
                continue
            mine = tuple(held[job_id])
            if before is None or mine != before.allocations:
                attempt = int(values[1] or 0)
                mine = tuple(a for a in mine if a.attempt == attempt)
                if not mine:
                    continue  # an old attempt's: the sweep releases it
                if before is not None and before.allocations != mine:
                    before = None
            live.append((job_id, stamp, values, mine, before))
        asks = self._asks_of([(job_id, int(values[2] or 0), values[-1])
                              for job_id, _, values, _, before in live if before is None])
        running = []
        for job_id, stamp, values, mine, job in live:
            if job is None:
                job = self._running_job(job_id, values, mine, asks.get(job_id))
            if stamp:
                self._running[job_id] = (stamp, values, job)
            running.append(job)
        return running

    def _running_job(self, job_id: str, values: list[str | None],
                     allocations: tuple[Allocation, ...], ask: Ask | None) -> RunningJob:
        """A placed job as the policy weighs it, from its record's RUNNING_FIELDS."""
        (_, attempt, _, vc, priority, mode, started, created, preempted_by,
         deadline, _) = values
        return RunningJob(
            job_id=job_id, vc=vc or "default", priority=PriorityClass.parse(priority),
            mode=mode or BORROWED, started_ms=int(started or created or 0),
            allocations=allocations, attempt=int(attempt or 0),
            grace_ms=self.settings.preemption_grace_ms(
                ask.grace_seconds if ask is not None else None),
            preempted_by=preempted_by or "",
            preempt_deadline_ms=int(deadline) if deadline else None)

    def forget_gone(self, queue: list[JobRequest]) -> None:
        """Drop what the caches keep of jobs no longer queued or placed (ended,
        deleted, or submitted again: a new submission has a new queue_seq),
        once they hold more of those than of live ones, so a long-running
        scheduler holds about what its cluster and queue hold."""
        # A placed job kept from the pass before was not asked what it asks
        # (`running`): what it asks is added to what this pass used, only
        # when a cache is large enough to be pruned at all.
        if len(self.specs) > 2 * len(self._specs_used) + PRUNE_SLACK:
            used = self._specs_used | {
                (job_id, int(values[2] or 0)) for job_id, (_, values, _) in self._running.items()
                if not values[-1] or self.asks.get(values[-1]) is None}
            if len(self.specs) > 2 * len(used) + PRUNE_SLACK:
                self.specs = {k: v for k, v in self.specs.items() if k in used}
        self._specs_used = set()
        if len(self.asks) > 2 * len(self._asks_used) + PRUNE_SLACK:
            texts = self._asks_used | {values[-1] for _, values, _ in self._running.values()}
            if len(self.asks) > 2 * len(texts) + PRUNE_SLACK:
                self.asks = {k: v for k, v in self.asks.items() if k in texts}
        self._asks_used = set()
        if len(self._attained) > 2 * len(queue) + PRUNE_SLACK:
            wanted = {(q.job_id, q.seq, q.attempt) for q in queue}
            self._attained = {k: v for k, v in self._attained.items() if k in wanted}
