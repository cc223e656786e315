"""Every state change of a job and its tasks, each one compare-and-set.

Each function reads the job (and the tasks of the attempt it touches) under
WATCH, decides with the pure rules (state tables, completion policy, retry
decision), and commits only if nothing it read changed meanwhile. So any
service may call them, on any node, as often as a message is redelivered:
a repeated call finds the work done and returns without writing.

Side effects (Celery sends, Docker calls) belong to the callers, after these
return.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shared.domain.asks import Ask
from shared.domain.exits import (
    STOPPED_BY_PLATFORM,
    STOPPED_BY_USER,
)
from shared.domain.models import (
    Attempt,
    Job,
    JobSpec,
    Task,
    attempt_task_key,
    job_id_of,
    parse_attempt_task_key,
    task_key,
)
from shared.domain.states import LIVE_JOB_STATES, JobState, TaskState, check_task_move
from shared.infra.clock import now_ms
from shared.state import keys, retention, scripts, telemetry
from shared.state.store import EVENTS_MAX_LEN, Expect, Pipe, Store, event_fields

PASS_REQUEST_TTL_MS = 1000


def initial_tasks(spec: JobSpec) -> list[Task]:
    return [Task(role=r.name, index=i) for r in spec.task_roles for i in range(r.task_number)]


def submit_job(store: Store, username: str, config: dict[str, Any], *,
               user_id: str = "") -> Job:
    """Store a validated config as a WAITING job with attempt 0 queued;
    `user_id` is the owner's immutable id (accounts.User.uid)."""
    return queue_new_job(store, username, config, user_id=user_id, request_pass=False).job


@dataclass(frozen=True)
class Queued:
    job: Job
    # This submit set the pass flag (see `claim_pass_request`): it rings the
    # schedulers' doorbell (shared/state/passwake.py).
    pass_claimed: bool


def queue_new_job(store: Store, username: str, config: dict[str, Any], *,
                  user_id: str = "", request_pass: bool = True,
                  expectations: Sequence[Expect] = (), spec: JobSpec | None = None) -> Queued:
    """`submit_job`, and with `request_pass` the pass flag claimed in the
    same atomic write (one round trip: the API's submit path); nothing is
    written unless every expectation holds (ExpectationFailed). `spec`: the
    config's, when the caller made it already."""
    spec = spec if spec is not None else JobSpec.from_config(config)
    created = now_ms()
    job = Job(id=job_id_of(username, spec.name), username=username, name=spec.name,
              virtual_cluster=spec.virtual_cluster, created_ms=created, version=1,
              gpus=sum(r.gpu_number * r.task_number for r in spec.task_roles),
              user_id=user_id, priority=spec.priority_class, submission=uuid.uuid4().hex[:16])
    attempt = Attempt(index=0, created_ms=created)
    stored, claimed = store.insert_job(job, config, initial_tasks(spec), attempt,
                                       pass_request_ms=PASS_REQUEST_TTL_MS if request_pass else 0,
                                       expectations=expectations, ask=Ask.of(spec).to_text())
    return Queued(stored, claimed)


def clear_placement(job: Job) -> None:
    """The job is back in its queue: nothing of its last placement stands."""
    job.waiting_reason, job.waiting, job.mode = "", "", ""
    job.preempted_by, job.preempt_deadline_ms = "", None


def move_task(task: Task, target: TaskState) -> None:
    check_task_move(task.state, target)
    task.state = target


def closed_attempt(store: Store, pipe: Pipe, job: Job, state: str, exit_code: int | None,
                    reason: str, platform: bool, current: Attempt | None = None) -> Attempt:
    """The job's current attempt record, ended (the caller writes it);
    `current`: that record as the caller read it already, None: read it."""
    attempt = current if current is not None and current.index == job.attempt \
        else store.read_attempt(pipe, job.id, job.attempt) or Attempt(index=job.attempt)
    attempt.state, attempt.exit_code, attempt.reason = state, exit_code, reason
    attempt.completed_ms, attempt.platform_failure = now_ms(), platform
    return attempt


def mark_task_running(
    store: Store, job_id: str, attempt: int, role: str, index: int, container_id: str,
    task_retry: int | None = None, submission: str | None = None,
) -> bool:
    """A task's container started. False: it belongs to no live task (stop
    it), or (`task_retry` given) it is not the task's current container, or
    (`submission` given) it was made for an earlier submission of the name."""
    job_key, tasks_key = keys.job(job_id), keys.job_tasks(job_id, attempt)

    def decide(pipe: Pipe) -> bool:
        view = store.read_job_view(pipe, job_id, attempt)
        job = view.job
        task = view.tasks.get(task_key(role, index))
        if job is None or task is None or attempt != job.attempt:
            return False
        if task_retry is not None and task_retry != task.retries:
            return False
        if submission and submission != job.submission:  # "": a container before the label
            return False
        if job.state not in LIVE_JOB_STATES:
            return False
        if task.state == TaskState.RUNNING:
            return True
        if task.state != TaskState.LAUNCHING:
            return False
        move_task(task, TaskState.RUNNING)
        task.container_id, task.started_ms = container_id, now_ms()
        previous = store.bump(job, JobState.RUNNING)
        attempt_record = None
        if previous == JobState.WAITING:
            attempt_record = view.attempt or Attempt(index=attempt)
            attempt_record.started_ms = job.started_ms = task.started_ms
        pipe.multi()
        store.write_tasks(pipe, job_id, attempt, [task])
        pipe.zrem(keys.LAUNCHING, attempt_task_key(job_id, attempt, role, index))
        if attempt_record is not None:
            store.write_attempt(pipe, job_id, attempt_record)
            queued_ms = attempt_record.created_ms or job.created_ms
            telemetry.record(pipe, telemetry.SUBMIT_TO_RUNNING, {"vc": job.virtual_cluster},
                             max(0, (task.started_ms or queued_ms) - queued_ms) / 1000)
        store.write_job(pipe, job, previous)
        store.add_event(pipe, job_id, "task-running", attempt=attempt, role=role, index=index,
                        node=task.node)
        return True

    return store.transact(decide, job_key, tasks_key)  # both in one WATCH


def request_stop(store: Store, job_id: str, reason: str = STOPPED_BY_USER) -> Job:
    """STOP: the job goes STOPPING (or straight to STOPPED if nothing runs).
    A `reason` starting STOPPED_BY_PLATFORM (idle GPUs: shared/state/idle.py)
    becomes its diagnostics and its stop event's; a user's stop leaves both
    as they were."""
    job_key = keys.job(job_id)

    def decide(pipe: Pipe) -> Job:
        job = store.require_job(pipe, job_id)
        if job.state not in LIVE_JOB_STATES:
            return job
        pipe.watch(keys.job_tasks(job_id, job.attempt))
        tasks = store.read_tasks(pipe, job_id, job.attempt)
        waiting = [t for t in tasks.values() if t.state == TaskState.WAITING]
        for task in waiting:
            move_task(task, TaskState.STOPPED)
            task.completed_ms = now_ms()
        previous = store.bump(job, JobState.STOPPING)
        job.execution_type = "STOP"
        job.waiting_reason = ""
        platform = reason.startswith(STOPPED_BY_PLATFORM)
        if platform:
            job.exit_diagnostics = reason
        closed = None
        if all(t.state.is_final for t in tasks.values()):
            store.bump(job, JobState.STOPPED)
            job.completed_ms = now_ms()
            closed = closed_attempt(store, pipe, job, JobState.STOPPED, None, reason, False)
        pipe.multi()
        store.write_tasks(pipe, job_id, job.attempt, waiting)
        if closed is not None:
            store.write_attempt(pipe, job_id, closed)
        store.dequeue(pipe, job_id, job.virtual_cluster)
        store.write_job(pipe, job, previous)
        store.add_event(pipe, job_id, "stop-requested", state=job.state,
                        **({"reason": reason} if platform else {}))
        return job

    return store.transact(decide, job_key)


def claim_pass_request(store: Store) -> bool:
    """Should this caller ring the schedulers' doorbell (shared/state/passwake.py)?
    Only when no request is on its way: a burst of submits then costs one ring,
    not one each.

    The scheduler clears the flag (`take_pass_request`) before its pass reads
    the queue, so a job queued while the flag was set is seen by the pass the
    pending ring starts. The flag expires, so a lost ring delays jobs by
    at most PASS_REQUEST_TTL_MS (and the scheduler's periodic pass repairs even
    that). A submit claims it inside its create script (`queue_new_job`);
    this is the same claim for any other caller.
    """
    return bool(store.r.set(keys.PASS_REQUESTED, "1", nx=True, px=PASS_REQUEST_TTL_MS))


def ask_pass_again(store: Store) -> None:
    """What a pass read moved under it: the next request passes (the pass
    lock's dirty flag, services/scheduler/gate.py)."""
    store.r.set(keys.SCHEDULER_DIRTY, "1")


def take_pass_request(pipe: Pipe) -> None:
    """A pass is about to read the queue: the next submit must ask again."""
    pipe.delete(keys.PASS_REQUESTED)


def set_waiting(store: Store, job_id: str, reason: str, explanation: str = "", *,
                version: int | None = None) -> bool:
    """Why a job waits, as a pass saw it (at `version`, when given): the
    sentence (`waiting_reason`) and the explanation as data (`waiting`, JSON).

    Not a state change (the version stays), but still compare-and-set: a
    plain write after the job was stopped and deleted would bring back a
    record holding nothing but a reason (every later read of it a 500), and
    a reason worked out for an older version would describe a job that moved
    on (placed, retried). False when nothing was written.
    """
    key = keys.job(job_id)

    def decide(pipe: Pipe) -> bool:
        job = store.read_job(pipe, job_id)
        if job is None or job.state != JobState.WAITING or (
                job.waiting_reason == reason and job.waiting == explanation):
            return False
        if version is not None and job.version != version:
            return False
        pipe.multi()
        pipe.hset(key, mapping={"waiting_reason": reason, "waiting": explanation})
        return True

    return store.transact(decide, key)


SET_WAITING_BATCH = 1000


def set_waiting_many(store: Store, reasons: Sequence[tuple[str, str, str, int]]) -> int:
    """`set_waiting` for many jobs, each (job id, reason, explanation, version)
    on the same terms (still WAITING at that version), one round trip per
    SET_WAITING_BATCH jobs; how many were written."""
    return sum(int(store.run_script(scripts.SET_WAITING, batch_keys, args))
               for batch_keys, args in _waiting_batches(reasons))


def queue_waiting_many(pipe: Pipe, reasons: Sequence[tuple[str, str, str, int]]) -> None:
    """`set_waiting_many`'s writes queued on `pipe`, to go with others in its
    round trip (each reply: how many of a batch were written)."""
    for batch_keys, args in _waiting_batches(reasons):
        scripts.run(pipe, scripts.SET_WAITING, batch_keys, args)


def _waiting_batches(reasons: Sequence[tuple[str, str, str, int]]
                     ) -> Iterator[tuple[list[str], list[str]]]:
    """SET_WAITING's KEYS and ARGV for each SET_WAITING_BATCH of `reasons`."""
    for start in range(0, len(reasons), SET_WAITING_BATCH):
        batch = reasons[start:start + SET_WAITING_BATCH]
        yield ([keys.job(job_id) for job_id, *_ in batch],
               [JobState.WAITING.value, *(json.dumps([reason, explanation, str(version)])
                                          for _, reason, explanation, version in batch)])


def mark_preempted(store: Store, job_id: str, *, attempt: int, by: str,
                   deadline_ms: int) -> Job | None:
    """Preempt the job's attempt to make room for `by`: its tasks are told,
    then stopped at `deadline_ms`. The job (its attempt still placed and not
    already being preempted or stopped), else None: the caller signals only
    what this marked, so a repeated decision signals no one twice.
    """
    key = keys.job(job_id)

    def decide(pipe: Pipe) -> Job | None:
        job = store.read_job(pipe, job_id)
        if job is None or job.attempt != attempt or job.state not in LIVE_JOB_STATES \
                or job.preempted_by or pipe.zscore(keys.QUEUE, job_id) is not None:
            return None
        job.preempted_by, job.preempt_deadline_ms = by, deadline_ms
        job.version += 1  # whoever decided on the old view must look again
        pipe.multi()
        store.write_job(pipe, job, job.state)
        store.add_event(pipe, job_id, "preempted", attempt=attempt, by=by,
                        deadline=deadline_ms)
        return job

    return store.transact(decide, key)


@dataclass(frozen=True)
class ModeChange:
    """A placed job's attempt now runs on its VC's guarantee or on borrowed
    GPUs (the policy promotes and demotes as other work comes and goes)."""

    job_id: str
    attempt: int
    mode: str


SET_MODES_BATCH = 500


def set_modes(store: Store, changes: Sequence[ModeChange]) -> list[str]:
    """Write each change where its job still runs that attempt, is live and
    placed, and has another mode, with a "mode" event; the jobs changed.
    One script call per SET_MODES_BATCH jobs: a pass that demotes every job
    of a VC at once stays a few round trips, not a transaction per job."""
    changed: list[str] = []
    live = json.dumps(sorted(state.value for state in LIVE_JOB_STATES))
    for start in range(0, len(changes), SET_MODES_BATCH):
        batch = changes[start:start + SET_MODES_BATCH]
        script_keys = [key for c in batch for key in (keys.job(c.job_id),
                                                      keys.job_events(c.job_id))]
        args = [str(EVENTS_MAX_LEN), live]
        for c in batch:
            event = event_fields("mode", attempt=c.attempt, mode=c.mode)
            args.append(json.dumps([str(c.attempt), c.mode,
                                    [part for item in event.items() for part in item]]))
        positions = store.run_script(scripts.SET_MODES, script_keys, args)
        changed += [batch[int(position) - 1].job_id for position in positions]
    return changed


STALE_BATCH = 500


def drop_stale_from_queue(store: Store, job_ids: Sequence[str]) -> list[str]:
    """Take from the queue the jobs that no longer wait there; the ones dropped.

    A pass reads the queue and the records without a lock, so a job it saw
    running (or gone) may be queued again by now: a retry re-queues it, a
    name freed by a delete is submitted again. Each entry is removed only if
    its record, read under WATCH, still says it has no business there
    (missing, not WAITING nor RUNNING with tasks still to place, or without
    a config); a re-queue racing this
    makes it re-read. Batches keep each transaction's WATCH list bounded.
    """
    dropped: list[str] = []
    for start in range(0, len(job_ids), STALE_BATCH):
        batch = job_ids[start:start + STALE_BATCH]

        def decide(pipe: Pipe, batch: Sequence[str] = batch) -> list[str]:
            stale: dict[str, str | None] = {}
            for job_id in batch:
                job = store.read_job(pipe, job_id)
                if job is None or (job.state != JobState.WAITING and not _placing(
                        store, pipe, job)) or not pipe.exists(keys.job_config(job_id)):
                    stale[job_id] = job.virtual_cluster if job is not None else None
            if stale:
                pipe.multi()
                for job_id, vc in stale.items():
                    store.dequeue(pipe, job_id, vc)
            return list(stale)

        dropped += store.transact(decide, *(keys.job(job_id) for job_id in batch))
    return dropped


def _placing(store: Store, pipe: Pipe, job: Job) -> bool:
    """A RUNNING job still being placed (no gang allocation): some task of
    its attempt waits for a place. Its tasks are watched from here on."""
    if job.state != JobState.RUNNING:
        return False
    pipe.watch(keys.job_tasks(job.id, job.attempt))
    return any(t.state == TaskState.WAITING
               for t in store.read_tasks(pipe, job.id, job.attempt).values())


def renew_stale_launch(store: Store, member: str, deadline_ms: int) -> Task | None:
    """A launch lease expired: its task if it still launches (the lease is
    renewed, the caller sends the start again), else None (the lease is gone).

    Conditional on the task's record: every write of the lease (placement,
    start, exit) also writes the task, so a task that started meanwhile
    never gets its lease back, and a lease a re-used job id was just given
    is never taken away.
    """
    job_id, attempt, role, index = parse_attempt_task_key(member)
    tasks_key = keys.job_tasks(job_id, attempt)

    def decide(pipe: Pipe) -> Task | None:
        task = store.read_tasks(pipe, job_id, attempt).get(task_key(role, index))
        launching = task is not None and task.state == TaskState.LAUNCHING and bool(task.node)
        pipe.multi()
        if launching:
            pipe.zadd(keys.LAUNCHING, {member: deadline_ms})
        else:
            pipe.zrem(keys.LAUNCHING, member)
        return task if launching else None

    return store.transact(decide, tasks_key)


def delete_job(store: Store, job_id: str) -> bool:
    """Forget a finished job and everything it kept, so its name is free again."""
    job_key = keys.job(job_id)

    def decide(pipe: Pipe) -> bool:
        job = store.read_job(pipe, job_id)
        if job is None or not job.state.is_final:
            return False
        doomed = retention.job_keys(store, pipe, job)  # its archive's keys too, once compacted
        pipe.multi()
        retention.forget_job(store, pipe, job, doomed)
        return True

    return store.transact(decide, job_key)
