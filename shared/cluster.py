"""What the nodes' records say, judged in one place: is a node live, what do
its allocations hold, what does each virtual cluster hold, and does a set of
tasks fit on a node.

Pure: the callers (the scheduler's pass and repair, the placement commit in
shared/lifecycle.py, the API's node, VC and metrics views, the submit-time
feasibility check) read the records and hand them here, so all of them agree
on the boundary of "lost" and on what "used" means.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shared.models import Allocation, Node, TaskPlacement

DEFAULT_VC = "default"
# How a placed job stands: on its VC's guarantee, or on borrowed GPUs
GUARANTEED = "guaranteed"
BORROWED = "borrowed"


def node_is_live(heartbeat_ms: int, now_ms: int, lost_seconds: float) -> bool:
    """A node is live while its last heartbeat is younger than `lost_seconds`
    (PAI_NODE_LOST_SECONDS); at that age exactly it is lost, and the scheduler
    fails its tasks."""
    return now_ms - heartbeat_ms < int(lost_seconds * 1000)


def node_state(heartbeat_ms: int, now_ms: int, lost_seconds: float) -> str:
    """The node's state as the API shows it (OpenPAI's words)."""
    return "READY" if node_is_live(heartbeat_ms, now_ms, lost_seconds) else "LOST"


@dataclass
class Held:
    """What a set of allocations (or placements) holds, summed.

    `gpus` and `ports` keep repeats: a GPU or port held twice is a fault that
    `fits_on` must see, not one that a set would hide.
    """

    gpus: list[int] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    cpus: int = 0
    memory_mb: int = 0
    tasks: int = 0

    def add(self, gpus: Iterable[int], cpus: int, memory_mb: int,
            ports: Iterable[int] = ()) -> None:
        self.gpus.extend(gpus)
        self.ports.extend(ports)
        self.cpus += cpus
        self.memory_mb += memory_mb
        self.tasks += 1

    def used_gpus(self, node: Node) -> set[int]:
        """The node's GPUs that something holds (an index the node no longer
        reports, after it re-registered with fewer, is not counted)."""
        return set(self.gpus) & {g.index for g in node.gpus}

    def free_gpus(self, node: Node) -> list[int]:
        used = set(self.gpus)
        return sorted(g.index for g in node.gpus if g.index not in used)

    def fits_on(self, node: Node) -> bool:
        """Could the node hold all of this at once: no GPU or port twice, only
        GPUs the node has, and CPUs and memory within its size?"""
        return (len(self.gpus) == len(set(self.gpus))
                and set(self.gpus) <= {g.index for g in node.gpus}
                and len(self.ports) == len(set(self.ports))
                and self.cpus <= node.cpus and self.memory_mb <= node.memory_mb)


def held(allocations: Iterable[Allocation]) -> Held:
    """What these allocations hold together."""
    total = Held()
    for alloc in allocations:
        total.add(alloc.gpus, alloc.cpus, alloc.memory_mb, alloc.ports)
    return total


def held_by_vc(allocations: Iterable[Allocation]) -> dict[str, Held]:
    """What each virtual cluster's allocations hold (VCs holding nothing are absent)."""
    by_vc: dict[str, Held] = {}
    for alloc in allocations:
        by_vc.setdefault(alloc.vc, Held()).add(alloc.gpus, alloc.cpus, alloc.memory_mb,
                                               alloc.ports)
    return by_vc


def gpus_by_vc(allocations: Iterable[Allocation]) -> dict[str, int]:
    """GPUs held per virtual cluster: what its quota is measured against."""
    return {vc: len(h.gpus) for vc, h in held_by_vc(allocations).items()}


def placement_fits(node: Node, allocations: Iterable[Allocation],
                   placements: Iterable[TaskPlacement]) -> bool:
    """Do these placements fit on the node beside what its allocations hold?"""
    total = held(allocations)
    for p in placements:
        total.add(p.gpus, p.cpus, p.memory_mb, p.all_ports)
    return total.fits_on(node)


def can_ever_hold(node: Node, gpus: int, cpus: int, memory_mb: int) -> bool:
    """Would a task of this size fit on the node if it were empty?"""
    return len(node.gpus) >= gpus and node.cpus >= cpus and node.memory_mb >= memory_mb


def gpu_type_matches(model: str, gpu_type: str) -> bool:
    """Does a node whose GPUs are `model` serve a job asking for `gpu_type`?

    Case-insensitively, the whole model name or one of its words: `V100`
    matches "Tesla V100-SXM2-32GB", as OpenPAI users name GPU types by their
    generation; `V10` does not.
    """
    wanted, model = gpu_type.strip().lower(), model.strip().lower()
    return bool(wanted) and (wanted == model or wanted in re.split(r"[^a-z0-9]+", model))


@dataclass(frozen=True)
class VcPolicy:
    guarantee: int
    borrowing: bool = True


def vc_policies(quotas: Mapping[str, int | None], borrowing: Mapping[str, bool],
                total_gpus: int) -> dict[str, VcPolicy]:
    """Each VC's guarantee: its `gpuQuota` (none: 0). The `default` VC, unless
    given a quota of its own, is guaranteed what the others leave."""
    guarantee = {name: quota or 0 for name, quota in quotas.items()}
    if quotas.get(DEFAULT_VC) is None:
        others = sum(g for name, g in guarantee.items() if name != DEFAULT_VC)
        guarantee[DEFAULT_VC] = max(0, total_gpus - others)
    return {name: VcPolicy(g, borrowing.get(name, True)) for name, g in guarantee.items()}
