"""Gang placement: a snapshot of nodes in, placements or reasons out. No IO.

A job is placed whole or not at all: every task gets concrete GPU indices,
CPUs, memory and ports on one node, or the job keeps waiting with a
human-readable reason built from structured shortfalls.

Nodes are indexed by free GPU count, so finding a best-fit node for a task
looks at the buckets from the task's GPU count upwards instead of scanning
every node; within a bucket each scan resumes where the last one for the same
requirement stopped, so a pass looks at each node about once per distinct
task requirement, not once per task. A job shape that failed once in a pass
fails fast for every later job of that shape.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from shared.cluster import held
from shared.models import Allocation, JobSpec, Node, TaskPlacement


@dataclass(frozen=True)
class PortRequest:
    label: str
    count: int
    begin_at: int = 0


@dataclass(frozen=True)
class TaskRequest:
    role: str
    index: int
    cpus: int
    memory_mb: int
    gpus: int
    ports: tuple[PortRequest, ...] = ()

    # Derived values are computed once, on first use, and kept in the
    # instance's __dict__ (functools.cached_property takes a lock per read on
    # Python 3.11, which a pass over 50,000 jobs notices).

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(GPUs, CPUs, memory MB, ports)."""
        shape: tuple[int, int, int, int] | None = self.__dict__.get("_shape")
        if shape is None:
            shape = (self.gpus, self.cpus, self.memory_mb, sum(p.count for p in self.ports) + 1)
            self.__dict__["_shape"] = shape
        return shape

    @property
    def requirement(self) -> tuple[int, int, int]:
        """What a node must have besides GPUs: CPUs, memory MB, ports."""
        need: tuple[int, int, int] | None = self.__dict__.get("_requirement")
        if need is None:
            need = self.shape[1:]
            self.__dict__["_requirement"] = need
        return need


@dataclass(frozen=True)
class JobRequest:
    job_id: str
    version: int
    attempt: int
    tasks: tuple[TaskRequest, ...]
    vc: str = "default"

    @property
    def gpus(self) -> int:
        gpus: int | None = self.__dict__.get("_gpus")
        if gpus is None:
            gpus = sum(t.gpus for t in self.tasks)
            self.__dict__["_gpus"] = gpus
        return gpus

    @property
    def shape(self) -> tuple[tuple[int, int, int, int], ...]:
        """The task shapes, sorted: jobs alike in it fit alike."""
        shape: tuple[tuple[int, int, int, int], ...] | None = self.__dict__.get("_shape")
        if shape is None:
            shape = tuple(sorted([t.shape for t in self.tasks]))
            self.__dict__["_shape"] = shape
        return shape


def job_request(job_id: str, version: int, attempt: int, spec: JobSpec) -> JobRequest:
    tasks = tuple(
        TaskRequest(
            role=role.name, index=i, cpus=role.cpu_number, memory_mb=role.memory_mb,
            gpus=role.gpu_number,
            ports=tuple(PortRequest(p.label, p.port_number, p.begin_at) for p in role.ports),
        )
        for role in spec.task_roles for i in range(role.task_number)
    )
    return JobRequest(job_id, version, attempt, tasks, spec.virtual_cluster)


@dataclass(frozen=True)
class Shortfall:
    """Why a task did not fit: the resource, what it asked, the most on offer."""

    resource: str
    requested: int
    free: int
    role: str = ""
    node: str | None = None

    def describe(self) -> str:
        unit = {"gpus": "GPUs", "cpus": "CPUs", "memory_mb": "MB of memory",
                "ports": "ports"}.get(self.resource, self.resource)
        who = f"role {self.role} " if self.role else ""
        if self.resource == "ports" and self.node:
            return f"{who}cannot get its ports: {self.node}"
        if self.resource == "node":
            return (f"{who}needs {self.node} together on one node; "
                    "no node has all of them free")
        if self.resource == "tasks":
            return (f"the gang of {self.requested} tasks does not fit at once: "
                    f"only {self.free} can be placed together now")
        return (f"{who}needs {self.requested} {unit} on one node; "
                f"the most free on any node is {self.free}")


class PortsExhausted(ValueError):
    """A port request cannot be met on a node from where it asks to begin."""


@dataclass
class NodeFree:
    """A node's free resources during one pass (mutated as tasks are placed)."""

    name: str
    ip: str
    free_gpus: list[int]
    free_cpus: int
    free_memory_mb: int
    port_range: tuple[int, int]
    used_ports: set[int] = field(default_factory=set)
    # Every port from the range's start up to here is used: the lowest free
    # one is not below it (ports are only taken during a pass).
    port_hint: int = field(default=0, repr=False, compare=False)

    def free_port_count(self) -> int:
        low, high = self.port_range
        return high - low + 1 - len(self.used_ports)

    def take_ports(self, count: int, begin_at: int = 0) -> list[int]:
        """The `count` lowest free ports from `begin_at` (or the range's start)."""
        low, high = self.port_range
        start, hint = max(low, begin_at), max(low, self.port_hint)
        from_hint = start <= hint
        port, taken = max(start, hint), list[int]()
        used = self.used_ports
        while len(taken) < count and port <= high:
            if port not in used:
                taken.append(port)
            port += 1
        if len(taken) < count:
            raise PortsExhausted(
                f"node {self.name} has no {count} free ports from {max(low, begin_at)}")
        used.update(taken)
        if from_hint:
            self.port_hint = port
        return taken


def free_view(node: Node, allocations: Iterable[Allocation]) -> NodeFree:
    """A live node's free resources given what its allocations hold."""
    used = held(allocations)
    return NodeFree(
        name=node.name, ip=node.ip, free_gpus=used.free_gpus(node),
        free_cpus=node.cpus - used.cpus, free_memory_mb=node.memory_mb - used.memory_mb,
        port_range=node.port_range, used_ports=set(used.ports),
    )


class _Bucket:
    """The nodes with one free-GPU count, in the order they entered it.

    Slots are append-only (a node that leaves leaves a hole), so a scan can
    remember how far it got for each requirement: within a pass a node's
    resources only shrink, and a node whose resources grow back (a failed
    gang's restore) enters again at the end. So every node before a
    requirement's frontier still cannot fit it, and no scan looks at a node
    twice for the same requirement: first-fit costs amortized O(1) per
    placement instead of a walk over every full node each time.
    """

    COMPACT_AFTER = 64  # holes tolerated before the slots are rebuilt

    def __init__(self) -> None:
        self.slots: list[str | None] = []
        self.position: dict[str, int] = {}
        # (cpus, memory MB, ports) -> first slot that may fit it
        self.frontiers: dict[tuple[int, int, int], int] = {}
        self.holes = 0

    def enter(self, name: str) -> None:
        self.position[name] = len(self.slots)
        self.slots.append(name)

    def leave(self, name: str) -> None:
        self.slots[self.position.pop(name)] = None
        self.holes += 1
        if self.holes > self.COMPACT_AFTER and 2 * self.holes > len(self.slots):
            self._compact()

    def _compact(self) -> None:
        """Drop the holes, moving every frontier to the same node."""
        alive_before = [0] * (len(self.slots) + 1)
        kept: list[str | None] = []
        for i, name in enumerate(self.slots):
            alive_before[i] = len(kept)
            if name is not None:
                self.position[name] = len(kept)
                kept.append(name)
        alive_before[len(self.slots)] = len(kept)
        self.slots, self.holes = kept, 0
        self.frontiers = {need: alive_before[at] for need, at in self.frontiers.items()}

    def _start(self, need: tuple[int, int, int]) -> int:
        """Where a scan for `need` may begin: past every node known to fail it,
        or to fail a requirement it is at least as large as."""
        start = self.frontiers.get(need)
        if start is None:
            cpus, memory, ports = need
            start = max((at for (c, m, p), at in self.frontiers.items()
                         if c <= cpus and m <= memory and p <= ports), default=0)
        return start

    def first_fit(self, need: tuple[int, int, int], nodes: Mapping[str, NodeFree]
                  ) -> NodeFree | None:
        if not self.position:
            return None
        cpus, memory, ports = need
        slots = self.slots
        for i in range(self._start(need), len(slots)):
            name = slots[i]
            if name is None:
                continue
            node = nodes[name]
            if node.free_cpus >= cpus and node.free_memory_mb >= memory \
                    and node.free_port_count() >= ports:
                self.frontiers[need] = i
                return node
        self.frontiers[need] = len(slots)
        return None


class Cluster:
    """Free resources of the live nodes, indexed by free GPU count."""

    def __init__(self, nodes: Iterable[NodeFree]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.buckets: list[_Bucket] = [_Bucket() for _ in range(self._bucket_count())]
        for node in sorted(self.nodes.values(), key=lambda n: n.name):
            self.buckets[len(node.free_gpus)].enter(node.name)

    def _bucket_count(self) -> int:
        return max((len(n.free_gpus) for n in self.nodes.values()), default=0) + 1

    def _move(self, node: NodeFree, before: int) -> None:
        after = len(node.free_gpus)
        if after != before:
            self.buckets[before].leave(node.name)
            self.buckets[after].enter(node.name)

    def best_fit(self, task: TaskRequest) -> NodeFree | None:
        """The node that fits the task with the fewest GPUs left over.

        Within a bucket, the first node (in the order the nodes entered it,
        by name at first) that fits; GPU-less tasks start at the bucket of
        nodes with no free GPUs, keeping GPUs for the tasks that need them.
        """
        need = task.requirement
        for count in range(task.gpus, len(self.buckets)):
            node = self.buckets[count].first_fit(need, self.nodes)
            if node is not None:
                return node
        return None

    def assign(self, node: NodeFree, task: TaskRequest) -> TaskPlacement:
        """Take the task's resources on the node. Ports come first: a port
        request that cannot be met (PortsExhausted) leaves the node's GPUs
        and its bucket untouched, for the caller to restore."""
        ports = {"default": node.take_ports(1)}
        for request in task.ports:
            ports[request.label] = node.take_ports(request.count, request.begin_at)
        before = len(node.free_gpus)
        gpus = tuple(node.free_gpus[:task.gpus])
        del node.free_gpus[:task.gpus]
        node.free_cpus -= task.cpus
        node.free_memory_mb -= task.memory_mb
        self._move(node, before)
        return TaskPlacement(role=task.role, index=task.index, node=node.name, ip=node.ip,
                             gpus=gpus, cpus=task.cpus, memory_mb=task.memory_mb, ports=ports)

    def restore(self, saved: dict[str, NodeFree]) -> None:
        """Put saved nodes back; each enters its bucket again at the end."""
        for name, node in saved.items():
            current = self.nodes[name]
            self.nodes[name] = node
            self.buckets[len(current.free_gpus)].leave(name)
            self.buckets[len(node.free_gpus)].enter(name)

    def shortfall(self, task: TaskRequest) -> Shortfall:
        nodes = list(self.nodes.values())
        checks = (
            ("gpus", task.gpus, max((len(n.free_gpus) for n in nodes), default=0)),
            ("cpus", task.cpus, max((n.free_cpus for n in nodes), default=0)),
            ("memory_mb", task.memory_mb, max((n.free_memory_mb for n in nodes), default=0)),
            ("ports", task.shape[3], max((n.free_port_count() for n in nodes), default=0)),
        )
        for resource, requested, free in checks:
            if requested > free:
                return Shortfall(resource, requested, max(free, 0), role=task.role)
        # Each resource is free somewhere, but not all of them on one node.
        return Shortfall("node", task.gpus, 0, role=task.role,
                         node=f"{task.gpus} GPUs, {task.cpus} CPUs, {task.memory_mb} MB")


def _copy(node: NodeFree) -> NodeFree:
    return NodeFree(node.name, node.ip, list(node.free_gpus), node.free_cpus,
                    node.free_memory_mb, node.port_range, set(node.used_ports), node.port_hint)


@dataclass(frozen=True)
class GangResult:
    placements: tuple[TaskPlacement, ...] = ()
    shortfall: Shortfall | None = None

    @property
    def placed(self) -> bool:
        return self.shortfall is None


def place_gang(cluster: Cluster, request: JobRequest) -> GangResult:
    """Place every task of the job, or none (the cluster is left as it was)."""
    if not cluster.nodes:
        return GangResult(shortfall=Shortfall("tasks", len(request.tasks), 0))
    order = sorted(request.tasks, key=lambda t: (-t.gpus, -t.cpus, -t.memory_mb, t.role, t.index))
    touched: dict[str, NodeFree] = {}
    placements: list[TaskPlacement] = []
    for task in order:
        node = cluster.best_fit(task)
        if node is None:
            cluster.restore(touched)
            # Judge against the cluster as it was: if the task fits alone,
            # it is the gang as a whole that does not.
            if placements and cluster.best_fit(task) is not None:
                return GangResult(shortfall=Shortfall("tasks", len(request.tasks),
                                                      len(placements)))
            return GangResult(shortfall=cluster.shortfall(task))
        if node.name not in touched:
            touched[node.name] = _copy(node)
        try:
            placements.append(cluster.assign(node, task))
        except PortsExhausted as error:
            # Enough free ports in all, but not from the asked beginAt on.
            cluster.restore(touched)
            return GangResult(shortfall=Shortfall("ports", task.shape[3], 0, role=task.role,
                                                  node=str(error)))
    return GangResult(placements=tuple(placements))


@dataclass
class PassPlan:
    placed: list[tuple[JobRequest, tuple[TaskPlacement, ...]]] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # job id -> reason


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside: for passes, which make no cycles.

    A pass allocates an object or more per queued job; every so many the
    collector walks the whole heap (the queue included), which made a pass
    over 50,000 jobs grow faster than the queue (docs/performance.md).
    Refcounting still frees everything. Nested and threaded uses are safe:
    the collector is back on when the last one leaves, if it was on before.
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def plan_pass(cluster: Cluster, queue: Sequence[JobRequest],
              quotas: Mapping[str, int | None] | None = None,
              used: Mapping[str, int] | None = None) -> PassPlan:
    """Place queued jobs in order, greedily: a job that does not fit waits
    and later, smaller jobs may still start (backfill). A job whose virtual
    cluster's GPU quota it would overrun waits whatever the nodes have."""
    with paused_gc():
        return _plan_pass(cluster, queue, quotas, used)


def _plan_pass(cluster: Cluster, queue: Sequence[JobRequest],
               quotas: Mapping[str, int | None] | None,
               used: Mapping[str, int] | None) -> PassPlan:
    plan = PassPlan()
    quotas = quotas or {}
    vc_used: dict[str, int] = dict(used or {})
    failed_shapes: dict[tuple[tuple[int, int, int, int], ...], str] = {}
    for request in queue:
        quota = quotas.get(request.vc)
        if quota is not None and vc_used.get(request.vc, 0) + request.gpus > quota:
            plan.waiting[request.job_id] = (
                f"virtual cluster {request.vc} is at its quota: {vc_used.get(request.vc, 0)} "
                f"of {quota} GPUs in use; the job needs {request.gpus}")
            continue
        shape = request.shape
        known = failed_shapes.get(shape)
        if known is not None:
            plan.waiting[request.job_id] = known
            continue
        result = place_gang(cluster, request)
        if result.placed:
            plan.placed.append((request, result.placements))
            vc_used[request.vc] = vc_used.get(request.vc, 0) + request.gpus
        else:
            assert result.shortfall is not None
            reason = ("no node has reported in yet" if not cluster.nodes
                      else result.shortfall.describe())
            failed_shapes[shape] = reason
            plan.waiting[request.job_id] = reason
    return plan
