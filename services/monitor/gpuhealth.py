"""The node's GPU health watch: NVML's signals and injected faults become
unhealthy marks, and the tasks on a newly marked GPU fail as the platform's
fault (retried elsewhere, uncharged). What counts as failing is decided in
shared/domain/gpuhealth.py; this is the IO around it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import docker
from docker.errors import APIError, DockerException, NotFound
from redis.exceptions import RedisError
from requests.exceptions import RequestException

from services.monitor.observations import UNKNOWN_EXIT_CODE
from shared.domain import gpuhealth
from shared.infra.clock import now_ms
from shared.node.containers import LABEL_ATTEMPT, LABEL_INDEX, LABEL_JOB, LABEL_ROLE, TaskRef
from shared.node.nvml import Nvml
from shared.state import gpufaults
from shared.state.store import Store
from shared.state.taskexits import record_task_exit

log = logging.getLogger(__name__)

# SIGTERM to SIGKILL for a task on a failed GPU: none. Its task is settled
# already (so the scheduler's sweep may release the allocation at any
# moment), and a program whose GPU fell over cannot save GPU state anyway.
STOP_SECONDS = 0
Stop = Callable[[TaskRef], None]
Tell = Callable[[TaskRef, bool], None]


class GpuHealthWatch:
    """One node's GPUs: read, judge, mark, and fail what runs on a bad one.

    `stop` stops a task's container (and waits for it); `tell` tells the
    scheduler a task ended (and whether its attempt did), so the allocation
    is released only once the container is gone.
    """

    def __init__(self, store: Store, node: str, stop: Stop, tell: Tell,
                 nvml: Nvml | None = None) -> None:
        self.store, self.node, self.stop, self.tell = store, node, stop, tell
        self.nvml = nvml or Nvml()
        self._events: object | None = None
        self._last: dict[int, gpuhealth.GpuReading] = {}

    def start(self) -> None:
        if self.nvml.open():
            self._events = self.nvml.watch_xids()

    def close(self) -> None:
        self.nvml.close()

    @property
    def watching_xids(self) -> bool:
        """Whether the driver reports critical XID events to this watch."""
        return self._events is not None

    def observe(self) -> list[tuple[int, str, str]]:
        """(GPU index, reason, source) of every failure seen this round."""
        found: list[tuple[int, str, str]] = []
        if self.nvml.available:
            try:
                for index, xid in self.nvml.xids(self._events):
                    reason = gpuhealth.xid_fault(xid)
                    if reason is not None:
                        found.append((index, reason, gpuhealth.NVML))
                for index, handle in self.nvml.devices():
                    reading = self.nvml.health(handle)
                    for reason in gpuhealth.reading_faults(self._last.get(index), reading):
                        found.append((index, reason, gpuhealth.NVML))
                    self._last[index] = reading
            except self.nvml.error as error:
                log.warning("NVML failed while reading GPU health (%s); next round", error)
        found += [(index, reason, gpuhealth.INJECTED)
                  for index, reason in gpufaults.take_injections(self.store.r, self.node)]
        return found

    def check(self) -> list[gpuhealth.GpuFault]:
        """One round: the faults newly marked; then every live task on any
        marked GPU of this node is failed (so a monitor that died between a
        mark and the failing finishes the job on its next round)."""
        marked = []
        for index, reason, source in self.observe():
            fault = gpuhealth.GpuFault(self.node, index, reason, now_ms(), source)
            if gpufaults.mark_fault(self.store.r, fault):
                log.error("GPU %d of node %s is unhealthy: %s; no new work goes to it",
                          index, self.node, reason)
                marked.append(fault)
        faults = gpufaults.read_faults(self.store.r).get(self.node, {})
        for fault in faults.values():
            self.fail_tasks_on(fault)
        return marked

    def fail_tasks_on(self, fault: gpuhealth.GpuFault) -> int:
        """Fail, as platform failures, the live tasks holding the GPU; how many."""
        failed = 0
        for alloc in self.store.get_allocations(self.store.r, self.node).values():
            if fault.index not in alloc.gpus:
                continue
            ref = TaskRef(alloc.job_id, alloc.attempt, alloc.role, alloc.index)
            report = record_task_exit(
                self.store, ref.job_id, ref.attempt, ref.role, ref.index,
                exit_code=UNKNOWN_EXIT_CODE, platform_failure=True,
                diagnostics=f"GPU {fault.index} of node {self.node} failed: {fault.reason}")
            if report is None:
                continue  # settled already
            failed += 1
            self.stop(ref)
            self.tell(ref, report.attempt_ended)
        return failed

    def run(self, stop: threading.Event, interval: float) -> None:
        """Check every `interval` seconds until `stop` is set."""
        self.start()
        try:
            while not stop.wait(interval):
                try:
                    self.check()
                except (RedisError, DockerException, RequestException) as error:
                    log.warning("GPU health round failed (%s); trying again", error)
        finally:
            self.close()


def stop_container(client: docker.DockerClient, ref: TaskRef) -> None:
    """Stop the task's running containers on this engine and wait for them,
    found by their labels (whichever task retry or submission made them);
    one already gone is done."""
    filters = {"label": [f"{LABEL_JOB}={ref.job_id}", f"{LABEL_ATTEMPT}={ref.attempt}",
                         f"{LABEL_ROLE}={ref.role}", f"{LABEL_INDEX}={ref.index}"],
               "status": "running"}
    for container in client.containers.list(filters=filters):
        try:
            container.stop(timeout=STOP_SECONDS)
        except NotFound:
            pass
        except APIError as error:
            log.warning("could not stop %s on a failed GPU: %s", container.name, error)
