"""What the monitor sees in Docker, as plain data: exits, container phases, events.

No IO here: each function takes the dicts Docker returns (a container's
`State`, an event) and says what they mean for a task.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.domain.prerequisites import failed_step
from shared.node.containers import LABEL_PREREQUISITES, TaskRef, task_ref_from_labels

# A task whose exit code is unknown (its container is gone): never 0, and
# outside the range a process can exit with.
UNKNOWN_EXIT_CODE = -1

_BYTES_PER_MB = 1024 * 1024


def describe(ref: TaskRef) -> str:
    """A task as logs name it: `alice~mnist attempt 0 worker[1]`."""
    return f"{ref.job_id} attempt {ref.attempt} {ref.role}[{ref.index}]"


@dataclass(frozen=True)
class ExitObservation:
    exit_code: int
    diagnostics: str


def _signal_name(exit_code: int) -> str | None:
    """`SIGKILL` for 137: a shell reports death by signal N as 128 + N."""
    if not 128 < exit_code < 128 + 65:
        return None
    try:
        return signal.Signals(exit_code - 128).name
    except ValueError:
        return None


def describe_exit(state: Mapping[str, Any], memory_bytes: int | None = None,
                  labels: Mapping[str, str] | None = None) -> ExitObservation:
    """A finished container's exit code and the reason a user should read.

    `state` is the container's inspected `State`; `memory_bytes` its memory
    limit (HostConfig.Memory), named in the OOM message; `labels` its
    labels, which name a runner's steps (shared/domain/prerequisites.py).
    """
    raw_code = state.get("ExitCode")
    exit_code = int(raw_code) if isinstance(raw_code, int) else UNKNOWN_EXIT_CODE
    error = str(state.get("Error") or "").strip()
    if state.get("OOMKilled"):
        limit = f" ({memory_bytes // _BYTES_PER_MB} MB)" if memory_bytes else ""
        diagnostics = f"OOMKilled: exceeded memoryMB{limit}"
    elif error:
        diagnostics = f"exit code {exit_code}: {error}"
    elif (step := failed_step(exit_code, (labels or {}).get(LABEL_PREREQUISITES))):
        diagnostics = f"exit code {exit_code}: {step} (the task's log says why, [pai] lines)"
    elif (name := _signal_name(exit_code)) is not None:
        diagnostics = f"exit code {exit_code} (killed by {name})"
    else:
        diagnostics = f"exit code {exit_code}"
    return ExitObservation(exit_code, diagnostics)


def exit_from_event_code(raw: str | None) -> ExitObservation:
    """The exit a `die` event reports, for a container already removed."""
    try:
        exit_code = int(raw) if raw not in (None, "") else UNKNOWN_EXIT_CODE
    except ValueError:
        exit_code = UNKNOWN_EXIT_CODE
    described = describe_exit({"ExitCode": exit_code})
    return ExitObservation(exit_code, described.diagnostics + " (container removed before "
                           "the monitor saw it exit)")


class Phase(StrEnum):
    """What reconcile does with a container, by its Docker status."""

    # alive: its task should be RUNNING and its log shipped
    RUNNING = "running"
    # ended: settle its task, then remove it
    EXITED = "exited"
    # created, never started: the launcher's while its task launches;
    # removed once nothing will ever start it
    CREATED = "created"
    # being removed, or a state Docker adds later: left alone
    LEAVE = "leave"


_PHASES = {
    "running": Phase.RUNNING,
    "paused": Phase.RUNNING,
    "restarting": Phase.RUNNING,
    "exited": Phase.EXITED,
    "dead": Phase.EXITED,
    "created": Phase.CREATED,
}


def phase_of(status: str | None) -> Phase:
    return _PHASES.get(status or "", Phase.LEAVE)


class EventKind(StrEnum):
    START = "start"
    DIE = "die"


@dataclass(frozen=True)
class ContainerEvent:
    kind: EventKind
    container_id: str
    ref: TaskRef | None
    exit_code: str | None
    time_seconds: int


def parse_container_event(event: Mapping[str, Any]) -> ContainerEvent | None:
    """A Docker `start` / `die` event of a container; None for any other event.

    Reads `Action` / `Actor` and falls back to the older `status` / `id`
    fields, which engines before API 1.44 also send.
    """
    if event.get("Type", "container") != "container":
        return None
    action = event.get("Action") or event.get("status") or ""
    try:
        kind = EventKind(action)
    except ValueError:
        return None
    actor = event.get("Actor") or {}
    container_id = actor.get("ID") or event.get("id")
    if not container_id:
        return None
    attributes: Mapping[str, str] = actor.get("Attributes") or {}
    time_nano = event.get("timeNano")
    seconds = int(time_nano) // 1_000_000_000 if time_nano else int(event.get("time") or 0)
    return ContainerEvent(kind, str(container_id), task_ref_from_labels(attributes),
                          attributes.get("exitCode"), seconds)
