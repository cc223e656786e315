"""pai across real hosts under the faults of a real network (docs/multi-node.md).

A control-plane host and three node hosts (tests/cluster/platform.py); the
observer asks every node's engine what runs. Each test injects one fault,
checks the invariants (never two live copies of a task past the fencing
bound, no GPU or port used twice, nothing lost) and records what it measured
(`figures`): the overlap, the time to run the work again elsewhere, the jobs
restarted.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

import pytest

from bench.live_platform import BIN
from shared.infra.supervise import EXIT_REFUSED
from tests.cluster.conftest import FAULT_SECONDS, OUTAGE_SECONDS
from tests.cluster.platform import (
    ADMIN,
    FENCE_BOUND_SECONDS,
    LOST_AFTER_SECONDS,
    Cluster,
    skewed_clock,
)
from tests.support.platform import GATE_FILE, gate

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.redis]

FOREVER = "while true; do sleep 1; done"


def settle(cluster: Cluster, names: list[str]) -> None:
    """Stop these jobs and wait for them to end; every node READY again."""
    for name in names:
        cluster.stop_job(name)
    cluster.wait(lambda: all(cluster.job(n)["jobStatus"]["state"] in ("STOPPED", "SUCCEEDED",
                                                                       "FAILED") for n in names),
                 "the test's jobs to end")
    cluster.wait(lambda: all(n["state"] == "READY" for n in cluster.node_views()),
                 "every node to be READY")


def check_invariants(cluster: Cluster) -> None:
    assert cluster.observer is not None
    assert cluster.observer.doubly_used() == []
    over = {task: seconds for task, seconds in cluster.observer.overlaps().items()
            if seconds > FENCE_BOUND_SECONDS}
    assert over == {}, f"two live copies of a task for longer than the bound: {over}"


def restarted(cluster: Cluster, names: list[str]) -> int:
    """How many of these jobs moved past their first attempt."""
    return sum(cluster.job(name)["jobStatus"]["attemptIndex"] > 0 for name in names)


def test_a_second_agent_with_a_taken_name_is_refused_and_harms_nothing(
        cluster: Cluster, figures: dict[str, Any]) -> None:
    cluster.submit("steady", FOREVER)
    node = cluster.wait(lambda: cluster.running_on("steady"), "steady to run")[0]
    other = next(name for name in cluster.nodes if name != node)
    before = cluster.node_view(node)
    # Another machine (another engine) started with the taken name.
    impostor = subprocess.run(
        cluster.nodes[other].nsenter(str(BIN / "pai-node-agent")),
        env=cluster.agent_env(other, node_name=node), capture_output=True, text=True,
        timeout=120)
    assert impostor.returncode == EXIT_REFUSED, impostor.stderr[-2000:]
    assert f"node name {node!r} is held by another machine's agent" in impostor.stderr
    after = cluster.node_view(node)
    assert (after["ip"], after["state"]) == (before["ip"], "READY")
    assert cluster.running_on("steady") == [node]
    # the rightful agent still answers the node's calls, from its own host
    answer = cluster.exec("steady", ["sh", "-c", "echo reached; exit 4"])
    assert (answer["exitCode"], answer["output"]) == (4, "reached\n")
    detail = cluster.job("steady")["jobStatus"]
    assert (detail["attemptIndex"], detail["platformRetries"]) == (0, 0)
    figures["two agents, one name"] = {"refused with": impostor.returncode,
                                       "jobs restarted": restarted(cluster, ["steady"])}
    settle(cluster, ["steady"])
    check_invariants(cluster)


def test_a_partitioned_node_fences_before_its_work_runs_elsewhere(
        cluster: Cluster, figures: dict[str, Any]) -> None:
    cluster.submit("cut-off", FOREVER)
    node = cluster.wait(lambda: cluster.running_on("cut-off"), "cut-off to run")[0]
    host = cluster.nodes[node]
    cut_at = time.monotonic()
    cluster.hosts.cut(host, cluster.cp.ip)
    try:
        moved = cluster.wait(lambda: cluster.running_on("cut-off", attempt=1),
                             "the job to run again elsewhere", LOST_AFTER_SECONDS + 60)
        rescheduled = time.monotonic() - cut_at
        assert moved[0] != node
        remaining = FAULT_SECONDS - (time.monotonic() - cut_at)
        if remaining > 0:
            time.sleep(remaining)  # the partition lasts its length: time is the fault here
    finally:
        cluster.hosts.heal([host])
    healed_at = time.monotonic()
    cluster.wait(lambda: cluster.node_view(node)["state"] == "READY",
                 "the node to reconcile, settle and be READY")
    assert cluster.observer is not None
    task = ("admin~cut-off", "main", "0")
    stale = [s for s in cluster.observer.sightings() if s.task == task and s.attempt == "0"]
    assert stale and all(s.last < healed_at for s in stale), "a stale container ran after heal"
    overlap = cluster.observer.overlaps().get(task, 0.0)
    detail = cluster.job("cut-off")
    assert detail["jobStatus"]["retries"] == 0
    assert detail["attempts"][0]["platformFailure"] is True
    figures["node cut off"] = {"overlap s": round(overlap, 1),
                               "rescheduled after s": round(rescheduled, 1),
                               "cut for s": round(healed_at - cut_at, 1)}
    settle(cluster, ["cut-off"])
    check_invariants(cluster)


def test_the_control_plane_cut_off_from_every_node_restarts_nothing(
        cluster: Cluster, figures: dict[str, Any]) -> None:
    names = [f"steady-{i}" for i in range(3)]
    for name in names:
        cluster.submit(name, FOREVER)
    for name in names:
        cluster.wait(lambda name=name: cluster.running_on(name),  # type: ignore[misc]
                     f"{name} to run")
    cut_at = time.monotonic()
    for host in cluster.nodes.values():
        cluster.hosts.cut(cluster.cp, host.ip)
    try:
        cluster.wait(lambda: all(n["state"] == "UNREACHABLE" for n in cluster.node_views()),
                     "every node to be unreachable")
        while time.monotonic() - cut_at < max(OUTAGE_SECONDS, LOST_AFTER_SECONDS + 10):
            assert not [n for n in cluster.node_views() if n["state"] == "LOST"]
            time.sleep(1)
    finally:
        cluster.hosts.heal([cluster.cp])
    healed_at = time.monotonic()
    cluster.wait(lambda: all(n["state"] == "READY" for n in cluster.node_views()),
                 "every node READY again")
    again = restarted(cluster, names)
    assert again == 0
    assert all(cluster.running_on(name) for name in names)
    assert cluster.observer is not None
    # the nodes may be READY within a fraction of a second of the heal: the
    # observer's sightings count once it has looked at every engine since
    observer = cluster.observer
    cluster.wait(lambda: observer.looked_since(healed_at), "the observer's look after the heal")
    for sighting in cluster.observer.sightings():
        if sighting.task[0] in {f"admin~{n}" for n in names}:
            assert sighting.last > healed_at, f"{sighting.task} stopped during the outage"
    figures["control plane cut off"] = {"for s": round(healed_at - cut_at, 1),
                                        "jobs restarted": again}
    settle(cluster, names)
    check_invariants(cluster)


def test_redis_down_for_minutes_restarts_nothing_and_loses_no_exit(
        cluster: Cluster, figures: dict[str, Any]) -> None:
    cluster.submit("through", FOREVER)
    cluster.submit("ends-meanwhile", gate() + "echo done")  # ends once Redis is down
    for name in ("through", "ends-meanwhile"):
        cluster.wait(lambda name=name: cluster.running_on(name),  # type: ignore[misc]
                     f"{name} to run")
    down_at = time.monotonic()
    cluster.processes.stop("redis", signal.SIGKILL)
    (cluster.storage / ADMIN[0] / "ends-meanwhile" / "output" / GATE_FILE).touch()
    time.sleep(max(OUTAGE_SECONDS, LOST_AFTER_SECONDS + 10))  # Redis is down that long
    cluster.start_redis()
    up_at = time.monotonic()
    ended = cluster.wait(lambda: cluster.job("ends-meanwhile")["jobStatus"]["state"] == "SUCCEEDED",
                         "the exit during the outage to be recorded")
    assert ended
    cluster.wait(lambda: all(n["state"] == "READY" for n in cluster.node_views()),
                 "every node READY again")
    assert cluster.running_on("through") is not None
    again = restarted(cluster, ["through", "ends-meanwhile"])
    assert again == 0
    figures["redis down"] = {"for s": round(up_at - down_at, 1), "jobs restarted": again,
                             "exit recorded after s": round(time.monotonic() - up_at, 1)}
    settle(cluster, ["through"])
    check_invariants(cluster)


def test_a_lossy_network_causes_no_false_node_loss(cluster: Cluster,
                                                   figures: dict[str, Any]) -> None:
    cluster.submit("lossy", FOREVER)
    cluster.wait(lambda: cluster.running_on("lossy"), "lossy to run")
    for host in cluster.nodes.values():
        cluster.hosts.lossy(host, 0.05)
    began = time.monotonic()
    worst = set()
    try:
        cluster.submit("during-loss", "sleep 2")
        while time.monotonic() - began < FAULT_SECONDS:
            worst |= {n["state"] for n in cluster.node_views()}
            time.sleep(1)
        cluster.wait(lambda: cluster.job("during-loss")["jobStatus"]["state"] == "SUCCEEDED",
                     "a job submitted during the loss to succeed")
    finally:
        cluster.hosts.heal(list(cluster.nodes.values()))
    assert "LOST" not in worst
    again = restarted(cluster, ["lossy", "during-loss"])
    assert again == 0
    figures["5% loss"] = {"for s": round(time.monotonic() - began, 1),
                          "node states seen": sorted(worst), "jobs restarted": again}
    settle(cluster, ["lossy"])
    check_invariants(cluster)


def test_a_node_whose_clock_is_minutes_off_changes_nothing(
        cluster: Cluster, figures: dict[str, Any]) -> None:
    skewed = "n3"
    cluster.stop_agent(skewed)
    # Its wall clock 5 minutes behind (its monotonic clock is never compared
    # across hosts, and stays the machine's).
    cluster.start_agent(skewed, extra_env=skewed_clock(-300))
    try:
        cluster.wait(lambda: cluster.node_view(skewed)["state"] == "READY", "the skewed node")
        for name in cluster.nodes:
            if name != skewed:
                cluster.cordon(name, False)
        submitted = time.time() * 1000
        cluster.submit("on-skewed", "sleep 3")
        cluster.wait(lambda: cluster.job("on-skewed")["jobStatus"]["state"] == "SUCCEEDED",
                     "the job on the skewed node")
        finished = time.time() * 1000
        detail = cluster.job("on-skewed")
        task = detail["taskRoles"]["main"]["taskStatuses"][0]
        assert task["containerNodeName"] == skewed
        status = detail["jobStatus"]
        # Stamps in the control plane's time (this machine's clock), not 5 minutes off.
        for stamp in (status["createdTime"], status["completedTime"]):
            assert submitted - 5_000 <= stamp <= finished + 5_000
        assert 2_000 <= status["completedTime"] - detail["attempts"][0]["startedTime"] <= 60_000
        assert cluster.node_view(skewed)["state"] == "READY"
        usage = cluster.http.get(f"{cluster.url}/api/v1/usage",
                                 params={"user": ADMIN[0], "groupBy": "job"}, timeout=10)
        rows = [r for r in usage.json().get("rows", []) if r.get("job") == "admin~on-skewed"]
        assert rows and 2 <= rows[0]["gpuSeconds"] <= 120
        figures["clock 5 min off"] = {"job took s": (status["completedTime"] -
                                                     status["createdTime"]) / 1000,
                                      "gpu seconds charged": rows[0]["gpuSeconds"],
                                      "jobs restarted": restarted(cluster, ["on-skewed"])}
    finally:
        for name in cluster.nodes:
            cluster.cordon(name, True)
        cluster.stop_agent(skewed)
        cluster.start_agent(skewed)
    cluster.wait(lambda: cluster.node_view(skewed)["state"] == "READY", "the node, clock fixed")
    check_invariants(cluster)


def test_a_node_whose_engine_hangs_is_taken_out_and_its_gang_placed_elsewhere(
        cluster: Cluster, figures: dict[str, Any]) -> None:
    hung, spare = "n2", "n1"
    cluster.cordon(spare, False)
    cluster.engines[hung].freeze()
    frozen_at = time.monotonic()
    try:
        cluster.submit("gang", FOREVER, tasks=2, gpus=2)  # two whole nodes
        cluster.wait(lambda: cluster.node_view(hung)["state"] == "NOT_READY",
                     "the hung engine's node to be NOT_READY")
        noticed = time.monotonic() - frozen_at
        cluster.wait(lambda: cluster.job("gang")["jobStatus"]["attemptIndex"] >= 1,
                     "the gang's first attempt to be given back")
        cluster.cordon(spare, True)
        placed = cluster.wait(lambda: cluster.running_on("gang", attempt=1),
                              "the gang to run on the other nodes")
        replaced = time.monotonic() - frozen_at
        assert hung not in placed
        detail = cluster.job("gang")
        assert detail["jobStatus"]["retries"] == 0
        assert "not ready" in detail["attempts"][0]["reason"]
    finally:
        cluster.engines[hung].thaw()
        cluster.cordon(spare, True)
    cluster.wait(lambda: cluster.node_view(hung)["state"] == "READY",
                 "the node, its engine back, to settle and be READY")
    figures["engine hung"] = {"not ready after s": round(noticed, 1),
                              "gang running elsewhere after s": round(replaced, 1)}
    settle(cluster, ["gang"])
    check_invariants(cluster)


def test_a_node_without_the_shared_storage_takes_no_work(
        cluster: Cluster, figures: dict[str, Any]) -> None:
    """n3's agent runs where the storage root is an empty local folder (its
    NFS mount missing): the node says NOT_READY with that reason, and no job
    lands there."""
    bare = "n3"
    cluster.stop_agent(bare)
    storage = str(cluster.storage)
    cluster.start_agent(bare, prefix=(  # the agent's path follows, as $0
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        f'mount -t tmpfs tmpfs "{storage}" && exec "$0"'))
    try:
        view = cluster.wait(lambda: (found := cluster.node_view(bare))["state"] == "NOT_READY"
                            and "not mounted there" in found["conditionReason"] and found,
                            "the node without its storage to be NOT_READY, saying why")
        for name in cluster.nodes:
            if name != bare:
                cluster.cordon(name, False)
        cluster.submit("needs-storage", "sleep 1")
        waiting = cluster.wait(lambda: (status := cluster.job("needs-storage")["jobStatus"])
                               .get("waitingReason") and status, "a pass to leave the job waiting")
        assert waiting["state"] == "WAITING"
        assert cluster.node_view(bare)["state"] == "NOT_READY"
        figures["storage missing"] = {"node state": view["state"],
                                      "reason": view["conditionReason"],
                                      "job while only that node took work": waiting["state"]}
    finally:
        for name in cluster.nodes:
            cluster.cordon(name, True)
        cluster.stop_agent(bare)
        cluster.start_agent(bare)
    cluster.wait(lambda: cluster.node_view(bare)["state"] == "READY", "the node, storage back")
    cluster.wait(lambda: cluster.job("needs-storage")["jobStatus"]["state"] == "SUCCEEDED",
                 "the job, placed once nodes take work")
    check_invariants(cluster)
