"""The node exporter on a real Docker engine and Redis: a task container's stats
become series, served over HTTP (no NVML on this machine: no GPU series)."""

from __future__ import annotations

import dataclasses

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from bench import free_port
from services.monitor.exporter import NodeExporter
from services.monitor.nodemetrics import NVML_UP, TASK_CPU, TASK_MEMORY
from services.monitor.sampling import NvmlReader
from shared.node.nvml import Nvml
from tests.support.monitor_rig import GATE, NoNvml, Rig, release, rig
from tests.support.polling import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.redis]
__all__ = ["rig"]  # the fixture, used by name


def test_a_running_tasks_cpu_and_memory_are_served(rig: Rig) -> None:
    settings = dataclasses.replace(rig.settings, monitor_host="127.0.0.1",
                                   monitor_port=free_port())
    exporter = NodeExporter(settings, rig.store, rig.docker, NvmlReader(Nvml(NoNvml())))
    job_id = rig.place()
    container = rig.run(job_id, GATE)
    wait_for(lambda: container.reload() or container.status == "running", "the container to run")
    try:
        exporter.serve()
        round_ = exporter.sampler.sample()
        resp = requests.get(f"http://127.0.0.1:{settings.monitor_port}/metrics", timeout=10)
    finally:
        exporter.close()
        release(container)

    labels = (rig.node, "alice", job_id.partition("~")[2], "main", "0", "0", "default")
    by_name = {(s.spec.name, s.labels) for s in round_}
    assert (TASK_CPU.name, labels) in by_name
    assert (TASK_MEMORY.name, labels) in by_name
    assert (NVML_UP.name, (rig.node,)) in by_name
    assert not any(s.spec.name.startswith("pai_gpu_") for s in round_)

    assert resp.status_code == 200
    served = {s.name: s for f in text_string_to_metric_families(resp.text) for s in f.samples}
    assert served["pai_task_memory_bytes"].labels["job_name"] == labels[2]
    assert served["pai_monitor_nvml_up"].value == 0
