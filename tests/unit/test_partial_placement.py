"""Jobs without gang allocation (`extras.gangAllocation: false`): the pure
core places as many of their waiting tasks as fit, the rest in later passes;
gang jobs stay all or nothing. One row per rule, then a property over
random clusters mixing both kinds."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scheduler.core import Cluster, JobRequest, job_request, place_some
from services.scheduler.decisions import INSUFFICIENT, PREEMPTING, UNSCHEDULABLE
from services.scheduler.policy import plan
from shared.domain.asks import Ask
from shared.domain.cluster import BORROWED, GUARANTEED, VcPolicy
from shared.domain.feasibility import infeasible_reasons
from shared.domain.models import Gpu, JobSpec, Node
from shared.domain.priority import PriorityClass
from tests.support.policy import NOW, Run, req, run_plan, scenario


def loose(job_id: str, gpus: int, *, tasks: int, seq: int = 0, vc: str = "default",
          cls: PriorityClass = PriorityClass.TEST) -> JobRequest:
    """A job of `tasks` tasks of `gpus` GPUs each, without gang allocation."""
    return replace(req(job_id, gpus, tasks=tasks, seq=seq, vc=vc, cls=cls), gang=False)


def placed_tasks(result: object) -> dict[str, list[int]]:
    return {p.request.job_id: sorted(t.index for t in p.placements)
            for p in result.placed}  # type: ignore[attr-defined]


CASES = [
    pytest.param({"a": 1}, [loose("j", 1, tasks=2)], [], {"j": [0]}, {},
                 id="partial placement: one of two one-GPU tasks on a one-GPU node"),
    pytest.param({"a": 1}, [req("g", 1, tasks=2)], [], {}, {"g": UNSCHEDULABLE},
                 id="a gang of the same shape never fits that node"),
    pytest.param({"a": 2}, [req("g", 1, tasks=3)], [], {}, {"g": UNSCHEDULABLE},
                 id="gang still all or nothing"),
    pytest.param({"a": 2, "b": 1}, [req("g", 1, tasks=3)], [], {"g": [0, 1, 2]}, {},
                 id="a gang that fits is placed whole"),
    pytest.param({"a": 2}, [loose("j", 1, tasks=3)], [], {"j": [0, 1]}, {},
                 id="as many as fit"),
    pytest.param({"a": 4}, [loose("j", 1, tasks=3)], [], {"j": [0, 1, 2]}, {},
                 id="all of them when all fit"),
    pytest.param({"a": 2}, [loose("j", 1, tasks=2)], [Run("r", "default", {"a": 2})], {},
                 {"j": INSUFFICIENT}, id="none fits now: it waits"),
    pytest.param({"a": 1}, [loose("j", 2, tasks=2)], [], {}, {"j": UNSCHEDULABLE},
                 id="a task no node can ever hold: unschedulable"),
    pytest.param({"a": 2}, [loose("j", 1, tasks=3, seq=0), req("k", 1, seq=1)], [],
                 {"j": [0, 1]}, {"k": INSUFFICIENT},
                 id="the partial job goes first in its queue's order"),
]


@pytest.mark.parametrize(("nodes", "queue", "runs", "expected", "reasons"), CASES)
def test_partial_placement(nodes: dict[str, int], queue: list[JobRequest], runs: list[Run],
                           expected: dict[str, list[int]], reasons: dict[str, str]) -> None:
    result = run_plan(nodes, queue, runs)
    assert placed_tasks(result) == expected
    assert {j: w.reason for j, w in result.waiting.items()} == reasons


SPEC = JobSpec.from_config({
    "jobName": "j", "image": "busybox", "extras": {"gangAllocation": False},
    "taskRoles": [{"name": "w", "taskNumber": 3, "cpuNumber": 1, "memoryMB": 100,
                   "gpuNumber": 1, "command": "true"}]})


def test_the_rest_is_placed_later_as_resources_free() -> None:
    # Pass 1: one GPU for three tasks; task 0 is placed.
    first = run_plan({"a": 1}, [job_request("j", 1, 0, Ask.of(SPEC))])
    assert placed_tasks(first) == {"j": [0]}
    # Pass 2: task 0 still holds the GPU, tasks 1 and 2 are asked for: none fits.
    holding = Run("j", "default", {"a": 1})
    rest = job_request("j", 3, 0, Ask.of(SPEC), waiting={"w:1", "w:2"})
    assert [t.index for t in rest.tasks] == [1, 2] and not rest.gang
    second = run_plan({"a": 1}, [rest], [holding])
    assert second.placed == [] and second.waiting["j"].reason == INSUFFICIENT
    # Pass 3: task 0 ended and freed its GPU; task 1 goes, task 2 waits on.
    third = run_plan({"a": 1}, [rest])
    assert placed_tasks(third) == {"j": [1]}
    # Pass 4: the last one.
    last = run_plan({"a": 1}, [job_request("j", 5, 0, Ask.of(SPEC), waiting={"w:2"})])
    assert placed_tasks(last) == {"j": [2]}


def test_a_gang_spec_asks_for_every_task_whatever_waits() -> None:
    gang = replace(SPEC, gang_allocation=True)
    request = job_request("j", 1, 0, Ask.of(gang))
    assert request.gang and len(request.tasks) == 3


def test_a_partly_placed_job_counts_by_what_it_holds() -> None:
    # Guarantee 3, three one-GPU tasks, two GPUs: two tasks go, on the
    # guarantee, and count two GPUs of it (the third is asked for later).
    result = run_plan({"a": 1, "b": 1}, [loose("j", 1, tasks=3, seq=0), req("k", 1, seq=1)],
                      vcs={"default": VcPolicy(3)})
    assert placed_tasks(result) == {"j": [0, 1]}
    assert [(p.gpus, p.whole, p.mode) for p in result.placed] == [(2, False, GUARANTEED)]
    assert result.waiting["k"].reason == INSUFFICIENT
    # Its six GPUs are beyond a guarantee of 3: it borrows, and what it
    # could not place waits behind it.
    result = run_plan({"a": 2, "b": 2}, [loose("j", 2, tasks=3, seq=0)],
                      vcs={"default": VcPolicy(3)})
    assert [(p.gpus, p.mode) for p in result.placed] == [(4, BORROWED)]


def test_a_partly_placed_job_still_queued_is_never_a_victim() -> None:
    # "p" holds the node borrowed but waits for more tasks (it is queued):
    # the guaranteed job cannot take its place; a placed borrower can.
    partial = Run("p", "default", {"a": 2}, mode=BORROWED)
    queue = [req("g", 2, vc="prod", cls=PriorityClass.PROD, seq=0),
             loose("p", 2, tasks=1, seq=1)]
    vcs = {"prod": VcPolicy(2), "default": VcPolicy(0)}
    result = run_plan({"a": 2}, queue, [partial], vcs)
    assert [p.victim.job_id for p in result.preempt] == []
    whole = Run("w", "default", {"a": 2}, mode=BORROWED)
    result = run_plan({"a": 2}, queue[:1], [whole], vcs)
    assert [p.victim.job_id for p in result.preempt] == ["w"]
    assert result.waiting["g"].reason == PREEMPTING


def test_place_some_reports_why_the_rest_waits() -> None:
    cluster, _ = scenario({"a": 1})
    result = place_some(cluster, loose("j", 1, tasks=2))
    assert [p.index for p in result.placements] == [0]
    assert result.shortfall is not None and result.shortfall.resource == "gpus"
    assert place_some(Cluster([]), loose("j", 1, tasks=2)).placements == ()


def test_submit_accepts_a_job_that_fits_only_one_task_at_a_time() -> None:
    node = Node(name="a", ip="127.0.0.1", cpus=4, memory_mb=4096,
                gpus=[Gpu(index=0, model="x")])
    assert infeasible_reasons(SPEC, [node]) == {}
    gang = replace(SPEC, gang_allocation=True)
    assert "taskRoles" in infeasible_reasons(gang, [node])


# ----------------------------------------------------------------- property

@st.composite
def mixed(draw: st.DrawFn) -> tuple[dict[str, int], list[Run], list[JobRequest],
                                    dict[str, VcPolicy]]:
    nodes = {f"n{i}": draw(st.integers(1, 8)) for i in range(draw(st.integers(1, 4)))}
    vcs = ["default", "a"]
    left = dict(nodes)
    runs = []
    for i in range(draw(st.integers(0, 4))):
        name = draw(st.sampled_from(sorted(nodes)))
        if left[name]:
            count = draw(st.integers(1, left[name]))
            left[name] -= count
            runs.append(Run(f"run{i}", draw(st.sampled_from(vcs)), {name: count},
                            mode=draw(st.sampled_from([GUARANTEED, BORROWED])),
                            cls=draw(st.sampled_from(list(PriorityClass))),
                            started=draw(st.integers(0, 100))))
    queue = []
    for i in range(draw(st.integers(1, 8))):
        request = req(f"q{i}", draw(st.integers(0, 4)), vc=draw(st.sampled_from(vcs)),
                      cls=draw(st.sampled_from(list(PriorityClass))), seq=i,
                      tasks=draw(st.integers(1, 4)))
        queue.append(replace(request, gang=draw(st.booleans())))
    policies = {vc: VcPolicy(draw(st.integers(0, 8)), draw(st.booleans())) for vc in vcs}
    return nodes, runs, queue, policies


@settings(max_examples=300, deadline=None)
@given(world=mixed())
def test_no_gpu_given_twice_and_gangs_stay_whole(
        world: tuple[dict[str, int], list[Run], list[JobRequest], dict[str, VcPolicy]]) -> None:
    nodes, runs, queue, vcs = world
    cluster, running = scenario(nodes, runs)
    free = {name: set(n.free_gpus) for name, n in cluster.nodes.items()}
    result = plan(cluster, queue, running, vcs, NOW)
    requests = {r.job_id: r for r in queue}
    ids = [p.request.job_id for p in result.placed]
    assert len(ids) == len(set(ids)) and set(ids).isdisjoint(result.waiting)
    assert set(ids) | set(result.waiting) == set(requests)
    given_gpus: Counter[tuple[str, int]] = Counter()
    for p in result.placed:
        asked = sorted((t.role, t.index) for t in requests[p.request.job_id].tasks)
        got = sorted((t.role, t.index) for t in p.placements)
        assert got, "a job placed with no task"
        assert len(got) == len(set(got)), "a task placed twice"
        if p.request.gang:
            assert got == asked, "a gang job was placed in part"
        else:
            assert set(got) <= set(asked)
        for t in p.placements:
            given_gpus.update((t.node, g) for g in t.gpus)
            assert set(t.gpus) <= free[t.node], "a held GPU was given"
    assert all(count == 1 for count in given_gpus.values()), "a GPU was given twice"
