"""GPU faults in Redis: the cluster-wide set of unhealthy GPUs
(keys.GPU_FAULTS) and the test hook that injects a fault into a node's next
monitor round. What a fault is, and what it means for placement, is
shared/domain/gpuhealth.py.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from shared.domain.gpuhealth import MAX_INJECTIONS, GpuFault, fault_field, parse_faults
from shared.state import keys

log = logging.getLogger(__name__)

def read_faults(reader: Any) -> dict[str, dict[int, GpuFault]]:
    return parse_faults(reader.hgetall(keys.GPU_FAULTS))


def mark_fault(r: Any, fault: GpuFault) -> bool:
    """Mark the GPU unhealthy; False if it already was (the first reason stays)."""
    return bool(r.hsetnx(keys.GPU_FAULTS, fault.field, fault.to_json()))


def clear_fault(r: Any, node: str, index: int) -> GpuFault | None:
    """An admin's clear: the fault it removed, None if the GPU was healthy."""
    pipe = r.pipeline()
    pipe.hget(keys.GPU_FAULTS, fault_field(node, index))
    pipe.hdel(keys.GPU_FAULTS, fault_field(node, index))
    raw, _ = pipe.execute()
    return GpuFault.from_json(raw) if raw else None


def inject(r: Any, node: str, gpu: int, *, xid: int | None = None, reason: str = "") -> None:
    """The test hook: make GPU `gpu` of `node` fail on its monitor's next
    round, as if NVML had reported XID `xid` (or `reason`)."""
    r.rpush(keys.gpu_fault_injections(node),
            json.dumps({"gpu": gpu, "xid": xid, "reason": reason}, separators=(",", ":")))


def take_injections(r: Any, node: str) -> list[tuple[int, str]]:
    """The injected faults waiting for this node, taken (each applies once)."""
    taken = r.lpop(keys.gpu_fault_injections(node), MAX_INJECTIONS) or []
    faults = []
    for text in taken:
        try:
            entry = json.loads(text)
            gpu = int(entry["gpu"])
            xid = entry.get("xid")
            reason = f"XID {int(xid)}" if xid is not None else str(entry.get("reason") or "")
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring a malformed GPU fault injection: %.200s", text)
            continue
        faults.append((gpu, f"{reason or 'injected fault'} (injected)"))
    return faults
