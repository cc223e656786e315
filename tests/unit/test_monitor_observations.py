"""What Docker's states and events mean for a task."""

from __future__ import annotations

from typing import Any

import pytest

from services.monitor.observations import (
    UNKNOWN_EXIT_CODE,
    ContainerEvent,
    EventKind,
    ExitObservation,
    Phase,
    describe,
    describe_exit,
    exit_from_event_code,
    parse_container_event,
    phase_of,
)
from shared.node.containers import TaskRef, task_labels


@pytest.mark.parametrize(
    ("state", "memory", "expected"),
    [
        pytest.param({"ExitCode": 0}, None, ExitObservation(0, "exit code 0"), id="success"),
        pytest.param({"ExitCode": 3}, None, ExitObservation(3, "exit code 3"), id="failure"),
        pytest.param({"ExitCode": 137, "OOMKilled": True}, 256 * 1024 * 1024,
                     ExitObservation(137, "OOMKilled: exceeded memoryMB (256 MB)"),
                     id="oom names the limit"),
        pytest.param({"ExitCode": 137, "OOMKilled": True}, 0,
                     ExitObservation(137, "OOMKilled: exceeded memoryMB"), id="oom without limit"),
        pytest.param({"ExitCode": 137}, None,
                     ExitObservation(137, "exit code 137 (killed by SIGKILL)"), id="sigkill"),
        pytest.param({"ExitCode": 143}, None,
                     ExitObservation(143, "exit code 143 (killed by SIGTERM)"), id="sigterm"),
        pytest.param({"ExitCode": 255}, None, ExitObservation(255, "exit code 255"),
                     id="255 is no signal"),
        pytest.param({"ExitCode": 127, "Error": "exec: \"nope\": not found"}, None,
                     ExitObservation(127, 'exit code 127: exec: "nope": not found'),
                     id="docker error"),
        pytest.param({"Status": "dead"}, None,
                     ExitObservation(UNKNOWN_EXIT_CODE, "exit code -1"), id="no exit code"),
    ],
)
def test_describe_exit(state: dict[str, Any], memory: int | None,
                       expected: ExitObservation) -> None:
    assert describe_exit(state, memory) == expected


@pytest.mark.parametrize(
    ("raw", "code"),
    [pytest.param("3", 3, id="code"), pytest.param(None, UNKNOWN_EXIT_CODE, id="missing"),
     pytest.param("x", UNKNOWN_EXIT_CODE, id="garbage")],
)
def test_exit_from_event_code(raw: str | None, code: int) -> None:
    observation = exit_from_event_code(raw)
    assert observation.exit_code == code
    assert "removed before" in observation.diagnostics


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        ("running", Phase.RUNNING), ("paused", Phase.RUNNING), ("restarting", Phase.RUNNING),
        ("exited", Phase.EXITED), ("dead", Phase.EXITED),
        ("created", Phase.CREATED), ("removing", Phase.LEAVE), (None, Phase.LEAVE),
    ],
)
def test_phase_of(status: str | None, phase: Phase) -> None:
    assert phase_of(status) == phase


REF = TaskRef("alice~mnist", 2, "worker", 1)
LABELS = task_labels(REF, node="node-a", username="alice", vc="default")


def _event(action: str, **attributes: str) -> dict[str, Any]:
    return {"Type": "container", "Action": action, "status": action, "id": "abc",
            "Actor": {"ID": "abc", "Attributes": {**LABELS, **attributes}},
            "time": 1700000000, "timeNano": 1700000000123456789}


def test_parse_die_event() -> None:
    assert parse_container_event(_event("die", exitCode="3")) == ContainerEvent(
        EventKind.DIE, "abc", REF, "3", 1700000000)


def test_parse_start_event_of_a_foreign_container() -> None:
    event = {"Type": "container", "Action": "start", "Actor": {"ID": "x", "Attributes": {}},
             "time": 5}
    assert parse_container_event(event) == ContainerEvent(EventKind.START, "x", None, None, 5)


def test_parse_old_style_event() -> None:
    event = {"status": "start", "id": "abc", "time": 7}
    parsed = parse_container_event(event)
    assert parsed is not None
    assert (parsed.kind, parsed.container_id, parsed.time_seconds) == (EventKind.START, "abc", 7)


@pytest.mark.parametrize(
    "event",
    [
        pytest.param({"Type": "container", "Action": "destroy", "Actor": {"ID": "x"}},
                     id="other action"),
        pytest.param({"Type": "network", "Action": "start", "Actor": {"ID": "x"}},
                     id="other type"),
        pytest.param({"Type": "container", "Action": "die", "Actor": {}}, id="no id"),
        pytest.param({}, id="empty"),
    ],
)
def test_parse_ignores(event: dict[str, Any]) -> None:
    assert parse_container_event(event) is None


def test_describe_names_job_attempt_and_task() -> None:
    assert describe(REF) == "alice~mnist attempt 2 worker[1]"
