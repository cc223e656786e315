"""Can a job ever run on this cluster? Checked at submit, so a config that
asks for more than any node has is refused at once instead of waiting forever.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.domain.cluster import can_ever_hold, gpu_type_matches
from shared.domain.models import JobSpec, Node


def infeasible_reasons(spec: JobSpec, nodes: Sequence[Node]) -> dict[str, list[str]]:
    """Field path -> reasons, judged against every node that ever reported.

    With no node known yet nothing can be judged (nodes may still be starting):
    the job is accepted and waits with a reason.
    """
    if not nodes:
        return {}
    reasons: dict[str, list[str]] = {}
    if spec.gpu_type and any(r.gpu_number for r in spec.task_roles):
        models = sorted({g.model for n in nodes for g in n.gpus if g.model})
        typed = [n for n in nodes if n.gpus and gpu_type_matches(n.gpus[0].model, spec.gpu_type)]
        if not typed:
            return {"gpuType": [f"no node has GPUs of type {spec.gpu_type}; the cluster has "
                                + (", ".join(models) or "no GPUs")]}
    max_gpus = max(len(n.gpus) for n in nodes)
    max_cpus = max(n.cpus for n in nodes)
    max_memory = max(n.memory_mb for n in nodes)
    for i, role in enumerate(spec.task_roles):
        path = f"taskRoles.{i}"
        if role.gpu_number > max_gpus:
            reasons.setdefault(f"{path}.gpuNumber", []).append(
                f"needs {role.gpu_number} GPUs on one node; the largest node has {max_gpus}")
        if role.cpu_number > max_cpus:
            reasons.setdefault(f"{path}.cpuNumber", []).append(
                f"needs {role.cpu_number} CPUs on one node; the largest node has {max_cpus}")
        if role.memory_mb > max_memory:
            reasons.setdefault(f"{path}.memoryMB", []).append(
                f"needs {role.memory_mb} MB on one node; the largest node has {max_memory} MB")
        if path + ".gpuNumber" in reasons or path + ".cpuNumber" in reasons \
                or path + ".memoryMB" in reasons:
            continue
        if not any(can_ever_hold(n, role.gpu_number, role.cpu_number, role.memory_mb)
                   for n in nodes):
            reasons.setdefault(path, []).append(
                f"no node has {role.gpu_number} GPUs, {role.cpu_number} CPUs and "
                f"{role.memory_mb} MB together")
    if reasons or not spec.gang_allocation:  # without a gang, tasks may run one by one
        return reasons
    totals = (
        ("GPUs", sum(r.gpu_number * r.task_number for r in spec.task_roles),
         sum(len(n.gpus) for n in nodes)),
        ("CPUs", sum(r.cpu_number * r.task_number for r in spec.task_roles),
         sum(n.cpus for n in nodes)),
        ("MB of memory", sum(r.memory_mb * r.task_number for r in spec.task_roles),
         sum(n.memory_mb for n in nodes)),
    )
    for unit, wanted, total in totals:
        if wanted > total:
            reasons.setdefault("taskRoles", []).append(
                f"the job's tasks need {wanted} {unit} at once; "
                f"the whole cluster has {total}")
    return reasons
