"""A node's streams: what the control plane sends one node's launcher, read
in a consumer group, at least once.

A node has two: its starts (shared/state/starts.py), written by the
scheduler, and its calls (shared/state/nodecalls.py), the exec requests and
terminal sessions the API sends. Each is read by the node's launcher alone,
in the group GROUP:

- an entry the launcher took stays pending until it is `done`, which
  acknowledges and deletes it, so the stream holds only what no launcher has
  finished;
- a launcher reads the entries left pending (`pending`) when it begins, so
  what a killed launcher (or the one the node's name had before) took and did
  not finish is handled by the next one;
- a stream no launcher reads (its node down) is trimmed past MAX_ENTRIES;
  what was trimmed while pending reads as an entry without fields, which the
  parser turns into one that names nothing.

Why not Celery messages: they are on the path of every GPU's turn and every
exec, and a Celery message costs its sender and its worker most of a
millisecond of CPU (kombu's encoding, the worker's bookkeeping) and a hop of
its own, where an entry is one XADD in the sender's pipeline and one read
(docs/performance-log.md, 2026-11-28 and 2026-11-29).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import redis

GROUP = "launcher"
# One launcher holds a node's name at a time (shared/state/nodeagent.py), so
# the group has one consumer: a launcher that takes the name over reads the
# entries its predecessor left pending as its own.
CONSUMER = "launcher"
MAX_ENTRIES = 1000

E = TypeVar("E")


def add(pipe: Any, key: str, fields: Mapping[str, str]) -> None:
    """Queue one entry on `pipe` (its stream kept near MAX_ENTRIES)."""
    pipe.xadd(key, dict(fields), maxlen=MAX_ENTRIES, approximate=True)


class GroupReader(Generic[E]):
    """The launcher's side of one of its node's streams: entries as `parse`
    makes them from (entry id, fields or None)."""

    def __init__(self, client: Any, key: str,
                 parse: Callable[[str, Mapping[str, str] | None], E]) -> None:
        self.client = client
        self.key = key
        self.parse = parse

    def join(self) -> None:
        """Create the group (and the stream) if there is none yet, from the
        stream's first entry: what was sent before any launcher of the node
        ran is read too."""
        try:
            self.client.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    def take(self, count: int, block_ms: int) -> list[E]:
        """Entries no launcher took yet, waiting up to `block_ms` for one."""
        return self._read(">", count, block_ms)

    def pending(self, count: int, after: str = "0") -> list[E]:
        """Entries taken and not done, oldest first, from past `after`."""
        return self._read(after, count, None)

    def done(self, entry_ids: Sequence[str]) -> None:
        """Acknowledge and delete entries that were handled."""
        if not entry_ids:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(self.key, GROUP, *entry_ids)
        pipe.xdel(self.key, *entry_ids)
        pipe.execute()

    def _read(self, since: str, count: int, block_ms: int | None) -> list[E]:
        try:
            answer = self.client.xreadgroup(GROUP, CONSUMER, {self.key: since}, count=count,
                                            block=block_ms)
        except redis.ResponseError as error:
            if "NOGROUP" not in str(error):
                raise
            self.join()  # no group yet (a new node), or the stream was deleted: join
            return []
        return [self.parse(entry_id, fields) for _, entries in answer or ()
                for entry_id, fields in entries]
