"""What this node offers the scheduler: GPUs (NVML), CPUs, memory, ports.

The mapping from NVML (or the operator's declared figures) to a `Node` is
pure; `discover_node` only gathers the facts: NVML, the CPU affinity, the
memory size and whether Docker knows the NVIDIA runtime.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import docker

from shared.domain.models import Gpu, Node
from shared.infra.config import Settings
from shared.node.nvml import Nvml

log = logging.getLogger("pai.launcher")


def virtual_gpus(node_name: str, count: int, model: str = "virtual",
                 groups: tuple[tuple[int, int], ...] = ()) -> list[Gpu]:
    """Declared GPUs for testing: only their environment variables are set.

    `groups` are index ranges (PAI_NODE_GPU_GROUPS), numbered in the order
    declared, so a test node can show the scheduler a topology; a GPU in no
    range has an unknown group.
    """
    group_of = {index: number for number, (low, high) in enumerate(groups)
                for index in range(low, high + 1)}
    return [Gpu(index=i, uuid=f"virtual-{node_name}-{i}", model=model, group=group_of.get(i))
            for i in range(count)]


def choose_gpus(node_name: str, nvml_gpus: list[Gpu], declared: int | None,
                model: str = "virtual", groups: tuple[tuple[int, int], ...] = ()) -> list[Gpu]:
    """The operator's declaration wins over what NVML found, as with CPUs."""
    if declared is None:
        return nvml_gpus
    return virtual_gpus(node_name, declared, model, groups)


def read_nvml_gpus(nvml: Nvml | None = None) -> list[Gpu]:
    """The GPUs NVML sees; none when there is no NVML (no driver, no GPU)."""
    with nvml or Nvml() as session:
        return session.gpus()


def real_cpus() -> int:
    """The CPUs this process may run on (what Docker can give a container)."""
    return len(os.sched_getaffinity(0))


def real_memory_mb(meminfo: str = "/proc/meminfo") -> int:
    with open(meminfo, encoding="ascii") as lines:
        for line in lines:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024  # the figure is in kB
    raise RuntimeError(f"no MemTotal line in {meminfo}")


def has_nvidia_runtime(docker_info: dict[str, Any]) -> bool:
    return "nvidia" in (docker_info.get("Runtimes") or {})


def build_node(
    settings: Settings, *, gpus: list[Gpu], cpus: int, memory_mb: int, nvidia_runtime: bool,
) -> Node:
    """The node record from observed figures and the operator's overrides.

    `nvidia_runtime` says whether containers get their GPUs through the
    NVIDIA runtime; with declared (virtual) GPUs they never do, since those
    indices need not exist: only the environment variables are set.
    """
    declared = settings.node_virtual_gpus
    return Node(
        name=settings.node_name,
        ip=settings.node_ip,
        cpus=settings.node_cpus or cpus,
        memory_mb=settings.node_memory_mb or memory_mb,
        gpus=choose_gpus(settings.node_name, gpus, declared, settings.node_gpu_model,
                         settings.node_gpu_groups),
        port_range=settings.port_range,
        real_cpus=cpus,
        nvidia_runtime=nvidia_runtime and declared is None,
        exporter=exporter_address(settings),
    )


def exporter_address(settings: Settings) -> str:
    """Where Prometheus reaches this node's monitor: its listening address, or
    the node's IP when it listens on every address."""
    host = settings.monitor_host
    if host in ("0.0.0.0", "::", ""):
        host = settings.node_ip
    return f"[{host}]:{settings.monitor_port}" if ":" in host else f"{host}:{settings.monitor_port}"


def describe_groups(gpus: list[Gpu]) -> str:
    """"0:[0,1,2,3] 1:[4,5,6,7]" for the log, or "unknown"."""
    members: dict[int, list[int]] = {}
    for gpu in gpus:
        if gpu.group is not None:
            members.setdefault(gpu.group, []).append(gpu.index)
    return " ".join(f"{group}:{indices}".replace(" ", "")
                    for group, indices in sorted(members.items())) or "unknown"


def discover_node(settings: Settings, docker_client: docker.DockerClient) -> Node:
    node = build_node(
        settings,
        gpus=read_nvml_gpus(),
        cpus=real_cpus(),
        memory_mb=real_memory_mb(),
        nvidia_runtime=has_nvidia_runtime(docker_client.info()),
    )
    log.info("node %s (%s): %d CPUs (%d real), %d MB, %d GPUs%s%s, topology groups %s, "
             "NVIDIA runtime %s",
             node.name, node.ip, node.cpus, node.real_cpus, node.memory_mb, len(node.gpus),
             " (virtual)" if settings.node_virtual_gpus is not None else "",
             f" {node.gpus[0].model}" if node.gpus else "", describe_groups(node.gpus),
             "yes" if node.nvidia_runtime else "no")
    return node
