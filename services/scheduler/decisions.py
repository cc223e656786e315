"""What a scheduling pass weighs and what it decides, as data: the reason
codes of a waiting job, the service a queued job has attained (and the
least-attained-service order over it), the running jobs it may preempt, and
the plan it returns (placements, waiting reasons, preemptions). The policy
that decides is services/scheduler/policy.py; the service that reads the
records and writes the decisions is services/scheduler/service.py.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from services.scheduler.core import JobRequest
from shared.domain.models import Allocation, TaskPlacement
from shared.domain.priority import PriorityClass
from shared.infra.config import Settings

# Reason codes of a waiting job (jobStatus.waiting.reason)
NO_NODES = "NoNodes"
UNSCHEDULABLE = "Unschedulable"  # no node could ever hold it as the cluster is
NO_GPU_TYPE = "GpuTypeUnavailable"
INSUFFICIENT = "InsufficientResources"
RESERVED = "ReservedForOtherJob"
PREEMPTING = "WaitingForPreemption"
QUOTA = "QuotaExceeded"  # beyond its VC's guarantee, and the VC does not borrow
BUDGET = "BudgetExhausted"  # its VC spent its GPU-hour budget, and its jobs wait
USER_BUDGET = "UserBudgetExhausted"  # its user spent their budget in the VC, and waits

NEVER = frozenset({NO_NODES, UNSCHEDULABLE, NO_GPU_TYPE})



@dataclass(frozen=True)
class Attained:
    """What a job has had of the cluster before its current attempt: GPU
    time (GPUs x milliseconds run, over its ended attempts) and since when it
    waits (its submit, or the end of its last attempt)."""

    gpu_ms: int = 0
    waiting_since_ms: int = 0


@dataclass(frozen=True)
class Las:
    """Least attained service within a class (Tiresias, NSDI'19: discretized
    two-dimensional LAS, attained service = GPUs x time run).

    A job's *level* is how many of `thresholds_gpu_ms` the GPU time it has
    attained reaches (0: none, the first queue). A queued job's *queue* is
    its level lowered by one for every `starve_ms` it has waited: within a
    class lower queues go first, then submit order, so after waiting
    `len(thresholds_gpu_ms) * starve_ms` a job is back in the first queue at
    its submit place, and no job submitted after it passes it again.

    `preempt`: a guaranteed job may also preempt running work of its own VC
    and class in its first attempt whose level (by the GPU time of that
    attempt so far) is above the job's own (not lifted by waiting): so a job
    is preempted for less-served work at most once, and cannot starve that
    way."""

    thresholds_gpu_ms: tuple[int, ...] = ()
    starve_ms: int = 1
    preempt: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> Las:
        return cls(tuple(g * 1000 for g in settings.las_thresholds_gpu_seconds),
                   max(1, int(settings.las_starve_seconds * 1000)), settings.las_preempt)

    def level(self, gpu_ms: int) -> int:
        return bisect.bisect_right(self.thresholds_gpu_ms, gpu_ms)

    def queue_of(self, attained: Attained, now_ms: int) -> int:
        waited = max(0, now_ms - attained.waiting_since_ms)
        return max(0, self.level(attained.gpu_ms) - waited // self.starve_ms)


DEFAULT_LAS = Las.from_settings(Settings())


@dataclass(frozen=True)
class RunningJob:
    """A placed job as the policy weighs it: what it holds and how it stands."""

    job_id: str
    vc: str
    priority: PriorityClass
    mode: str  # GUARANTEED or BORROWED
    started_ms: int  # youngest is preempted first
    allocations: tuple[Allocation, ...]
    attempt: int = 0
    grace_ms: int = 30_000
    # Being preempted already: for whom, and when its grace period ends
    preempted_by: str = ""
    preempt_deadline_ms: int | None = None
    # what its allocations hold, counted once: a pass weighs every running
    # job's GPUs several times, and a job that did not move keeps its object
    gpus: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", sum(len(a.gpus) for a in self.allocations))

    def served_ms(self, now_ms: int) -> int:
        """The GPU time this attempt has had so far (GPUs x milliseconds)."""
        return self.gpus * max(0, now_ms - self.started_ms)


@dataclass(frozen=True)
class Blocker:
    """What holds a waiting job: kind is quota, reservation, job, resources,
    nodes or gpuType; name says which."""

    kind: str
    name: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name}


@dataclass(frozen=True)
class Waiting:
    reason: str
    message: str
    blocked_by: tuple[Blocker, ...] = ()
    estimated_start_ms: int | None = None

    def to_dict(self) -> dict[str, object]:
        """The stored explanation (its position is read live from the VC's queue)."""
        return {"reason": self.reason, "message": self.message,
                "blockedBy": [b.to_dict() for b in self.blocked_by],
                "estimatedStartTime": self.estimated_start_ms}


@dataclass(frozen=True)
class Placed:
    """A job placed this pass: all its tasks, or (no gang allocation) those
    that fit now."""

    request: JobRequest
    placements: tuple[TaskPlacement, ...]
    mode: str

    @property
    def gpus(self) -> int:
        return sum(len(p.gpus) for p in self.placements)

    @property
    def whole(self) -> bool:
        return len(self.placements) == len(self.request.tasks)


@dataclass(frozen=True)
class Preemption:
    victim: RunningJob
    by: str  # the job it makes room for


@dataclass
class Plan:
    placed: list[Placed] = field(default_factory=list)
    preempt: list[Preemption] = field(default_factory=list)
    # running jobs whose standing changed (promoted into, or pushed out of,
    # their VC's guarantee): job id -> new mode
    modes: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, Waiting] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)  # in its VC's queue, 1 = next
    reservations: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # job id -> how many jobs had been placed when it reserved (what came
    # after must not be on its nodes)
    reserved_after: dict[str, int] = field(default_factory=dict)
