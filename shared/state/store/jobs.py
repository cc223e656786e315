"""Job records: their creation (one script), writes, reads (falling back
to a compacted job's archive), queue places and events.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.domain.archive import Archive
from shared.domain.models import Attempt, Job, Task, attempt_task_key, task_key
from shared.domain.priority import PriorityClass, queue_order
from shared.domain.states import JobState, check_job_move
from shared.infra.clock import now_ms
from shared.infra.failover import failover_seconds, ride_through
from shared.state import jobfeed, keys, scripts
from shared.state.jobfeed import SortRow
from shared.state.store import (
    Expect,
    ExpectationFailed,
    JobConflict,
    JobNotFound,
    Pipe,
    Reader,
    StoreCore,
)
from shared.state.store.codec import event_fields
from shared.state.store.listing import _pairs
from shared.state.store.tasks import _in_task_order, _task_fields, _tasks_from

EVENTS_MAX_LEN = 1000
# The job record's field that keeps what the job asks the scheduler for
# (shared/domain/asks.py): written at submit, read by a pass (QUEUED_FIELDS)
ASK_FIELD = "ask"


@dataclass(frozen=True)
class JobView:
    """A job's record and one attempt's tasks and record, read together
    (`read_job_view`); the config only when it was asked for."""

    job: Job | None
    tasks: dict[str, Task]
    attempt: Attempt | None
    config: dict[str, Any] | None
    # The allocation asked for (`held_on`), as read with the rest: the node
    # and the raw value (None where the node holds none for the task)
    held: tuple[str, str | None] | None = None


class JobsMixin(StoreCore):
    """A job's record, config, queue places and events."""

    def create_job(
        self, job: Job, config: dict[str, Any], tasks: Sequence[Task], attempt: Attempt,
    ) -> Job:
        """Store a new WAITING job, queue it; JobConflict if user~name exists."""
        return self.insert_job(job, config, tasks, attempt)[0]

    def insert_job(
        self, job: Job, config: dict[str, Any], tasks: Sequence[Task], attempt: Attempt,
        *, pass_request_ms: int = 0, expectations: Sequence[Expect] = (), ask: str = "",
    ) -> tuple[Job, bool]:
        """`create_job` in one round trip (scripts.CREATE_JOB, one conditional
        script); with `pass_request_ms`, it also sets the scheduler's pass
        flag for that long if nobody had (shared/state/lifecycle.py
        `claim_pass_request`). Returns the job and whether this call set it.

        Idempotent: a submit whose reply was lost (a primary switch) and is
        sent again finds its own job (same creation time and config, byte
        for byte) and returns it; anyone else's job of that name is a
        JobConflict. So a connection error is waited out and the script run
        again, as `transact` re-runs a transaction.

        `expectations` are what the caller decided on (records it read
        earlier, or remembered): they are checked in the same atomic step,
        and if one does not hold nothing is written (ExpectationFailed).

        `ask`: what the job asks the scheduler for (shared/domain/asks.py,
        its text), written on the record beside the job's own fields.
        """
        stored_config = json.dumps(config, separators=(",", ":"))
        fields = job.to_fields()
        fields.pop("queue_seq")
        if ask:
            fields[ASK_FIELD] = ask
        task_fields = _task_fields(tasks)
        args: list[Any] = [
            job.id, job.created_ms, stored_config, attempt.index,
            json.dumps(attempt.to_dict(), separators=(",", ":")),
            queue_order(PriorityClass.parse(job.priority), 0), now_ms(), EVENTS_MAX_LEN,
            pass_request_ms, len(task_fields), len(expectations), SortRow.of(job).encode()]
        rest: list[str] = []
        for expect in expectations:
            rest.extend((expect.kind, expect.field, expect.value))
        for pair in (*task_fields.items(), *fields.items()):
            rest.extend(pair)
        # as the script's one array (its comment says why); every item a string
        args.append(json.dumps(rest, ensure_ascii=False, separators=(",", ":")))
        script_keys = [
            keys.job(job.id), keys.job_config(job.id), keys.job_tasks(job.id, attempt.index),
            keys.job_attempts(job.id), keys.state_jobs(job.state), keys.JOBS,
            keys.user_jobs(job.username), keys.vc_jobs(job.virtual_cluster), keys.QUEUE,
            keys.vc_queue(job.virtual_cluster), keys.job_events(job.id), keys.QUEUE_SEQ,
            keys.PASS_REQUESTED, *(expect.key for expect in expectations),
            keys.job_archive(job.id),  # a compacted job keeps its record there
            keys.JOB_CHANGES]
        reply = ride_through(lambda: self.run_script(scripts.CREATE_JOB, script_keys, args),
                             failover_seconds(self.r))
        outcome, claimed = reply[0], bool(reply[1])
        if outcome == "changed":
            raise ExpectationFailed(f"what job {job.id} was decided on changed")
        if outcome == "taken":
            raise JobConflict(f"job {job.name} already exists for user {job.username}")
        if outcome == "own":  # this very submit, committed before its reply was lost
            stored = dict(zip(reply[2::2], reply[3::2], strict=True))
            return Job.from_fields({"id": job.id, **stored}), claimed
        job.queue_seq = int(reply[2])
        return job, claimed

    def enqueue(self, pipe: Pipe, job: Job) -> None:
        """Queue the job for placement: in the queue the scheduler reads, and
        in its VC's queue at its place (class, then submit order)."""
        pipe.zadd(keys.QUEUE, {job.id: job.queue_seq})
        pipe.zadd(keys.vc_queue(job.virtual_cluster),
                  {job.id: queue_order(PriorityClass.parse(job.priority), job.queue_seq)})

    def dequeue(self, pipe: Pipe, job_id: str, vc: str | None) -> None:
        """Take the job from the queues (`vc` None: its record is gone, so only
        from the scheduler's: a record goes only with `delete_job`, which
        dequeues it from both)."""
        pipe.zrem(keys.QUEUE, job_id)
        if vc is not None:
            pipe.zrem(keys.vc_queue(vc), job_id)

    def queue_position(self, job: Job) -> int | None:
        """The job's place in its VC's queue (1: next), None when not queued."""
        rank = self.r.zrank(keys.vc_queue(job.virtual_cluster), job.id)
        return None if rank is None else int(rank) + 1

    def is_queued(self, job_id: str) -> bool:
        """Whether the job is in the scheduler's queue."""
        return self.r.zscore(keys.QUEUE, job_id) is not None

    def reorder_vc_queues(self, places: Sequence[tuple[str, str, float]]) -> None:
        """Move queued jobs (VC, job id, score) to new places in their VC's
        queue, in one round trip; a job dequeued meanwhile stays out (XX)."""
        if not places:
            return
        pipe = self.r.pipeline(transaction=False)
        for vc, job_id, score in places:
            pipe.zadd(keys.vc_queue(vc), {job_id: score}, xx=True)
        pipe.execute()

    def submission_of(self, job_id: str) -> str:
        """The job's current submission ("" for none, or a job that is gone)."""
        return str(self.r.hget(keys.job(job_id), "submission") or "")

    def read_configs(self, job_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The configs of live jobs, in one round trip (None: gone). No archive
        is read: a live job is never compacted."""
        raws = self.r.mget([keys.job_config(job_id) for job_id in job_ids]) if job_ids else []
        return [json.loads(raw) if raw else None for raw in raws]

    def write_job(self, pipe: Pipe, job: Job, previous_state: JobState | None) -> None:
        """Queue the job record's write and keep the per-state index and the
        feed of changes (shared/state/jobfeed.py) in step."""
        if previous_state is not None and previous_state != job.state:
            pipe.zrem(keys.state_jobs(previous_state), job.id)
        if previous_state != job.state:
            pipe.zadd(keys.state_jobs(job.state), {job.id: job.created_ms})
            if job.state.is_final:  # for the retention sweep (shared/state/retention.py)
                pipe.zadd(keys.RETENTION_PENDING, {job.id: job.completed_ms or now_ms()})
        pipe.hset(keys.job(job.id), mapping=job.to_fields())
        jobfeed.add_change(pipe, job)

    def read_job(self, reader: Reader, job_id: str) -> Job | None:
        """The job's record: its hash, or once compacted its archive's.

        A compacted job has no hash (shared/state/retention.py): it never changes
        again but by going away, and every write of a new record under its
        id writes the hash, so a transaction that watches the hash (and
        re-reads here) still sees every change that matters to it."""
        fields = reader.hgetall(keys.job(job_id))
        if fields:
            # a compacted record leaves out its id, which its key says
            return Job.from_fields({"id": job_id, **fields})
        return _archived_job(job_id, self.read_archive(reader, job_id))

    def read_job_view(self, reader: Reader, job_id: str, attempt: int, *,
                      config: bool = False,
                      held_on: tuple[str, str, int] | None = None) -> JobView:
        """What a compare-and-set on an attempt decides on, in one round trip
        (a script, so it is one under WATCH too, where a pipeline's commands
        each go alone): the job's record (`read_job`'s, the archive read
        only for a job without a hash), the attempt's tasks and its record,
        the job's config when asked for, and with `held_on` (node, role,
        index) what that task of the attempt holds on that node."""
        script_keys = [keys.job(job_id), keys.job_tasks(job_id, attempt),
                       keys.job_attempts(job_id), keys.job_config(job_id)]
        args = [str(attempt), "1" if config else ""]
        if held_on is not None:
            node, role, index = held_on
            script_keys.append(keys.node_alloc(node))
            args.append(attempt_task_key(job_id, attempt, role, index))
        raw_job, raw_tasks, raw_attempt, raw_config, raw_held = scripts.run(
            reader, scripts.READ_JOB_VIEW, script_keys, args)
        job = Job.from_fields({"id": job_id, **_pairs(raw_job)}) if raw_job \
            else _archived_job(job_id, self.read_archive(reader, job_id))
        return JobView(job, _tasks_from(_pairs(raw_tasks)),
                       Attempt.from_dict(json.loads(raw_attempt)) if raw_attempt else None,
                       json.loads(raw_config) if raw_config else None,
                       (held_on[0], raw_held or None) if held_on is not None else None)

    def get_job(self, job_id: str) -> Job | None:
        return self.read_job(self.r, job_id)

    def require_job(self, reader: Reader, job_id: str) -> Job:
        job = self.read_job(reader, job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def read_launch(self, job_id: str, attempt: int
                    ) -> tuple[Job | None, list[Task], dict[str, Any] | None]:
        """What a launcher reads to start a task of the attempt, in one round
        trip: the job's record, the attempt's tasks and the config. Only a
        live job has a task to start, and a live job is never compacted, so
        what is not in Redis's hashes counts as gone (no archive is read)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(keys.job(job_id))
        pipe.hgetall(keys.job_tasks(job_id, attempt))
        pipe.get(keys.job_config(job_id))
        fields, raw_tasks, raw_config = pipe.execute()
        job = Job.from_fields({"id": job_id, **fields}) if fields else None
        return (job, _in_task_order(_tasks_from(raw_tasks).values()),
                json.loads(raw_config) if raw_config else None)

    def read_live_task(self, job_id: str, attempt: int, role: str, index: int
                       ) -> tuple[Job | None, Task | None]:
        """The job's record and one task of the attempt, in one round trip:
        what a launcher reads to find a task it runs. A live job is never
        compacted, so a job without a hash counts as gone."""
        pipe = self.r.pipeline(transaction=False)
        queue_live_task(pipe, job_id, attempt, role, index)
        return live_task_from(job_id, *pipe.execute())

    def get_config(self, job_id: str) -> dict[str, Any] | None:
        raw = self.r.get(keys.job_config(job_id))
        if raw:
            return json.loads(raw)
        archive = self.read_archive(self.r, job_id)
        return archive.config if archive is not None else None

    def bump(self, job: Job, target: JobState | None = None) -> JobState:
        """Move the job (checked against the table) and bump its version.

        Returns the state it had, for `write_job`'s index upkeep.
        """
        previous = job.state
        if target is not None and target != previous:
            check_job_move(previous, target)
            job.state = target
        job.version += 1
        return previous

    def add_event(self, pipe: Pipe, job_id: str, kind: str,
                  **data: Any) -> None:
        pipe.xadd(keys.job_events(job_id), event_fields(kind, **data),
                  maxlen=EVENTS_MAX_LEN, approximate=True)

    def get_events(self, job_id: str) -> list[dict[str, Any]]:
        events = self.read_events(self.r, job_id)
        if not events:
            archive = self.read_archive(self.r, job_id)
            return archive.milestones() if archive is not None else []
        return events

    def read_events(self, reader: Reader, job_id: str) -> list[dict[str, Any]]:
        entries = reader.xrange(keys.job_events(job_id))
        events = []
        for _entry_id, fields in entries:
            event: dict[str, Any] = {"kind": fields["kind"], "time": int(fields["time"])}
            event.update({k: json.loads(v) for k, v in fields.items() if k not in event})
            events.append(event)
        return events


def _archived_job(job_id: str, archive: Archive | None) -> Job | None:
    """A compacted job's record from its archive; None without one, or from
    a version 1 archive (its record is a hash of its own)."""
    if archive is None or archive.record is None:
        return None
    return Job.from_fields({"id": job_id, **archive.record})


def queue_live_task(pipe: Any, job_id: str, attempt: int, role: str, index: int) -> None:
    """Queue `read_live_task`'s two reads on `pipe`, beside the caller's own
    (their two replies, in order, are `live_task_from`'s)."""
    pipe.hgetall(keys.job(job_id))
    pipe.hget(keys.job_tasks(job_id, attempt), task_key(role, index))


def live_task_from(job_id: str, fields: dict[str, str], raw_task: str | None
                   ) -> tuple[Job | None, Task | None]:
    """`read_live_task`'s answer from the replies of `queue_live_task`'s reads."""
    return (Job.from_fields({"id": job_id, **fields}) if fields else None,
            Task.from_dict(json.loads(raw_task)) if raw_task else None)
