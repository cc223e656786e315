"""A node's starts: the stream from which its launcher takes the tasks placed
on it (one of the node's streams, shared/state/nodestreams.py: read in a
consumer group, at least once).

The scheduler is the one writer (a pass's placements, a launch sent again
when its lease fell due, a task retry's relaunch): one entry per node a send
names, listing that node's tasks. An entry stays pending until its starts
ran, and a launcher reads what was left pending when it begins and every so
often after, for a start that failed on the way. A start is idempotent: the
launcher checks that the task is still its own to start, and finds a
container made before by its name.

An entry trimmed before a launcher read it (its node down) is sent again by
the launch lease (the scheduler's `retry_stale_launches`), as is one never
sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.state import keys, nodestreams
from shared.state.nodestreams import GroupReader
from shared.state.store import plain_json

log = logging.getLogger("pai.starts")

FIELD = "tasks"

# (job id, attempt, role, index): a task of an attempt
StartRef = tuple[str, int, str, int]


@dataclass(frozen=True)
class Entry:
    """One entry of a node's stream; `tasks` is empty for an entry trimmed or
    deleted while it was pending, or one that does not parse."""

    id: str
    tasks: tuple[StartRef, ...]


def send(client: Any, starts: Mapping[str, Sequence[StartRef]]) -> None:
    """Add each node's tasks to its stream as one entry, all in one round trip."""
    sending = {node: tasks for node, tasks in starts.items() if tasks}
    if not sending:
        return
    pipe = client.pipeline(transaction=False)
    for node, tasks in sending.items():
        nodestreams.add(pipe, keys.node_starts(node),
                        {FIELD: plain_json([list(task) for task in tasks])})
    pipe.execute()


def parse(entry_id: str, fields: Mapping[str, str] | None) -> Entry:
    """An entry as read; one that does not parse names no task (it is logged,
    and `done` then drops it rather than read it again forever)."""
    if not fields:
        return Entry(entry_id, ())
    try:
        tasks = tuple((str(j), int(a), str(r), int(i))
                      for j, a, r, i in json.loads(fields[FIELD]))
    except (KeyError, TypeError, ValueError) as error:
        log.error("start entry %s does not parse (%s): dropped", entry_id, error)
        return Entry(entry_id, ())
    return Entry(entry_id, tasks)


class StartReader(GroupReader[Entry]):
    """The launcher's side of one node's starts."""

    def __init__(self, client: Any, node: str) -> None:
        super().__init__(client, keys.node_starts(node), parse)
