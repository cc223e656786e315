"""What a node agent checks of its own machine, each in a thread of its own
with a deadline, so that a hung engine or a hung NFS mount stalls only its
check, never the lease or the node's other work:

- the Docker engine answers a ping;
- each storage root and the log tree is the cluster's shared storage
  (shared/infra/sharedstorage.py).

The monitor renews its problems with the lease (a node with any takes no
work: NOT_READY, with the reason, in `GET /nodes`); the launcher starts no
container while its storage check fails, so no job's output lands on the
node's own disk.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from shared.infra.sharedstorage import problem_with

log = logging.getLogger(__name__)

ENGINE_TIMEOUT_SECONDS = 10.0
STORAGE_TIMEOUT_SECONDS = 10.0
STORAGE_CHECK_SECONDS = 30.0
# A failing check looks again this often (or its interval, if shorter): a
# mount that comes back, or a storage identity the control plane has just
# written, is seen within seconds, not an interval later.
RECHECK_SECONDS = 2.0


class Check:
    """One check, run every `interval` s on a worker of its own (every
    RECHECK_SECONDS while it fails). A call past `timeout` is a problem
    ("... did not answer in N s"), and no new call starts until the stuck
    one returns."""

    def __init__(self, name: str, probe: Callable[[], str], interval: float,
                 timeout: float) -> None:
        self.name, self.probe, self.interval, self.timeout = name, probe, interval, timeout
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"check-{name}")
        self._pending: Future[str] | None = None
        self.problem = ""

    def run_once(self) -> str:
        if self._pending is None or self._pending.done():
            self._pending = self._pool.submit(self.probe)
        try:
            self.problem = self._pending.result(timeout=self.timeout)
        except FutureTimeout:
            self.problem = f"{self.name} did not answer in {self.timeout:.0f} s"
        except Exception as error:
            self.problem = f"{self.name} failed: {error}"
        return self.problem

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            before = self.problem
            after = self.run_once()
            if after != before:
                (log.error if after else log.warning)(
                    "node check %s: %s", self.name, after or "healthy again")
            stop.wait(min(self.interval, RECHECK_SECONDS) if after else self.interval)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class NodeHealth:
    def __init__(self, checks: Sequence[Check]) -> None:
        self.checks = list(checks)

    def problem(self) -> str:
        """Every current problem, in one line ("" when healthy)."""
        return "; ".join(c.problem for c in self.checks if c.problem)[:1000]

    def threads(self, stop: threading.Event) -> list[threading.Thread]:
        return [threading.Thread(target=c.loop, args=(stop,), daemon=True,
                                 name=f"pai-monitor-check-{c.name}") for c in self.checks]

    def close(self) -> None:
        for check in self.checks:
            check.close()


def engine_check(ping: Callable[[], object], interval: float) -> Check:
    def probe() -> str:
        ping()
        return ""
    return Check("docker engine", probe, interval, ENGINE_TIMEOUT_SECONDS)


def storage_check(folders: Sequence[str], identity: Callable[[], str]) -> Check:
    """`identity` gives the cluster's id (read once: it never changes)."""
    known: list[str] = []

    def probe() -> str:
        if not known:
            known.append(identity())
        return "; ".join(p for p in (problem_with(f, known[0]) for f in folders) if p)
    return Check("shared storage", probe, STORAGE_CHECK_SECONDS, STORAGE_TIMEOUT_SECONDS)
