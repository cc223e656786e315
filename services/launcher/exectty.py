"""Interactive exec on a node: a program with a TTY, pumped between Docker and Redis.

The launcher claims a session (shared/state/execsessions.py) once, checks that
its task runs here in the job's current attempt, and runs the program with
Docker's exec API (tty and stdin on). Two threads pump it: this one reads
the exec's socket into the session's output stream, a second pops the
user's keystrokes (and resizes) from the input list and writes them. The
session ends when the program exits, when no byte passed either way for the
idle time, at its longest length, or when its hash is gone (the client left,
or the API died and stopped renewing it); but for the first, the program
and what it started are killed (DockerRuntime's pid/cgroup check). Sessions
have slots of their own (PAI_EXEC_TTY_SLOTS_PER_NODE), apart from
non-interactive execs and task starts: a node full of terminals still runs
`pai exec` commands and starts tasks.
"""

from __future__ import annotations

import contextlib
import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from docker.errors import APIError, NotFound
from docker.utils import socket as docker_socket

from services.launcher.runtime import DockerRuntime, close_exec_socket
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.state import execsessions
from shared.state.execs import ExecRequest
from shared.state.execsessions import EndReason, Refusal, Resize, Sessions, TtyRequest
from shared.state.store import Store, connect, dedicated

log = logging.getLogger("pai.launcher")

POLL_SECONDS = 1.0  # the pumps wake at least this often to check the session's limits
FULL_WAIT_SECONDS = 0.05  # output full: wait for the API to take some (back-pressure)
INPUT_WAIT_SECONDS = 1.0


class _Activity:
    """When a byte last passed either way (monotonic); a float is written whole."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def touch(self) -> None:
        self.last = time.monotonic()


class TtySessions:
    """The node's interactive sessions: claim, check, run, pump, end."""

    def __init__(self, settings: Settings, store: Store, runtime: DockerRuntime, node: str,
                 running_container: Callable[[ExecRequest], str | None]) -> None:
        self.settings, self.store, self.runtime, self.node = settings, store, runtime, node
        self.running_container = running_container
        self.slots = threading.BoundedSemaphore(settings.exec_tty_slots_per_node)
        # Each session holds two connections for its life (`dedicated`), one
        # in BLMPOP for its input and one to write its output: a pool of
        # their own, so they never take the Celery threads'.
        self.sessions = Sessions(connect(settings.redis_url,
                                         pool_size=2 * settings.exec_tty_slots_per_node + 2))

    def open(self, session_id: str) -> None:
        """Claim the session and serve it in a thread of its own; the feed of
        calls (calls.py) goes on at once."""
        request = self.sessions.claim(session_id, self.node, self.node)
        if request is None:
            log.info("exec session %s: not for this node, gone, or taken before", session_id)
            return
        container_id = self.running_container(request.exec)
        if container_id is None:
            self.sessions.refuse(request.id, Refusal.NOT_RUNNING,
                                 f"its container does not run on {self.node} in attempt "
                                 f"{request.exec.attempt}")
            return
        if not self.slots.acquire(blocking=False):
            self.sessions.refuse(request.id, Refusal.BUSY,
                                 f"node {self.node} serves as many terminal sessions as it may")
            return
        try:
            threading.Thread(target=self._serve, args=(request, container_id), daemon=True,
                             name=f"tty-{request.id[:8]}").start()
        except BaseException:
            self.slots.release()
            raise

    def _serve(self, request: TtyRequest, container_id: str) -> None:
        what = (f"{request.exec.job_id} attempt {request.exec.attempt} "
                f"{request.exec.role}[{request.exec.index}]")
        try:
            with dedicated(self.sessions.r) as link:  # its output's, given back at the end
                self._run(Sessions(link), request, container_id, what)
        except Exception:
            log.exception("exec session %s in %s failed", request.id[:12], what)
            with contextlib.suppress(Exception):
                self.sessions.end(request.id, None, EndReason.NODE_LOST,
                                  "the node failed to serve the session")
        finally:
            self.slots.release()

    def _run(self, output: Sessions, request: TtyRequest, container_id: str,
             what: str) -> None:
        """The session from the exec's start to its end entry; `output` writes it."""
        engine = self.runtime.engine
        try:
            exec_id = engine.exec_create(container_id, request.exec.argv, stdout=True,
                                         stderr=True, stdin=True, tty=True)
            sock, early = engine.exec_attach(exec_id, tty=True)
        except (NotFound, APIError) as error:
            log.info("exec session in %s refused by Docker: %s", what, error)
            output.refuse(request.id, Refusal.NOT_RUNNING,
                          f"its container does not run on {self.node}: Docker refused: {error}")
            return
        self._resize(exec_id, Resize(request.cols, request.rows))
        started = time.monotonic()
        log.info("exec session %s by %s in %s started: %s", request.id[:12],
                 request.exec.user, what, request.exec.argv)
        output.put_output(request.id, {"started": "1"})
        try:
            reason = self._pump(request, exec_id, sock, early, output)
        finally:
            close_exec_socket(sock)
        exit_code = self._finish(exec_id, reason)
        output.end(request.id, exit_code, reason)
        self._audit_end(request, exit_code, reason, time.monotonic() - started)
        log.info("exec session %s by %s in %s ended (%s): exit %s after %.0f s",
                 request.id[:12], request.exec.user, what, reason.value, exit_code,
                 time.monotonic() - started)

    def _finish(self, exec_id: str, reason: EndReason) -> int | None:
        """Kill the program unless it ended by itself; its exit code."""
        try:
            if reason != EndReason.EXITED:
                self.runtime._kill_exec(exec_id)
            return self.runtime.exit_code(exec_id)
        except (NotFound, APIError) as error:  # its container is gone
            log.info("exec %s: no exit code: %s", exec_id[:12], error)
            return None

    def _pump(self, request: TtyRequest, exec_id: str, sock: Any, early: bytes,
              output: Sessions) -> EndReason:
        """Carry bytes both ways until the session must end (`early`: output
        that came with the engine's answer, the first sent); why it ended."""
        activity, stop = _Activity(), threading.Event()
        typing = threading.Thread(target=self._pump_input, daemon=True,
                                  args=(request, exec_id, sock, activity, stop),
                                  name=f"tty-in-{request.id[:8]}")
        typing.start()
        started = beat_at = time.monotonic()
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI | select.POLLHUP)
        try:
            if early and not self._put(output, request, early, activity, started):
                return EndReason.CLIENT_GONE
            while True:
                now = time.monotonic()
                reason = execsessions.end_reason(now, started, activity.last,
                                                 request.idle_seconds,
                                                 request.exec.timeout_seconds)
                if reason is not None:
                    return reason
                if now - beat_at >= POLL_SECONDS:
                    beat_at = now
                    if not output.beat(request.id, now_ms()):
                        return EndReason.CLIENT_GONE
                if not poller.poll(POLL_SECONDS * 1000):
                    continue
                chunk = docker_socket.read(sock, execsessions.READ_BYTES)
                if not chunk:
                    return EndReason.EXITED  # the program closed its terminal: it ended
                activity.touch()
                if not self._put(output, request, chunk, activity, started):
                    return EndReason.CLIENT_GONE
        finally:
            stop.set()
            typing.join(INPUT_WAIT_SECONDS * 2)

    def _put(self, output: Sessions, request: TtyRequest, chunk: bytes, activity: _Activity,
             started: float) -> bool:
        """Append output, waiting while the stream is full (the API is behind:
        the program waits too, as on a slow link); False when the session is
        gone. The wait ends with the session's limits."""
        while True:
            added = output.put_data(request.id, chunk)
            if added != 0:
                return added > 0
            if execsessions.end_reason(time.monotonic(), started, activity.last,
                                       request.idle_seconds,
                                       request.exec.timeout_seconds) is not None:
                return True  # the caller's next turn ends the session
            time.sleep(FULL_WAIT_SECONDS)

    def _pump_input(self, request: TtyRequest, exec_id: str, sock: Any, activity: _Activity,
                    stop: threading.Event) -> None:
        raw = getattr(sock, "_sock", sock)  # docker-py's SocketIO wraps the socket
        try:
            with dedicated(self.sessions.r) as link:  # its input's, given back at the end
                self._pump_input_on(Sessions(link), request, exec_id, raw, activity, stop)
        except OSError as error:  # the program ended and its socket with it
            log.debug("exec session %s: input stopped: %s", request.id[:12], error)
        except Exception:
            log.exception("exec session %s: input failed", request.id[:12])

    def _pump_input_on(self, inputs: Sessions, request: TtyRequest, exec_id: str, raw: Any,
                       activity: _Activity, stop: threading.Event) -> None:
        while not stop.is_set():
            for item in inputs.take_input(request.id, INPUT_WAIT_SECONDS):
                if isinstance(item, Resize):
                    self._resize(exec_id, item)
                    continue
                activity.touch()
                raw.sendall(item)

    def _resize(self, exec_id: str, size: Resize) -> None:
        try:
            self.runtime.client.api.exec_resize(exec_id, height=size.rows, width=size.cols)
        except (NotFound, APIError) as error:  # the program ended meanwhile
            log.debug("exec %s: resize refused: %s", exec_id[:12], error)

    def _audit_end(self, request: TtyRequest, exit_code: int | None, reason: EndReason,
                   seconds: float) -> None:
        pipe = self.store.pipeline(atomic=True)
        self.store.add_event(pipe, request.exec.job_id, "exec-session-end",
                             user=request.exec.user, attempt=request.exec.attempt,
                             role=request.exec.role, index=request.exec.index,
                             session=request.id, exitCode=exit_code, reason=reason.value,
                             durationSec=round(seconds, 1))
        pipe.execute()
