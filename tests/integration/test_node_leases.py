"""Node leases on a real Redis (shared/state/leases.py): one holder per node
name, renewals stamped by Redis's clock, an impostor refused and harmless."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from shared.domain.lease import Claim, Phase
from shared.domain.models import Node
from shared.state import keys, leases
from shared.state.leases import Holder, NameLost, Role
from shared.state.store import Store

pytestmark = pytest.mark.redis

TERMS = {"lease_ms": 30_000, "grace_ms": 10_000, "renew_ms": 5_000}


def holder(node: str, engine: str, role: Role = Role.MONITOR, pid: int = 4242) -> Holder:
    return Holder(node=node, engine=engine, role=role, instance=uuid.uuid4().hex, pid=pid)


def claim(store: Store, who: Holder, ip: str = "10.1.0.1", live_ms: int = 60_000,
          force: bool = False) -> Claim:
    return leases.claim(store, who, ip=ip, peer=f"{ip}:9188", live_ms=live_ms, force=force,
                        **TERMS).claim


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    return Store(redis_client)


@pytest.fixture
def node() -> str:
    return f"gpu-{uuid.uuid4().hex[:8]}"


def test_a_claim_and_its_renewals_are_stamped_with_redis_time(store: Store, node: str) -> None:
    first = holder(node, "engine-a")
    before = leases.redis_now_ms(store.r)
    assert claim(store, first) == Claim.TAKEN
    stamped = leases.renew(store, first, live_ms=60_000, phase=Phase.READY).stamped_ms
    after = leases.redis_now_ms(store.r)
    assert before <= stamped <= after
    assert store.r.zscore(keys.NODES, node) == stamped
    lease = leases.read_lease(store.r, node)
    assert lease is not None
    assert (lease.engine, lease.ip, lease.peer, lease.phase) == \
        ("engine-a", "10.1.0.1", "10.1.0.1:9188", Phase.READY)
    assert lease.renewed_ms == stamped and lease.claimed_ms <= stamped


def test_the_nodes_version_moves_when_who_the_nodes_are_changes_and_only_then(
        store: Store, node: str) -> None:
    """Nodes read their peers again only when this version moved: a new node,
    a new peer address, a node declared lost and a node back each move it;
    renewals do not."""
    def version() -> int:
        return int(store.r.get(keys.NODES_VERSION) or 0)

    monitor, launcher = holder(node, "engine-a"), holder(node, "engine-a", Role.LAUNCHER)
    start = version()
    assert claim(store, monitor) == Claim.TAKEN  # a new node
    assert claim(store, launcher) == Claim.TAKEN  # its other process, at the same address
    renewal = leases.renew(store, monitor, live_ms=60_000)
    assert version() == renewal.nodes_version == start + 1
    last = leases.renew(store, launcher, live_ms=60_000)  # the node's last renewal
    assert last.nodes_version == start + 1

    assert leases.mark_lost(store, node, last.stamped_ms)
    assert version() == start + 2
    assert leases.mark_lost(store, node, last.stamped_ms)  # judged again: already lost
    assert version() == start + 2
    back = leases.renew(store, monitor, live_ms=60_000)
    assert back.nodes_version == version() == start + 3
    assert claim(store, monitor, ip="10.1.0.2") == Claim.TAKEN  # restarted on a new address
    assert leases.renew(store, monitor, live_ms=60_000).nodes_version == start + 4
    assert claim(store, monitor, ip="10.1.0.2") == Claim.TAKEN  # the same again: no change
    assert version() == start + 4


def test_a_second_machine_with_a_taken_name_is_refused_and_harms_nothing(
        store: Store, node: str) -> None:
    first = holder(node, "engine-a")
    assert claim(store, first, ip="10.1.0.1") == Claim.TAKEN
    leases.renew(store, first, live_ms=60_000, inventory=Node(node, "10.1.0.1", 8, 1024)
                 .to_dict())
    impostor = holder(node, "engine-b")
    answer = leases.claim(store, impostor, ip="10.1.0.2", peer="10.1.0.2:9188",
                          live_ms=60_000, **TERMS)
    assert answer.claim == Claim.HELD_ELSEWHERE
    assert "engine-a" in answer.refusal(node, "monitor")
    assert "10.1.0.1" in answer.refusal(node, "monitor")
    # Its renewal, had it gone on anyway, writes nothing: the IP does not flip.
    with pytest.raises(NameLost):
        leases.renew(store, impostor, live_ms=60_000,
                     inventory=Node(node, "10.1.0.2", 8, 1024).to_dict())
    lease = leases.read_lease(store.r, node)
    assert lease is not None and (lease.engine, lease.ip) == ("engine-a", "10.1.0.1")
    assert store.get_node(node) is not None and store.get_node(node).ip == "10.1.0.1"


def test_another_machine_takes_the_name_only_once_the_lease_is_dead(
        store: Store, node: str) -> None:
    first = holder(node, "engine-a")
    assert claim(store, first, live_ms=300) == Claim.TAKEN
    second = holder(node, "engine-b")
    deadline = time.monotonic() + 10
    outcome = claim(store, second, ip="10.1.0.2")
    while outcome != Claim.TAKEN and time.monotonic() < deadline:
        assert outcome == Claim.HELD_ELSEWHERE
        time.sleep(0.05)  # time passing is what is tested: the lease runs out
        outcome = claim(store, second, ip="10.1.0.2")
    assert outcome == Claim.TAKEN
    with pytest.raises(NameLost):  # the old holder, back, finds its name taken
        leases.renew(store, first, live_ms=300)
    lease = leases.read_lease(store.r, node)
    assert lease is not None and (lease.engine, lease.ip) == ("engine-b", "10.1.0.2")


def test_a_second_process_of_one_role_on_one_machine_is_noticed(
        store: Store, node: str) -> None:
    running = holder(node, "engine-a", pid=111)
    assert claim(store, running) == Claim.TAKEN
    restarted = holder(node, "engine-a", pid=222)
    answer = leases.claim(store, restarted, ip="10.1.0.1", peer="", live_ms=60_000, **TERMS)
    assert answer.claim == Claim.ROLE_HELD and answer.holder["pid"] == "111"
    # Its caller found pid 111 dead (killed): it takes the role over.
    assert claim(store, restarted, force=True) == Claim.TAKEN
    with pytest.raises(NameLost):
        leases.renew(store, running, live_ms=60_000)
    leases.renew(store, restarted, live_ms=60_000)


def test_the_launcher_and_the_monitor_of_one_machine_share_the_name(
        store: Store, node: str) -> None:
    monitor, launcher = holder(node, "engine-a"), holder(node, "engine-a", Role.LAUNCHER)
    assert claim(store, monitor) == Claim.TAKEN
    assert leases.claim(store, launcher, ip="10.1.0.1", peer="", live_ms=60_000,
                        **TERMS).claim == Claim.TAKEN
    leases.renew(store, launcher, live_ms=60_000)
    leases.renew(store, monitor, live_ms=60_000)
    lease = leases.read_lease(store.r, node)
    assert lease is not None and lease.peer == "10.1.0.1:9188"  # the launcher kept it
    assert lease.launcher_renewed_ms > 0


def test_a_problem_cleared_and_a_return_start_the_settling_time(store: Store,
                                                                node: str) -> None:
    monitor = holder(node, "engine-a")
    assert claim(store, monitor) == Claim.TAKEN
    leases.renew(store, monitor, live_ms=60_000, phase=Phase.READY, problem="")
    lease = leases.read_lease(store.r, node)
    assert lease is not None and lease.healthy_since_ms == 0  # a new node: nothing to settle
    leases.renew(store, monitor, live_ms=60_000, problem="Docker engine did not answer")
    assert leases.read_lease(store.r, node).problem == "Docker engine did not answer"
    cleared = leases.renew(store, monitor, live_ms=60_000, problem="").stamped_ms
    assert leases.read_lease(store.r, node).healthy_since_ms == cleared
    back = leases.renew(store, monitor, live_ms=60_000, back=True).stamped_ms
    assert leases.read_lease(store.r, node).healthy_since_ms == back


def test_a_joining_node_whose_first_problem_clears_does_not_settle(store: Store,
                                                                     node: str) -> None:
    """A node that starts before the control plane wrote the storage's
    identity (every service of a box started at once) has a problem from
    its first renewal; once it clears, the node is joining, not flapping: no
    settling time. Once it has served, a problem that clears settles."""
    monitor = holder(node, "engine-a")
    assert claim(store, monitor) == Claim.TAKEN
    leases.renew(store, monitor, live_ms=60_000, problem="storage has no .pai-cluster file")
    leases.renew(store, monitor, live_ms=60_000, phase=Phase.READY,
                 problem="storage has no .pai-cluster file")
    leases.renew(store, monitor, live_ms=60_000, phase=Phase.READY, problem="")
    lease = leases.read_lease(store.r, node)
    assert lease is not None and lease.healthy_since_ms == 0

    leases.renew(store, monitor, live_ms=60_000, problem="storage has no .pai-cluster file")
    cleared = leases.renew(store, monitor, live_ms=60_000, problem="").stamped_ms
    assert leases.read_lease(store.r, node).healthy_since_ms == cleared


def test_the_control_plane_declares_a_node_lost_only_if_it_did_not_renew_since(
        store: Store, node: str) -> None:
    monitor = holder(node, "engine-a")
    assert claim(store, monitor) == Claim.TAKEN
    seen = int(store.r.zscore(keys.NODES, node))
    renewed = leases.renew(store, monitor, live_ms=60_000).stamped_ms
    assert renewed >= seen
    if renewed > seen:
        assert not leases.mark_lost(store, node, seen)
    for _ in range(1000):  # the control plane judges in a later millisecond than the renewal
        if leases.redis_now_ms(store.r) > renewed:
            break
    assert leases.mark_lost(store, node, renewed)
    view = leases.read_cluster(store)
    assert view.silences[node].declared_lost
    leases.renew(store, monitor, live_ms=60_000)  # it comes back: no longer lost
    assert not leases.read_cluster(store).silences[node].declared_lost


def test_the_control_plane_marks_only_nodes_with_a_lease(store: Store, node: str) -> None:
    store.register_node(Node(node, "10.1.0.1", 8, 1024))  # set up by hand: no lease
    assert not leases.mark_node(store, node, "a launch was not started", 1)
    assert leases.read_lease(store.r, node) is None
    monitor = holder(node, "engine-a")
    assert claim(store, monitor) == Claim.TAKEN
    assert leases.mark_node(store, node, "a launch was not started", 123)
    lease = leases.read_lease(store.r, node)
    assert lease is not None and (lease.marked, lease.marked_until_ms) == (
        "a launch was not started", 123)
