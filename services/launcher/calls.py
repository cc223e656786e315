"""The launcher's feed of calls: it takes the exec requests and terminal
sessions the API sent its node (shared/state/nodecalls.py) and hands each to
its handler, one after the other, on the feed's thread.

- A handler is quick: it claims the request, checks the task and gives the
  command or the session to a thread of its own (or answers BUSY, or
  NOT_RUNNING), so a long command never holds the feed.
- An entry is done (acknowledged and deleted) once its handler returned. A
  handler that lost Redis leaves its entry, and those after it, pending: the
  feed reads what is pending when it begins and after every lost link, and
  the claim runs nothing twice. A handler that failed otherwise is logged
  and its entry dropped: its request stays claimed, and the API's wait for
  the answer ends in a timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import redis

from shared.infra import links
from shared.state.nodecalls import Call, CallReader, Kind

if TYPE_CHECKING:
    from services.launcher.service import Launcher

log = logging.getLogger("pai.launcher")

BATCH = 16
RETRY_SECONDS = 1.0
# a blocking read returns at least this often, so a stop is seen within it
BLOCK_MS = int(links.BLOCK_CHUNK_SECONDS * 1000)


class CallFeed:
    def __init__(self, reader: CallReader, handlers: Mapping[Kind, Callable[[Call], None]],
                 *, block_ms: int = BLOCK_MS) -> None:
        self.reader = reader
        self.handlers = handlers
        self.block_ms = block_ms

    def run(self, stop: threading.Event) -> None:
        """Handle what comes, until `stop` is set."""
        recover = True
        while not stop.is_set():
            try:
                if recover:
                    self.recover()  # its first read joins the group if there is none
                    recover = False
                self.handle(self.reader.take(BATCH, self.block_ms))
            except redis.RedisError as error:
                log.warning("calls of this node not read: %s", error)
                stop.wait(RETRY_SECONDS)
                recover = True
            except Exception:
                log.exception("calls of this node not read")
                stop.wait(RETRY_SECONDS)
                recover = True

    def recover(self) -> None:
        """Handle the entries left pending: a predecessor's, or this feed's
        when it lost Redis on the way."""
        while entries := self.reader.pending(BATCH):
            log.info("handling %d calls left pending", len(entries))
            self.handle(entries)

    def handle(self, calls: list[Call]) -> None:
        handled: list[str] = []
        try:
            for call in calls:
                self._one(call)
                handled.append(call.id)
        finally:
            self.reader.done(handled)

    def _one(self, call: Call) -> None:
        if call.kind is None:
            return  # trimmed while pending, or unreadable: nothing to do
        try:
            self.handlers[call.kind](call)
        except redis.RedisError:
            raise  # left pending, with those after it
        except Exception:
            log.exception("%s call %s failed: dropped", call.kind.value, call.request_id)


def launcher_calls(launcher: Launcher, *, block_ms: int = BLOCK_MS) -> CallFeed:
    """The feed of the launcher's node, handing each kind to the launcher."""
    return CallFeed(CallReader(launcher.store.r, launcher.node.name),
                    {Kind.EXEC: lambda call: launcher.exec_command(call.request_id, call.task),
                     Kind.TTY: lambda call: launcher.tty.open(call.request_id)},
                    block_ms=block_ms)
