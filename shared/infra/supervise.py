"""A Celery service as a supervised child process: crashed, it starts again.

The scheduler and every launcher are Celery workers. When Redis goes away
while a worker holds unacknowledged messages (always, with late acks),
kombu's Redis transport can fail while closing the lost connection and the
worker stops with "Unrecoverable error" instead of reconnecting; the chaos
suite (tests/chaos) finds this within a few Redis restarts. Every piece of
the services' state is in Redis, so the cure is the one systemd or
Kubernetes would apply: start the worker again. The service's own process
does that, so `make up`, Compose and bare hosts get it too:

- the service process runs the worker as a child (`<module> --worker`) and
  starts it again, after a short backoff, whenever it exits unasked;
- SIGTERM or SIGINT to the service goes to the child (Celery's warm
  shutdown: running tasks finish, unacknowledged messages go back) and the
  service exits with it;
- a child that keeps crashing (more than MAX_RESTARTS in RESTART_WINDOW_S)
  is given up on, and the service exits non-zero for the operator's own
  supervisor to see;
- a child that exits with EXIT_REFUSED refused to run (another machine's
  agent holds its node's name): it would be refused again, so the service
  exits with that code at once;
- a child outlives no service: it is killed when the service dies, even by
  SIGKILL (Linux's parent-death signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

log = logging.getLogger("pai.supervise")

WORKER_FLAG = "--worker"
EXIT_REFUSED = 78  # sysexits EX_CONFIG: refused to run; starting it again changes nothing
MAX_RESTARTS = 20
RESTART_WINDOW_S = 300.0
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
STOP_GRACE_S = 60.0
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies; exit now if it
    already has (the request only covers deaths after it)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


class Supervisor:
    """Runs `argv` and keeps it running until asked to stop."""

    def __init__(self, name: str, argv: Sequence[str], *,
                 max_restarts: int = MAX_RESTARTS, window_s: float = RESTART_WINDOW_S,
                 backoff_s: Sequence[float] = BACKOFF_S,
                 stop_grace_s: float = STOP_GRACE_S) -> None:
        self.name, self.argv = name, list(argv)
        self.max_restarts, self.window_s = max_restarts, window_s
        self.backoff_s, self.stop_grace_s = tuple(backoff_s), stop_grace_s
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.restarts: list[float] = []  # monotonic times of unasked exits
        self._timers: list[threading.Timer] = []  # the grace of a stop asked of the child

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """Pass the stop to the child; SIGKILL it if it still runs after the
        grace (from any thread, or from a signal handler interrupting the wait)."""
        self.stopping.set()
        child = self.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)
            timer = threading.Timer(self.stop_grace_s, self._kill, (child,))
            timer.daemon = True
            timer.start()
            self._timers.append(timer)

    def _kill(self, child: subprocess.Popen[bytes]) -> None:
        if child.returncode is None:  # not reaped: the wait has not returned
            log.error("%s worker outlived its %.0f s grace; killing it", self.name,
                      self.stop_grace_s)
            with contextlib.suppress(ProcessLookupError):
                child.kill()

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv, stdin=subprocess.DEVNULL)

    def run(self) -> int:
        """Until stopped: the child's exit code then; 1 when it kept crashing."""
        for _ in range(self.max_restarts + 1):
            if self.stopping.is_set():
                return 0
            self.child = self._spawn()
            if self.stopping.is_set():  # a stop raced the spawn
                self.request_stop()
            code = self._wait(self.child)
            if self.stopping.is_set() or code == EXIT_REFUSED:
                return code
            now = time.monotonic()
            self.restarts = [t for t in self.restarts if now - t < self.window_s] + [now]
            if len(self.restarts) > self.max_restarts:
                break
            delay = self.backoff_s[min(len(self.restarts), len(self.backoff_s)) - 1]
            log.error("%s worker exited unasked with %s; starting it again in %.1f s "
                      "(%d restarts in the last %.0f s)", self.name, code, delay,
                      len(self.restarts), self.window_s)
            if self.stopping.wait(delay):
                return 0
        log.critical("%s worker crashed %d times in %.0f s; giving up", self.name,
                     len(self.restarts), self.window_s)
        return 1

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        """The child's exit code. The wait blocks in waitpid, polling nothing:
        an idle service wakes for nothing (a wait with a timeout polls the
        child every 50 ms). A stop reaches the child through `request_stop`,
        whose timer kills it after the grace."""
        try:
            return child.wait()
        finally:
            timers, self._timers = self._timers, []
            for timer in timers:
                timer.cancel()


def serve(name: str, module: str, worker: Callable[[], None],
          argv: Sequence[str] | None = None) -> None:
    """The entry point of a Celery service: `worker()` itself when this is
    the supervised child (`--worker`), else a Supervisor of it."""
    args = list(sys.argv[1:] if argv is None else argv)
    if WORKER_FLAG in args:  # `--worker <the supervisor's pid>`
        parent = args[args.index(WORKER_FLAG) + 1:][:1]
        if parent and parent[0].isdigit():
            die_with_parent(int(parent[0]))
        worker()
        return
    supervisor = Supervisor(name, [sys.executable, "-m", module, WORKER_FLAG,
                                   str(os.getpid())])

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        supervisor.request_stop(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    raise SystemExit(supervisor.run())


def work_beside(app: Any, argv: list[str], loop: Callable[[threading.Event], None],
                name: str) -> None:
    """Run the Celery worker `app` (with `argv`) in this thread and `loop(stop)`
    in a daemon thread beside it (the launcher's heartbeat, the scheduler's
    repair), told to stop when the worker returns."""
    stop = threading.Event()
    threading.Thread(target=loop, args=(stop,), daemon=True, name=name).start()
    try:
        app.worker_main(argv)
    finally:
        stop.set()
