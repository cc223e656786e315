"""shared/domain/cluster.py: node liveness, what allocations hold, per-VC usage and
whether placements fit: the one judgement every service uses."""

from __future__ import annotations

import pytest

from shared.domain.cluster import (
    Held,
    can_ever_hold,
    gpus_by_vc,
    held,
    held_by_vc,
    node_is_live,
    node_state,
    placement_fits,
)
from shared.domain.models import Allocation, Gpu, Node, TaskPlacement


def node(gpus: int = 4, cpus: int = 16, memory: int = 1000) -> Node:
    return Node("n1", "127.0.0.1", cpus, memory, [Gpu(i) for i in range(gpus)])


def alloc(index: int, gpus: tuple[int, ...] = (), cpus: int = 1, memory: int = 100,
          ports: tuple[int, ...] = (), vc: str = "default") -> Allocation:
    return Allocation("job", 0, "main", index, "n1", gpus, cpus, memory, ports, vc)


def placement(index: int, gpus: tuple[int, ...] = (), cpus: int = 1, memory: int = 100,
              ports: tuple[int, ...] = ()) -> TaskPlacement:
    return TaskPlacement("main", index, "n1", "127.0.0.1", gpus, cpus, memory,
                         {"http": list(ports)} if ports else {})


@pytest.mark.parametrize(("age_ms", "live"), [
    pytest.param(0, True, id="a heartbeat just now is live"),
    pytest.param(29_999, True, id="one ms before the limit is live"),
    pytest.param(30_000, False, id="at the limit exactly it is lost"),
    pytest.param(90_000, False, id="long silent is lost"),
    pytest.param(-5, True, id="a clock a little ahead is live"),
])
def test_node_is_live_until_its_heartbeat_is_as_old_as_the_limit(age_ms: int, live: bool) -> None:
    now = 1_000_000
    assert node_is_live(now - age_ms, now, 30.0) is live
    assert node_state(now - age_ms, now, 30.0) == ("READY" if live else "LOST")


def test_held_sums_what_the_allocations_hold() -> None:
    total = held([alloc(0, (0, 1), cpus=2, memory=300, ports=(15000,)),
                  alloc(1, (3,), cpus=1, memory=50)])
    assert (sorted(total.gpus), total.ports, total.cpus, total.memory_mb, total.tasks) == \
        ([0, 1, 3], [15000], 3, 350, 2)
    assert total.free_gpus(node()) == [2]
    assert total.used_gpus(node()) == {0, 1, 3}


def test_a_gpu_the_node_no_longer_reports_is_not_counted_as_used() -> None:
    total = held([alloc(0, (1, 7))])
    assert total.used_gpus(node(gpus=4)) == {1}
    assert total.free_gpus(node(gpus=4)) == [0, 2, 3]


def test_usage_per_vc() -> None:
    allocations = [alloc(0, (0,), vc="a"), alloc(1, (1, 2), cpus=4, vc="b"),
                   alloc(2, (), cpus=3, memory=10, vc="a")]
    by_vc = held_by_vc(allocations)
    assert {vc: (len(h.gpus), h.cpus, h.memory_mb, h.tasks) for vc, h in by_vc.items()} == \
        {"a": (1, 4, 110, 2), "b": (2, 4, 100, 1)}
    assert gpus_by_vc(allocations) == {"a": 1, "b": 2}
    assert held_by_vc([]) == {}


@pytest.mark.parametrize(("allocations", "placements", "fits"), [
    pytest.param([alloc(0, (0,))], [placement(1, (1, 2))], True, id="free GPUs fit"),
    pytest.param([alloc(0, (0,))], [placement(1, (0,))], False, id="a held GPU twice"),
    pytest.param([], [placement(0, (1,)), placement(1, (1,))], False,
                 id="one GPU to two placements"),
    pytest.param([], [placement(0, (4,))], False, id="a GPU the node does not have"),
    pytest.param([alloc(0, cpus=10)], [placement(1, cpus=6)], True, id="CPUs exactly full"),
    pytest.param([alloc(0, cpus=10)], [placement(1, cpus=7)], False, id="one CPU too many"),
    pytest.param([alloc(0, memory=900)], [placement(1, memory=101)], False,
                 id="memory over the node's"),
    pytest.param([alloc(0, ports=(15000,))], [placement(1, ports=(15000,))], False,
                 id="a held port twice"),
    pytest.param([alloc(0, ports=(15000,))], [placement(1, ports=(15001,))], True,
                 id="another port"),
    pytest.param([], [], True, id="nothing fits anywhere"),
])
def test_placement_fits(allocations: list[Allocation], placements: list[TaskPlacement],
                        fits: bool) -> None:
    assert placement_fits(node(), allocations, placements) is fits


def test_held_fits_on_catches_what_was_already_double_booked() -> None:
    """A node whose records already hold one GPU twice fits nothing more."""
    assert not held([alloc(0, (1,)), alloc(1, (1,))]).fits_on(node())
    assert Held().fits_on(node(gpus=0, cpus=0, memory=0))


@pytest.mark.parametrize(("gpus", "cpus", "memory", "fits"), [
    pytest.param(4, 16, 1000, True, id="the whole node"),
    pytest.param(5, 1, 1, False, id="more GPUs than it has"),
    pytest.param(0, 17, 1, False, id="more CPUs than it has"),
    pytest.param(0, 1, 1001, False, id="more memory than it has"),
])
def test_can_ever_hold_judges_an_empty_node(gpus: int, cpus: int, memory: int,
                                            fits: bool) -> None:
    assert can_ever_hold(node(), gpus, cpus, memory) is fits
