"""Gathering what the node exporter shows: NVML, `docker stats`, the node's allocations.

`docker stats` takes a second or two per container (the engine waits for a
second CPU reading), so a scrape never waits for it: `NodeSampler` samples
in the background every PAI_MONITOR_SAMPLE_SECONDS, a few containers at a
time, and the exporter serves the latest round.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import docker
from docker.errors import DockerException, NotFound
from docker.models.containers import Container
from redis.exceptions import RedisError
from requests.exceptions import RequestException

from services.monitor.nodemetrics import (
    SAMPLE_DURATION,
    SAMPLE_TIME,
    TASK_GPU_IDLE,
    GpuSample,
    Series,
    TaskSample,
    cpu_percent,
    fault_series,
    memory_bytes,
    needs_pids,
    node_series,
    task_labels,
)
from shared.domain.models import Allocation, attempt_task_key, split_job_id
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.node.containers import LABEL_JOB, LABEL_NODE, LABEL_USER, LABEL_VC, task_ref_from_labels
from shared.node.engine import EngineCalls
from shared.node.nvml import Nvml, text
from shared.state import gpufaults, tasksamples
from shared.state.accounts import Accounts
from shared.state.idle import (
    IdleAction,
    IdlePolicy,
    SampleTaken,
    Verdict,
    decide,
    idle_runs,
    keep_round,
    stop_reason,
)
from shared.state.store import Store

log = logging.getLogger(__name__)

STATS_WORKERS = 4  # containers sampled at once: docker stats is slow, the engine is shared

# Stop a job idling on its GPUs: job id and the diagnostics reason (run.py
# wires it to the normal stop path).
IdleStop = Callable[[str, str], None]


class NvmlReader:
    """The node's GPU devices through NVML; `read` is None where there is no NVML."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self.nvml = nvml or Nvml()

    @property
    def available(self) -> bool:
        return self.nvml.available

    def start(self) -> bool:
        return self.nvml.open()

    def close(self) -> None:
        self.nvml.close()

    def read(self) -> list[GpuSample] | None:
        if not self.nvml.available:
            return None
        try:
            return [self._device(index, handle) for index, handle in self.nvml.devices()]
        except self.nvml.error as error:
            log.warning("NVML failed while reading the GPUs (%s): no GPU series this round",
                        error)
            return None

    def _device(self, index: int, handle: Any) -> GpuSample:
        lib, maybe = self.nvml.lib, self.nvml.maybe
        memory = maybe(lambda: lib.nvmlDeviceGetMemoryInfo(handle))
        power_mw = maybe(lambda: lib.nvmlDeviceGetPowerUsage(handle))

        def ecc(kind: int) -> Any:
            return maybe(lambda: lib.nvmlDeviceGetTotalEccErrors(
                handle, kind, lib.NVML_AGGREGATE_ECC))

        def pids() -> tuple[int, ...]:
            processes = [*lib.nvmlDeviceGetComputeRunningProcesses(handle),
                         *lib.nvmlDeviceGetGraphicsRunningProcesses(handle)]
            return tuple(sorted({int(p.pid) for p in processes}))

        return GpuSample(
            index=index,
            uuid=text(lib.nvmlDeviceGetUUID(handle)),
            model=text(lib.nvmlDeviceGetName(handle)),
            utilization_percent=maybe(
                lambda: float(lib.nvmlDeviceGetUtilizationRates(handle).gpu)),
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            temperature_celsius=maybe(
                lambda: float(lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU))),
            power_watts=power_mw / 1000.0 if power_mw is not None else None,
            ecc_corrected=ecc(lib.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ecc_uncorrected=ecc(lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            process_pids=maybe(pids),
        )


def container_pids(top: Mapping[str, Any]) -> tuple[int, ...] | None:
    """Host PIDs from `docker top`'s table; None when it has no PID column."""
    titles = list(top.get("Titles") or ())
    if "PID" not in titles:
        return None
    column = titles.index("PID")
    pids = []
    for row in top.get("Processes") or ():
        with contextlib.suppress(ValueError, IndexError):
            pids.append(int(row[column]))
    return tuple(sorted(pids))


def _listed(containers: list[Container]) -> frozenset[str]:
    """The attempt task keys of the task containers running now."""
    refs = (task_ref_from_labels(c.labels) for c in containers)
    return frozenset(attempt_task_key(r.job_id, r.attempt, r.role, r.index)
                     for r in refs if r is not None)


class NodeSampler:
    """Samples the node in the background; `latest` is what a scrape serves."""

    def __init__(self, settings: Settings, store: Store, docker_client: docker.DockerClient,
                 nvml: NvmlReader, workers: int = STATS_WORKERS,
                 stop_idle: IdleStop | None = None) -> None:
        self.settings, self.store, self.docker, self.nvml = settings, store, docker_client, nvml
        self.engine = EngineCalls(docker_client)
        self.node = settings.node_name
        self.virtual_gpus = settings.node_virtual_gpus is not None
        self.stop_idle = stop_idle
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="pai-stats")
        self._lock = threading.Lock()
        self._latest: list[Series] = []
        self._recorded_at: float | None = None  # monotonic time of the last samples kept
        self._stopped: set[str] = set()  # task attempts whose job was stopped for idling

    def latest(self) -> list[Series]:
        with self._lock:
            return self._latest

    def run(self, stop: threading.Event) -> None:
        """Sample now and then every interval, until `stop` is set."""
        while not stop.is_set():
            try:
                self.sample()
            except Exception:
                log.exception("sampling the node failed; serving the previous round")
            stop.wait(min(self.settings.monitor_sample_seconds,
                          self.settings.task_sample_seconds))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.nvml.close()

    def sample(self) -> list[Series]:
        started = time.monotonic()
        gpus = self.nvml.read()
        containers = self.engine.list_containers(
            filters={"label": [LABEL_JOB, f"{LABEL_NODE}={self.node}"], "status": "running"})
        allocations = self._allocations()
        sample = partial(self._task_sample, allocations=allocations,
                         with_pids=needs_pids(gpus, self.virtual_gpus))
        tasks = [t for t in self._pool.map(sample, containers) if t is not None]
        series = node_series(self.node, gpus, tasks, virtual_gpus=self.virtual_gpus)
        if self._record_due(started):
            series.extend(self.record(tasks, gpus, _listed(containers)))
        series.extend(fault_series(self.node, self._faults()))
        series.append(Series(SAMPLE_DURATION, (self.node,), time.monotonic() - started))
        series.append(Series(SAMPLE_TIME, (self.node,), time.time()))
        with self._lock:
            self._latest = series
        return series

    def _faults(self) -> dict[int, str]:
        try:
            faults = gpufaults.read_faults(self.store.r).get(self.node, {})
        except RedisError as error:
            log.warning("cannot read the node's GPU faults (%s): none shown", error)
            return {}
        return {index: fault.reason for index, fault in faults.items()}

    def _allocations(self) -> dict[str, Allocation]:
        try:
            return self.store.get_allocations(self.store.r, self.node)
        except RedisError as error:
            log.warning("cannot read the node's allocations (%s): no task GPU series", error)
            return {}

    def _task_sample(self, container: Container, *, allocations: Mapping[str, Allocation],
                     with_pids: bool) -> TaskSample | None:
        labels = container.labels or {}
        ref = task_ref_from_labels(labels)
        if ref is None:
            return None
        try:
            stats = container.stats(stream=False)
            pids = container_pids(container.top()) if with_pids else None
        except NotFound:
            return None  # ended meanwhile
        except (DockerException, RequestException) as error:
            log.warning("cannot sample container %s: %s", container.name, error)
            return None
        user, name = split_job_id(ref.job_id)
        alloc = allocations.get(attempt_task_key(ref.job_id, ref.attempt, ref.role, ref.index))
        return TaskSample(
            user=labels.get(LABEL_USER) or user, job_name=name, role=ref.role,
            index=ref.index, attempt=ref.attempt, vc=labels.get(LABEL_VC, ""),
            cpu_percent=cpu_percent(stats), memory_bytes=memory_bytes(stats), pids=pids,
            gpus=alloc.gpus if alloc is not None else ())

    # ------------------------------------------------ samples and idle GPUs

    def _record_due(self, now: float) -> bool:
        if (self._recorded_at is not None
                and now - self._recorded_at < self.settings.task_sample_seconds):
            return False
        self._recorded_at = now
        return True

    def _gpu_utilization(self, gpus: list[GpuSample] | None) -> dict[int, float | None]:
        if self.virtual_gpus:
            try:
                return dict(tasksamples.virtual_utilization(self.store.r, self.node))
            except RedisError as error:
                log.warning("cannot read the virtual GPUs' utilisation (%s)", error)
                return {}
        return {gpu.index: gpu.utilization_percent for gpu in gpus or ()}

    def _policy(self, action: IdleAction = IdleAction.NOTIFY) -> IdlePolicy:
        s = self.settings
        return IdlePolicy(percent=s.idle_gpu_percent, window_ms=int(s.idle_gpu_seconds * 1000),
                          grace_ms=int(s.idle_gpu_grace_seconds * 1000), action=action)

    def _vc_action(self, vc: str) -> IdleAction:
        found = Accounts(self.store).get_vc(vc) if vc else None
        if found is None or found.idle_gpu_action not in tuple(IdleAction):
            return IdleAction.NOTIFY
        return IdleAction(found.idle_gpu_action)

    def record(self, tasks: list[TaskSample], gpus: list[GpuSample] | None,
               listed: frozenset[str] = frozenset()) -> list[Series]:
        """Keep each task's sample in its stream and judge its GPUs idle or not,
        in one pipeline; returns the idle tasks' series. A task `listed` (its
        container runs, by attempt task key) that could not be sampled keeps
        its idle run as it was. Redis being away costs this round's samples,
        nothing else."""
        now = now_ms()
        try:
            return self._record(tasks, gpus, now, listed)
        except RedisError as error:
            log.warning("cannot keep the tasks' samples (%s): this round is lost", error)
            return []

    def _record(self, tasks: list[TaskSample], gpus: list[GpuSample] | None,
                now: int, listed: frozenset[str]) -> list[Series]:
        utilization = self._gpu_utilization(gpus)
        previous = idle_runs(self.store.r, self.node)
        maxlen = tasksamples.max_samples(self.settings.task_sample_seconds,
                                         self.settings.task_sample_keep_seconds)
        # running but not sampled this round (docker stats failed): nothing new to judge
        idle: dict[str, int] = {key: previous[key] for key in listed if key in previous}
        series: list[Series] = []
        stops: list[tuple[TaskSample, Verdict]] = []
        taken: list[SampleTaken] = []
        for task in tasks:
            job_id = f"{task.user}~{task.job_name}"
            key = attempt_task_key(job_id, task.attempt, task.role, task.index)
            sample = tasksamples.Sample(
                time_ms=now, cpu_percent=task.cpu_percent, memory_bytes=task.memory_bytes,
                gpu_percent=tasksamples.task_gpu_percent(task.gpus, utilization))
            taken.append(SampleTaken(job_id, task.attempt, task.role, task.index, sample))
            verdict = decide(previous.get(key), [sample], now, self._policy())
            if verdict.since_ms is None:
                idle.pop(key, None)
                continue
            idle[key] = verdict.since_ms
            if verdict.flagged:
                series.append(Series(TASK_GPU_IDLE, task_labels(self.node, task),
                                     (now - verdict.since_ms) / 1000.0))
                stops.append((task, verdict))
        keep_round(self.store.r, self.node, taken, idle, maxlen)
        for task, verdict in stops:
            self._maybe_stop(task, verdict, now)
        return series

    def _maybe_stop(self, task: TaskSample, verdict: Verdict, now: int) -> None:
        """Stop the job of a flagged task whose VC says so, once its grace is over."""
        if self.stop_idle is None or verdict.since_ms is None:
            return
        job_id = f"{task.user}~{task.job_name}"
        key = attempt_task_key(job_id, task.attempt, task.role, task.index)
        if key in self._stopped:
            return
        policy = self._policy(self._vc_action(task.vc))
        if not decide(verdict.since_ms, [], now, policy).stop:
            return
        log.warning("job %s: task %s[%d] idle on its GPUs since %d ms; stopping it",
                    job_id, task.role, task.index, verdict.since_ms)
        self.stop_idle(job_id, stop_reason(verdict.since_ms, policy))
        self._stopped.add(key)
