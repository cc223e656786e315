"""A node's starts: the stream from which its launcher takes the tasks placed
on it.

The scheduler is the one writer (a pass's placements, a launch sent again
when its lease fell due, a task retry's relaunch): one entry per node a send
names, listing that node's tasks. The node's launcher is the one reader, in
the consumer group GROUP. Delivery is at least once, as with a Celery
message:

- an entry the launcher took stays pending until it is `done`, after its
  starts ran; `done` acknowledges and deletes it, so the stream holds only
  what no launcher has finished;
- a launcher reads its pending entries (`pending`) when it starts, so what a
  killed launcher (or the launcher the node's name had before) took and did
  not finish is started by the next one, and again every so often, for a
  start that failed on the way;
- a start is idempotent: the launcher checks that the task is still its own
  to start, and finds a container made before by its name.

An entry no launcher reads (its node down) is trimmed once the stream passes
MAX_ENTRIES; the launch lease (the scheduler's `retry_stale_launches`) sends
again what was trimmed or never sent.

Why not a Celery message: a start is on the path of every GPU's turn, and a
Celery message costs its sender and its worker most of a millisecond of CPU
(kombu's encoding, the worker's bookkeeping) where an entry is one XADD in
a pipeline and one read; a short job's launcher spends about 1 ms less
(docs/performance-log.md, 2026-11-28).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from shared.state import keys
from shared.state.store import compact_json

log = logging.getLogger("pai.starts")

GROUP = "launcher"
# One launcher holds a node's name at a time (shared/state/nodeagent.py), so
# the group has one consumer: a launcher that takes the name over reads the
# entries its predecessor left pending as its own.
CONSUMER = "launcher"
FIELD = "tasks"
MAX_ENTRIES = 1000

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
        pipe.xadd(keys.node_starts(node),
                  {FIELD: compact_json([list(task) for task in tasks])},
                  maxlen=MAX_ENTRIES, approximate=True)
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


class StartReader:
    """The launcher's side of one node's stream."""

    def __init__(self, client: Any, node: str) -> None:
        self.client = client
        self.key = keys.node_starts(node)

    def join(self) -> None:
        """Create the group (and the stream) if there is none yet, from the
        stream's first entry: what was sent before any launcher of the node
        ran is read too."""
        try:
            self.client.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    def take(self, count: int, block_ms: int) -> list[Entry]:
        """Entries no launcher took yet, waiting up to `block_ms` for one."""
        return self._read(">", count, block_ms)

    def pending(self, count: int, after: str = "0") -> list[Entry]:
        """Entries taken and not done, oldest first, from past `after`."""
        return self._read(after, count, None)

    def done(self, entry_ids: Sequence[str]) -> None:
        """Acknowledge and delete entries whose starts ran."""
        if not entry_ids:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(self.key, GROUP, *entry_ids)
        pipe.xdel(self.key, *entry_ids)
        pipe.execute()

    def _read(self, since: str, count: int, block_ms: int | None) -> list[Entry]:
        try:
            answer = self.client.xreadgroup(GROUP, CONSUMER, {self.key: since}, count=count,
                                            block=block_ms)
        except redis.ResponseError as error:
            if "NOGROUP" not in str(error):
                raise
            self.join()  # no group yet (a new node), or the stream was deleted: join
            return []
        return [parse(entry_id, fields) for _, entries in answer or ()
                for entry_id, fields in entries]
