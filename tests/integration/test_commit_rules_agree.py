"""The batch commit's Lua script (shared/state/placing.py) and the Python
fit (shared/domain/cluster.py `placement_fits`) give the same answer on
random nodes, holdings and gangs: a placement constraint written in one and
not the other fails here.

The model: gangs are bound in order, each when every node it uses still
fits it beside what the node held and the gangs bound before it."""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import replace

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.domain.cluster import placement_fits
from shared.domain.models import Allocation, Gpu, Node, TaskPlacement
from shared.state.lifecycle import submit_job
from shared.state.placing import PlacementCommit, commit_placements
from shared.state.store import Store

pytestmark = pytest.mark.redis

NODES = ("n1", "n2")
GPU_INDEXES = st.integers(min_value=0, max_value=4)  # node GPUs 0..3: 4 is none of them
PORTS = st.lists(st.integers(min_value=20000, max_value=20003), max_size=2)


@st.composite
def nodes(draw: st.DrawFn) -> dict[str, Node]:
    return {name: Node(name, "127.0.0.1",
                       cpus=draw(st.integers(min_value=1, max_value=8)),
                       memory_mb=draw(st.integers(min_value=256, max_value=4096)),
                       gpus=[Gpu(i) for i in range(draw(st.integers(min_value=0, max_value=4)))],
                       port_range=(20000, 20100))
            for name in NODES}


@st.composite
def holdings(draw: st.DrawFn) -> list[Allocation]:
    return [Allocation(job_id="old~held", attempt=0, role="main", index=index,
                       node=draw(st.sampled_from(NODES)),
                       gpus=tuple(draw(st.lists(GPU_INDEXES, max_size=2))),
                       cpus=draw(st.integers(min_value=0, max_value=4)),
                       memory_mb=draw(st.integers(min_value=0, max_value=2048)),
                       ports=tuple(draw(PORTS)))
            for index in range(draw(st.integers(min_value=0, max_value=3)))]


@st.composite
def gang(draw: st.DrawFn) -> list[TaskPlacement]:
    return [TaskPlacement(role="main", index=index, node=draw(st.sampled_from(NODES)),
                          ip="127.0.0.1", gpus=tuple(draw(st.lists(GPU_INDEXES, max_size=2))),
                          cpus=draw(st.integers(min_value=1, max_value=4)),
                          memory_mb=draw(st.integers(min_value=128, max_value=2048)),
                          ports={"default": draw(PORTS)})
            for index in range(draw(st.integers(min_value=1, max_value=2)))]


def model(cluster: dict[str, Node], held: list[Allocation],
          gangs: list[list[TaskPlacement]]) -> list[bool]:
    """Each gang binds if every node it uses fits it beside what is held."""
    holding: dict[str, list[Allocation]] = defaultdict(list)
    for alloc in held:
        holding[alloc.node].append(alloc)
    answers = []
    for number, placements in enumerate(gangs):
        by_node: dict[str, list[TaskPlacement]] = defaultdict(list)
        for p in placements:
            by_node[p.node].append(p)
        fits = all(placement_fits(cluster[name], holding[name], parts)
                   for name, parts in by_node.items())
        answers.append(fits)
        if fits:
            for p in placements:
                holding[p.node].append(Allocation(
                    job_id=f"gang~{number}", attempt=0, role=p.role, index=p.index, node=p.node,
                    gpus=p.gpus, cpus=p.cpus, memory_mb=p.memory_mb, ports=p.all_ports))
    return answers


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cluster=nodes(), held=holdings(), gangs=st.lists(gang(), min_size=1, max_size=3))
def test_the_lua_commit_and_the_python_fit_agree(
        redis_client: redis.Redis, cluster: dict[str, Node], held: list[Allocation],
        gangs: list[list[TaskPlacement]]) -> None:
    # Names of this example's own: the test's Redis user may not flush it
    run = uuid.uuid4().hex[:8]
    cluster = {f"{run}-{name}": replace(node, name=f"{run}-{name}")
               for name, node in cluster.items()}
    held = [replace(a, node=f"{run}-{a.node}", job_id=f"old~{run}") for a in held]
    gangs = [[replace(p, node=f"{run}-{p.node}") for p in placements] for placements in gangs]
    store = Store(redis_client)
    for node in cluster.values():
        store.register_node(node)
    for alloc in held:
        store.write_allocation(redis_client, alloc)
    commits = []
    for number, placements in enumerate(gangs):
        job = submit_job(store, "alice", {
            "jobName": f"g{run}-{number}", "image": "busybox",
            "taskRoles": [{"name": "main", "taskNumber": len(placements), "cpuNumber": 1,
                           "memoryMB": 128, "gpuNumber": 0, "command": "true"}]})
        commits.append(PlacementCommit(job.id, job.version, job.attempt, tuple(placements),
                                       queue_seq=job.queue_seq, vc=job.virtual_cluster))

    bound = commit_placements(store, commits, launch_deadline_ms=2**41)

    assert bound == model(cluster, held, gangs)
