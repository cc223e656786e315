"""The supervisor of the Celery services: a worker that crashes starts
again, a stop reaches the worker, a crash loop is given up on."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from shared.infra.supervise import EXIT_REFUSED, Supervisor, work_beside
from tests.support.threads import wakeups


def script(body: str) -> list[str]:
    return [sys.executable, "-c", body]


def test_a_worker_that_crashes_is_started_again_until_it_exits_when_asked(
        tmp_path: Path) -> None:
    """Two crashes, then a worker that runs until the service is stopped:
    three starts, and the stop's SIGTERM reaches the third (its exit code is
    the service's)."""
    runs = tmp_path / "runs"
    body = (f"import pathlib, signal, sys, time\n"
            f"p = pathlib.Path({str(runs)!r})\n"
            f"p.write_text(p.read_text() + 'x' if p.exists() else 'x')\n"
            f"if len(p.read_text()) < 3: sys.exit(3)\n"
            f"signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
            f"for _ in range(600): time.sleep(0.1)\n"
            f"sys.exit(9)\n")
    supervisor = Supervisor("test", script(body), backoff_s=(0.0,))
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(supervisor.run()))
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (runs.exists() and len(runs.read_text()) == 3):
        time.sleep(0.05)
    supervisor.request_stop(signal.SIGTERM)
    thread.join(60)
    assert runs.read_text() == "xxx"
    assert result == [0]
    assert len(supervisor.restarts) == 2


def test_a_worker_that_keeps_crashing_is_given_up_on() -> None:
    supervisor = Supervisor("test", script("import sys; sys.exit(1)"), max_restarts=3,
                            backoff_s=(0.0,))
    assert supervisor.run() == 1
    assert len(supervisor.restarts) == 4


def test_a_stop_before_the_first_start_starts_nothing() -> None:
    supervisor = Supervisor("test", script("raise SystemExit(5)"))
    supervisor.request_stop()
    assert supervisor.run() == 0
    assert supervisor.child is None


def _running(supervisor: Supervisor, ready: Path) -> tuple[threading.Thread, list[int]]:
    """`supervisor.run()` in a thread, once its worker has touched `ready`;
    the list gets run's result."""
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(supervisor.run()))
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not ready.exists():
        time.sleep(0.05)
    return thread, result


def test_a_worker_that_ignores_the_stop_is_killed_after_the_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    body = ("import pathlib, signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            "for _ in range(600): time.sleep(0.1)\n")
    supervisor = Supervisor("test", script(body), stop_grace_s=0.5)
    thread, result = _running(supervisor, ready)
    supervisor.request_stop()
    thread.join(60)
    assert result == [-signal.SIGKILL]


def test_a_supervisor_waiting_for_its_worker_does_not_wake_up(tmp_path: Path) -> None:
    """It blocks until the worker exits or a stop comes, rather than polling
    (a wait with a timeout polls the child every 50 ms: 6 ms of CPU a second
    for each service, on every node, for ever). Over one second of a worker
    running, the waiting thread is woken at most a few times (a poll would
    be about 20); the stop still reaches the worker at once."""
    ready = tmp_path / "ready"
    body = ("import pathlib, signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            "for _ in range(600): time.sleep(0.1)\n")
    supervisor = Supervisor("test", script(body))
    thread, result = _running(supervisor, ready)
    assert thread.native_id is not None
    before = wakeups(thread.native_id)
    time.sleep(1.0)  # the window observed, not a wait for something to happen
    woken = wakeups(thread.native_id) - before
    supervisor.request_stop()
    thread.join(60)
    assert result == [0]
    assert woken <= 3


class _Worker:
    """A Celery app's worker_main as work_beside calls it: it returns when told."""

    def __init__(self, fail: bool) -> None:
        self.fail, self.argv, self.loop_ran = fail, [""], threading.Event()

    def worker_main(self, argv: list[str]) -> None:
        assert self.loop_ran.wait(10), "the loop beside the worker never started"
        self.argv = argv
        if self.fail:
            raise RuntimeError("the worker died")


@pytest.mark.parametrize("fail", [False, True], ids=["the worker returns", "the worker raises"])
def test_the_loop_beside_a_worker_is_stopped_when_the_worker_ends(fail: bool) -> None:
    worker, stopped = _Worker(fail), threading.Event()

    def loop(stop: threading.Event) -> None:
        worker.loop_ran.set()
        if stop.wait(10):
            stopped.set()

    if fail:
        with pytest.raises(RuntimeError, match="the worker died"):
            work_beside(worker, ["worker", "-Q", "q"], loop, "beside")
    else:
        work_beside(worker, ["worker", "-Q", "q"], loop, "beside")
    assert worker.argv == ["worker", "-Q", "q"]
    assert stopped.wait(10)


def test_a_worker_that_refuses_to_run_is_not_started_again(tmp_path: Path) -> None:
    """A worker that exits with EXIT_REFUSED (another machine's agent holds
    its node's name) would be refused again: the service ends with it."""
    runs = tmp_path / "runs"
    body = (f"import pathlib, sys\n"
            f"p = pathlib.Path({str(runs)!r})\n"
            f"p.write_text(p.read_text() + 'x' if p.exists() else 'x')\n"
            f"sys.exit({EXIT_REFUSED})\n")
    supervisor = Supervisor("test", script(body), backoff_s=(0.0,))
    assert supervisor.run() == EXIT_REFUSED
    assert runs.read_text() == "x"
    assert supervisor.restarts == []
