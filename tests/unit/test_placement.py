"""Gang placement: table-driven cases and properties over random clusters."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scheduler.core import (
    Cluster,
    JobRequest,
    NodeFree,
    PortRequest,
    TaskRequest,
    free_view,
    place_gang,
)
from services.scheduler.decisions import Plan
from services.scheduler.policy import plan
from shared.domain.cluster import vc_policies
from shared.domain.models import Allocation, Gpu, Node


def node(name: str, gpus: int = 8, cpus: int = 16, memory: int = 65536,
         ports: tuple[int, int] = (15000, 15100)) -> NodeFree:
    return NodeFree(name, "127.0.0.1", list(range(gpus)), cpus, memory, ports)


def plan_pass(cluster: Cluster, queue: list[JobRequest]) -> Plan:
    """One pass of the policy with every GPU guaranteed to `default`: what is
    left is placement alone."""
    total = sum(len(n.free_gpus) for n in cluster.nodes.values())
    return plan(cluster, queue, [], vc_policies({"default": None}, {}, total), 0)


def reasons(result: Plan) -> dict[str, str]:
    return {job_id: why.message for job_id, why in result.waiting.items()}


def placed_ids(result: Plan) -> list[str]:
    return [p.request.job_id for p in result.placed]


def job(job_id: str, *tasks: tuple[int, int, int, int]) -> JobRequest:
    """tasks: (count, gpus, cpus, memory) per role."""
    requests = []
    for role_no, (count, gpus, cpus, memory) in enumerate(tasks):
        requests += [TaskRequest(f"r{role_no}", i, cpus, memory, gpus) for i in range(count)]
    return JobRequest(job_id, 1, 0, tuple(requests))


CASES = [
    pytest.param([node("a", gpus=4)], job("j", (1, 8, 1, 100)), False,
                 "needs 8 GPUs on one node; the most free on any node is 4",
                 id="8 GPUs on a 4-GPU node fails"),
    pytest.param([node("a", gpus=8)], job("j", (1, 8, 1, 100)), True, "",
                 id="equal edge case fits"),
    pytest.param([node("a", cpus=2)], job("j", (1, 0, 3, 100)), False,
                 "needs 3 CPUs on one node; the most free on any node is 2",
                 id="CPU shortfall is named"),
    pytest.param([node("a", memory=1000)], job("j", (1, 0, 1, 2000)), False,
                 "needs 2000 MB of memory on one node; the most free on any node is 1000",
                 id="memory shortfall is named"),
    pytest.param([node("a", gpus=4), node("b", gpus=4)], job("j", (2, 4, 1, 100)), True, "",
                 id="gang spread over two nodes"),
    pytest.param([node("a", gpus=4), node("b", gpus=4)], job("j", (3, 4, 1, 100)), False,
                 "the gang of 3 tasks does not fit at once: only 2 can be placed together now",
                 id="gang of three on two nodes waits whole"),
    pytest.param([node("a", gpus=4, cpus=1), node("b", gpus=0, cpus=8)],
                 job("j", (1, 2, 4, 100)), False,
                 "role r0 needs 2 GPUs, 4 CPUs, 100 MB together on one node; "
                 "no node has all of them free", id="resources split across nodes"),
    pytest.param([], job("j", (1, 0, 1, 100)), False, "no node has reported in yet",
                 id="no nodes"),
]


@pytest.mark.parametrize(("nodes", "request_", "placed", "reason"), CASES)
def test_gang_cases(nodes: list[NodeFree], request_: JobRequest, placed: bool,
                    reason: str) -> None:
    result = plan_pass(Cluster(nodes), [request_])
    assert bool(result.placed) == placed
    if not placed:
        assert reason in result.waiting[request_.job_id].message


def test_two_six_gpu_jobs_on_eight_gpus_one_waits() -> None:
    result = plan_pass(Cluster([node("a", gpus=8)]),
                       [job("first", (1, 6, 1, 100)), job("second", (1, 6, 1, 100))])
    assert placed_ids(result) == ["first"]
    assert reasons(result)["second"].startswith("role r0 needs 6 GPUs on one node; "
                                                "the most free on any node is 2")


def test_smaller_job_backfills_behind_a_waiting_one() -> None:
    result = plan_pass(Cluster([node("a", gpus=4), node("b", gpus=8, cpus=0)]),
                       [job("big", (1, 8, 1, 100)), job("small", (1, 2, 1, 100))])
    assert placed_ids(result) == ["small"]
    assert "big" in result.waiting


def test_best_fit_keeps_a_whole_node_free() -> None:
    cluster = Cluster([node("a", gpus=8), node("b", gpus=2)])
    result = place_gang(cluster, job("j", (1, 2, 1, 100)))
    assert result.placements[0].node == "b"
    assert len(cluster.nodes["a"].free_gpus) == 8


def test_failed_gang_leaves_cluster_untouched() -> None:
    cluster = Cluster([node("a", gpus=4), node("b", gpus=4)])
    before = {n: (list(v.free_gpus), v.free_cpus, set(v.used_ports))
              for n, v in cluster.nodes.items()}
    assert not place_gang(cluster, job("j", (3, 4, 1, 100))).placed
    after = {n: (list(v.free_gpus), v.free_cpus, set(v.used_ports))
             for n, v in cluster.nodes.items()}
    assert after == before
    assert place_gang(cluster, job("k", (2, 4, 1, 100))).placed


def test_ports_are_exact_and_unique_per_node() -> None:
    cluster = Cluster([node("a", ports=(20000, 20009))])
    task = TaskRequest("r", 0, 1, 100, 0, ports=(PortRequest("ssh", 2), PortRequest("tb", 1)))
    placed = place_gang(cluster, JobRequest("j", 1, 0, (task,)))
    assert placed.placements[0].ports == {"default": [20000], "ssh": [20001, 20002],
                                          "tb": [20003]}
    second = place_gang(cluster, JobRequest("k", 1, 0, (task,)))
    assert second.placements[0].ports["default"] == [20004]
    third = place_gang(cluster, JobRequest("l", 1, 0, (task,)))
    assert not third.placed
    assert "ports" in (third.shortfall.describe() if third.shortfall else "")


def test_free_view_subtracts_allocations() -> None:
    inventory = Node("a", "10.0.0.1", cpus=8, memory_mb=8000,
                     gpus=[Gpu(i) for i in range(4)], port_range=(15000, 15010))
    alloc = Allocation("u~j", 0, "r", 0, "a", (1, 2), 3, 1000, (15000,))
    view = free_view(inventory, [alloc])
    assert view.free_gpus == [0, 3]
    assert (view.free_cpus, view.free_memory_mb, view.used_ports) == (5, 7000, {15000})


# ----------------------------------------------------------------- properties

node_strategy = st.builds(
    lambda i, g, c, m: node(f"n{i}", gpus=g, cpus=c, memory=m, ports=(15000, 15063)),
    st.integers(0, 10_000), st.integers(0, 8), st.integers(1, 16), st.integers(100, 4000))

task_shape = st.tuples(st.integers(1, 4), st.integers(0, 8), st.integers(1, 8),
                       st.integers(100, 2000))


@settings(max_examples=200, deadline=None)
@given(nodes=st.lists(node_strategy, min_size=1, max_size=6, unique_by=lambda n: n.name),
       jobs=st.lists(st.lists(task_shape, min_size=1, max_size=3), min_size=1, max_size=8))
def test_placement_never_double_books(nodes: list[NodeFree],
                                      jobs: list[list[tuple[int, int, int, int]]]) -> None:
    capacity = {n.name: (len(n.free_gpus), n.free_cpus, n.free_memory_mb) for n in nodes}
    requests = [job(f"j{i}", *shapes) for i, shapes in enumerate(jobs)]
    result = plan_pass(Cluster(nodes), requests)

    gpus_given: Counter[tuple[str, int]] = Counter()
    ports_given: Counter[tuple[str, int]] = Counter()
    used = {name: [0, 0, 0] for name in capacity}
    for request, placements in ((p.request, p.placements) for p in result.placed):
        # all-or-nothing: every task of a placed job has a place, exactly once
        assert sorted((p.role, p.index) for p in placements) == \
            sorted((t.role, t.index) for t in request.tasks)
        for p in placements:
            task = next(t for t in request.tasks if (t.role, t.index) == (p.role, p.index))
            assert len(p.gpus) == task.gpus
            gpus_given.update((p.node, g) for g in p.gpus)
            ports_given.update((p.node, port) for port in p.all_ports)
            used[p.node][0] += len(p.gpus)
            used[p.node][1] += p.cpus
            used[p.node][2] += p.memory_mb
    assert all(count == 1 for count in gpus_given.values()), "a GPU was given twice"
    assert all(count == 1 for count in ports_given.values()), "a port was given twice"
    for name, (gpus, cpus, memory) in capacity.items():
        assert used[name][0] <= gpus and used[name][1] <= cpus and used[name][2] <= memory
    placed = set(placed_ids(result))
    assert placed.isdisjoint(result.waiting)
    assert placed | set(result.waiting) == {r.job_id for r in requests}


def test_ports_from_a_begin_at_near_the_top_of_the_range_make_the_job_wait() -> None:
    cluster = Cluster([node("a", ports=(20000, 20009))])
    task = TaskRequest("r", 0, 1, 100, 0, ports=(PortRequest("ssh", 3, begin_at=20008),))
    result = plan_pass(cluster, [JobRequest("j", 1, 0, (task,)),
                                 job("next", (1, 0, 1, 100))])
    assert result.waiting["j"].reason == "Unschedulable"
    assert reasons(result)["j"].endswith("role r cannot get its ports: node a has no 3 "
                                         "free ports from 20008")
    assert placed_ids(result) == ["next"]
    assert cluster.nodes["a"].used_ports == {20000}
