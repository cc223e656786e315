"""Admin flags on nodes in Redis (Store.set_node_flags / node_flags): kept
apart from the node's record, changed by compare-and-set."""

from __future__ import annotations

import pytest
import redis

from shared.domain.cluster import NodeFlags
from shared.domain.models import Node
from shared.state import keys
from shared.state.store import NodeNotFound, Pipe, Store

pytestmark = pytest.mark.redis


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    store = Store(redis_client)
    for name in ("n1", "n2"):
        store.register_node(Node(name, "127.0.0.1", cpus=4, memory_mb=4000))
    return store


def test_a_node_nobody_flagged_is_not_listed(store: Store) -> None:
    assert store.node_flags() == {}


def test_cordon_drain_and_uncordon(store: Store) -> None:
    cordoned = store.set_node_flags("n1", schedulable=False, reason="bad fan", by="root")
    assert store.node_flags() == {"n1": cordoned}
    assert (cordoned.schedulable, cordoned.drain, cordoned.reason, cordoned.by) == \
        (False, False, "bad fan", "root") and cordoned.at_ms > 0
    draining = store.set_node_flags("n2", drain=True, by="ops")
    assert store.node_flags() == {"n1": cordoned, "n2": draining}
    assert store.set_node_flags("n1", schedulable=True, by="root").accepts_work
    assert store.node_flags() == {"n2": draining}


def test_flags_survive_the_launcher_rewriting_its_record(store: Store) -> None:
    flags = store.set_node_flags("n1", drain=True, reason="reboot", by="root")
    store.register_node(Node("n1", "127.0.0.1", cpus=8, memory_mb=8000))
    assert store.node_flags() == {"n1": flags}


def test_an_unknown_node_cannot_be_flagged(store: Store, redis_client: redis.Redis) -> None:
    with pytest.raises(NodeNotFound):
        store.set_node_flags("ghost", schedulable=False, by="root")
    assert not redis_client.exists(keys.NODE_FLAGS)


def test_a_meaningless_change_writes_nothing(store: Store) -> None:
    store.set_node_flags("n1", schedulable=False, reason="kept", by="root")
    with pytest.raises(ValueError):
        store.set_node_flags("n1", schedulable=True, drain=True, by="root")
    assert store.node_flags()["n1"].reason == "kept"


def test_clear_node_flags(store: Store) -> None:
    store.set_node_flags("n1", schedulable=False, by="root")
    assert store.clear_node_flags("n1") is True
    assert store.clear_node_flags("n1") is False
    assert store.node_flags() == {}


def test_a_change_is_decided_on_the_flags_as_they_are_at_commit(
        store: Store, redis_client: redis.Redis) -> None:
    """Two admins at once: one cordons with a reason while the other starts a
    drain. The drain, decided on the flags it read, must not commit over the
    cordon and lose its reason: it is decided again on fresh flags."""
    real_transact = store.transact
    raced = False

    def transact_with_a_rival(fn: object, *watch: str) -> NodeFlags:
        def rival_first(pipe: Pipe) -> NodeFlags:
            nonlocal raced
            result: NodeFlags = fn(pipe)  # type: ignore[operator]
            if not raced:
                raced = True
                redis_client.hset(keys.NODE_FLAGS, "n1", NodeFlags(
                    schedulable=False, reason="bad fan", by="other", at_ms=1).to_json())
            return result
        return real_transact(rival_first, *watch)

    store.transact = transact_with_a_rival  # type: ignore[method-assign,assignment]
    flags = store.set_node_flags("n1", drain=True, by="root")
    assert raced
    assert (flags.drain, flags.reason) == (True, "bad fan")
    assert Store(redis_client).node_flags() == {"n1": flags}
