"""Worlds for the scheduling policy's table-driven tests: nodes, VCs, running
and queued jobs built from short specs, and what a pass decides on them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from services.scheduler.core import Cluster, JobRequest, NodeFree, PortRequest, TaskRequest
from services.scheduler.decisions import DEFAULT_LAS, Attained, Las, Plan, RunningJob
from services.scheduler.policy import plan
from shared.domain.cluster import BORROWED, GUARANTEED, VcPolicy
from shared.domain.models import Allocation
from shared.domain.priority import PriorityClass

NOW = 1_000_000
PORTS = (15000, 15099)
PROD, TEST, OPPO = PriorityClass.PROD, PriorityClass.TEST, PriorityClass.OPPO


def req(job_id: str, gpus: int, *, vc: str = "default", cls: PriorityClass = TEST,
        seq: int = 0, tasks: int = 1, gpu_type: str | None = None,
        ports: tuple[PortRequest, ...] = ()) -> JobRequest:
    return JobRequest(job_id, 1, 0, tuple(TaskRequest("w", i, 1, 100, gpus, ports)
                                          for i in range(tasks)),
                      vc, cls, seq, gpu_type)


@dataclass
class Run:
    """A running job for a case: `gpus` per node it holds."""

    job_id: str
    vc: str
    on: dict[str, int]
    mode: str = GUARANTEED
    cls: PriorityClass = TEST
    started: int = 0
    preempted_by: str = ""
    attempt: int = 0


def scenario(nodes: dict[str, int], runs: Sequence[Run] = (), *, model: str = "",
             groups: dict[int, int] | None = None) -> tuple[Cluster, list[RunningJob]]:
    """8-CPU nodes of the given GPU counts, with the running jobs' tasks on them."""
    free = {name: list(range(count)) for name, count in nodes.items()}
    running = []
    for run in runs:
        allocations = []
        for node, count in run.on.items():
            gpus = tuple(free[node][:count])
            del free[node][:count]
            allocations.append(Allocation(run.job_id, 0, "w", len(allocations), node, gpus,
                                          0, 0, ()))
        running.append(RunningJob(run.job_id, run.vc, run.cls, run.mode, run.started,
                                  tuple(allocations), preempted_by=run.preempted_by,
                                  preempt_deadline_ms=NOW + 5000 if run.preempted_by else None,
                                  attempt=run.attempt))
    cluster = Cluster(NodeFree(name, "127.0.0.1", free[name], 64, 64_000, PORTS,
                               gpu_model=model, gpu_groups=groups,
                               all_gpus=tuple(range(count)), cpus=64, memory_mb=64_000)
                      for name, count in nodes.items())
    return cluster, running


def run_plan(nodes: dict[str, int], queue: Sequence[JobRequest], runs: Sequence[Run] = (),
             vcs: dict[str, VcPolicy] | None = None, *,
             attained: dict[str, Attained] | None = None, las: Las = DEFAULT_LAS,
             **node_options: object) -> Plan:
    cluster, running = scenario(nodes, runs, **node_options)  # type: ignore[arg-type]
    return plan(cluster, queue, running, vcs or {"default": VcPolicy(sum(nodes.values()))},
                NOW, attained, las)


def placed(result: Plan) -> dict[str, str]:
    """job id -> the mode it was placed in."""
    return {p.request.job_id: p.mode for p in result.placed}


def preempted(result: Plan) -> dict[str, str]:
    return {p.victim.job_id: p.by for p in result.preempt}


HOUR = 3_600_000
World = tuple[dict[str, int], list[Run], list[JobRequest], dict[str, VcPolicy],
              dict[str, Attained]]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    nodes = {f"n{i}": draw(st.integers(1, 8)) for i in range(draw(st.integers(1, 4)))}
    vcs = ["default", "a", "b"]
    left = dict(nodes)
    runs = []
    for i in range(draw(st.integers(0, 5))):
        name = draw(st.sampled_from(sorted(nodes)))
        if not left[name]:
            continue
        count = draw(st.integers(1, left[name]))
        left[name] -= count
        runs.append(Run(f"run{i}", draw(st.sampled_from(vcs)), {name: count},
                        mode=draw(st.sampled_from([GUARANTEED, BORROWED])),
                        cls=draw(st.sampled_from(list(PriorityClass))),
                        started=draw(st.integers(0, NOW)),
                        attempt=draw(st.sampled_from([0, 0, 1]))))
    queue = [req(f"q{i}", draw(st.integers(0, 8)), vc=draw(st.sampled_from(vcs)),
                 cls=draw(st.sampled_from(list(PriorityClass))), seq=i,
                 tasks=draw(st.integers(1, 3)))
             for i in range(draw(st.integers(1, 8)))]
    policies = {vc: VcPolicy(draw(st.integers(0, 8)), draw(st.booleans())) for vc in vcs}
    attained = {r.job_id: Attained(draw(st.integers(0, 20 * HOUR)), draw(st.integers(0, NOW)))
                for r in queue if draw(st.booleans())}
    return nodes, runs, queue, policies, attained
