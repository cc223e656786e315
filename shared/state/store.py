"""The Redis store: the platform's system of record.

Reads work on a plain client or on a pipeline in WATCH mode (both run
commands at once), so the same readers serve optimistic transactions.
Writers take a pipeline in MULTI mode. `Store.transact` runs a read-decide-
write function under WATCH and retries it on conflict: every state change
goes through it, so two writers can never both win.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, TypeVar

import redis
from redis.client import NEVER_DECODE

from shared.domain import gpuhealth, jobsort
from shared.domain.archive import Archive
from shared.domain.cluster import NodeFlags, change_flags
from shared.domain.lease import ClusterView, Lease, NodeSilence, Outage
from shared.domain.models import (
    Allocation,
    Attempt,
    Job,
    Node,
    Task,
    parse_attempt_task_key,
    task_key,
)
from shared.domain.priority import PriorityClass, queue_order
from shared.domain.states import TASK_FINAL, JobState, TaskState, check_job_move
from shared.infra import links
from shared.infra.clock import now_ms
from shared.infra.config import parse_sentinel_url
from shared.infra.failover import (
    SWITCH_ERRORS,
    FailoverWait,
    failover_seconds,
    ride_through,
    sentinel_client,
)
from shared.state import jobfeed, keys, scripts
from shared.state.jobfeed import Changes, SortRow
from shared.state.jobtable import JobTable

T = TypeVar("T")

MAX_TRANSACTION_RETRIES = 200
EVENTS_MAX_LEN = 1000


class StoreError(RuntimeError):
    pass


class JobConflict(StoreError):
    """A job of that name already exists for that user."""


class JobNotFound(StoreError):
    pass


class NodeNotFound(StoreError):
    """No node of that name ever reported."""


class Contention(StoreError):
    """A transaction lost its compare-and-set too many times in a row."""


class ExpectationFailed(StoreError):
    """Something a write was decided on changed before it: nothing was
    written; decide again on fresh reads."""


@dataclass(frozen=True)
class Snapshot:
    """The cluster and the queue as one scheduling pass reads them."""

    faults: gpuhealth.Faults
    nodes: list[Node]  # every node that ever reported, with its heartbeat
    flags: dict[str, NodeFlags]  # the nodes an admin holds
    allocations: dict[str, list[Allocation]]  # node -> what it holds
    queued: list[tuple[str, Job | None]]  # the scheduler's queue, its records
    # every node's renewals and lease, the outage record and Redis's time:
    # what decides which nodes may take work (shared/domain/lease.py)
    cluster: ClusterView = field(default_factory=lambda: ClusterView({}, Outage(), 0))


@dataclass(frozen=True)
class Expect:
    """One condition a conditional write holds to, checked atomically with it."""

    kind: str  # "equal" | "absent" | "below"
    key: str
    field: str = ""
    value: str = ""

    @classmethod
    def field_equals(cls, key: str, field: str, value: str) -> Expect:
        """The hash `key` has `field` set to exactly `value`."""
        return cls("equal", key, field, value)

    @classmethod
    def key_absent(cls, key: str) -> Expect:
        return cls("absent", key)

    @classmethod
    def number_below(cls, key: str, value: int) -> Expect:
        """The string `key` holds a number below `value` (a missing key is 0)."""
        return cls("below", key, value=str(value))


POOL_SIZE = 100  # redis-py's default
SORT_READ_CHUNK = 2000  # hashes `read_fields` reads per script call: about 1 ms of Redis
POOL_WAIT_SECONDS = 20.0


def connect(url: str, pool_size: int = POOL_SIZE) -> redis.Redis:
    """A client whose callers wait for a free connection rather than fail.

    Under the API's gevent workers hundreds of requests may want Redis at
    once; past `pool_size` connections they queue (up to POOL_WAIT_SECONDS)
    instead of getting redis-py's "Too many connections", which was a 500.
    A `redis+sentinel://` URL gives a client that follows the primary the
    sentinels name and waits out a switch (shared/infra/failover.py).
    """
    target = parse_sentinel_url(url)
    if target is not None:
        return sentinel_client(target, pool_size=pool_size, pool_wait_seconds=POOL_WAIT_SECONDS)
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=POOL_WAIT_SECONDS,
        decode_responses=True, **links.redis_options())
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # close() closes the pool, as from_url's does
    return client


# redis-py types every reply as a union of bytes, str and awaitables, which
# helps no one here (the client decodes replies): a pipeline or client is Any.
Pipe = Any
Reader = Any


class Store:
    def __init__(self, client: redis.Redis) -> None:
        self.r: Any = client
        self._table: JobTable | None = None

    @property
    def table(self) -> JobTable:
        """This process's table of every job's sort fields (made on first use)."""
        if self._table is None:
            self._table = JobTable(self)
        return self._table

    @classmethod
    def from_url(cls, url: str) -> Store:
        return cls(connect(url))

    # ------------------------------------------------------------ transactions

    def transact(self, fn: Callable[[Pipe], T], *watch: str) -> T:
        """Run `fn` under WATCH on `watch` (fn may WATCH more before MULTI).

        `fn` reads through the pipeline, calls `pipe.multi()`, queues its
        writes and returns; the writes commit only if nothing watched changed
        since it was read, else `fn` runs again on fresh data. On a Sentinel
        client a connection lost during a primary switch is waited out and
        `fn` runs again too: before EXEC nothing was written, and a lost EXEC
        under WATCH comes back from redis-py as a WatchError, so the re-run
        decides on what the new primary holds. Only an EXEC with nothing
        watched has an unknown outcome: that error is raised.
        """
        switch = FailoverWait(failover_seconds(self.r))
        with self.r.pipeline() as pipe:
            for _ in range(MAX_TRANSACTION_RETRIES):
                executing = False
                try:
                    if watch:
                        pipe.watch(*watch)
                    result = fn(pipe)
                    if pipe.explicit_transaction:
                        executing = not pipe.watching
                        pipe.execute()
                    else:
                        pipe.unwatch()
                    return result
                except redis.WatchError:
                    pipe.reset()
                    continue
                except SWITCH_ERRORS:
                    pipe.reset()
                    if executing or not switch.pause():
                        raise
        raise Contention(f"gave up after {MAX_TRANSACTION_RETRIES} conflicting writes on {watch}")

    def run_script(self, script: scripts.Script, script_keys: Sequence[str],
                   args: Sequence[Any]) -> Any:
        """Run one of shared/state/scripts.py's Lua scripts (atomic: nothing
        else runs in Redis meanwhile) on this store's client. Its keys are
        named in `script_keys`, so they show in the call as any command's do."""
        return scripts.run(self.r, script, script_keys, args)

    # ------------------------------------------------------------------ jobs

    def create_job(
        self, job: Job, config: dict[str, Any], tasks: Sequence[Task], attempt: Attempt,
    ) -> Job:
        """Store a new WAITING job, queue it; JobConflict if user~name exists."""
        return self.insert_job(job, config, tasks, attempt)[0]

    def insert_job(
        self, job: Job, config: dict[str, Any], tasks: Sequence[Task], attempt: Attempt,
        *, pass_request_ms: int = 0, expectations: Sequence[Expect] = (),
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
        """
        stored_config = json.dumps(config, separators=(",", ":"))
        fields = job.to_fields()
        fields.pop("queue_seq")
        task_fields = _task_fields(tasks)
        args: list[Any] = [
            job.id, job.created_ms, stored_config, attempt.index,
            json.dumps(attempt.to_dict(), separators=(",", ":")),
            queue_order(PriorityClass.parse(job.priority), 0), now_ms(), EVENTS_MAX_LEN,
            pass_request_ms, len(task_fields), len(expectations), SortRow.of(job).encode()]
        for expect in expectations:
            args.extend((expect.kind, expect.field, expect.value))
        for pair in (*task_fields.items(), *fields.items()):
            args.extend(pair)
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

    def get_config(self, job_id: str) -> dict[str, Any] | None:
        raw = self.r.get(keys.job_config(job_id))
        if raw:
            return json.loads(raw)
        archive = self.read_archive(self.r, job_id)
        return archive.config if archive is not None else None

    def read_archive(self, reader: Reader, job_id: str) -> Archive | None:
        """A compacted job's archive (shared/domain/archive.py), or None: the readers
        below fall back to it, so a job reads the same before and after."""
        blob = reader.execute_command("GET", keys.job_archive(job_id), **{NEVER_DECODE: True})
        return Archive.decode(blob) if blob else None

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

    # -------------------------------------------------------- tasks, attempts

    def write_tasks(self, pipe: Pipe, job_id: str, attempt: int, tasks: Iterable[Task]) -> None:
        mapping = _task_fields(tasks)
        if mapping:
            pipe.hset(keys.job_tasks(job_id, attempt), mapping=mapping)

    def read_tasks(self, reader: Reader, job_id: str, attempt: int) -> dict[str, Task]:
        return _tasks_from(reader.hgetall(keys.job_tasks(job_id, attempt)))

    def get_tasks(self, job_id: str, attempt: int) -> list[Task]:
        tasks: Iterable[Task] = self.read_tasks(self.r, job_id, attempt).values()
        if not tasks:
            archive = self.read_archive(self.r, job_id)
            tasks = archive.tasks_of(attempt) if archive is not None else []
        return _in_task_order(tasks)

    def write_attempt(self, pipe: Pipe, job_id: str, attempt: Attempt) -> None:
        pipe.hset(keys.job_attempts(job_id), str(attempt.index),
                  json.dumps(attempt.to_dict(), separators=(",", ":")))

    def read_attempt(self, reader: Reader, job_id: str, index: int) -> Attempt | None:
        raw = reader.hget(keys.job_attempts(job_id), str(index))
        return Attempt.from_dict(json.loads(raw)) if raw else None

    def get_attempts(self, job_id: str) -> list[Attempt]:
        raw: dict[str, str] = self.r.hgetall(keys.job_attempts(job_id))
        if not raw:
            archive = self.read_archive(self.r, job_id)
            return list(archive.attempts) if archive is not None else []
        return sorted((Attempt.from_dict(json.loads(v)) for v in raw.values()),
                      key=lambda a: a.index)

    # ---------------------------------------------------------------- events

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

    # --------------------------------------------------------------- listing

    def list_jobs(
        self, *, username: str | None = None, vc: str | None = None,
        state: str | None = None, keyword: str | None = None, offset: int = 0,
        limit: int = 50, oldest_first: bool = False, sort: str = jobsort.SUBMIT_TIME,
    ) -> tuple[list[Job], int]:
        """A page of the jobs that pass the filters (`keyword`: a part of the
        name, any case), newest first (`oldest_first`: the other way), or by
        another field (`sort`, shared/domain/jobsort.py); and how many pass.

        The list as it opens, everyone's or one user's, VC's or state's jobs
        by submit time, is a range of that index: no more than the page is
        read. Any other list (two filters, a keyword, another field) is
        answered by this process's table of every job's sort fields and
        names (shared/state/jobtable.py), brought up to date first.
        """
        filters = [(keys.user_jobs, username), (keys.vc_jobs, vc), (keys.state_jobs, state)]
        given = [index(value) for index, value in filters if value]
        if sort == jobsort.SUBMIT_TIME and not keyword and len(given) <= 1:
            index_key = given[0] if given else keys.JOBS
            pipe = self.r.pipeline(transaction=False)
            pipe.zcard(index_key)
            (pipe.zrange if oldest_first else pipe.zrevrange)(
                index_key, offset, offset + limit - 1)
            total, ids = pipe.execute()
            return self._jobs(ids), int(total)
        ids, matched = self.table.page(
            sort=sort, descending=not oldest_first, offset=offset, limit=limit,
            now=now_ms(), username=username, vc=vc, state=state, keyword=keyword)
        return self._jobs(ids), matched

    def _jobs(self, ids: Sequence[str]) -> list[Job]:
        found = self.read_jobs(ids)
        return [found[i] for i in ids if i in found]

    def read_jobs(self, ids: Sequence[str]) -> dict[str, Job]:
        """The records of the jobs that exist among `ids`, in two round trips
        at most: the hashes, then the archives of the compacted ones."""
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(keys.job(job_id))
        found = {i: Job.from_fields({"id": i, **f})
                 for i, f in zip(ids, pipe.execute(), strict=True) if f}
        compacted = [i for i in ids if i not in found]
        for job_id, record in self.archived_records(compacted).items():
            found[job_id] = Job.from_fields({"id": job_id, **record})
        return found

    def archived_records(self, ids: Sequence[str]) -> dict[str, dict[str, str]]:
        """The records of compacted jobs, from their archives, one round trip
        (a job with no archive either is gone, and left out)."""
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.execute_command("GET", keys.job_archive(job_id), **{NEVER_DECODE: True})
        records = {}
        for job_id, blob in zip(ids, pipe.execute(), strict=True):
            record = Archive.record_of(blob) if blob else None
            if record is not None:
                records[job_id] = record
        return records

    def read_fields(self, hashes: Sequence[str], fields: Sequence[str],
                    chunk: int = SORT_READ_CHUNK) -> list[list[str | None]]:
        """HMGET of the same `fields` (at least one) from each of many hashes
        (None for a field or hash that is not there), in one script call per
        `chunk` hashes, each answering one joined string: one command instead
        of one each, and one reply to parse a call, which is most of the
        client's cost of reading thousands of small hashes. The values must
        hold no NUL (job records: numbers, states, names, JSON)."""
        width = len(fields)
        values: list[list[str | None]] = []
        for start in range(0, len(hashes), chunk):
            flat = self.run_script(scripts.HMGET_JOINED, hashes[start:start + chunk],
                                   fields).split("\0")
            rows: list[list[str | None]] = [flat[n:n + width]
                                            for n in range(0, len(flat), width)]
            if _MISSING in flat:  # rare: a field never written, or a hash gone
                rows = [[None if v == _MISSING else v for v in row] for row in rows]
            values += rows
        return values

    def read_columns(self, hashes: Sequence[str], fields: Sequence[tuple[str, str]],
                     chunk: int = SORT_READ_CHUNK) -> list[str]:
        """The same fields of many hashes a column at a time: for each (field,
        default) one string, each hash's value (the default where it has
        none) joined by spaces, read `chunk` hashes a script call. A column
        of numbers is then parsed in C (numpy.fromstring) instead of a value
        at a time. The values must hold no space (job records' numbers,
        states, VC names)."""
        args = [item for pair in fields for item in pair]
        parts: list[list[str]] = [[] for _ in fields]
        for start in range(0, len(hashes), chunk):
            reply = self.run_script(scripts.HMGET_COLUMNS, hashes[start:start + chunk], args)
            for column, text in zip(parts, reply, strict=True):
                column.append(text)
        return [" ".join(column) for column in parts]

    def read_hashes(self, hashes: Sequence[str]) -> list[dict[str, str]]:
        """HGETALL of many hashes ({} for one that is missing), in one script
        call per READ_MANY keys."""
        found: list[dict[str, str]] = []
        for start in range(0, len(hashes), READ_MANY):
            found += [_pairs(flat) for flat in
                      self.run_script(scripts.HGETALL_MANY, hashes[start:start + READ_MANY], [])]
        return found

    def read_changes(self, after: str, count: int) -> Changes:
        """The feed of job changes after entry `after` (at most `count`; "":
        none, only where the feed stands), with the feed's position and the
        number of jobs, in one atomic read (shared/state/jobfeed.py)."""
        jobs, added, last_id, raw = self.run_script(
            scripts.READ_JOB_CHANGES, [keys.JOB_CHANGES, keys.JOBS], [after, str(count)])
        entries = []
        for entry_id, fields in raw:
            values = dict(zip(fields[::2], fields[1::2], strict=True))
            entries.append((entry_id, values.get("j", ""), values.get("d", jobfeed.GONE)))
        return Changes(int(jobs), int(added), last_id, entries)

    def queued_job_ids(self, limit: int = 100_000) -> list[str]:
        return self.r.zrange(keys.QUEUE, 0, limit - 1)

    # ---------------------------------------------------------------- nodes

    def register_node(self, node: Node) -> None:
        """Write the node's record and stamp its renewal with Redis's time,
        with no lease: a node set up by hand (tests, benchmarks, drills).
        A node agent registers through its lease (shared/state/leases.py)."""
        node.heartbeat_ms = int(self.run_script(
            scripts.REGISTER_NODE, [keys.node(node.name), keys.NODES],
            [node.name, json.dumps(node.to_dict(), separators=(",", ":"))]))

    def heartbeat(self, name: str) -> None:
        """Stamp a renewal of a node set up by hand, with Redis's time."""
        self.run_script(scripts.REGISTER_NODE, [keys.node(name), keys.NODES], [name, ""])

    def node_heartbeats(self) -> dict[str, int]:
        return {n: int(s) for n, s in self.r.zrange(keys.NODES, 0, -1, withscores=True)}

    def get_nodes(self) -> list[Node]:
        """Every node that ever reported, with its last heartbeat."""
        beats = self.node_heartbeats()
        if not beats:
            return []
        return _nodes_from(beats, self.r.mget([keys.node(n) for n in beats]))

    def node_flags(self) -> dict[str, NodeFlags]:
        """Every node an admin holds (cordoned or draining), in one round trip;
        a node not named here is schedulable."""
        raw: dict[str, str] = self.r.hgetall(keys.NODE_FLAGS)
        return {name: NodeFlags.from_json(flags) for name, flags in raw.items()}

    def set_node_flags(self, name: str, *, schedulable: bool | None = None,
                       drain: bool | None = None, reason: str | None = None,
                       by: str) -> NodeFlags:
        """Apply an admin's change (cluster.change_flags) on the flags as they
        are at commit; NodeNotFound for a node that never reported, ValueError
        for a change that means nothing. A node made schedulable again loses
        its entry, so `node_flags()` lists only the nodes held."""

        def change(pipe: Pipe) -> NodeFlags:
            if pipe.zscore(keys.NODES, name) is None:
                raise NodeNotFound(f"node {name} has never reported")
            raw = pipe.hget(keys.NODE_FLAGS, name)
            flags = change_flags(NodeFlags.from_json(raw) if raw else NodeFlags(),
                                 schedulable=schedulable, drain=drain, reason=reason, by=by,
                                 now_ms=now_ms())
            pipe.multi()
            if flags.accepts_work:
                pipe.hdel(keys.NODE_FLAGS, name)
            else:
                pipe.hset(keys.NODE_FLAGS, name, flags.to_json())
            return flags

        return self.transact(change, keys.NODE_FLAGS)

    def clear_node_flags(self, name: str) -> bool:
        """Forget any hold on a node (one being retired): True if it had one.
        A single HDEL, so nothing can interleave with it."""
        return bool(self.r.hdel(keys.NODE_FLAGS, name))

    def get_node(self, name: str) -> Node | None:
        """One node's record with its last heartbeat, without reading the others."""
        pipe = self.r.pipeline(transaction=False)
        pipe.zscore(keys.NODES, name)
        pipe.get(keys.node(name))
        beat, raw = pipe.execute()
        if beat is None or not raw:
            return None
        node = Node.from_dict(json.loads(raw))
        node.heartbeat_ms = int(beat)
        return node

    def get_allocations(self, reader: Reader, node: str) -> dict[str, Allocation]:
        raw: dict[str, str] = reader.hgetall(keys.node_alloc(node))
        return {k: Allocation.from_dict(json.loads(v)) for k, v in raw.items()}

    def all_allocations(self, node_names: Sequence[str]) -> dict[str, list[Allocation]]:
        """Every allocation of the named nodes, in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for name in node_names:
            pipe.hgetall(keys.node_alloc(name))
        replies = pipe.execute() if node_names else []
        return {name: [Allocation.from_dict(json.loads(v)) for v in raw.values()]
                for name, raw in zip(node_names, replies, strict=True)}

    def snapshot(self, known: dict[str, Allocation] | None = None,
                 queue_limit: int = 100_000,
                 jobs_known: dict[str, tuple[str, Job]] | None = None) -> Snapshot:
        """What a scheduling pass decides on, in two round trips: the GPU
        faults, the nodes and their heartbeats, the admins' holds, the queue,
        Redis's time and the outage record, then the nodes' records,
        allocations and leases and the queued jobs' records. `known`:
        allocations parsed before, by their stored text (an allocation's
        text is written once and never changed), which this
        keeps up to date with the allocations it parses (and rid of most of
        those released). `jobs_known`: queued records read before (job id ->
        stamp and record, `_queued_jobs`), which Redis sends again only when
        their version or submission changed."""
        jobs_known = {} if jobs_known is None else jobs_known
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(keys.GPU_FAULTS)
        pipe.zrange(keys.NODES, 0, -1, withscores=True)
        pipe.hgetall(keys.NODE_FLAGS)
        pipe.zrange(keys.QUEUE, 0, queue_limit - 1)
        pipe.time()
        pipe.hgetall(keys.CONTROL_PLANE)
        faults, beats_list, flags, queued, (seconds, micros), outage = pipe.execute()
        beats = {n: int(s) for n, s in beats_list}
        pipe = self.r.pipeline(transaction=False)
        if beats:
            pipe.mget([keys.node(n) for n in beats])
        for name in beats:
            pipe.hgetall(keys.node_alloc(name))
        for name in beats:
            pipe.hgetall(keys.node_lease(name))
        for start in range(0, len(queued), READ_MANY):  # one command, not one each
            chunk = queued[start:start + READ_MANY]
            stamps = [jobs_known[job_id][0] if job_id in jobs_known else "" for job_id in chunk]
            scripts.run(pipe, scripts.QUEUED_RECORDS, [keys.job(i) for i in chunk], stamps)
        replies = pipe.execute() if beats or queued else []
        at = 1 if beats else 0
        nodes = _nodes_from(beats, replies[0]) if beats else []
        held = dict(zip(beats, replies[at:at + len(beats)], strict=True))
        at += len(beats)
        cluster = ClusterView(
            {name: NodeSilence(renewed, Lease.from_fields(raw) if raw else None)
             for (name, renewed), raw in zip(beats.items(), replies[at:at + len(beats)],
                                             strict=True)},
            Outage.from_fields(outage), int(seconds) * 1000 + int(micros) // 1000)
        records = [None if flat == 0 else _pairs(flat)
                   for chunk in replies[at + len(beats):] for flat in chunk]
        parsed = {} if known is None else known
        allocations = {node.name: [_allocation(text, parsed) for text in held[node.name].values()]
                       for node in nodes}
        live = sum(len(raw) for raw in held.values())
        if len(parsed) > 2 * live + MAX_GONE_ALLOCATIONS:  # keep those still held
            kept = {text: parsed[text] for raw in held.values() for text in raw.values()
                    if text in parsed}
            parsed.clear()
            parsed.update(kept)
        return Snapshot(
            gpuhealth.parse_faults(faults), nodes,
            {name: NodeFlags.from_json(f) for name, f in flags.items()}, allocations,
            _queued_jobs(queued, records, jobs_known), cluster)

    def write_allocation(self, pipe: Pipe, alloc: Allocation) -> None:
        pipe.hset(keys.node_alloc(alloc.node), alloc.key,
                  json.dumps(alloc.to_dict(), separators=(",", ":")))

    def release_allocation(self, node: str, alloc_key: str) -> bool:
        """Free an allocation whose task is settled or gone; False otherwise.

        Conditional on the task's record: once a finished job is deleted its
        name may be submitted again, and the new job's allocation has the same
        key; a release decided on the old task must not free it. (Every write
        of an allocation also writes its task, so checking the task in the
        same atomic step as the delete suffices.) One round trip: a script
        (scripts.RELEASE_ALLOCATION) that reads the task and deletes the allocation at once.
        """
        job_id, attempt, role, index = parse_attempt_task_key(alloc_key)
        return bool(self.run_script(
            scripts.RELEASE_ALLOCATION, [keys.job_tasks(job_id, attempt), keys.node_alloc(node)],
            [task_key(role, index), alloc_key, *sorted(TASK_FINAL)]))

    # ------------------------------------------------------------------ logs

    def append_log(self, job_id: str, attempt: int, role: str, index: int,
                   lines: Sequence[str], max_lines: int) -> None:
        if not lines:
            return
        key = keys.task_log(job_id, attempt, role, index)
        pipe = self.r.pipeline(transaction=False)
        for line in lines:
            pipe.xadd(key, {"l": line}, maxlen=max_lines, approximate=True)
        pipe.execute()

    def read_log(self, job_id: str, attempt: int, role: str, index: int,
                 tail: int | None = None, after: str = "-") -> list[tuple[str, str]]:
        """(entry id, line) pairs: the last `tail` lines, or those after an id."""
        key = keys.task_log(job_id, attempt, role, index)
        if tail is not None:
            if tail <= 0:  # Redis refuses COUNT 0: nothing is asked for
                return []
            entries = list(reversed(self.r.xrevrange(key, count=tail)))
        else:
            start = "-" if after == "-" else f"({after}"
            entries = self.r.xrange(key, min=start)
        return [(entry_id, fields.get("l", "")) for entry_id, fields in entries]

    def follow_log(self, job_id: str, attempt: int, role: str, index: int, *, after: str,
                   block_ms: int) -> list[tuple[str, str]]:
        """Lines after entry `after`, waiting up to `block_ms` for the first one."""
        key = keys.task_log(job_id, attempt, role, index)
        reply = self.r.xread({key: after}, count=1000, block=block_ms or None)
        if not reply:
            return []
        return [(entry_id, fields.get("l", "")) for entry_id, fields in reply[0][1]]

    def log_extent(self, job_id: str, attempt: int, role: str, index: int) -> tuple[int, int]:
        """(lines the stream keeps, lines ever appended to it): their difference is
        what the bound dropped, oldest first."""
        try:
            info = self.r.xinfo_stream(keys.task_log(job_id, attempt, role, index))
        except redis.ResponseError:  # no such key: nothing shipped yet
            return 0, 0
        kept = int(info["length"])
        return kept, max(kept, int(info.get("entries-added") or kept))

    def last_log_id(self, job_id: str, attempt: int, role: str, index: int) -> str:
        """The id of the newest line (or "0-0"): following starts after it."""
        entries = self.r.xrevrange(keys.task_log(job_id, attempt, role, index), count=1)
        return str(entries[0][0]) if entries else "0-0"

    def task_exists(self, job_id: str, attempt: int, role: str, index: int) -> bool:
        if self.r.hexists(keys.job_tasks(job_id, attempt), task_key(role, index)):
            return True
        archive = self.read_archive(self.r, job_id)
        return archive is not None and archive.has_task(attempt, role, index)

    def get_task(self, job_id: str, attempt: int, role: str, index: int) -> Task | None:
        """One task of one attempt, without reading its siblings."""
        raw = self.r.hget(keys.job_tasks(job_id, attempt), task_key(role, index))
        return Task.from_dict(json.loads(raw)) if raw else None

    def task_settled(self, job_id: str, attempt: int, role: str, index: int) -> bool:
        """The task reached a final state, or does not exist at all."""
        task = self.get_task(job_id, attempt, role, index)
        return task is None or task.state.is_final


def event_fields(kind: str, **data: Any) -> dict[str, str]:
    """A job event as its stream entry stores it (`Store.read_events` reads it)."""
    fields = {"kind": kind, "time": str(now_ms())}
    fields.update({k: _event_json(v) for k, v in data.items()})
    return fields


def _event_json(value: Any) -> str:
    """`json.dumps(value)`, the same text, without its encoder's set-up for the
    values most events carry (a pass writes thousands of events at once)."""
    kind = type(value)
    if kind is int:  # not bool, whose text differs
        return int.__repr__(value)
    if kind is str:
        return encode_basestring_ascii(value)
    return _dumps(value)


def _c_encoder(item_separator: str, key_separator: str) -> Any:
    """json's C encoder (ASCII, no circularity check: the values are trees),
    made once: calling it directly skips the set-up json.dumps does on every
    call, which is most of the cost of a small value. None without it."""
    if c_make_encoder is None:
        return None
    return c_make_encoder(None, None, encode_basestring_ascii, None, key_separator,
                          item_separator, False, False, True)


_dumps_chunks = _c_encoder(", ", ": ")
_compact_chunks = _c_encoder(",", ":")


def _dumps(value: Any) -> str:
    """`json.dumps(value)`, the same text."""
    if _dumps_chunks is None or not isinstance(value, list | dict):
        return json.dumps(value)
    return "".join(_dumps_chunks(value, 0))


def _tasks_from(raw: dict[str, str]) -> dict[str, Task]:
    """An attempt's tasks from its hash (task key -> JSON)."""
    return {k: Task.from_dict(json.loads(v)) for k, v in raw.items()}


def _in_task_order(tasks: Iterable[Task]) -> list[Task]:
    return sorted(tasks, key=lambda t: (t.role, t.index))


def _queued_jobs(ids: Sequence[str], records: Sequence[dict[str, str] | None],
                 known: dict[str, tuple[str, Job]]) -> list[tuple[str, Job | None]]:
    """The queued jobs' records, parsed: a record Redis did not send again
    (None: its version and submission are those of the one in `known`, job id
    -> stamp and record, which keeps only the queued ones) is the one parsed
    before; {} is a record that is gone.

    A job's version moves with every write but two, the waiting reason and
    the mode, and a resubmitted name has a new `queue_seq`: the pass reads
    neither of those two from a queued record but the reason it wrote itself
    (`Scheduler._pass` keeps the record it holds up to date with that). So
    Redis sends a queued record only when it changed, and a pass over a long
    queue neither ships nor parses the records of jobs that did not move."""
    queued: list[tuple[str, Job | None]] = []
    for job_id, fields in zip(ids, records, strict=True):
        if fields is None:
            queued.append((job_id, known[job_id][1]))
            continue
        if not fields:
            known.pop(job_id, None)
            queued.append((job_id, None))
            continue
        job = Job.from_fields(fields)
        version, seq = fields.get("version"), fields.get("queue_seq")
        if version and seq:
            known[job_id] = (f"{version}:{seq}", job)
        else:
            known.pop(job_id, None)  # an old record without them: read whole every pass
        queued.append((job_id, job))
    if len(known) > 2 * len(ids) + 1000:
        wanted = set(ids)
        for job_id in [i for i in known if i not in wanted]:
            del known[job_id]
    return queued


def compact_json(value: Any) -> str:
    """`json.dumps(value, separators=(",", ":"))`, the same text: records and
    script arguments as the store writes them."""
    if _compact_chunks is None or not isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return "".join(_compact_chunks(value, 0))


def _pairs(flat: Sequence[str]) -> dict[str, str]:
    """A hash from HGETALL's flat field/value list, as a script returns it."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _nodes_from(beats: dict[str, int], raws: Sequence[str | None]) -> list[Node]:
    """The nodes' records (None: gone), each with its heartbeat."""
    nodes = []
    for name, raw in zip(beats, raws, strict=True):
        if raw:
            node = Node.from_dict(json.loads(raw))
            node.heartbeat_ms = beats[name]
            nodes.append(node)
    return nodes


MAX_KNOWN_ALLOCATIONS = 200_000
MAX_GONE_ALLOCATIONS = 1_000  # released allocations `snapshot` may keep parsed


def _allocation(text: str, known: dict[str, Allocation]) -> Allocation:
    """The allocation stored as `text`, parsed once (Allocation is frozen)."""
    alloc = known.get(text)
    if alloc is None:
        if len(known) >= MAX_KNOWN_ALLOCATIONS:
            known.clear()
        alloc = known[text] = Allocation.from_dict(json.loads(text))
    return alloc


def _task_fields(tasks: Iterable[Task]) -> dict[str, str]:
    return {t.key: json.dumps(t.to_dict(), separators=(",", ":")) for t in tasks}


_MISSING = "\x01"  # what scripts.HMGET_JOINED answers for a field that is not there
# keys per HGETALL_MANY or QUEUED_RECORDS call (each call holds Redis for its length)
READ_MANY = 10_000


def _archived_job(job_id: str, archive: Archive | None) -> Job | None:
    """A compacted job's record from its archive; None without one, or from
    a version 1 archive (its record is a hash of its own)."""
    if archive is None or archive.record is None:
        return None
    return Job.from_fields({"id": job_id, **archive.record})


def task_is_live(task: Task) -> bool:
    return task.state in (TaskState.LAUNCHING, TaskState.RUNNING)
