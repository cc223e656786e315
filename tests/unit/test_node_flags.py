"""An admin's hold on a node (shared/domain/cluster.py): how a change moves the
flags, and the state the API shows from them, its heartbeat and its tasks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.cluster import NODE_STATES, NodeFlags, change_flags, node_view_state

NOW = 1_700_000_000_000
READY = NodeFlags()
CORDONED = NodeFlags(schedulable=False, reason="bad fan", by="root", at_ms=1)
DRAINING = NodeFlags(schedulable=False, drain=True, reason="reboot", by="root", at_ms=1)


@pytest.mark.parametrize(("current", "change", "after"), [
    pytest.param(READY, {"schedulable": False, "reason": "bad fan"},
                 (False, False, "bad fan"), id="cordon"),
    pytest.param(READY, {"drain": True}, (False, True, ""), id="drain cordons too"),
    pytest.param(READY, {"schedulable": False, "drain": True, "reason": "r"},
                 (False, True, "r"), id="cordon and drain at once"),
    pytest.param(CORDONED, {"drain": True}, (False, True, "bad fan"),
                 id="drain a cordoned node: its reason stays"),
    pytest.param(CORDONED, {"drain": True, "reason": "rma"}, (False, True, "rma"),
                 id="a new reason replaces the old"),
    pytest.param(DRAINING, {"schedulable": True}, (True, False, ""),
                 id="uncordon ends the drain and forgets the reason"),
    pytest.param(DRAINING, {"schedulable": True, "drain": False}, (True, False, ""),
                 id="uncordon said in full"),
    pytest.param(DRAINING, {"drain": False}, (False, False, "reboot"),
                 id="ending a drain alone leaves the node cordoned"),
    pytest.param(DRAINING, {"schedulable": False}, (False, True, "reboot"),
                 id="cordoning a draining node keeps it draining"),
    pytest.param(CORDONED, {"schedulable": False, "drain": False}, (False, False, "bad fan"),
                 id="cordon only"),
    pytest.param(READY, {"drain": False}, (True, False, ""),
                 id="ending a drain on a ready node changes nothing"),
    pytest.param(READY, {"schedulable": True, "reason": "ignored"}, (True, False, ""),
                 id="a schedulable node keeps no reason"),
])
def test_change_flags(current: NodeFlags, change: dict[str, object],
                      after: tuple[bool, bool, str]) -> None:
    given = {"schedulable": None, "drain": None, "reason": None, **change}
    flags = change_flags(current, by="admin", now_ms=NOW, **given)  # type: ignore[arg-type]
    assert (flags.schedulable, flags.drain, flags.reason) == after
    assert (flags.by, flags.at_ms) == ("admin", NOW)
    assert flags.accepts_work == (after[:2] == (True, False))


@pytest.mark.parametrize(("schedulable", "drain", "message"), [
    pytest.param(None, None, "say schedulable or drain", id="nothing asked"),
    pytest.param(True, True, "cannot be schedulable", id="schedulable and draining"),
])
def test_changes_that_mean_nothing_are_refused(schedulable: bool | None, drain: bool | None,
                                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        change_flags(READY, schedulable=schedulable, drain=drain, reason=None, by="a",
                     now_ms=NOW)


@pytest.mark.parametrize(("condition", "flags", "tasks", "state"), [
    pytest.param("READY", READY, 3, "READY", id="ready"),
    pytest.param("READY", CORDONED, 3, "CORDONED", id="cordoned, tasks run on"),
    pytest.param("READY", CORDONED, 0, "CORDONED", id="cordoned and empty"),
    pytest.param("READY", DRAINING, 2, "DRAINING", id="draining while tasks remain"),
    pytest.param("READY", DRAINING, 0, "DRAINED", id="drained once empty"),
    pytest.param("LOST", DRAINING, 0, "LOST", id="lost wins over drained"),
    pytest.param("LOST", CORDONED, 1, "LOST", id="lost wins over cordoned"),
    pytest.param("LOST", READY, 0, "LOST", id="lost"),
    pytest.param("NOT_READY", CORDONED, 1, "NOT_READY", id="not ready wins over cordoned"),
    pytest.param("SETTLING", READY, 0, "SETTLING", id="settling"),
    pytest.param("UNREACHABLE", READY, 2, "UNREACHABLE", id="unreachable"),
    pytest.param("RECONCILING", DRAINING, 2, "RECONCILING", id="reconciling"),
])
def test_node_view_state(condition: str, flags: NodeFlags, tasks: int, state: str) -> None:
    assert node_view_state(condition, flags, tasks) == state
    assert state in NODE_STATES


def test_flags_round_trip_through_json_and_ignore_unknown_fields() -> None:
    assert NodeFlags.from_json(DRAINING.to_json()) == DRAINING
    assert NodeFlags.from_json('{"schedulable": false, "later": 1}') == \
        NodeFlags(schedulable=False)


CHANGES = st.tuples(st.sampled_from([None, True, False]), st.sampled_from([None, True, False]),
                    st.sampled_from([None, "", "fan"]))


@given(st.lists(CHANGES, max_size=12))
def test_any_sequence_of_changes_keeps_the_flags_coherent(
        changes: list[tuple[bool | None, bool | None, str | None]]) -> None:
    """Whatever admins do in whatever order: a draining node never takes work,
    a node that takes work keeps no reason, and `schedulable: true` always
    brings a node back."""
    flags = READY
    for schedulable, drain, reason in changes:
        try:
            flags = change_flags(flags, schedulable=schedulable, drain=drain, reason=reason,
                                 by="a", now_ms=NOW)
        except ValueError:
            assert (schedulable, drain) in ((None, None), (True, True))
            continue
        assert not (flags.drain and flags.schedulable)
        assert flags.accepts_work == flags.schedulable
        assert not (flags.accepts_work and flags.reason)
        if drain:
            assert flags.drain and not flags.accepts_work
    back = change_flags(flags, schedulable=True, drain=None, reason=None, by="a", now_ms=NOW)
    assert back == NodeFlags(by="a", at_ms=NOW)
