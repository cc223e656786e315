"""shared/domain/lease.py: when a node is lost, when the control plane is out,
when a node fences itself, and how a node stands. Times in ms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.domain.lease import (
    LOST_MARGIN_MS,
    ClusterView,
    Condition,
    FenceAction,
    Lease,
    LeaseTerms,
    NodeSilence,
    Outage,
    PeerReport,
    Phase,
    condition_of,
    fence_action,
    judge_nodes,
    unready_of,
)

TERMS = LeaseTerms(lease_ms=30_000, grace_ms=10_000, renew_ms=5_000)
FLOOR = 60_000
NOW = 10_000_000
SETTLE = 30_000


def lease(**fields: object) -> Lease:
    values: dict[str, object] = {"engine": "e", "terms": TERMS, "phase": Phase.READY,
                                 "claimed_ms": 1, "launcher_renewed_ms": NOW - 1_000}
    values.update(fields)
    return Lease(**values)  # type: ignore[arg-type]


def node(silent_for: int, **fields: object) -> NodeSilence:
    return NodeSilence(NOW - silent_for, lease(**fields))


def test_the_control_plane_waits_for_lease_grace_and_margin_or_its_floor() -> None:
    assert TERMS.lost_after_ms(FLOOR) == FLOOR
    assert TERMS.lost_after_ms(0) == 30_000 + 10_000 + LOST_MARGIN_MS
    assert TERMS.quiet_after_ms == 15_000


@pytest.mark.parametrize(("silences", "outage", "lost", "in_outage"), [
    pytest.param({"a": 61_000, "b": 1_000, "c": 2_000}, Outage(checked_ms=NOW - 5_000),
                 ("a",), False, id="one of three silent past its time is lost"),
    pytest.param({"a": 59_000, "b": 1_000, "c": 2_000}, Outage(checked_ms=NOW - 5_000),
                 (), False, id="silent but not yet past its time"),
    pytest.param({"a": 61_000, "b": 1_000, "c": 2_000}, Outage(checked_ms=NOW - 14_000),
                 ("a",), False, id="a late round is no gap: the lost are still lost"),
    pytest.param({"a": 90_000, "b": 90_000, "c": 1_000}, Outage(checked_ms=NOW - 5_000),
                 (), True, id="two of three silent at once: the control plane is out"),
    pytest.param({"a": 90_000, "b": 1_000}, Outage(checked_ms=NOW - 5_000),
                 ("a",), False, id="one of two is no majority"),
    pytest.param({"a": 90_000}, Outage(checked_ms=NOW - 5_000),
                 (), True, id="a lone node silent: nowhere else to run anyway"),
    pytest.param({"a": 90_000, "b": 90_000, "c": 90_000}, Outage(checked_ms=NOW - 95_000),
                 (), False, id="nobody judged for 95 s: everyone's silence counts from now"),
    pytest.param({"a": 90_000, "b": 1_000, "c": 1_000}, Outage(since_ms=NOW - 60_000,
                                                                checked_ms=NOW - 5_000),
                 (), False, id="an outage ending gives the last silent node its time again"),
])
def test_judge_nodes(silences: dict[str, int], outage: Outage, lost: tuple[str, ...],
                     in_outage: bool) -> None:
    judged = judge_nodes({name: node(s) for name, s in silences.items()}, NOW, outage, FLOOR)
    assert judged.lost == lost
    assert judged.outage.in_progress == in_outage


def test_an_outage_begins_once_and_ends_with_a_grace_for_every_node() -> None:
    nodes = {name: node(90_000) for name in "abc"}
    begun = judge_nodes(nodes, NOW, Outage(checked_ms=NOW - 5_000), FLOOR)
    assert begun.outage_began and begun.outage.since_ms == NOW and begun.lost == ()
    again = judge_nodes(nodes, NOW + 5_000, begun.outage, FLOOR)
    assert not again.outage_began and again.outage.since_ms == NOW
    back = {"a": NodeSilence(NOW + 9_000, lease()), "b": NodeSilence(NOW + 9_500, lease()),
            "c": node(90_000)}
    ended = judge_nodes(back, NOW + 10_000, again.outage, FLOOR)
    assert ended.outage_ended and not ended.outage.in_progress and ended.lost == ()
    assert ended.outage.ended_ms == NOW + 10_000
    outage, lost_at = ended.outage, None
    for now in range(NOW + 15_000, NOW + 10_000 + 2 * FLOOR, 5_000):  # a round every 5 s
        renewing = {**back, "a": NodeSilence(now - 2_000, lease()),
                    "b": NodeSilence(now - 1_000, lease())}
        judged = judge_nodes(renewing, now, outage, FLOOR)
        outage = judged.outage
        if judged.lost:
            assert judged.lost == ("c",)
            lost_at = now
            break
    assert lost_at == NOW + 10_000 + FLOOR  # a whole floor after the outage ended


def test_a_node_that_joined_after_the_silence_began_does_not_outvote_the_silent() -> None:
    """a and b went silent together; d joined since: a and b are still two of
    three of the nodes that held leases when they went quiet."""
    nodes = {"a": node(90_000), "b": node(90_000), "c": node(1_000),
             "d": NodeSilence(NOW - 1_000, lease(claimed_ms=NOW - 20_000))}
    judged = judge_nodes(nodes, NOW, Outage(checked_ms=NOW - 5_000), FLOOR)
    assert judged.outage.in_progress and judged.lost == ()


def test_a_node_declared_lost_counts_no_more_until_it_renews() -> None:
    nodes = {"a": node(900_000, lost_ms=NOW - 800_000), "b": node(90_000),
             "c": node(1_000), "d": node(1_000)}
    judged = judge_nodes(nodes, NOW, Outage(checked_ms=NOW - 5_000), FLOOR)
    assert judged.lost == ("b",) and not judged.outage.in_progress


@pytest.mark.parametrize(("silence", "fields", "condition"), [
    pytest.param(1_000, {}, Condition.READY, id="renewing and healthy"),
    pytest.param(16_000, {}, Condition.UNREACHABLE, id="missed three renewals"),
    pytest.param(61_000, {}, Condition.LOST, id="silent past its time"),
    pytest.param(5_000, {"lost_ms": NOW - 2_000, "claimed_ms": 1}, Condition.LOST,
                 id="declared lost and not renewed since"),
    pytest.param(1_000, {"problem": "Docker engine did not answer in 10 s"},
                 Condition.NOT_READY, id="its own check failed"),
    pytest.param(1_000, {"marked": "a launch was not started", "marked_until_ms": NOW + 1},
                 Condition.NOT_READY, id="the control plane's mark"),
    pytest.param(1_000, {"marked": "a launch was not started", "marked_until_ms": NOW},
                 Condition.READY, id="a mark that ran out"),
    pytest.param(1_000, {"launcher_renewed_ms": 0}, Condition.NOT_READY,
                 id="no launcher yet"),
    pytest.param(1_000, {"launcher_renewed_ms": NOW - 20_000}, Condition.NOT_READY,
                 id="its launcher stopped renewing"),
    pytest.param(1_000, {"phase": Phase.RECONCILING}, Condition.RECONCILING,
                 id="reconciling after joining"),
    pytest.param(1_000, {"healthy_since_ms": NOW - 10_000}, Condition.SETTLING,
                 id="back from a problem for 10 s of 30"),
    pytest.param(1_000, {"healthy_since_ms": NOW - 30_000}, Condition.READY,
                 id="settled"),
])
def test_condition_of(silence: int, fields: dict[str, object], condition: Condition) -> None:
    judged, reason = condition_of(node(silence, **fields), NOW, Outage(), FLOOR, SETTLE)
    assert judged == condition
    assert (reason == "") == (condition == Condition.READY)


def test_a_node_without_a_lease_has_only_its_renewals() -> None:
    assert condition_of(NodeSilence(NOW - 1_000, None), NOW, Outage(), FLOOR, SETTLE) == \
        (Condition.READY, "")
    assert condition_of(NodeSilence(NOW - 70_000, None), NOW, Outage(), FLOOR, SETTLE)[0] == \
        Condition.LOST


def test_the_nodes_that_may_not_take_work_are_every_node_not_ready_with_its_reason() -> None:
    view = ClusterView({"ok": node(1_000), "sick": node(1_000, problem="storage not mounted"),
                        "quiet": node(40_000), "joining": node(1_000, phase=Phase.RECONCILING),
                        "marked": node(1_000, marked="launches overdue",
                                       marked_until_ms=NOW + 5_000)},
                       Outage(), NOW)
    unready = unready_of(view, FLOOR, SETTLE)
    assert sorted(unready) == ["joining", "marked", "quiet", "sick"]
    assert "storage not mounted" in unready["sick"]
    assert "launches overdue" in unready["marked"]


def test_during_an_outage_a_silent_node_is_unreachable_not_lost() -> None:
    outage = Outage(since_ms=NOW - 100_000)
    assert condition_of(node(200_000), NOW, outage, FLOOR, SETTLE)[0] == Condition.UNREACHABLE


@pytest.mark.parametrize(("silence", "known", "peers", "action"), [
    pytest.param(29_000, 3, [], FenceAction.RUN, id="within its lease"),
    pytest.param(30_000, 3, [PeerReport("b", None), PeerReport("c", None)], FenceAction.FENCE,
                 id="cut off alone: no peer answers"),
    pytest.param(30_000, 3, [PeerReport("b", 1_000), PeerReport("c", None)], FenceAction.FENCE,
                 id="a peer still reaches the control plane"),
    pytest.param(30_000, 3, [PeerReport("b", 31_000), PeerReport("c", 30_500)],
                 FenceAction.HOLD, id="every node cut off alike: the control plane is out"),
    pytest.param(30_000, 3, [PeerReport("b", 31_000), PeerReport("c", None)], FenceAction.HOLD,
                 id="two of three cut off together"),
    pytest.param(30_000, 4, [PeerReport("b", 31_000), PeerReport("c", None),
                             PeerReport("d", None)], FenceAction.FENCE,
                 id="two of four is no majority"),
    pytest.param(30_000, 1, [], FenceAction.HOLD, id="a lone node: nowhere else to run"),
])
def test_fence_action(silence: int, known: int, peers: list[PeerReport],
                      action: FenceAction) -> None:
    assert fence_action(silence, TERMS, known, peers) == action


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 9).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.integers(0, 3), min_size=n, max_size=n))))
def test_a_node_the_control_plane_declares_lost_never_holds(case: tuple[int, list[int]]) -> None:
    """A partition: each node is in group 0 (with the control plane) or in an
    island of nodes that reach each other but not the control plane. Every
    node the control plane declares lost fences itself (it never holds, so
    its jobs never run twice), and a node that holds is never declared lost."""
    size, groups = case
    names = [f"n{i}" for i in range(size)]
    silent = 10 * TERMS.lost_after_ms(FLOOR)
    silences = {name: node(silent if group else 1_000) for name, group in zip(names, groups,
                                                                           strict=True)}
    judged = judge_nodes(silences, NOW, Outage(checked_ms=NOW - 5_000), FLOOR)
    for name, group in zip(names, groups, strict=True):
        if group == 0:
            continue
        island = [other for other, g in zip(names, groups, strict=True)
                  if g == group and other != name]
        answers = [PeerReport(other, silent) for other in island]
        answers += [PeerReport(other, None) for other in names
                    if other != name and other not in island]
        action = fence_action(silent, TERMS, size, answers)
        if name in judged.lost:
            assert action == FenceAction.FENCE
        if action == FenceAction.HOLD:
            assert name not in judged.lost and judged.outage.in_progress
