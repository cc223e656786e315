"""Fencing: a node cut off from the control plane stops its own job containers.

Past its lease without a renewal (and not in a control-plane outage, which
shared/domain/lease.py tells apart), the node can no longer be sure its
tasks are still its own: the control plane will hand them, their GPUs and
their ports to other nodes once the lease has certainly expired. So it stops
them first: the notice in each container's preemption file, SIGTERM, and
SIGKILL after the grace (what `docker stop` does with a timeout).

Every container it stops is written to the fence journal first, a file on
the node's own disk: when the control plane is back, the monitor records
those exits as the platform's doing (retried, never charged to the job),
even if it was restarted in between. Exits the journal does not name are
the job's own, whenever they happened.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from docker.errors import APIError, DockerException, NotFound
from requests.exceptions import RequestException

from shared.domain.notice import PREEMPTION_FILE, preemption_notice
from shared.infra.clock import now_ms
from shared.node.containers import LABEL_JOB, LABEL_NODE
from shared.node.notices import put_text

log = logging.getLogger(__name__)

JOURNAL_NAME = "fenced.jsonl"
STOP_THREADS = 8
# Entries older than this are dropped when the journal is rewritten: their
# containers' exits were recorded long ago (or never will be).
KEEP_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class FencedContainer:
    container_id: str
    reason: str
    at_ms: int


class FenceJournal:
    """The containers this node stopped by fencing, one JSON line each, in
    `<state dir>/<node>/fenced.jsonl`: appended and fsynced before the stop,
    read once at start-up, kept in memory after (only the monitor writes it)."""

    def __init__(self, state_dir: str, node: str) -> None:
        self.folder = os.path.join(state_dir, node)
        self.path = os.path.join(self.folder, JOURNAL_NAME)
        self._lock = threading.Lock()
        self._entries = self._read()

    def _read(self) -> dict[str, FencedContainer]:
        found: dict[str, FencedContainer] = {}
        try:
            with open(self.path, encoding="utf-8") as lines:
                for line in lines:
                    try:
                        raw = json.loads(line)
                        entry = FencedContainer(str(raw["id"]), str(raw["reason"]),
                                                int(raw["at"]))
                    except (ValueError, KeyError, TypeError):
                        continue  # a line cut short by a crash
                    found[entry.container_id] = entry
        except FileNotFoundError:
            pass
        return found

    def add(self, entries: list[FencedContainer]) -> None:
        if not entries:
            return
        with self._lock:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as out:
                out.write("".join(_line(e) for e in entries))
                out.flush()
                os.fsync(out.fileno())
            self._entries.update((e.container_id, e) for e in entries)

    def reason_for(self, container_id: str) -> str | None:
        entry = self._entries.get(container_id)
        return entry.reason if entry is not None else None

    def prune(self, now: int) -> None:
        """Drop entries older than KEEP_MS (the file rewritten, then renamed)."""
        with self._lock:
            kept = {k: e for k, e in self._entries.items() if now - e.at_ms < KEEP_MS}
            if len(kept) == len(self._entries):
                return
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as out:
                out.write("".join(_line(e) for e in kept.values()))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
            self._entries = kept


def _line(entry: FencedContainer) -> str:
    return json.dumps({"id": entry.container_id, "reason": entry.reason, "at": entry.at_ms},
                      separators=(",", ":")) + "\n"


class Fencer:
    """Stops every job container of the node, as described above."""

    def __init__(self, docker_client: Any, node: str, journal: FenceJournal,
                 grace_seconds: float,
                 stopped: Callable[[int], None] | None = None) -> None:
        self.docker, self.node, self.journal = docker_client, node, journal
        self.grace_seconds = grace_seconds
        self._stopped = stopped

    def fence(self, reason: str) -> int:
        """Stop the node's running job containers; how many were stopped."""
        try:
            running = self.docker.containers.list(
                filters={"label": [LABEL_JOB, f"{LABEL_NODE}={self.node}"],
                         "status": "running"})
        except (DockerException, RequestException) as error:
            log.error("fence: cannot list the job containers of node %s: %s", self.node, error)
            return 0
        at = now_ms()
        self.journal.add([FencedContainer(str(c.id), reason, at) for c in running])
        deadline_ms = at + int(self.grace_seconds * 1000)
        notice = preemption_notice(f"node:{self.node}", deadline_ms, reason)
        with ThreadPoolExecutor(max(1, min(len(running), STOP_THREADS)),
                                thread_name_prefix="fence") as pool:
            stopped = sum(pool.map(lambda c: self._stop(c, notice), running))
        (log.warning if running else log.debug)(
            "fenced node %s: stopped %d of %d job container(s): %s", self.node, stopped,
            len(running), reason)
        if self._stopped is not None:
            self._stopped(stopped)
        return stopped

    def _stop(self, container: Any, notice: str) -> bool:
        try:
            put_text(container, PREEMPTION_FILE, notice)
            container.stop(timeout=int(self.grace_seconds))
            return True
        except NotFound:
            return True  # ended meanwhile
        except (APIError, DockerException, RequestException) as error:
            log.error("fence: could not stop container %s: %s", container.name, error)
            return False
