"""Per-task utilisation samples: what a running task used, over time, in Redis.

The node's monitor (services/monitor/sampling.py) adds one sample per task
attempt every PAI_TASK_SAMPLE_SECONDS to a capped stream
(`keys.task_samples`): time, CPU percent, memory bytes and each allocated
GPU's utilisation percent. The stream holds at most
PAI_TASK_SAMPLE_KEEP_SECONDS of them (MAXLEN ~); retention deletes it when
it compacts or expires the finished job (shared/state/retention.py), so a
finished job costs Redis no more memory than before.

Virtual GPUs (declared for tests, no NVML) report the utilisation a test
or drill sets in `keys.virtual_gpu_utilization(node)`, a test hook like
the GPU-fault injections of shared/domain/gpuhealth.py: `set_virtual_utilization`.
A virtual GPU nobody set reports nothing (unknown, never idle).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.state import keys

MAX_SAMPLES = 100_000  # a ceiling on any one stream, whatever the settings say
MAX_GPUS = 64
UNKNOWN = "-"  # a GPU whose utilisation the monitor could not read


@dataclass(frozen=True)
class Sample:
    """One task at one moment; None where the monitor could not tell."""

    time_ms: int
    cpu_percent: float | None = None
    memory_bytes: int | None = None
    gpu_percent: tuple[float | None, ...] = ()  # one per allocated GPU, in index order

    def fields(self) -> dict[str, str]:
        return {"t": str(self.time_ms), "c": _text(self.cpu_percent),
                "m": _text(self.memory_bytes),
                "g": ",".join(UNKNOWN if p is None else _text(p) for p in self.gpu_percent)}

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Sample:
        gpus = fields.get("g", "")
        memory = _number(fields.get("m", ""))
        return cls(time_ms=int(fields["t"]), cpu_percent=_number(fields.get("c", "")),
                   memory_bytes=None if memory is None else int(memory),
                   gpu_percent=tuple(_number(p) for p in gpus.split(",")) if gpus else ())

    def to_dict(self) -> dict[str, Any]:
        return {"time": self.time_ms, "cpuPercent": self.cpu_percent,
                "memoryBytes": self.memory_bytes, "gpuPercent": list(self.gpu_percent)}


def _text(value: float | int | None) -> str:
    if value is None:
        return ""
    return str(round(value, 2)) if isinstance(value, float) else str(value)


def _number(raw: str) -> float | None:
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def max_samples(sample_seconds: float, keep_seconds: float) -> int:
    """How many samples a stream keeps: `keep_seconds` of them, at least one."""
    return max(1, min(MAX_SAMPLES, math.ceil(keep_seconds / sample_seconds)))


def add(pipe: Any, job_id: str, attempt: int, role: str, index: int, sample: Sample,
        maxlen: int) -> None:
    """Queue one sample on the task attempt's stream (the caller runs the pipeline)."""
    pipe.xadd(keys.task_samples(job_id, attempt, role, index), sample.fields(),
              maxlen=maxlen, approximate=True)


def read(reader: Any, job_id: str, attempt: int, role: str, index: int,
         limit: int | None = None) -> list[Sample]:
    """The task attempt's samples, oldest first; the last `limit` when given."""
    key = keys.task_samples(job_id, attempt, role, index)
    if limit is None:
        entries = reader.xrange(key)
    else:
        entries = list(reversed(reader.xrevrange(key, count=limit)))
    return [Sample.from_fields(fields) for _id, fields in entries]


def virtual_utilization(reader: Any, node: str) -> dict[int, float]:
    """The test hook: GPU index -> percent set for the node's virtual GPUs."""
    found: dict[int, float] = {}
    raw = reader.hgetall(keys.virtual_gpu_utilization(node)) or {}
    for raw_index, raw_percent in raw.items():
        percent = _number(raw_percent)
        if percent is not None and str(raw_index).isdigit():
            found[int(raw_index)] = min(100.0, max(0.0, percent))
    return found


def set_virtual_utilization(client: Any, node: str, percent: Mapping[int, float]) -> None:
    """The test hook's writer: what the node's virtual GPUs report from now on."""
    client.hset(keys.virtual_gpu_utilization(node),
                mapping={str(i): str(p) for i, p in percent.items()})


def task_gpu_percent(gpus: Sequence[int], utilization: Mapping[int, float | None]
                     ) -> tuple[float | None, ...]:
    """Each allocated GPU's utilisation, in the allocation's order (None: unknown)."""
    return tuple(utilization.get(index) for index in gpus[:MAX_GPUS])
