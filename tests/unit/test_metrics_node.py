"""The node exporter's pure half: NVML samples and container stats to labelled series."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from services.monitor.nodemetrics import (
    GPU_ECC_ERRORS,
    GPU_EXTERNAL,
    GPU_POWER,
    GPU_UTILIZATION,
    NVML_UP,
    TASK_CPU,
    TASK_GPU_UTILIZATION,
    TASK_MEMORY,
    GpuSample,
    Series,
    TaskSample,
    cpu_percent,
    memory_bytes,
    needs_pids,
    node_series,
)
from services.monitor.sampling import NvmlReader, container_pids
from shared.node.nvml import Nvml

NODE = "gpu-01"
TASK_LABELS = (NODE, "alice", "mnist", "worker", "1", "0", "vision")


def gpu(index: int, utilization: float | None = 50.0, pids: tuple[int, ...] | None = (),
        **extra: Any) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}", model="Tesla V100",
                     utilization_percent=utilization, memory_used_bytes=1 << 30,
                     memory_total_bytes=16 << 30, temperature_celsius=60.0, power_watts=120.5,
                     process_pids=pids, **extra)


def task(gpus: tuple[int, ...] = (), pids: tuple[int, ...] | None = (),
         cpu: float | None = 150.0, memory: int | None = 2 << 20) -> TaskSample:
    return TaskSample(user="alice", job_name="mnist", role="worker", index=1, attempt=0,
                      vc="vision", cpu_percent=cpu, memory_bytes=memory, pids=pids, gpus=gpus)


def named(series: list[Series], name: str) -> dict[tuple[str, ...], float]:
    return {s.labels: s.value for s in series if s.spec.name == name}


# ---------------------------------------------------------------- series


def test_without_nvml_there_are_task_series_and_no_gpu_series() -> None:
    series = node_series(NODE, None, [task(gpus=(0, 1))])

    assert {s.spec.name for s in series} == {NVML_UP.name, TASK_CPU.name, TASK_MEMORY.name}
    assert named(series, NVML_UP.name) == {(NODE,): 0.0}
    assert named(series, TASK_CPU.name) == {TASK_LABELS: 150.0}
    assert named(series, TASK_MEMORY.name) == {TASK_LABELS: float(2 << 20)}


def test_each_gpu_gets_its_device_series_labelled_node_index_uuid_model() -> None:
    series = node_series(NODE, [gpu(0), gpu(1, utilization=75.0)], [])

    assert named(series, NVML_UP.name) == {(NODE,): 1.0}
    assert named(series, GPU_UTILIZATION.name) == {
        (NODE, "0", "GPU-0", "Tesla V100"): 50.0, (NODE, "1", "GPU-1", "Tesla V100"): 75.0}
    assert named(series, GPU_POWER.name)[(NODE, "0", "GPU-0", "Tesla V100")] == 120.5
    assert named(series, "pai_gpu_memory_total_bytes")[(NODE, "1", "GPU-1", "Tesla V100")] \
        == float(16 << 30)


def test_a_reading_nvml_cannot_give_is_absent_not_zero() -> None:
    unsupported = GpuSample(index=0, uuid="GPU-0", model="GeForce")

    series = node_series(NODE, [unsupported], [task(gpus=(0,))])

    names = {s.spec.name for s in series}
    assert GPU_UTILIZATION.name not in names
    assert GPU_ECC_ERRORS.name not in names
    assert TASK_GPU_UTILIZATION.name not in names
    assert "pai_gpu_temperature_celsius" not in names


def test_ecc_errors_are_a_counter_by_type() -> None:
    series = node_series(NODE, [gpu(0, ecc_corrected=7, ecc_uncorrected=0)], [])

    assert named(series, GPU_ECC_ERRORS.name) == {
        (NODE, "0", "GPU-0", "Tesla V100", "corrected"): 7.0,
        (NODE, "0", "GPU-0", "Tesla V100", "uncorrected"): 0.0}


def test_a_task_gets_the_utilization_of_each_gpu_it_holds() -> None:
    series = node_series(NODE, [gpu(0, 10.0), gpu(1, 20.0), gpu(2, 30.0)], [task(gpus=(0, 2))])

    assert named(series, TASK_GPU_UTILIZATION.name) == {
        (*TASK_LABELS, "0", "GPU-0"): 10.0, (*TASK_LABELS, "2", "GPU-2"): 30.0}


def test_virtual_gpus_are_never_mapped_to_devices() -> None:
    series = node_series(NODE, [gpu(0, pids=(99,))], [task(gpus=(0,))], virtual_gpus=True)

    names = {s.spec.name for s in series}
    assert TASK_GPU_UTILIZATION.name not in names
    assert GPU_EXTERNAL.name not in names


@pytest.mark.parametrize(("gpu_pids", "task_pids", "expected"), [
    pytest.param((), (), 0.0, id="idle GPU: no external process"),
    pytest.param((10, 11), (10, 11, 12), 0.0, id="every process is the task's"),
    pytest.param((10, 99), (10, 11), 1.0, id="one process outside every task"),
    pytest.param((98, 99), (), 2.0, id="a GPU no task holds, busy"),
    pytest.param((), None, 0.0, id="task PIDs unknown, GPU idle: still knowable"),
])
def test_external_processes_are_those_outside_every_task_container(
        gpu_pids: tuple[int, ...], task_pids: tuple[int, ...] | None, expected: float) -> None:
    series = node_series(NODE, [gpu(0, pids=gpu_pids)], [task(gpus=(0,), pids=task_pids)])

    assert named(series, GPU_EXTERNAL.name) == {(NODE, "0", "GPU-0", "Tesla V100"): expected}


@pytest.mark.parametrize(("gpu_pids", "task_pids"), [
    pytest.param((10,), None, id="a task's PIDs are unknown while the GPU is busy"),
    pytest.param(None, (10,), id="NVML could not list the GPU's processes"),
])
def test_external_processes_are_absent_when_unknowable(
        gpu_pids: tuple[int, ...] | None, task_pids: tuple[int, ...] | None) -> None:
    series = node_series(NODE, [gpu(0, pids=gpu_pids)], [task(pids=task_pids)])

    assert GPU_EXTERNAL.name not in {s.spec.name for s in series}


def test_task_pids_are_needed_only_when_a_real_gpu_runs_a_process() -> None:
    assert not needs_pids(None, virtual_gpus=False)
    assert not needs_pids([gpu(0, pids=())], virtual_gpus=False)
    assert needs_pids([gpu(0, pids=(5,))], virtual_gpus=False)
    assert not needs_pids([gpu(0, pids=(5,))], virtual_gpus=True)


def test_a_task_without_stats_has_no_cpu_or_memory_series() -> None:
    series = node_series(NODE, None, [task(cpu=None, memory=None)])

    assert {s.spec.name for s in series} == {NVML_UP.name}


# ------------------------------------------------------------ docker stats


def stats(total: int, pre_total: int, system: int, pre_system: int,
          cpus: int | None = 2) -> dict[str, Any]:
    cpu: dict[str, Any] = {"cpu_usage": {"total_usage": total}, "system_cpu_usage": system}
    if cpus is not None:
        cpu["online_cpus"] = cpus
    return {"cpu_stats": cpu, "precpu_stats": {"cpu_usage": {"total_usage": pre_total},
                                               "system_cpu_usage": pre_system}}


@pytest.mark.parametrize(("sample", "expected"), [
    pytest.param(stats(1_500, 1_000, 12_000, 10_000), 50.0, id="a quarter of 2 CPUs' time"),
    pytest.param(stats(3_000, 1_000, 12_000, 10_000, cpus=4), 400.0, id="every CPU busy"),
    pytest.param(stats(1_000, 1_000, 12_000, 10_000), 0.0, id="idle"),
    pytest.param(stats(1_000, 0, 12_000, 12_000), None, id="no system time passed"),
    pytest.param({"cpu_stats": {}, "precpu_stats": {}}, None, id="no reading (just started)"),
])
def test_cpu_percent_is_the_docker_clis(sample: dict[str, Any], expected: float | None) -> None:
    assert cpu_percent(sample) == expected


def test_cpu_percent_counts_per_cpu_usage_when_online_cpus_is_missing() -> None:
    sample = stats(1_500, 1_000, 12_000, 10_000, cpus=None)
    sample["cpu_stats"]["cpu_usage"]["percpu_usage"] = [1, 2, 3, 4]

    assert cpu_percent(sample) == 100.0


@pytest.mark.parametrize(("memory", "expected"), [
    pytest.param({"usage": 100 << 20, "stats": {"inactive_file": 30 << 20}}, 70 << 20,
                 id="cgroup v2: inactive file cache excluded"),
    pytest.param({"usage": 100 << 20, "stats": {"total_inactive_file": 10 << 20}}, 90 << 20,
                 id="cgroup v1"),
    pytest.param({"usage": 5 << 20, "stats": {}}, 5 << 20, id="no cache figure"),
    pytest.param({}, None, id="no reading"),
])
def test_memory_bytes_excludes_the_page_cache(memory: dict[str, Any],
                                              expected: int | None) -> None:
    assert memory_bytes({"memory_stats": memory}) == expected


def test_container_pids_come_from_the_pid_column_of_docker_top() -> None:
    top = {"Titles": ["UID", "PID", "PPID", "CMD"],
           "Processes": [["root", "4242", "1", "sh"], ["root", "4250", "4242", "python"]]}

    assert container_pids(top) == (4242, 4250)
    assert container_pids({"Titles": ["UID"], "Processes": []}) is None


# ------------------------------------------------------------------ NVML


class _NVMLError(Exception):
    pass


def _nvml(devices: int = 1, *, fail_init: bool = False) -> Any:
    """An NVML binding stand-in: what pynvml's functions return, by contract."""

    def unsupported(*_args: Any) -> Any:
        raise _NVMLError("Not Supported")

    def init() -> None:
        if fail_init:
            raise _NVMLError("NVML Shared Library Not Found")

    return SimpleNamespace(
        NVMLError=_NVMLError, NVML_TEMPERATURE_GPU=0, NVML_AGGREGATE_ECC=1,
        NVML_MEMORY_ERROR_TYPE_CORRECTED=0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: devices,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}".encode(),  # older bindings: bytes
        nvmlDeviceGetName=lambda h: "Tesla T4",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=87, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=3 << 30, total=15 << 30),
        nvmlDeviceGetTemperature=lambda h, sensor: 71,
        nvmlDeviceGetPowerUsage=lambda h: 65_500,  # milliwatts
        nvmlDeviceGetTotalEccErrors=unsupported,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=300)],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [SimpleNamespace(pid=300),
                                                         SimpleNamespace(pid=7)],
    )


def test_nvml_readings_become_a_sample_in_plain_units() -> None:
    reader = NvmlReader(Nvml(_nvml()))
    assert reader.start()

    assert reader.read() == [GpuSample(
        index=0, uuid="GPU-0", model="Tesla T4", utilization_percent=87.0,
        memory_used_bytes=3 << 30, memory_total_bytes=15 << 30, temperature_celsius=71.0,
        power_watts=65.5, ecc_corrected=None, ecc_uncorrected=None, process_pids=(7, 300))]


def test_without_an_nvml_library_there_is_no_gpu_sample() -> None:
    reader = NvmlReader(Nvml(_nvml(fail_init=True)))

    assert not reader.start()
    assert reader.read() is None


def test_each_unhealthy_gpu_is_one_series_with_its_reason() -> None:
    from services.monitor.nodemetrics import GPU_UNHEALTHY, Series, fault_series
    assert fault_series("n1", {3: "XID 79", 1: "row remapping failed"}) == [
        Series(GPU_UNHEALTHY, ("n1", "1", "row remapping failed"), 1.0),
        Series(GPU_UNHEALTHY, ("n1", "3", "XID 79"), 1.0)]
    assert fault_series("n1", {}) == []
