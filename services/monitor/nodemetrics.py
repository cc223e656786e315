"""What the node exporter shows: NVML samples and container stats as labelled series.

No IO here. The sampler (sampling.py) gathers facts from NVML, Docker and
the node's allocations; `node_series` turns one round of them into series,
and the exporter (exporter.py) serves the latest round. Absent facts give
absent series, never invented ones: no NVML, no GPU series; virtual GPUs
(declared for testing) are not devices, so no task is mapped to a device.

Task series carry `job_name`, not `job`: Prometheus sets `job` on every
series to the scrape job's name, and would rename ours to `exported_job`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.domain.metricfamily import Kind, MetricFamily

GPU_LABELS = ("node", "index", "uuid", "model")
TASK_LABELS = ("node", "user", "job_name", "role", "index", "attempt", "vc")
TASK_GPU_LABELS = (*TASK_LABELS, "gpu", "uuid")


def _gauge(name: str, help_text: str, labelnames: tuple[str, ...]) -> MetricFamily:
    """A node family: each is a gauge, but for GPU_ECC_ERRORS, the one counter."""
    return MetricFamily(name, Kind.GAUGE, help_text, labelnames)


GPU_UTILIZATION = _gauge("pai_gpu_utilization_percent",
                         "Percent of the last sample period a kernel ran on the GPU (NVML).",
                         GPU_LABELS)
GPU_MEMORY_USED = _gauge("pai_gpu_memory_used_bytes", "GPU memory in use.", GPU_LABELS)
GPU_MEMORY_TOTAL = _gauge("pai_gpu_memory_total_bytes", "GPU memory installed.", GPU_LABELS)
GPU_TEMPERATURE = _gauge("pai_gpu_temperature_celsius", "GPU core temperature.", GPU_LABELS)
GPU_POWER = _gauge("pai_gpu_power_watts", "GPU power draw.", GPU_LABELS)
GPU_ECC_ERRORS = MetricFamily("pai_gpu_ecc_errors", Kind.COUNTER,
                              "ECC memory errors since the driver loaded, by type "
                              "(corrected, uncorrected).", (*GPU_LABELS, "type"))
GPU_EXTERNAL = _gauge("pai_gpu_external_processes",
                      "Processes on the GPU that are not in any pai task container "
                      "(OpenPAI's 'GPU used by an external process').", GPU_LABELS)
TASK_CPU = _gauge("pai_task_cpu_percent",
                  "A task container's CPU use (100 = one core busy).", TASK_LABELS)
TASK_MEMORY = _gauge("pai_task_memory_bytes",
                     "A task container's memory use, page cache excluded (as docker stats).",
                     TASK_LABELS)
TASK_GPU_UTILIZATION = _gauge("pai_task_gpu_utilization_percent",
                              "Utilization of each GPU assigned to a task.", TASK_GPU_LABELS)
TASK_GPU_IDLE = _gauge("pai_task_gpu_idle_seconds",
                       "How long every GPU of a task flagged idle has stayed below "
                       "PAI_IDLE_GPU_PERCENT (shared/state/idle.py); absent while not flagged.",
                       TASK_LABELS)
GPU_UNHEALTHY = _gauge("pai_gpu_unhealthy",
                       "1 for each GPU of the node marked unhealthy, with why (XID, ECC, "
                       "pages, thermal: docs/monitoring.md); absent while healthy.",
                       ("node", "index", "reason"))
NVML_UP = _gauge("pai_monitor_nvml_up",
                 "1 when the monitor reads the node's GPUs through NVML; 0: no GPU series.",
                 ("node",))
SAMPLE_DURATION = _gauge("pai_monitor_sample_duration_seconds",
                         "How long the last round of NVML and container sampling took.",
                         ("node",))
SAMPLE_TIME = _gauge("pai_monitor_last_sample_timestamp_seconds",
                     "When the series served were sampled.", ("node",))

NODE_SERIES: tuple[MetricFamily, ...] = (
    GPU_UTILIZATION, GPU_MEMORY_USED, GPU_MEMORY_TOTAL, GPU_TEMPERATURE, GPU_POWER,
    GPU_ECC_ERRORS, GPU_EXTERNAL, TASK_CPU, TASK_MEMORY, TASK_GPU_UTILIZATION, NVML_UP,
    SAMPLE_DURATION, SAMPLE_TIME, GPU_UNHEALTHY, TASK_GPU_IDLE,
)


@dataclass(frozen=True)
class Series:
    spec: MetricFamily
    labels: tuple[str, ...]  # values, in the spec's label order
    value: float


@dataclass(frozen=True)
class GpuSample:
    """One device as NVML saw it; None where NVML could not say."""

    index: int
    uuid: str
    model: str
    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    process_pids: tuple[int, ...] | None = None  # compute and graphics processes on it


@dataclass(frozen=True)
class TaskSample:
    """One running task container: who it is, what it uses, what it holds."""

    user: str
    job_name: str
    role: str
    index: int
    attempt: int
    vc: str
    cpu_percent: float | None = None
    memory_bytes: int | None = None
    pids: tuple[int, ...] | None = None  # host PIDs; None when not looked up
    gpus: tuple[int, ...] = ()  # GPU indices its allocation holds


# ------------------------------------------------------------ docker stats


def cpu_percent(stats: Mapping[str, Any]) -> float | None:
    """CPU use between the two samples `docker stats` carries, as the docker CLI
    computes it: the container's share of the host's CPU time, times the CPUs."""
    cpu, pre = stats.get("cpu_stats") or {}, stats.get("precpu_stats") or {}
    try:
        used = cpu["cpu_usage"]["total_usage"] - pre["cpu_usage"]["total_usage"]
        system = cpu["system_cpu_usage"] - pre["system_cpu_usage"]
    except (KeyError, TypeError):
        return None
    cpus = cpu.get("online_cpus") or len(cpu["cpu_usage"].get("percpu_usage") or ()) or 1
    if system <= 0 or used < 0:
        return None
    return used / system * cpus * 100.0


def memory_bytes(stats: Mapping[str, Any]) -> int | None:
    """Memory in use without the reclaimable page cache (cgroup v1 or v2), as docker stats."""
    memory = stats.get("memory_stats") or {}
    usage = memory.get("usage")
    if usage is None:
        return None
    details = memory.get("stats") or {}
    for cache in ("total_inactive_file", "inactive_file"):  # cgroup v1, then v2
        if cache in details and details[cache] < usage:
            return int(usage - details[cache])
    return int(usage)


# --------------------------------------------------------------- the series


def _gpu_series(node: str, gpu: GpuSample) -> list[Series]:
    labels = (node, str(gpu.index), gpu.uuid, gpu.model)
    found = [(GPU_UTILIZATION, gpu.utilization_percent), (GPU_MEMORY_USED, gpu.memory_used_bytes),
             (GPU_MEMORY_TOTAL, gpu.memory_total_bytes),
             (GPU_TEMPERATURE, gpu.temperature_celsius), (GPU_POWER, gpu.power_watts)]
    series = [Series(spec, labels, float(value)) for spec, value in found if value is not None]
    for kind, count in (("corrected", gpu.ecc_corrected), ("uncorrected", gpu.ecc_uncorrected)):
        if count is not None:
            series.append(Series(GPU_ECC_ERRORS, (*labels, kind), float(count)))
    return series


def task_labels(node: str, task: TaskSample) -> tuple[str, ...]:
    return (node, task.user, task.job_name, task.role, str(task.index), str(task.attempt),
            task.vc)


def _external_series(node: str, gpus: Sequence[GpuSample],
                     tasks: Sequence[TaskSample]) -> list[Series]:
    """Per GPU, its processes outside every task container; absent when unknowable
    (NVML could not list them, or a task's PIDs are unknown while some run)."""
    known = all(task.pids is not None for task in tasks)
    ours = {pid for task in tasks for pid in task.pids or ()}
    return [Series(GPU_EXTERNAL, (node, str(gpu.index), gpu.uuid, gpu.model),
                   float(len(set(gpu.process_pids) - ours)))
            for gpu in gpus
            if gpu.process_pids is not None and (known or not gpu.process_pids)]


def node_series(node: str, gpus: Sequence[GpuSample] | None, tasks: Sequence[TaskSample], *,
                virtual_gpus: bool = False) -> list[Series]:
    """Every series of one sampling round.

    `gpus` is None when NVML is not there: then there is no GPU series at
    all. With `virtual_gpus` the node's GPU indices are declared, not
    devices, so no task is mapped to a device and no process is called
    external.
    """
    series: list[Series] = [Series(NVML_UP, (node,), 0.0 if gpus is None else 1.0)]
    for task in tasks:
        labels = task_labels(node, task)
        if task.cpu_percent is not None:
            series.append(Series(TASK_CPU, labels, task.cpu_percent))
        if task.memory_bytes is not None:
            series.append(Series(TASK_MEMORY, labels, float(task.memory_bytes)))
    if gpus is None:
        return series
    for gpu in gpus:
        series.extend(_gpu_series(node, gpu))
    if virtual_gpus:
        return series
    by_index = {gpu.index: gpu for gpu in gpus}
    for task in tasks:
        for index in task.gpus:
            held = by_index.get(index)
            if held is not None and held.utilization_percent is not None:
                series.append(Series(TASK_GPU_UTILIZATION,
                                     (*task_labels(node, task), str(index), held.uuid),
                                     held.utilization_percent))
    series.extend(_external_series(node, gpus, tasks))
    return series


def fault_series(node: str, faults: Mapping[int, str]) -> list[Series]:
    """One series per GPU marked unhealthy (index -> reason); virtual GPUs too,
    since the scheduler skips them all the same."""
    return [Series(GPU_UNHEALTHY, (node, str(index), reason), 1.0)
            for index, reason in sorted(faults.items())]


def needs_pids(gpus: Sequence[GpuSample] | None, virtual_gpus: bool) -> bool:
    """Whether task PIDs matter this round: some real GPU runs a process."""
    return not virtual_gpus and gpus is not None and any(g.process_pids for g in gpus)
