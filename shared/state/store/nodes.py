"""Nodes and their allocations: a node's record and renewals, an admin's
holds, the allocations each node holds, and the snapshot a scheduling
pass decides on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.domain import gpuhealth
from shared.domain.cluster import NodeFlags, change_flags
from shared.domain.lease import ClusterView, Lease, NodeSilence, Outage
from shared.domain.models import Allocation, Node, parse_attempt_task_key, task_key
from shared.domain.states import TASK_FINAL, JobState
from shared.infra.clock import now_ms
from shared.state import keys, scripts
from shared.state.jobfeed import FeedPosition
from shared.state.store import NodeNotFound, Pipe, Reader, StoreCore
from shared.state.store.jobs import ASK_FIELD
from shared.state.store.listing import READ_MANY, _pairs, changes_of


@dataclass
class QueuedJob:
    """What a pass reads of a queued job's record: the fields it decides
    on (`QUEUED_FIELDS`), not the whole record, and what the job asks for
    (`ask`, shared/domain/asks.py's text; "" on a record without one, whose
    config says it). The rest of the record is the API's to show. The pass
    writes a waiting reason on the record and here alike."""

    id: str
    state: JobState
    version: int
    queue_seq: int
    attempt: int
    retry_after_ms: int | None
    waiting_reason: str
    waiting: str
    ask: str = ""

    @classmethod
    def from_values(cls, job_id: str, values: Sequence[str | None]) -> QueuedJob:
        """From the record's `QUEUED_FIELDS`, in that order (a record that
        exists has a state)."""
        state, version, seq, attempt, retry_after, reason, waiting, ask = values
        return cls(job_id, JobState(state or ""), int(version or 0), int(seq or 0),
                   int(attempt or 0),
                   int(retry_after) if retry_after not in (None, "", "None") else None,
                   reason or "", waiting or "", ask or "")


# A pass's snapshot reads at most this many entries of the feed of job
# changes; past it, asking about every queued record costs less.
FEED_READ = 10_000
# The job record's fields a pass reads for a queued job, in QueuedJob's order
QUEUED_FIELDS = ("state", "version", "queue_seq", "attempt", "retry_after_ms",
                 "waiting_reason", "waiting", ASK_FIELD)


@dataclass(frozen=True)
class Snapshot:
    """The cluster and the queue as one scheduling pass reads them."""

    faults: gpuhealth.Faults
    nodes: list[Node]  # every node that ever reported, with its heartbeat
    flags: dict[str, NodeFlags]  # the nodes an admin holds
    allocations: dict[str, list[Allocation]]  # node -> what it holds
    queued: list[tuple[str, QueuedJob | None]]  # the scheduler's queue, its records
    # every node's renewals and lease, the outage record and Redis's time:
    # what decides which nodes may take work (shared/domain/lease.py)
    cluster: ClusterView = field(default_factory=lambda: ClusterView({}, Outage(), 0))
    # each virtual cluster's record and its users' budgets, by name
    # (shared/state/accounts.py `vcs_from` makes them VirtualClusters)
    vc_records: list[tuple[dict[str, str], dict[str, str]]] = field(default_factory=list)
    # where the feed of job changes stood when the queue was read, and how
    # many queued records Redis was asked about (every one's on a full read)
    feed: FeedPosition | None = None
    records_asked: int = 0
    # the jobs the feed named since the caller's position; None: it could
    # not say (or was not asked), and every record was asked about
    moved: frozenset[str] | None = None


class NodesMixin(StoreCore):
    """Nodes, an admin's holds on them, their allocations, and the pass's snapshot."""

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

    def launching(self, due_by_ms: int | None = None) -> list[str]:
        """The launches waiting on a node to start them (attempt task keys),
        only those whose deadline is `due_by_ms` or earlier if given."""
        if due_by_ms is None:
            return self.r.zrange(keys.LAUNCHING, 0, -1)
        return self.r.zrangebyscore(keys.LAUNCHING, 0, due_by_ms)

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
                 jobs_known: dict[str, tuple[str, QueuedJob]] | None = None,
                 nodes_known: dict[str, Node] | None = None,
                 feed: FeedPosition | None = None, passer: str = "") -> Snapshot:
        """What a scheduling pass decides on, in two round trips: the GPU
        faults, the nodes and their heartbeats, the admins' holds, the queue,
        Redis's time, the outage record and the virtual clusters' names, then
        the nodes' records, allocations and leases, the queued jobs' records
        and the virtual clusters' records and budgets. `known`:
        allocations parsed before, by their stored text (an allocation's
        text is written once and never changed), which this
        keeps up to date with the allocations it parses (and rid of most of
        those released). `jobs_known`: queued records read before (job id ->
        stamp and record, `_queued_jobs`), which Redis sends again only when
        their version or submission changed. `nodes_known`: node records
        parsed before, by their stored text (`_nodes_from`), which this keeps
        to the records read now.

        `feed`: where the caller stood in the feed of job changes
        (shared/state/jobfeed.py) when it last read the queue. Redis is then
        asked only about the queued jobs not in `jobs_known` and those the
        feed names since; without it, or when the feed cannot say (trimmed
        past it, a new feed, more than FEED_READ entries since), about every
        one, each answered as `jobs_known`'s stamps allow (`_queued_jobs`).
        A write the feed does not carry (a pass's own commit, a mode, a
        waiting reason) is the caller's to account for. `passer`: the
        caller's name among the schedulers, written as the latest pass's
        reader; when another's was there, that one's passes may have written
        so since `feed`, and every record is asked about."""
        jobs_known = {} if jobs_known is None else jobs_known
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(keys.GPU_FAULTS)
        pipe.zrange(keys.NODES, 0, -1, withscores=True)
        pipe.hgetall(keys.NODE_FLAGS)
        pipe.zrange(keys.QUEUE, 0, queue_limit - 1)
        pipe.time()
        pipe.hgetall(keys.CONTROL_PLANE)
        pipe.smembers(keys.VCS)
        scripts.run(pipe, scripts.READ_JOB_CHANGES, [keys.JOB_CHANGES, keys.JOBS],
                    [feed.after if feed is not None else "", str(FEED_READ)])
        if passer:
            pipe.set(keys.LAST_PASSER, passer, get=True)
        faults, beats_list, flags, queued, (seconds, micros), outage, vc_names, reply, \
            *last = pipe.execute()
        changes = changes_of(reply)
        moved: set[str] | None = None  # None: ask about every queued record
        alone = not passer or last == [passer]  # no other replica passed since
        if feed is not None and changes.missed(feed.added) == 0 \
                and len(changes.entries) < FEED_READ and alone:
            moved = {job_id for _, job_id, _ in changes.entries}
            for job_id in moved:  # queued now or not: an entry is read once
                jobs_known.pop(job_id, None)
        # a record not asked about is the one held, as one whose stamp held
        asking = [moved is None or i not in jobs_known for i in queued]
        asked = [i for i, ask in zip(queued, asking, strict=True) if ask]
        beats = {n: int(s) for n, s in beats_list}
        vc_names = sorted(vc_names)
        pipe = self.r.pipeline(transaction=False)
        for name in vc_names:
            pipe.hgetall(keys.vc(name))
            pipe.hgetall(keys.vc_user_budgets(name))
        if beats:
            pipe.mget([keys.node(n) for n in beats])
        # each node's allocations, then each one's lease: a script call per
        # READ_MANY hashes, not a command each (10,000 nodes, 20,000 commands)
        hashes = [keys.node_alloc(n) for n in beats] + [keys.node_lease(n) for n in beats]
        for start in range(0, len(hashes), READ_MANY):
            scripts.run(pipe, scripts.HGETALL_MANY, hashes[start:start + READ_MANY], [])
        for start in range(0, len(asked), READ_MANY):  # one command, not one each
            chunk = asked[start:start + READ_MANY]
            stamps = [jobs_known[job_id][0] if job_id in jobs_known else "" for job_id in chunk]
            scripts.run(pipe, scripts.QUEUED_RECORDS, [keys.job(i) for i in chunk],
                        [*stamps, *QUEUED_FIELDS])
        replies = pipe.execute() if beats or asked or vc_names else []
        vc_records = list(zip(replies[0:2 * len(vc_names):2], replies[1:2 * len(vc_names):2],
                              strict=True))
        replies = replies[2 * len(vc_names):]
        at = 1 if beats else 0
        nodes = _nodes_from(beats, replies[0], nodes_known) if beats else []
        calls = -(-len(hashes) // READ_MANY)
        read = [_pairs(flat) for chunk in replies[at:at + calls] for flat in chunk]
        at += calls
        held = dict(zip(beats, read[:len(beats)], strict=True))
        cluster = ClusterView(
            {name: NodeSilence(renewed, Lease.from_fields(raw) if raw else None)
             for (name, renewed), raw in zip(beats.items(), read[len(beats):], strict=True)},
            Outage.from_fields(outage), int(seconds) * 1000 + int(micros) // 1000)
        answers = iter([None if values == 0 else values
                        for chunk in replies[at:] for values in chunk])
        records = [next(answers) if ask else None for ask in asking]
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
            _queued_jobs(queued, records, jobs_known), cluster, vc_records,
            changes.position(), len(asked), None if moved is None else frozenset(moved))

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


def _queued_jobs(ids: Sequence[str], records: Sequence[Sequence[str | None] | None],
                 known: dict[str, tuple[str, QueuedJob]]
                 ) -> list[tuple[str, QueuedJob | None]]:
    """The queued jobs' records, parsed: a record Redis did not send again
    (None: its version and submission are those of the one in `known`, job id
    -> stamp and record, which keeps only the queued ones) is the one parsed
    before; values without a state are a record that is gone.

    A job's version moves with every write but two, the waiting reason and
    the mode, and a resubmitted name has a new `queue_seq`: the pass reads
    neither of those two from a queued record but the reason it wrote itself
    (`Scheduler._pass` keeps the record it holds up to date with that). So
    Redis sends a queued record only when it changed, and a pass over a long
    queue neither ships nor parses the records of jobs that did not move."""
    queued: list[tuple[str, QueuedJob | None]] = []
    for job_id, values in zip(ids, records, strict=True):
        if values is None:
            queued.append((job_id, known[job_id][1]))
            continue
        if values[0] is None:  # every record has a state
            known.pop(job_id, None)
            queued.append((job_id, None))
            continue
        job = QueuedJob.from_values(job_id, values)
        version, seq = values[1], values[2]
        if version and seq:
            known[job_id] = (f"{version}:{seq}", job)
        else:
            known.pop(job_id, None)  # an old record without them: read every pass
        queued.append((job_id, job))
    if len(known) > 2 * len(ids) + 1000:
        wanted = set(ids)
        for job_id in [i for i in known if i not in wanted]:
            del known[job_id]
    return queued


def _nodes_from(beats: dict[str, int], raws: Sequence[str | None],
                known: dict[str, Node] | None = None) -> list[Node]:
    """The nodes' records (None: gone), each with its heartbeat. `known`:
    records parsed before, by their text (a node's record is written when its
    inventory changes, not with its renewals, and parsing one is 30 µs), kept
    to the texts read now; each node returned is then a copy with its
    heartbeat, the one kept is never changed."""
    nodes = []
    parsed = {} if known is None else known
    kept: dict[str, Node] = {}
    for name, raw in zip(beats, raws, strict=True):
        if not raw:
            continue
        node = parsed.get(raw) or Node.from_dict(json.loads(raw))
        if known is None:
            node.heartbeat_ms = beats[name]
            nodes.append(node)
        else:
            kept[raw] = node
            nodes.append(dataclasses.replace(node, heartbeat_ms=beats[name]))
    if known is not None:
        known.clear()
        known.update(kept)
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
