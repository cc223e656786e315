"""Retention: what Redis keeps of finished jobs, and for how long.

Redis is the system of record and has to fit in memory, so a finished job
must not keep everything a running one needs for ever (docs/operations.md,
"Retention"). A periodic sweep (the scheduler's repair pass calls `sweep`)
does three things, each a compare-and-set on the job's record, each
repeatable after a kill -9 at any point:

1. Compact: PAI_RETENTION_COMPACT_AFTER_SECONDS after a job finished, each
   task attempt's log file in the log tree is made whole from its stream
   (shared/state/logfiles.py) and the stream leaves Redis; the config, attempts,
   the last attempt's tasks, a summary of the events and the record (less
   what only a live job uses) fold into one compressed archive
   (shared/domain/archive.py) and their keys go, the record's hash too. The API
   reads the same job before and after (shared/state/store falls back to the
   archive; logs come from files).
2. Expire: finished jobs older than PAI_RETENTION_DAYS go with every key
   they had, their index entries and their log files.
3. Usage: a bounded walk over the usage day keys (shared/state/usage.py) gives
   those written before their writes set an expiry, or under another
   PAI_USAGE_RETENTION_DAYS, the expiry the setting asks for.
4. Repair: a bounded walk over the finished jobs' indexes enrolls any that
   finished without reaching the sweep's list (jobs from before it existed),
   and any compacted into a version 1 archive with its record beside it:
   compaction folds that record in.

A job that is not final is never touched: each step re-reads it under
WATCH and gives up unless it is final.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import redis

from shared.domain.archive import (
    RUNNING_ONLY_FIELDS,
    Archive,
    finished_task,
    summarize_events,
    task_ref,
    told_by_attempts,
)
from shared.domain.models import Attempt, Job
from shared.domain.states import JobState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.state import jobfeed, keys, logfiles, logstream, usage
from shared.state.store import Pipe, Reader, Store

log = logging.getLogger(__name__)

FINAL_STATES = tuple(s for s in JobState if s.is_final)
DAY_MS = 24 * 3600 * 1000
# The expiry walk looks at up to this many times its batch of the oldest
# jobs of each final state (jobs created long ago but finished lately wait there).
EXPIRY_LOOKAHEAD = 4
SWEEP_SECONDS = 2.0
# The usage walk looks at this many keys per job of the batch each sweep (a
# SCAN step: cheap, the keys are only given an expiry).
USAGE_SCAN_PER_JOB = 10
_DEFAULT_FIELDS = Job(id="", username="", name="", virtual_cluster="default").to_fields()
# The id, user and name are in the record's key (Store.read_job puts them back).
_REQUIRED_FIELDS = frozenset({"state"})


@dataclass(frozen=True)
class SweepReport:
    enrolled: int = 0
    compacted: int = 0
    expired: int = 0
    usage_keys: int = 0  # usage day keys given their expiry


def sweep(store: Store, settings: Settings, now: int | None = None) -> SweepReport:
    """One bounded round of retention work: at most `retention_batch` jobs a
    step, and no new compaction once SWEEP_SECONDS have gone (filing big
    logs takes time, and the scheduler's repair pass that runs this also
    notices lost nodes)."""
    now = now_ms() if now is None else now
    batch = settings.retention_batch
    enrolled = enroll_finished(store, batch)
    due = store.r.zrangebyscore(keys.RETENTION_PENDING, "-inf",
                                now - int(settings.retention_compact_after_seconds * 1000),
                                start=0, num=batch)
    compacted, stop_at = 0, time.monotonic() + SWEEP_SECONDS
    for job_id in due:
        if time.monotonic() > stop_at:
            break
        compacted += compact_job(store, job_id, settings.task_log_dir,
                                 group=settings.log_group)
    expired = 0
    if settings.retention_days > 0:
        expired = expire_due(store, now - settings.retention_days * DAY_MS, batch,
                             settings.task_log_dir)
    usage_keys = usage.enforce_retention(store.r, settings.usage_retention_days,
                                         USAGE_SCAN_PER_JOB * batch)
    return SweepReport(enrolled, compacted, expired, usage_keys)


# ------------------------------------------------------------------ repair


def enroll_finished(store: Store, batch: int) -> int:
    """Walk `batch` more jobs of each final state's index (oldest first, from
    where the last walk stopped, wrapping at the end) and enroll the ones
    neither compacted nor waiting for it: those with a record hash (a
    compacted job has none, but for a version 1 archive's). ZADD NX: an
    enrolled job that was compacted meanwhile is simply dropped from the
    list by `compact_job`."""
    enrolled = 0
    for state in FINAL_STATES:
        start = int(store.r.hget(keys.RETENTION_CURSOR, state.value) or 0)
        ids: list[str] = store.r.zrange(keys.state_jobs(state), start, start + batch - 1)
        if ids:
            pipe = store.r.pipeline(transaction=False)
            pipe.zmscore(keys.RETENTION_PENDING, ids)
            for job_id in ids:
                pipe.hmget(keys.job(job_id), "completed_ms", "created_ms")
            pending, *replies = pipe.execute()
            missing = {}
            for n, job_id in enumerate(ids):
                completed, created = replies[n]
                if pending[n] is None and (completed or created):
                    missing[job_id] = int(completed or created)
            if missing:
                enrolled += int(store.r.zadd(keys.RETENTION_PENDING, missing, nx=True))
        following = start + len(ids) if len(ids) == batch else 0
        store.r.hset(keys.RETENTION_CURSOR, state.value, following)
    return enrolled


# ------------------------------------------------------------------ compact


def compacted_record(job: Job, attempts: Sequence[Attempt]) -> dict[str, str]:
    """The record a finished job keeps in its archive: without the fields
    only a live job uses, those at their default (`Job.from_fields` restores
    them), the id, user and name (the archive's key says them), and its
    diagnostics when its last attempt tells them (`archive.diagnostics_of`)."""
    drop = set(RUNNING_ONLY_FIELDS) | {"id", "username", "name"}
    if told_by_attempts(job.state.value, job.exit_diagnostics, attempts):
        drop.add("exit_diagnostics")
    return {name: value for name, value in job.to_fields().items()
            if name in _REQUIRED_FIELDS
            or (name not in drop and value != _DEFAULT_FIELDS.get(name))}


def compact_job(store: Store, job_id: str, log_dir: str | None,
                group: int | None = None) -> bool:
    """Fold a finished job into its archive and move its logs to files; False
    when there was nothing to do (not final, gone, done already), and then
    the job leaves the sweep's list. A job compacted into a version 1
    archive, its record a hash beside it, gets the record folded in."""
    job_key, archive_key = keys.job(job_id), keys.job_archive(job_id)

    def decide(pipe: Pipe) -> bool:
        job = store.read_job(pipe, job_id)
        earlier = store.read_archive(pipe, job_id) if job is not None else None
        if job is None or not job.state.is_final or (
                earlier is not None and earlier.record is not None):
            pipe.multi()
            pipe.zrem(keys.RETENTION_PENDING, job_id)
            return False
        if earlier is not None:
            pipe.multi()
            pipe.set(archive_key, replace(
                earlier, record=compacted_record(job, earlier.attempts)).encode())
            pipe.delete(job_key)
            pipe.zrem(keys.RETENTION_PENDING, job_id)
            return True
        task_keys = [keys.job_tasks(job_id, a) for a in range(job.attempt + 1)]
        pipe.watch(*task_keys)
        tasks = {a: store.read_tasks(pipe, job_id, a) for a in range(job.attempt + 1)}
        refs = [(a, t.role, t.index) for a, of_attempt in tasks.items()
                for t in of_attempt.values()]
        filed: list[tuple[int, str, int]] = []
        kept: list[tuple[int, str, int]] = []
        if log_dir and refs:
            pipe.watch(*(keys.task_log(job_id, *ref) for ref in refs))  # a late line: again
            for ref in refs:
                (filed if _file_log(pipe, log_dir, job_id, *ref, group=group)
                 else kept).append(ref)
        raw_config = pipe.get(keys.job_config(job_id))
        attempts = tuple(sorted(_attempts(pipe, job_id), key=lambda a: a.index))
        archive = Archive(
            config=json.loads(raw_config) if raw_config else {"taskRoles": []},
            attempts=attempts,
            tasks=tuple(sorted((finished_task(t) for t in tasks[job.attempt].values()),
                               key=lambda t: (t.role, t.index))),
            events=summarize_events(store.read_events(pipe, job_id)),
            streams=tuple(task_ref(*ref) for ref in kept), logs_filed=bool(log_dir),
            last_attempt=job.attempt, record=compacted_record(job, attempts))
        pipe.multi()
        pipe.set(archive_key, archive.encode())
        pipe.delete(job_key, keys.job_config(job_id), keys.job_attempts(job_id),
                    keys.job_events(job_id), keys.job_ssh_key(job_id),
                    keys.job_proxy_token(job_id), *task_keys,
                    *(keys.task_log(job_id, *ref) for ref in filed),
                    *(keys.task_samples(job_id, *ref) for ref in refs))
        pipe.zrem(keys.RETENTION_PENDING, job_id)
        return True

    return store.transact(decide, job_key, archive_key)


def _attempts(reader: Reader, job_id: str) -> list[Attempt]:
    raw: dict[str, str] = reader.hgetall(keys.job_attempts(job_id))
    return [Attempt.from_dict(json.loads(v)) for v in raw.values()]


def _file_log(reader: Reader, log_dir: str, job_id: str, attempt: int, role: str,
              index: int, group: int | None = None) -> bool:
    """Make the task's log file whole from its stream: True when the stream
    may go (the file has it all, or there is no stream), False when the file
    cannot be written (the stream then stays, and the log with it)."""
    key = keys.task_log(job_id, attempt, role, index)
    try:
        info = reader.xinfo_stream(key)
    except redis.ResponseError:  # no stream: nothing was shipped, or it is filed already
        return True
    _kept, added = logstream.extent(info)
    lines = [line for _id, line in logstream.lines_after(reader.xrange(key))]
    try:
        logfiles.make_whole(log_dir, job_id, attempt, role, index, lines, added, group)
    except OSError as error:
        log.warning("cannot file the log of %s %s[%d] (attempt %d): it stays in Redis (%s)",
                    job_id, role, index, attempt, error)
        return False
    return True


# ------------------------------------------------------------------ expire


def job_keys(store: Store, reader: Reader, job: Job) -> list[str]:
    """Every key a job has: its record, config, attempts, events, archive,
    checkpoint steps, proxy token, each attempt's tasks and every task attempt's log and
    sample streams (for a compacted job, every one its config could have
    had: a line shipped late may have made one again)."""
    found = [keys.job(job.id), keys.job_config(job.id), keys.job_attempts(job.id),
             keys.job_events(job.id), keys.job_archive(job.id), keys.job_ssh_key(job.id),
             keys.job_checkpoints(job.id), keys.job_proxy_token(job.id)]
    for attempt in range(job.attempt + 1):
        found.append(keys.job_tasks(job.id, attempt))
        for task in store.read_tasks(reader, job.id, attempt).values():
            found.append(keys.task_log(job.id, attempt, task.role, task.index))
            found.append(keys.task_samples(job.id, attempt, task.role, task.index))
    archive = store.read_archive(reader, job.id)
    if archive is not None:
        for role in archive.config.get("taskRoles", ()):
            for index in range(int(role.get("taskNumber", 0))):
                for attempt in range(job.attempt + 1):
                    found.append(keys.task_log(job.id, attempt, role["name"], index))
                    found.append(keys.task_samples(job.id, attempt, role["name"], index))
    return list(dict.fromkeys(found))


def forget_job(store: Store, pipe: Pipe, job: Job, doomed: Sequence[str]) -> None:
    """Queue the removal of a job's keys and of every index entry it has
    (the feed of changes says it is gone, for the API's job tables)."""
    pipe.delete(*doomed)
    for index in (keys.JOBS, keys.user_jobs(job.username), keys.vc_jobs(job.virtual_cluster),
                  keys.state_jobs(job.state), keys.RETENTION_PENDING):
        pipe.zrem(index, job.id)
    store.dequeue(pipe, job.id, job.virtual_cluster)
    jobfeed.add_removal(pipe, job.id)


def expire_job(store: Store, job_id: str, log_dir: str | None, cutoff_ms: int) -> bool:
    """Remove a finished job that ended before `cutoff_ms`, files first: a
    kill between the two leaves a job without files, which the next sweep
    removes, never files without a job."""
    job = store.get_job(job_id)
    if job is None or not _expired(job, cutoff_ms):
        return False
    remove_logs(log_dir, job_id)

    def decide(pipe: Pipe) -> bool:
        current = store.read_job(pipe, job_id)
        if current is None or not _expired(current, cutoff_ms):
            return False
        doomed = job_keys(store, pipe, current)
        pipe.multi()
        forget_job(store, pipe, current, doomed)
        return True

    return store.transact(decide, keys.job(job_id), keys.job_archive(job_id))


def remove_logs(log_dir: str | None, job_id: str) -> None:
    """Remove a job's log files before its record goes (expiry, or a user's
    delete): its name may be used again, and the new job's logs must start
    afresh. A tree this process may not write is logged, not fatal: the
    record still goes, Redis's memory matters more than the files."""
    if not log_dir:
        return
    try:
        logfiles.remove_job_logs(log_dir, job_id)
    except FileNotFoundError:
        pass
    except OSError as error:
        log.warning("cannot remove the log files of %s: %s", job_id, error)


def _expired(job: Job, cutoff_ms: int) -> bool:
    return job.state.is_final and (job.completed_ms or job.created_ms) < cutoff_ms


def expire_due(store: Store, cutoff_ms: int, batch: int, log_dir: str | None) -> int:
    """Expire up to `batch` jobs that finished before `cutoff_ms`, oldest first.

    The state indexes are ordered by creation, and a job finishes after it
    was created, so every due job was created before the cutoff: the walk
    reads that end of each index only.
    """
    expired = 0
    for state in FINAL_STATES:
        if expired >= batch:
            break
        ids: list[str] = store.r.zrangebyscore(keys.state_jobs(state), "-inf", cutoff_ms,
                                               start=0, num=batch * EXPIRY_LOOKAHEAD)
        if not ids:
            continue
        found = store.read_jobs(ids)
        for job_id in ids:
            if expired >= batch:
                break
            job = found.get(job_id)
            if job is not None and _expired(job, cutoff_ms):
                expired += expire_job(store, job_id, log_dir, cutoff_ms)
    return expired
