"""Nodes through the API on a real Redis: what each shows (GPU model and
topology, free and used), and admins cordoning, draining and uncordoning."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from shared.domain.models import Allocation, Gpu, Node
from shared.state import keys
from shared.state.store import Store
from tests.support.api import AuthedClient, error_of

pytestmark = pytest.mark.redis

NODE = "/api/v1/nodes/n1"


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    """Node n1 with 4 GPUs in two NVLink pairs, as its launcher reports it."""
    store = Store(redis_client)
    store.register_node(Node("n1", "127.0.0.1", cpus=8, memory_mb=8000, gpus=[
        Gpu(i, f"GPU-{i}", "NVIDIA H100", 81920, group=i // 2) for i in range(4)]))
    return store


def hold(store: Store, gpus: tuple[int, ...] = (0,)) -> Allocation:
    """A task holding part of n1, as the scheduler's commit writes it."""
    alloc = Allocation("alice~train", 0, "main", 0, "n1", gpus, 2, 1000, ())
    pipe = store.r.pipeline()
    store.write_allocation(pipe, alloc)
    pipe.execute()
    return alloc


def view(client: AuthedClient) -> dict[str, Any]:
    resp = client.get(NODE)
    assert resp.status_code == 200, resp.json
    one: dict[str, Any] = resp.json
    listed = client.get("/api/v1/nodes").json
    assert listed == [one]  # the list and the one node agree
    return one


def put(client: AuthedClient, body: dict[str, Any]) -> dict[str, Any]:
    resp = client.put(NODE, json=body)
    assert resp.status_code == 200, resp.json
    answer: dict[str, Any] = resp.json
    return answer


def test_a_node_shows_its_gpus_model_topology_and_use(store: Store, alice: AuthedClient) -> None:
    hold(store, gpus=(1,))
    node = view(alice)
    assert [(g["model"], g["group"], g["used"]) for g in node["gpus"]] == [
        ("NVIDIA H100", 0, False), ("NVIDIA H100", 0, True), ("NVIDIA H100", 1, False),
        ("NVIDIA H100", 1, False)]
    assert (node["gpuTotal"], node["gpuUsed"], node["gpuFree"]) == (4, 1, 3)
    assert (node["state"], node["schedulable"], node["draining"]) == ("READY", True, False)
    assert (node["cordonReason"], node["cordonedBy"], node["cordonedTime"]) == ("", None, None)


def test_cordon_drain_and_uncordon(store: Store, admin: AuthedClient,
                                   alice: AuthedClient) -> None:
    """READY -> CORDONED -> DRAINING (a task still there) -> DRAINED (gone) -> READY."""
    alloc = hold(store)
    cordoned = put(admin, {"schedulable": False, "reason": "fan noise"})
    assert (cordoned["state"], cordoned["schedulable"], cordoned["draining"],
            cordoned["cordonReason"], cordoned["cordonedBy"]) == (
        "CORDONED", False, False, "fan noise", "root")
    assert isinstance(cordoned["cordonedTime"], int)
    assert view(alice) == cordoned  # everyone sees it

    draining = put(admin, {"drain": True})
    assert (draining["state"], draining["draining"], draining["cordonReason"]) == (
        "DRAINING", True, "fan noise")
    assert store.release_allocation("n1", alloc.key)  # its task has gone
    assert view(alice)["state"] == "DRAINED"

    ready = put(admin, {"schedulable": True})
    assert (ready["state"], ready["schedulable"], ready["draining"], ready["cordonReason"]) \
        == ("READY", True, False, "")
    assert store.node_flags() == {}


def test_a_lost_node_is_lost_whatever_an_admin_set(store: Store, admin: AuthedClient,
                                                   redis_client: redis.Redis) -> None:
    put(admin, {"drain": True})
    redis_client.zadd(keys.NODES, {"n1": 1})  # its last heartbeat, long ago
    node = view(admin)
    assert (node["state"], node["draining"]) == ("LOST", True)


def test_only_an_admin_may_cordon_or_drain(store: Store, alice: AuthedClient) -> None:
    """Threat: a user cordons every node but the ones their jobs use, or drains
    a node to have other users' jobs preempted off it. 403, nothing changed."""
    for body in ({"schedulable": False}, {"drain": True}, {"schedulable": True}):
        assert error_of(alice.put(NODE, json=body), 403) == "ForbiddenUserError"
    assert store.node_flags() == {}
    assert view(alice)["state"] == "READY"


def test_an_unknown_node_is_404(store: Store, admin: AuthedClient) -> None:
    assert error_of(admin.get("/api/v1/nodes/ghost"), 404) == "NoNodeError"
    assert error_of(admin.put("/api/v1/nodes/ghost", json={"schedulable": False}),
                    404) == "NoNodeError"
    assert store.node_flags() == {}


@pytest.mark.parametrize("body", [
    pytest.param({}, id="nothing asked"),
    pytest.param({"reason": "why"}, id="only a reason"),
    pytest.param({"schedulable": True, "drain": True}, id="schedulable and draining"),
    pytest.param({"schedulable": "false"}, id="a string for a flag"),
    pytest.param({"drain": 1}, id="a number for a flag"),
    pytest.param({"schedulable": None}, id="null for a flag"),
    pytest.param({"schedulable": False, "reason": "x" * 513}, id="reason too long"),
    pytest.param({"schedulable": False, "reason": 5}, id="reason not a string"),
    pytest.param({"schedulable": False, "cordon": True}, id="an unknown field"),
    pytest.param([False], id="not an object"),
])
def test_a_bad_body_is_400_and_changes_nothing(store: Store, admin: AuthedClient,
                                               body: Any) -> None:
    assert error_of(admin.put(NODE, json=body), 400) == "BadRequestError"
    assert store.node_flags() == {}


def test_a_body_that_is_not_json_is_400(store: Store, admin: AuthedClient) -> None:
    resp = admin.put(NODE, data="schedulable=false", content_type="application/json")
    assert error_of(resp, 400) == "BadRequestError"


def test_prometheus_finds_every_nodes_exporter_through_the_api(
        store: Store, flask_client: Any) -> None:
    """HTTP service discovery (/prometheus/targets): public, as /metrics is,
    each node's exporter with its name and condition as labels."""
    store.register_node(Node("n2", "10.0.0.2", cpus=8, memory_mb=8000,
                             exporter="10.0.0.2:9187"))
    resp = flask_client.get("/prometheus/targets")
    assert resp.status_code == 200
    assert resp.json == [{"targets": ["10.0.0.2:9187"],
                          "labels": {"node": "n2", "pai_node_condition": "READY"}}]
