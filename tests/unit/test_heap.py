"""The collector around passes (services/scheduler/heap.py): paused inside,
survivors frozen after, a thaw that collects what was frozen."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest

from services.scheduler import heap
from services.scheduler.heap import paused_gc


class Node:
    """A weak-referenceable object that can sit in a cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def thawed_heap(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts and ends with nothing frozen and the collector on,
    and the next thaw THAW_SECONDS away."""
    monkeypatch.setattr(heap, "_thawed_at", time.monotonic())
    gc.unfreeze()
    gc.enable()
    yield
    gc.unfreeze()
    gc.enable()


def test_the_collector_is_off_inside_and_back_on_after() -> None:
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():  # nested: only the last to leave turns it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with paused_gc(freeze_survivors=True):
        pass
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_plain_pause_freezes_nothing() -> None:
    ref = cycle()
    with paused_gc():
        pass
    gc.collect()
    assert ref() is None


def test_what_survives_a_freezing_pass_is_frozen_and_refcounting_still_frees_it() -> None:
    with paused_gc(freeze_survivors=True):
        kept = [Node() for _ in range(100)]
        dropped = weakref.ref(kept[0])
    assert gc.get_freeze_count() >= 100
    del kept
    assert dropped() is None  # no collector needed


def test_a_frozen_cycle_lives_until_the_thaw(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = cycle()
    with paused_gc(freeze_survivors=True):
        pass
    gc.collect()
    assert ref() is not None  # frozen: the collector does not look at it
    monkeypatch.setattr(heap, "THAW_SECONDS", 0.0)  # the thaw is due at the next pass's end
    with paused_gc(freeze_survivors=True):
        pass
    assert ref() is None
    assert gc.isenabled()


def test_the_last_pauser_freezes_when_any_pauser_of_the_span_asked() -> None:
    with paused_gc():
        with paused_gc(freeze_survivors=True):
            pass
        assert gc.get_freeze_count() == 0  # not yet: a pauser is still inside
        kept = Node()
    assert gc.get_freeze_count() > 0
    assert kept.other is None
