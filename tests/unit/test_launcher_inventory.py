"""What a node reports: GPUs from NVML or the operator, CPUs, memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.launcher.inventory import (
    build_node,
    choose_gpus,
    describe_groups,
    has_nvidia_runtime,
    real_memory_mb,
    virtual_gpus,
)
from shared.domain.models import Gpu
from shared.infra.config import Settings

GIB = 1024**3


REAL = [Gpu(index=0, uuid="GPU-real", model="A100", memory_mb=40960)]


@pytest.mark.parametrize(("found", "declared", "expected"), [
    pytest.param([], None, [], id="no NVML, nothing declared: no GPUs"),
    pytest.param(REAL, None, REAL, id="NVML GPUs when nothing declared"),
    pytest.param([], 2, virtual_gpus("n1", 2), id="declared GPUs without NVML"),
    pytest.param(REAL, 3, virtual_gpus("n1", 3), id="the operator's declaration wins"),
    pytest.param(REAL, 0, [], id="declaring 0 hides real GPUs"),
])
def test_choose_gpus(found: list[Gpu], declared: int | None, expected: list[Gpu]) -> None:
    assert choose_gpus("n1", found, declared) == expected


def test_virtual_gpus_are_named_after_the_node() -> None:
    assert virtual_gpus("box", 2) == [Gpu(0, "virtual-box-0", "virtual"),
                                      Gpu(1, "virtual-box-1", "virtual")]


def test_declared_gpus_carry_the_declared_model_and_groups() -> None:
    settings = Settings(node_name="n1", node_virtual_gpus=6, node_gpu_model="H100",
                        node_gpu_groups=((4, 5), (0, 2)))
    node = build_node(settings, gpus=REAL, cpus=2, memory_mb=1000, nvidia_runtime=False)
    assert [(g.index, g.model, g.group) for g in node.gpus] == [
        (0, "H100", 1), (1, "H100", 1), (2, "H100", 1), (3, "H100", None), (4, "H100", 0),
        (5, "H100", 0)]


def test_nvml_gpus_keep_their_own_model_and_groups() -> None:
    found = [Gpu(0, "GPU-a", "A100", 40960, group=0), Gpu(1, "GPU-b", "A100", 40960, group=1)]
    settings = Settings(node_name="n1", node_gpu_model="ignored")
    assert build_node(settings, gpus=found, cpus=2, memory_mb=1000,
                      nvidia_runtime=True).gpus == found


@pytest.mark.parametrize(("gpus", "shown"), [
    pytest.param([], "unknown", id="no GPUs"),
    pytest.param([Gpu(0), Gpu(1)], "unknown", id="groups unknown"),
    pytest.param([Gpu(0, group=0), Gpu(1, group=1), Gpu(2, group=0)], "0:[0,2] 1:[1]",
                 id="by group"),
])
def test_describe_groups(gpus: list[Gpu], shown: str) -> None:
    assert describe_groups(gpus) == shown


@pytest.mark.parametrize(("settings", "cpus", "memory", "real_cpus"), [
    pytest.param(Settings(node_name="n1"), 2, 24000, 2, id="real figures by default"),
    pytest.param(Settings(node_name="n1", node_cpus=16, node_memory_mb=65536), 16, 65536, 2,
                 id="declared figures win, real CPUs kept"),
])
def test_build_node_figures(settings: Settings, cpus: int, memory: int, real_cpus: int) -> None:
    node = build_node(settings, gpus=[], cpus=2, memory_mb=24000, nvidia_runtime=False)
    assert (node.cpus, node.memory_mb, node.real_cpus) == (cpus, memory, real_cpus)


def test_build_node_identity() -> None:
    settings = Settings(node_name="gpu-07", node_ip="10.0.0.7", port_range=(20000, 21000))
    node = build_node(settings, gpus=REAL, cpus=8, memory_mb=1000, nvidia_runtime=True)
    assert (node.name, node.ip, node.port_range, node.gpus, node.nvidia_runtime) == (
        "gpu-07", "10.0.0.7", (20000, 21000), REAL, True)


def test_virtual_gpus_never_use_the_nvidia_runtime() -> None:
    node = build_node(Settings(node_name="n1", node_virtual_gpus=8), gpus=REAL, cpus=2,
                      memory_mb=1000, nvidia_runtime=True)
    assert len(node.gpus) == 8
    assert node.nvidia_runtime is False


@pytest.mark.parametrize(("info", "expected"), [
    pytest.param({"Runtimes": {"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}},
                 True, id="nvidia runtime"),
    pytest.param({"Runtimes": {"runc": {}}}, False, id="runc only"),
    pytest.param({}, False, id="no runtimes listed"),
])
def test_nvidia_runtime_from_docker_info(info: dict[str, Any], expected: bool) -> None:
    assert has_nvidia_runtime(info) is expected


def test_real_memory_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684084 kB\nMemFree:        1000 kB\n")
    assert real_memory_mb(str(meminfo)) == 24105
