"""A node's calls: the stream from which its launcher takes the exec requests
(shared/state/execs.py) and terminal sessions (shared/state/execsessions.py)
the API sends it. One of the node's streams (shared/state/nodestreams.py):
read in a consumer group, at least once.

The API adds the entry in the transaction that writes the request and its
audit, so a call is sent exactly when it is recorded, in one round trip. An
entry names the call's kind and the request's id, and an exec's entry the
task it is for (`TaskAt`), so that the launcher reads the task beside its
claim of the request, in the same round trip. The request itself, and who
may run what, stay in the request's hash, which the launcher claims once and
only for its own node: an entry read twice (a launcher killed between
reading and acknowledging it) runs nothing twice, and an entry whose task is
not its request's has its task read again, the request's.

An entry trimmed unread (its node's launcher down past MAX_ENTRIES calls) is
lost; the API's wait for its answer ends in a timeout, as it does for a node
that does not answer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.state import keys, nodestreams
from shared.state.nodestreams import GroupReader

log = logging.getLogger("pai.nodecalls")


class Kind(StrEnum):
    EXEC = "exec"  # run a command, answer its output (shared/state/execs.py)
    TTY = "tty"  # open an interactive session (shared/state/execsessions.py)


@dataclass(frozen=True)
class TaskAt:
    """The task a call is for, as its sender read it: a hint for the launcher's
    first read, never what decides (the request's own fields do)."""

    job_id: str
    attempt: int
    role: str
    index: int


@dataclass(frozen=True)
class Call:
    """One entry; `kind` is None for an entry trimmed while it was pending,
    or one that does not parse (it is dropped). `task` is None for an entry
    that names none (a terminal's, or one sent by an earlier version)."""

    id: str
    kind: Kind | None = None
    request_id: str = ""
    task: TaskAt | None = None


def send(pipe: Any, node: str, kind: Kind, request_id: str, task: TaskAt | None = None) -> None:
    """Queue the call to `node` on `pipe` (the pipeline recording the request)."""
    fields = {"kind": kind.value, "id": request_id}
    if task is not None:
        fields.update(job=task.job_id, attempt=str(task.attempt), role=task.role,
                      index=str(task.index))
    nodestreams.add(pipe, keys.node_calls(node), fields)


def parse(entry_id: str, fields: Mapping[str, str] | None) -> Call:
    if not fields:
        return Call(entry_id)
    try:
        return Call(entry_id, Kind(fields["kind"]), str(fields["id"]), _task_at(fields))
    except (KeyError, ValueError) as error:
        log.error("call entry %s does not parse (%s): dropped", entry_id, error)
        return Call(entry_id)


def _task_at(fields: Mapping[str, str]) -> TaskAt | None:
    """The entry's task, or None where it names none or not in full."""
    try:
        return TaskAt(str(fields["job"]), int(fields["attempt"]), str(fields["role"]),
                      int(fields["index"]))
    except (KeyError, ValueError):
        return None


class CallReader(GroupReader[Call]):
    """The launcher's side of one node's calls."""

    def __init__(self, client: Any, node: str) -> None:
        super().__init__(client, keys.node_calls(node), parse)
