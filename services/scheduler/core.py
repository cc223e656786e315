"""Gang placement: a snapshot of nodes in, placements or reasons out. No IO.

A job is placed whole or not at all: every task gets concrete GPU indices,
CPUs, memory and ports on one node, or the job keeps waiting with a
human-readable reason built from structured shortfalls.

Nodes are indexed by free GPU count, so finding a best-fit node for a task
looks at the buckets from the task's GPU count upwards instead of scanning
every node; a request shape that failed once in a pass fails fast for every
later job of that shape or larger.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

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

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.gpus, self.cpus, self.memory_mb, sum(p.count for p in self.ports) + 1)


@dataclass(frozen=True)
class JobRequest:
    job_id: str
    version: int
    attempt: int
    tasks: tuple[TaskRequest, ...]
    vc: str = "default"

    @property
    def gpus(self) -> int:
        return sum(t.gpus for t in self.tasks)


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
        if self.resource == "node":
            return (f"{who}needs {self.node} together on one node; "
                    "no node has all of them free")
        if self.resource == "tasks":
            return (f"the gang of {self.requested} tasks does not fit at once: "
                    f"only {self.free} can be placed together now")
        return (f"{who}needs {self.requested} {unit} on one node; "
                f"the most free on any node is {self.free}")


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

    def fits(self, task: TaskRequest) -> bool:
        return (len(self.free_gpus) >= task.gpus and self.free_cpus >= task.cpus
                and self.free_memory_mb >= task.memory_mb
                and self._free_port_count() >= task.shape[3])

    def _free_port_count(self) -> int:
        low, high = self.port_range
        return high - low + 1 - len(self.used_ports)

    def take_ports(self, count: int, begin_at: int = 0) -> list[int]:
        low, high = self.port_range
        port, taken = max(low, begin_at), list[int]()
        while len(taken) < count and port <= high:
            if port not in self.used_ports:
                taken.append(port)
            port += 1
        if len(taken) < count:
            raise ValueError(f"node {self.name} has no {count} free ports from {begin_at}")
        self.used_ports.update(taken)
        return taken


def free_view(node: Node, allocations: Iterable[Allocation]) -> NodeFree:
    """A live node's free resources given what its allocations hold."""
    used_gpus: set[int] = set()
    cpus, memory = node.cpus, node.memory_mb
    used_ports: set[int] = set()
    for alloc in allocations:
        used_gpus.update(alloc.gpus)
        cpus -= alloc.cpus
        memory -= alloc.memory_mb
        used_ports.update(alloc.ports)
    return NodeFree(
        name=node.name, ip=node.ip,
        free_gpus=sorted(g.index for g in node.gpus if g.index not in used_gpus),
        free_cpus=cpus, free_memory_mb=memory, port_range=node.port_range,
        used_ports=used_ports,
    )


class Cluster:
    """Free resources of the live nodes, indexed by free GPU count."""

    def __init__(self, nodes: Iterable[NodeFree]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.buckets: list[dict[str, None]] = [{} for _ in range(self._bucket_count())]
        for node in sorted(self.nodes.values(), key=lambda n: n.name):
            self.buckets[len(node.free_gpus)][node.name] = None

    def _bucket_count(self) -> int:
        return max((len(n.free_gpus) for n in self.nodes.values()), default=0) + 1

    def _move(self, node: NodeFree, before: int) -> None:
        after = len(node.free_gpus)
        if after != before:
            del self.buckets[before][node.name]
            self.buckets[after][node.name] = None

    def best_fit(self, task: TaskRequest) -> NodeFree | None:
        """The node that fits the task with the fewest GPUs left over.

        Within a bucket, the first node (by name) that fits; GPU-less tasks
        start at the bucket of nodes with no free GPUs, keeping GPUs for the
        tasks that need them.
        """
        for count in range(task.gpus, len(self.buckets)):
            for name in self.buckets[count]:
                node = self.nodes[name]
                if node.fits(task):
                    return node
        return None

    def assign(self, node: NodeFree, task: TaskRequest) -> TaskPlacement:
        before = len(node.free_gpus)
        gpus = tuple(node.free_gpus[:task.gpus])
        del node.free_gpus[:task.gpus]
        node.free_cpus -= task.cpus
        node.free_memory_mb -= task.memory_mb
        ports = {"default": node.take_ports(1)}
        for request in task.ports:
            ports[request.label] = node.take_ports(request.count, request.begin_at)
        self._move(node, before)
        return TaskPlacement(role=task.role, index=task.index, node=node.name, ip=node.ip,
                             gpus=gpus, cpus=task.cpus, memory_mb=task.memory_mb, ports=ports)

    def snapshot(self, names: Iterable[str]) -> dict[str, NodeFree]:
        return {n: _copy(self.nodes[n]) for n in names}

    def restore(self, saved: dict[str, NodeFree]) -> None:
        for name, node in saved.items():
            current = self.nodes[name]
            before = len(current.free_gpus)
            self.nodes[name] = node
            del self.buckets[before][name]
            self.buckets[len(node.free_gpus)][name] = None

    def shortfall(self, task: TaskRequest) -> Shortfall:
        nodes = list(self.nodes.values())
        checks = (
            ("gpus", task.gpus, max((len(n.free_gpus) for n in nodes), default=0)),
            ("cpus", task.cpus, max((n.free_cpus for n in nodes), default=0)),
            ("memory_mb", task.memory_mb, max((n.free_memory_mb for n in nodes), default=0)),
            ("ports", task.shape[3], max((n._free_port_count() for n in nodes), default=0)),
        )
        for resource, requested, free in checks:
            if requested > free:
                return Shortfall(resource, requested, max(free, 0), role=task.role)
        # Each resource is free somewhere, but not all of them on one node.
        return Shortfall("node", task.gpus, 0, role=task.role,
                         node=f"{task.gpus} GPUs, {task.cpus} CPUs, {task.memory_mb} MB")


def _copy(node: NodeFree) -> NodeFree:
    return NodeFree(node.name, node.ip, list(node.free_gpus), node.free_cpus,
                    node.free_memory_mb, node.port_range, set(node.used_ports))


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
        placements.append(cluster.assign(node, task))
    return GangResult(placements=tuple(placements))


@dataclass
class PassPlan:
    placed: list[tuple[JobRequest, tuple[TaskPlacement, ...]]] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # job id -> reason


def plan_pass(cluster: Cluster, queue: Sequence[JobRequest],
              quotas: Mapping[str, int | None] | None = None,
              used: Mapping[str, int] | None = None) -> PassPlan:
    """Place queued jobs in order, greedily: a job that does not fit waits
    and later, smaller jobs may still start (backfill). A job whose virtual
    cluster's GPU quota it would overrun waits whatever the nodes have."""
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
        shape = tuple(sorted(t.shape for t in request.tasks))
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
