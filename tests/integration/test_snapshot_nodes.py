"""What a pass's snapshot reads of the nodes (shared/state/store/nodes.py
`snapshot`): their records, parsed once per text and handed out as copies
with each snapshot's heartbeats, and their allocations and leases, read a
script call per READ_MANY hashes, each back on its own node."""

from __future__ import annotations

import uuid

import pytest

from services.scheduler.service import Scheduler
from shared.domain.models import Gpu, Node
from shared.state import keys, leases
from shared.state.leases import Holder, Role
from shared.state.lifecycle import submit_job
from shared.state.store import Store
from tests.support.scheduling import add_node, config, scheduler, store

pytestmark = pytest.mark.redis
__all__ = ["scheduler", "store"]  # the fixtures, used by name


def node(name: str, gpus: int) -> Node:
    return Node(name, "127.0.0.1", cpus=16, memory_mb=32000,
                gpus=[Gpu(i) for i in range(gpus)], port_range=(20000, 20100))


def test_a_record_parsed_before_is_a_copy_with_this_snapshots_heartbeat(store: Store) -> None:
    store.register_node(node("n1", 2))
    known: dict[str, Node] = {}
    first = store.snapshot(nodes_known=known).nodes
    store.r.zadd(keys.NODES, {"n1": first[0].heartbeat_ms + 5_000})  # a renewal
    second = store.snapshot(nodes_known=known).nodes

    assert second[0].heartbeat_ms == first[0].heartbeat_ms + 5_000
    assert second[0] is not first[0] and first[0].heartbeat_ms != second[0].heartbeat_ms
    assert [n.heartbeat_ms for n in known.values()] == [0]  # the one kept never changes
    assert second[0].gpus == first[0].gpus


def test_a_record_written_again_is_parsed_again_and_only_todays_texts_are_kept(
        store: Store) -> None:
    store.register_node(node("n1", 2))
    store.register_node(node("n2", 2))
    known: dict[str, Node] = {}
    store.snapshot(nodes_known=known)
    store.register_node(node("n1", 4))  # its inventory changed
    store.r.delete(keys.node("n2"))  # its record gone

    nodes = store.snapshot(nodes_known=known).nodes
    assert [(n.name, len(n.gpus)) for n in nodes] == [("n1", 4)]
    assert [(n.name, len(n.gpus)) for n in known.values()] == [("n1", 4)]


def test_each_nodes_allocations_and_lease_come_back_on_it_across_script_calls(
        store: Store, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shared.state.store.nodes.READ_MANY", 3)  # 10 hashes: 4 calls
    names = ["n1", "n2", "n3", "n4", "n5"]
    for name in names:
        add_node(store, name, gpus=1)
    for name in ("n2", "n5"):
        holder = Holder(node=name, engine=f"engine-of-{name}", role=Role.MONITOR,
                        instance=uuid.uuid4().hex, pid=4242)
        leases.claim(store, holder, ip="10.1.0.1", peer="10.1.0.1:9188", live_ms=60_000,
                     lease_ms=30_000, grace_ms=10_000, renew_ms=5_000)
    for i in range(3):
        submit_job(store, "alice", config(f"j{i}"))
    scheduler.run_pass()

    snapshot = store.snapshot()
    by_node = {name: sorted(a.job_id for a in allocs)
               for name, allocs in snapshot.allocations.items()}
    assert by_node == {name: sorted(key.rsplit(":", 3)[0]
                                    for key in store.r.hkeys(keys.node_alloc(name)))
                       for name in names}
    assert sum(len(held) for held in by_node.values()) == 3
    engines = {name: silence.lease.engine if silence.lease else None
               for name, silence in snapshot.cluster.silences.items()}
    assert engines == {"n1": None, "n2": "engine-of-n2", "n3": None, "n4": None,
                       "n5": "engine-of-n5"}
