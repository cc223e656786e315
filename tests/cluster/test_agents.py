"""Fifty lightweight node agents on five test hosts, across the network from
the control plane (Redis and the real `pai-scheduler` on their own host).

Each host runs `python -m bench.lightagent`: ten nodes' leases, renewed by
the real `LeaseKeeper` and the launcher's renewals, no Docker. What must
hold: every node registers and stays live through a steady window (none
judged lost), the scheduler fills all fifty with 1-GPU jobs, and when one
host is cut off from the control plane its ten nodes, and only they, are
declared lost. The figures (the scheduler's pass time from its own
histogram, Redis's CPU in all and per node, how long the lost judgement
took) go to the tier's `figures`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench import cpu_seconds
from bench.lightagent import GPUS_PER_NODE
from bench.live_platform import BIN
from shared.state import keys, leases, telemetry
from shared.state.lifecycle import submit_job
from shared.state.store import Store
from tests.cluster.hosts import Host, can_make_hosts
from tests.cluster.platform import TIMINGS, Cluster, wait_for

HOSTS = 5
AGENTS_PER_HOST = 10
NODES = HOSTS * AGENTS_PER_HOST
# The steady window: 5 s in `make test`, longer in `make test-cluster`.
WINDOW_SECONDS = float(os.environ.get("PAI_CLUSTER_AGENT_SECONDS", "5"))
JOB = {"image": "busybox", "taskRoles": [{
    "name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 1000,
    "gpuNumber": 1, "command": "sleep 3600"}]}


@dataclass
class Fleet:
    cluster: Cluster
    hosts: dict[str, Host]
    store: Store

    def nodes_of(self, host: str) -> set[str]:
        return {f"{host}-{i:03d}" for i in range(AGENTS_PER_HOST)}

    def live(self) -> set[str]:
        """Nodes whose monitor lease renewed within its term, as the repair round reads them."""
        view = leases.read_cluster(self.store)
        return {name for name, silence in view.silences.items()
                if silence.lease is not None
                and view.now_ms - silence.renewed_ms < silence.lease.terms.lease_ms}

    def lost(self) -> set[str]:
        return set(self.store.r.smembers(keys.NODES_LOST))

    def allocated_gpus(self) -> dict[str, int]:
        names = sorted(n for host in self.hosts for n in self.nodes_of(host))
        return {name: sum(len(a.gpus) for a in allocations)
                for name, allocations in self.store.all_allocations(names).items()}

    def pass_histogram(self) -> tuple[float, int]:
        """The scheduler's pass durations recorded so far: (seconds in all, passes)."""
        (values,) = telemetry.read_recorded(self.store.r, [telemetry.SCHEDULER_PASS])
        total = sum(h.total for h in values.histograms.values())
        return total, sum(h.count for h in values.histograms.values())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    reason = can_make_hosts()
    if reason:
        pytest.fail(f"the multi-host tier needs test hosts: {reason}")
    work: Path = tmp_path_factory.mktemp("agents")
    cluster = Cluster(work, nodes=0)
    hosts = {f"a{i}": cluster.hosts.add(f"a{i}") for i in range(1, HOSTS + 1)}
    store: Store | None = None
    try:
        cluster.start_redis()
        store = Store.from_url(cluster.redis_url)
        # Nothing starts the placed tasks: a launch timeout past the run, or
        # after 20 s the scheduler would take every node for unready and
        # place the jobs again, and the figures would measure that.
        cluster.processes.start("scheduler", cluster.cp.nsenter(str(BIN / "pai-scheduler")),
                                cluster.env(PAI_LAUNCH_TIMEOUT_SECONDS="3600"))
        for name, host in hosts.items():
            cluster.processes.start(
                f"agents-{name}",
                host.nsenter(sys.executable, "-m", "bench.lightagent", "--prefix", f"{name}-",
                             "--count", str(AGENTS_PER_HOST), "--ip", host.ip),
                cluster.env())
        yield Fleet(cluster, hosts, store)
    finally:
        if store is not None:
            store.r.close()
        left = cluster.close()
        assert left == [], left  # every namespace, link and rule torn down


def test_fifty_agents_stay_live_take_work_and_only_a_cut_host_is_lost(
        fleet: Fleet, figures: dict[str, Any]) -> None:
    cluster = fleet.cluster
    every = {n for host in fleet.hosts for n in fleet.nodes_of(host)}
    wait_for(lambda: fleet.live() == every, f"all {NODES} nodes to renew their leases", 60)

    began, before_fill = time.monotonic(), fleet.pass_histogram()
    for n in range(NODES * GPUS_PER_NODE):
        submit_job(fleet.store, f"user{n % 8}", {**JOB, "jobName": f"fill-{n:04d}"})
    wait_for(lambda: set(fleet.allocated_gpus().values()) == {GPUS_PER_NODE},
             f"every GPU of the {NODES} nodes to be allocated", 120)
    filled = time.monotonic() - began
    fill_total, fill_passes = _minus(fleet.pass_histogram(), before_fill)

    redis_pid = cluster.processes.pid("redis")
    cpu, (pass_total, passes) = cpu_seconds(redis_pid), fleet.pass_histogram()
    window_began = time.monotonic()
    while time.monotonic() - window_began < WINDOW_SECONDS:
        assert fleet.lost() == set(), "a node was judged lost while every host was up"
        time.sleep(1)
    window = time.monotonic() - window_began
    cpu = cpu_seconds(redis_pid) - cpu
    pass_total, passes = _minus(fleet.pass_histogram(), (pass_total, passes))
    assert fleet.live() == every

    cut = fleet.hosts[f"a{HOSTS}"]
    cut_at = time.monotonic()
    cluster.hosts.cut(cut, cluster.cp.ip)
    try:
        wait_for(lambda: fleet.lost() == fleet.nodes_of(cut.name),
                 f"{cut.name}'s nodes, and only they, to be declared lost", 90)
        lost_after = time.monotonic() - cut_at
    finally:
        cluster.hosts.heal([cut])
    assert fleet.live() >= every - fleet.nodes_of(cut.name)

    figures["50 lightweight agents on 5 hosts"] = {
        "heartbeat s": float(TIMINGS["PAI_HEARTBEAT_SECONDS"]),
        "400 jobs placed in s": round(filled, 1),
        "passes placing them": fill_passes,
        "placing pass mean ms": _mean_ms(fill_total, fill_passes),
        "steady window s": round(window, 1),
        "passes in the window": passes,
        "window pass mean ms": _mean_ms(pass_total, passes),
        "Redis CPU %": round(cpu / window * 100, 2),
        "Redis CPU ms/s per node": round(cpu / window * 1000 / NODES, 3),
        "cut host's 10 nodes lost after s": round(lost_after, 1),
    }


def _minus(after: tuple[float, int], before: tuple[float, int]) -> tuple[float, int]:
    return after[0] - before[0], after[1] - before[1]


def _mean_ms(total: float, count: int) -> float | None:
    return round(total / count * 1000, 1) if count else None
