"""A pass's bookkeeping of the VCs (what each holds of its guarantee, by
class) and whether a node could ever hold a task: what the policy
(services/scheduler/policy.py) asks as it decides."""

from __future__ import annotations

from collections.abc import Mapping

from services.scheduler.core import JobRequest, NodeFree, TaskRequest
from services.scheduler.decisions import RunningJob
from shared.domain.cluster import VcPolicy, gpu_type_matches
from shared.domain.priority import PriorityClass

NO_GUARANTEE = VcPolicy(0, True)  # a VC nobody configured


def could_hold(node: NodeFree, task: TaskRequest, gpu_type: str | None) -> bool:
    """Could the node, empty, hold the task (ports counted from each
    request's `beginAt`)?"""
    low, high = node.port_range
    return (len(node.all_gpus or node.free_gpus) >= task.gpus
            and (node.cpus or node.free_cpus) >= task.cpus
            and (node.memory_mb or node.free_memory_mb) >= task.memory_mb
            and high - low + 1 >= task.shape[3]
            and all(high - max(low, p.begin_at) + 1 >= p.count for p in task.ports)
            and (not gpu_type or not task.gpus or gpu_type_matches(node.gpu_model, gpu_type)))


class VcStanding:
    """Per VC: its guarantee, what it holds, and its guaranteed GPUs by class."""

    def __init__(self, vcs: Mapping[str, VcPolicy]) -> None:
        self.vcs = vcs
        self.used: dict[str, int] = {}
        self.by_class: dict[str, list[int]] = {}  # VC -> guaranteed GPUs per class
        self.demotable: dict[str, list[RunningJob]] = {}  # running guaranteed work

    def policy(self, vc: str) -> VcPolicy:
        return self.vcs.get(vc) or NO_GUARANTEE

    def share(self, vc: str) -> float:
        """How much of its guarantee a VC uses: the lowest goes first. A VC
        with no guarantee comes after every VC with one."""
        guarantee = self.policy(vc).guarantee
        used = self.used.get(vc, 0)
        return used / guarantee if guarantee else 1e18 + used

    def guaranteed_gpus(self, vc: str, at_least: PriorityClass = PriorityClass.OPPO) -> int:
        return sum(self.by_class.get(vc, (0, 0, 0))[at_least:])

    def count(self, vc: str, priority: PriorityClass, gpus: int) -> None:
        self.by_class.setdefault(vc, [0, 0, 0])[priority] += gpus

    def fits_guarantee(self, request: JobRequest, policy: VcPolicy) -> bool:
        """Would the job run on its VC's guarantee (counting the VC's
        guaranteed work of its class or higher, and what its first waiting
        job keeps)?"""
        if request.priority == PriorityClass.OPPO:
            return False
        counts = self.by_class.get(request.vc)
        used = sum(counts[request.priority:]) if counts else 0
        return used + request.gpus <= policy.guarantee
