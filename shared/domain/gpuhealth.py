"""GPU health: which GPUs are failing and why, judged in one place.

A node's monitor reads each GPU's health signals from NVML (critical XID
errors, uncorrected ECC errors, retired pages and row remapping pending or
failed, hardware thermal or power-brake slowdown) and, for tests and
drills, a fault-injection list in Redis. A GPU found failing is marked in
GPU_FAULTS with its reason; from then on:

- the scheduler places nothing on it (`healthy_view`), and a placement
  commit that would use it is refused (`faulty_in`), so a pass that read
  the faults just before the mark cannot slip a task onto it;
- the monitor fails the tasks holding it as platform failures (retried
  elsewhere, not counted against the job's retryCount);
- `GET /nodes` shows it unhealthy with the reason, until an admin clears
  it (`DELETE /api/v1/nodes/<node>/gpus/<index>/fault`).

The mark stays after the signal is gone: a GPU that threw an XID is not
trusted again until someone looked at it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.domain.models import Node, TaskPlacement

# XIDs an application causes on a healthy GPU (as the Kubernetes NVIDIA
# device plugin skips them): a job's bad memory access is not the GPU's fault.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# nvmlClocksThrottleReasonHwThermalSlowdown, ...HwPowerBrakeSlowdown
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
MAX_INJECTIONS = 100  # taken per round, so a flood cannot stall the monitor
NVML, INJECTED = "nvml", "injected"


@dataclass(frozen=True)
class GpuReading:
    """One device's health counters at one moment; None: not supported."""

    uncorrected_ecc: int | None = None  # volatile: since the driver loaded
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    throttle_reasons: int | None = None


def reading_faults(previous: GpuReading | None, current: GpuReading) -> list[str]:
    """Why a GPU is failing, as this reading shows (empty: nothing new).

    Uncorrected ECC errors count when they grew since the last reading (or,
    on the first, when there are any): an admin's clear is not undone by
    the old count on the next round.
    """
    reasons = []
    ecc, before = current.uncorrected_ecc, previous.uncorrected_ecc if previous else None
    if ecc and (before is None or ecc > before):
        reasons.append(f"{ecc - (before or 0)} uncorrected ECC error(s)")
    if current.retired_pages_pending:
        reasons.append("retired memory pages pending (the GPU needs a reset)")
    if current.remap_failed:
        reasons.append("row remapping failed")
    elif current.remap_pending:
        reasons.append("row remapping pending (the GPU needs a reset)")
    throttle = current.throttle_reasons or 0
    if throttle & HW_THERMAL_SLOWDOWN:
        reasons.append("hardware thermal slowdown")
    if throttle & HW_POWER_BRAKE_SLOWDOWN:
        reasons.append("hardware power-brake slowdown")
    return reasons


def xid_fault(xid: int) -> str | None:
    """The reason a critical XID event gives, None for one the job caused."""
    return None if xid in APPLICATION_XIDS else f"XID {xid}"


@dataclass(frozen=True)
class GpuFault:
    """A GPU marked unhealthy: where, why, since when, and who saw it."""

    node: str
    index: int
    reason: str
    since_ms: int
    source: str = NVML  # NVML, or INJECTED through the test hook

    @property
    def field(self) -> str:
        return fault_field(self.node, self.index)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> GpuFault:
        data: dict[str, Any] = json.loads(raw)
        return cls(node=str(data["node"]), index=int(data["index"]), reason=str(data["reason"]),
                   since_ms=int(data["since_ms"]), source=str(data.get("source", NVML)))


def fault_field(node: str, index: int) -> str:
    return f"{node}:{index}"


Faults = Mapping[str, Mapping[int, GpuFault]]  # node -> GPU index -> fault


def parse_faults(raw: Mapping[str, str]) -> dict[str, dict[int, GpuFault]]:
    """GPU_FAULTS as node -> index -> fault; an entry another version wrote is skipped."""
    faults: dict[str, dict[int, GpuFault]] = {}
    for text in raw.values():
        try:
            fault = GpuFault.from_json(text)
        except (ValueError, KeyError, TypeError):
            continue
        faults.setdefault(fault.node, {})[fault.index] = fault
    return faults


def healthy_view(node: Node, faults: Faults) -> Node:
    """The node as the scheduler sees it: without its unhealthy GPUs."""
    bad = faults.get(node.name)
    if not bad:
        return node
    return dataclasses.replace(node, gpus=[g for g in node.gpus if g.index not in bad])


def faulty_in(placements: Iterable[TaskPlacement], faults: Faults) -> list[tuple[str, int]]:
    """(node, GPU) pairs these placements would use that are unhealthy."""
    return sorted({(p.node, gpu) for p in placements for gpu in p.gpus
                   if gpu in faults.get(p.node, {})})
