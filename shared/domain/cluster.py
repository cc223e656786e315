"""What the nodes' records say, judged in one place: is a node live, what do
its allocations hold, what does each virtual cluster hold, and does a set of
tasks fit on a node.

Pure: the callers (the scheduler's pass and repair, the placement commit in
shared/state/placing.py, the API's node, VC and metrics views, the submit-time
feasibility check) read the records and hand them here, so all of them agree
on the boundary of "lost" and on what "used" means.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.domain.models import Allocation, Node, TaskPlacement

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


# ---------------------------------------------------------------- admin flags

# What a node is, as `pai nodes` shows it: READY takes work; CORDONED takes
# no new work, its tasks run on; DRAINING takes none and its jobs are being
# preempted away; DRAINED is drained and empty (safe to service). Whatever
# an admin said, the node's own condition (shared/domain/lease.py) wins when
# it is not READY: LOST (declared lost: its tasks went elsewhere),
# UNREACHABLE (missed renewals, not lost yet), NOT_READY (its engine,
# launcher or storage has a problem), RECONCILING (joining or back from
# silence), SETTLING (healthy again, not for long enough).
NODE_STATES = ("READY", "CORDONED", "DRAINING", "DRAINED", "LOST", "UNREACHABLE", "NOT_READY",
               "RECONCILING", "SETTLING")


@dataclass(frozen=True)
class NodeFlags:
    """An admin's hold on a node: whether new work may land on it
    (`schedulable`, Slurm's DRAIN when false) and whether the jobs on it are
    to be preempted and requeued (`drain`, as `kubectl drain`), with who set
    it, when and why. Kept apart from the node's record, which its launcher
    rewrites every minute; a node without flags is schedulable."""

    schedulable: bool = True
    drain: bool = False
    reason: str = ""
    by: str = ""
    at_ms: int = 0

    @property
    def accepts_work(self) -> bool:
        """May the scheduler place new tasks here?"""
        return self.schedulable and not self.drain

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> NodeFlags:
        data: dict[str, Any] = json.loads(raw)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def change_flags(current: NodeFlags, *, schedulable: bool | None, drain: bool | None,
                 reason: str | None, by: str, now_ms: int) -> NodeFlags:
    """The flags after an admin's change; ValueError for a change that means nothing.

    `drain: true` cordons too (a drained node takes no new work);
    `schedulable: true` uncordons and ends a drain; `drain: false` alone ends
    the drain and leaves the node cordoned; `schedulable: false` alone
    cordons and leaves a drain as it was. A reason not given is kept while
    the node stays cordoned; an uncordoned node keeps none.
    """
    if schedulable is None and drain is None:
        raise ValueError("say schedulable or drain (or both)")
    if schedulable and drain:
        raise ValueError("a draining node cannot be schedulable: drain cordons it")
    new_drain = drain if drain is not None else (current.drain and not schedulable)
    new_schedulable = schedulable if schedulable is not None else \
        current.schedulable and not new_drain
    if new_schedulable:
        return NodeFlags(by=by, at_ms=now_ms)
    return NodeFlags(schedulable=False, drain=new_drain,
                     reason=current.reason if reason is None else reason, by=by, at_ms=now_ms)


def takes_work(node: Node, flags: NodeFlags | None, now_ms: int, lost_seconds: float,
               unready: Container[str] = ()) -> bool:
    """May the scheduler place new work on the node: live, not among the
    nodes the last repair round found unready (shared/domain/lease.py
    conditions), and neither cordoned nor draining? Its GPUs are then what
    guarantees are made of."""
    return node_is_live(node.heartbeat_ms, now_ms, lost_seconds) and \
        node.name not in unready and (flags is None or flags.accepts_work)


def node_view_state(condition: str, flags: NodeFlags, tasks: int) -> str:
    """One of NODE_STATES: the node's condition unless READY, then the
    admin's flags; a draining node is DRAINED once nothing holds it any more."""
    if condition != "READY":
        return condition
    if flags.drain:
        return "DRAINING" if tasks else "DRAINED"
    return "READY" if flags.schedulable else "CORDONED"


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
