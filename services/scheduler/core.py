"""Gang placement: a snapshot of nodes in, placements or reasons out. No IO.

A job is placed whole or not at all: every task gets concrete GPU indices,
CPUs, memory and ports on one node, or the job keeps waiting with a
human-readable reason built from structured shortfalls. A job that opted out
of gang allocation (`extras.gangAllocation: false`) is placed task by task
instead: as many of its waiting tasks as fit now (`place_some`), the rest in
later passes. What to place, in
which order, and whom to preempt is the policy's (services/scheduler/policy.py);
this module only answers "does this gang fit, and where".

Nodes are indexed by free GPU count, so finding a best-fit node for a task
looks at the buckets from the task's GPU count upwards instead of scanning
every node; within a bucket each scan resumes where the last one for the same
requirement stopped, so a pass looks at each node about once per distinct
task requirement, not once per task. A job shape that failed once in a pass
fails fast for every later job of that shape (the policy keeps that cache,
keyed by `JobRequest.fit_key`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from shared.domain.asks import Ask
from shared.domain.cluster import gpu_type_matches, held
from shared.domain.models import Allocation, Node, TaskPlacement, task_key
from shared.domain.priority import PriorityClass


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

    @property
    def fit(self) -> tuple[tuple[int, int, int, int], tuple[tuple[int, int], ...]]:
        """Everything that decides where the task fits: its shape and, per port
        request, how many from where (two tasks alike in shape but not in
        `beginAt` do not fit alike)."""
        fit = self.__dict__.get("_fit")
        if fit is None:
            fit = (self.shape, tuple(sorted((p.count, p.begin_at) for p in self.ports)))
            self.__dict__["_fit"] = fit
        return fit


@dataclass(frozen=True)
class JobRequest:
    job_id: str
    version: int
    attempt: int
    tasks: tuple[TaskRequest, ...]
    vc: str = "default"
    priority: PriorityClass = PriorityClass.TEST
    seq: int = 0  # submit order (the job's queue sequence)
    gpu_type: str | None = None
    # False (extras.gangAllocation: false): its tasks may start a few at a
    # time; `tasks` are then only those still waiting for a place
    gang: bool = True

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

    @property
    def fit_key(self) -> tuple[object, ...]:
        """Jobs equal in this fit alike on any cluster: task shapes (with each
        port request's `beginAt` when there are any), and the GPU type."""
        key: tuple[object, ...] | None = self.__dict__.get("_fit_key")
        if key is None:
            if any(t.ports for t in self.tasks):
                key = (tuple(sorted(t.fit for t in self.tasks)), self.gpu_type)
            else:
                key = (self.shape, self.gpu_type)
            if not self.gang:  # fits where a gang would not: never alike
                key = (*key, "partial")
            self.__dict__["_fit_key"] = key
        return key


def job_request(job_id: str, version: int, attempt: int, ask: Ask,
                seq: int = 0, waiting: Collection[str] | None = None,
                like: JobRequest | None = None) -> JobRequest:
    """The job's request, from what it asks (shared/domain/asks.py); `waiting`
    (task keys), for a job without gang allocation that is partly placed:
    only those tasks are asked for. `like`: a request made of the same ask
    with no `waiting`, whose tasks (immutable) and what it worked out of them
    the new one shares: a long queue of jobs submitted alike makes each
    task and shape once."""
    if like is not None and waiting is None:
        request = JobRequest(job_id, version, attempt, like.tasks, like.vc, like.priority,
                             seq, like.gpu_type, like.gang)
        derived = request.__dict__
        derived["_gpus"], derived["_shape"], derived["_fit_key"] = \
            like.gpus, like.shape, like.fit_key
        return request
    tasks = tuple(
        TaskRequest(
            role=role.name, index=i, cpus=role.cpus, memory_mb=role.memory_mb,
            gpus=role.gpus,
            ports=tuple(PortRequest(label, count, begin_at)
                        for label, begin_at, count in role.ports),
        )
        for role in ask.roles for i in range(role.tasks)
        if waiting is None or task_key(role.name, i) in waiting
    )
    return JobRequest(job_id, version, attempt, tasks, ask.vc,
                      PriorityClass.parse(ask.priority_class), seq, ask.gpu_type, ask.gang)


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
        if self.resource == "gpu_type":
            return f"no live node has GPUs of type {self.node}"
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
    gpu_model: str = ""
    # GPU index -> the NVLink/switch group it shares with its peers (absent:
    # no topology known, every GPU alike)
    gpu_groups: Mapping[int, int] | None = None
    # The node's whole size, for reservations (what it will have once its
    # running tasks end): every GPU index, CPUs, memory MB. Empty: use free.
    all_gpus: tuple[int, ...] = ()
    cpus: int = 0
    memory_mb: int = 0

    def emptied(self) -> NodeFree:
        """The node as it will be when everything on it has ended."""
        return NodeFree(self.name, self.ip, list(self.all_gpus or self.free_gpus),
                        self.cpus or self.free_cpus, self.memory_mb or self.free_memory_mb,
                        self.port_range, set(), 0, self.gpu_model, self.gpu_groups,
                        self.all_gpus, self.cpus, self.memory_mb)

    def take_gpus(self, count: int) -> tuple[int, ...]:
        """`count` free GPUs, from one topology group when one can hold them
        all (the fullest such group, keeping emptier groups whole)."""
        free = self.free_gpus
        chosen = free[:count]
        groups = self.gpu_groups
        if groups and count > 1:
            members: dict[int, list[int]] = {}
            for gpu in free:
                members.setdefault(groups.get(gpu, -1), []).append(gpu)
            fitting = [m for m in members.values() if len(m) >= count]
            if fitting:
                chosen = min(fitting, key=lambda m: (len(m), m[0]))[:count]
        taken = set(chosen)
        free[:] = [g for g in free if g not in taken]
        return tuple(chosen)

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
    groups = {g.index: g.group for g in node.gpus if g.group is not None}
    return NodeFree(
        name=node.name, ip=node.ip, free_gpus=used.free_gpus(node),
        free_cpus=node.cpus - used.cpus, free_memory_mb=node.memory_mb - used.memory_mb,
        port_range=node.port_range, used_ports=set(used.ports),
        gpu_model=node.gpus[0].model if node.gpus else "", gpu_groups=groups or None,
        all_gpus=tuple(sorted(g.index for g in node.gpus)), cpus=node.cpus,
        memory_mb=node.memory_mb,
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
        # ((cpus, memory MB, ports), GPU type) -> first slot that may fit it
        self.frontiers: dict[tuple[tuple[int, int, int], str | None], int] = {}
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

    def _start(self, need: tuple[int, int, int], gpu_type: str | None) -> int:
        """Where a scan for `need` may begin: past every node known to fail it,
        or to fail a requirement it is at least as large as (of any GPU type,
        or of the same one)."""
        start = self.frontiers.get((need, gpu_type))
        if start is None:
            cpus, memory, ports = need
            start = max((at for ((c, m, p), kind), at in self.frontiers.items()
                         if c <= cpus and m <= memory and p <= ports
                         and (kind is None or kind == gpu_type)), default=0)
        return start

    def first_fit(self, need: tuple[int, int, int], nodes: Mapping[str, NodeFree],
                  gpu_type: str | None = None) -> NodeFree | None:
        if not self.position:
            return None
        cpus, memory, ports = need
        slots = self.slots
        for i in range(self._start(need, gpu_type), len(slots)):
            name = slots[i]
            if name is None:
                continue
            node = nodes[name]
            if node.free_cpus >= cpus and node.free_memory_mb >= memory \
                    and node.free_port_count() >= ports \
                    and (gpu_type is None or gpu_type_matches(node.gpu_model, gpu_type)):
                self.frontiers[need, gpu_type] = i
                return node
        self.frontiers[need, gpu_type] = len(slots)
        return None


class Cluster:
    """Free resources of the live nodes, indexed by free GPU count."""

    def __init__(self, nodes: Iterable[NodeFree], *, by_name: bool = True) -> None:
        """`by_name`: nodes of equal free GPUs are tried in name order; else
        in the order given (a reservation prefers the nodes freest now)."""
        self.nodes = {n.name: n for n in nodes}
        for node in self.nodes.values():
            if not node.all_gpus and not node.cpus:  # given without its size: as free now
                node.all_gpus, node.cpus = tuple(node.free_gpus), node.free_cpus
                node.memory_mb = node.free_memory_mb
        self.buckets: list[_Bucket] = [_Bucket() for _ in range(self._bucket_count())]
        ordered = sorted(self.nodes.values(), key=lambda n: n.name) if by_name \
            else self.nodes.values()
        for node in ordered:
            self.buckets[len(node.free_gpus)].enter(node.name)

    def _bucket_count(self) -> int:
        return max((len(n.free_gpus) for n in self.nodes.values()), default=0) + 1

    def _move(self, node: NodeFree, before: int) -> None:
        after = len(node.free_gpus)
        if after != before:
            self.buckets[before].leave(node.name)
            self.buckets[after].enter(node.name)

    def best_fit(self, task: TaskRequest, gpu_type: str | None = None) -> NodeFree | None:
        """The node that fits the task with the fewest GPUs left over (of the
        GPU type, when one is asked for).

        Within a bucket, the first node (in the order the nodes entered it,
        by name at first) that fits; GPU-less tasks start at the bucket of
        nodes with no free GPUs, keeping GPUs for the tasks that need them.
        """
        need = task.requirement
        if not task.gpus:
            gpu_type = None  # a CPU-only task does not care what GPUs a node has
        for count in range(task.gpus, len(self.buckets)):
            node = self.buckets[count].first_fit(need, self.nodes, gpu_type)
            if node is not None:
                return node
        return None

    def remove(self, names: Iterable[str]) -> dict[str, NodeFree]:
        """Take nodes out of this pass (reserved for a job); returned as they were."""
        taken = {}
        for name in names:
            node = self.nodes.pop(name, None)
            if node is not None:
                self.buckets[len(node.free_gpus)].leave(name)
                taken[name] = node
        return taken

    def assign(self, node: NodeFree, task: TaskRequest) -> TaskPlacement:
        """Take the task's resources on the node. Ports come first: a port
        request that cannot be met (PortsExhausted) leaves the node's GPUs
        and its bucket untouched, for the caller to restore."""
        ports = {"default": node.take_ports(1)}
        for request in task.ports:
            ports[request.label] = node.take_ports(request.count, request.begin_at)
        before = len(node.free_gpus)
        gpus = node.take_gpus(task.gpus)
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

    def shortfall(self, task: TaskRequest, gpu_type: str | None = None) -> Shortfall:
        nodes = list(self.nodes.values())
        if gpu_type and task.gpus:
            nodes = [n for n in nodes if gpu_type_matches(n.gpu_model, gpu_type)]
            if not nodes:
                return Shortfall("gpu_type", task.gpus, 0, role=task.role, node=gpu_type)
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


def copy_node(node: NodeFree) -> NodeFree:
    return NodeFree(node.name, node.ip, list(node.free_gpus), node.free_cpus,
                    node.free_memory_mb, node.port_range, set(node.used_ports), node.port_hint,
                    node.gpu_model, node.gpu_groups, node.all_gpus, node.cpus, node.memory_mb)


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
    gpu_type = request.gpu_type
    for task in order:
        node = cluster.best_fit(task, gpu_type)
        if node is None:
            cluster.restore(touched)
            # Judge against the cluster as it was: if the task fits alone,
            # it is the gang as a whole that does not.
            if placements and cluster.best_fit(task, gpu_type) is not None:
                return GangResult(shortfall=Shortfall("tasks", len(request.tasks),
                                                      len(placements)))
            return GangResult(shortfall=cluster.shortfall(task, gpu_type))
        if node.name not in touched:
            touched[node.name] = copy_node(node)
        try:
            placements.append(cluster.assign(node, task))
        except PortsExhausted as error:
            # Enough free ports in all, but not from the asked beginAt on.
            cluster.restore(touched)
            return GangResult(shortfall=Shortfall("ports", task.shape[3], 0, role=task.role,
                                                  node=str(error)))
    return GangResult(placements=tuple(placements))


def place_some(cluster: Cluster, request: JobRequest) -> GangResult:
    """Place every task of the job that fits now, each on its own (for a job
    without gang allocation). `placements` holds those placed (maybe none);
    `shortfall` says why the first task left over did not fit, None when
    all were placed."""
    order = sorted(request.tasks, key=lambda t: (-t.gpus, -t.cpus, -t.memory_mb, t.role, t.index))
    placements: list[TaskPlacement] = []
    shortfall: Shortfall | None = None
    gpu_type = request.gpu_type
    for task in order:
        node = cluster.best_fit(task, gpu_type) if cluster.nodes else None
        if node is not None:
            saved = {node.name: copy_node(node)}
            try:
                placements.append(cluster.assign(node, task))
                continue
            except PortsExhausted as error:
                cluster.restore(saved)
                shortfall = shortfall or Shortfall("ports", task.shape[3], 0, role=task.role,
                                                   node=str(error))
                continue
        if shortfall is None:
            shortfall = cluster.shortfall(task, gpu_type) if cluster.nodes \
                else Shortfall("tasks", len(request.tasks), 0)
    return GangResult(placements=tuple(placements), shortfall=shortfall)
