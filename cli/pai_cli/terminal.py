"""`pai exec -it`: the local terminal joined to a shell in a running task.

The API's interactive exec is a WebSocket (docs/debugging.md): binary
messages carry the terminal's bytes both ways, text messages JSON control
messages (a start message first, resizes, the server's exit message). The
local terminal is put in raw mode so every key (Ctrl-C, arrows, tab) goes to
the remote program, and restored on any exit; a window resize (SIGWINCH) is
sent on. The exit status is the remote program's.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from simple_websocket import Client, ConnectionClosed
from simple_websocket import ConnectionError as WebSocketRefused

from pai_cli.session import CliError

READ_BYTES = 16 * 1024
EXIT_NO_STATUS = 1  # the session ended without the program's exit code
WAIT_SECONDS = 0.5  # the input loop wakes this often to see whether the session ended

REFUSALS = {
    400: "the request was refused as invalid",
    401: "your login was refused; run pai login again",
    403: "only the job's owner and admins may open a terminal in its tasks",
    404: "no such job or task",
    409: "the task is not running",
    429: "you hold as many terminal sessions as you may; close one first",
    503: "the cluster serves as many terminal sessions as it may; try again shortly",
}


def websocket_url(base: str, path: str) -> str:
    """The cluster's http(s) URL as ws(s), with the path and `?tty=1`."""
    parts = urlsplit(base)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + path, "tty=1", ""))


def window_size(fd: int) -> tuple[int, int] | None:
    """(cols, rows) of the terminal on `fd`, or None when it is not one."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return None
    return (size.columns, size.lines) if size.columns and size.lines else None


@dataclass
class _Outcome:
    done: threading.Event = field(default_factory=threading.Event)
    exit_code: int | None = None
    message: str = ""
    ended: bool = False  # the server said how the session ended


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """The terminal on `fd` in raw mode, restored however the block ends."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run_terminal(base: str, token: str, path: str, argv: list[str], *,
                 stdin_fd: int | None = None, stdout_fd: int | None = None) -> int:
    """Join the local terminal to the task's; the remote program's exit code."""
    stdin_fd = sys.stdin.fileno() if stdin_fd is None else stdin_fd
    stdout_fd = sys.stdout.fileno() if stdout_fd is None else stdout_fd
    try:
        ws = Client.connect(websocket_url(base, path),
                            headers={"Authorization": f"Bearer {token}"})
    except WebSocketRefused as error:
        status = int(error.status_code or 0)
        raise CliError(REFUSALS.get(status, f"the cluster refused the terminal (HTTP {status})")
                       ) from None
    except OSError as error:
        raise CliError(f"cannot reach {base}: {error}") from None
    start: dict[str, Any] = {"type": "start"}
    if argv:
        start["command"] = argv
    size = window_size(stdout_fd) or window_size(stdin_fd)
    if size:
        start["cols"], start["rows"] = size
    outcome = _Outcome()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    previous = signal.signal(signal.SIGWINCH, lambda *_: os.write(wake_write, b"w"))
    try:
        ws.send(json.dumps(start))
        threading.Thread(target=_receive, args=(ws, stdout_fd, outcome), daemon=True).start()
        with raw_mode(stdin_fd):
            _send_input(ws, stdin_fd, stdout_fd, wake_read, outcome)
    finally:
        signal.signal(signal.SIGWINCH, previous)
        os.close(wake_read)
        os.close(wake_write)
        with contextlib.suppress(Exception):
            ws.close()
    if outcome.message:
        raise CliError(outcome.message)
    if not outcome.ended:
        raise CliError("the connection to the cluster was lost")
    code = outcome.exit_code
    return code if isinstance(code, int) and 0 <= code <= 255 else EXIT_NO_STATUS


def _receive(ws: Client, stdout_fd: int, outcome: _Outcome) -> None:
    """The remote terminal's output to ours, until the server ends the session."""
    try:
        while not outcome.done.is_set():
            message = ws.receive()
            if isinstance(message, bytes):
                _write_all(stdout_fd, message)
                continue
            if message is None:
                continue
            control = json.loads(message)
            if control.get("type") == "exit":
                outcome.exit_code, outcome.ended = control.get("exitCode"), True
                reason = control.get("reason")
                if reason not in (None, "exited"):
                    outcome.message = _ended_message(reason, control.get("message", ""))
                break
            if control.get("type") == "error":
                outcome.message = str(control.get("message") or "the session was refused")
                break
    except (ConnectionClosed, OSError, ValueError):
        pass
    finally:
        outcome.done.set()


def _ended_message(reason: str, detail: str) -> str:
    said = {"idle": "the session was idle too long and was closed",
            "max-duration": "the session reached its longest length and was closed",
            "node-lost": "the task's node stopped answering"}.get(reason,
                                                                  f"session ended: {reason}")
    return f"{said} ({detail})" if detail else said


def _send_input(ws: Client, stdin_fd: int, stdout_fd: int, wake_fd: int,
                outcome: _Outcome) -> None:
    """Our keystrokes and window changes to the remote terminal."""
    reading = True
    while not outcome.done.is_set():
        ready, _, _ = select.select([stdin_fd, wake_fd] if reading else [wake_fd], [], [],
                                    WAIT_SECONDS)
        try:
            # A resize goes before the keys read with it: the signal may have
            # come while select returned for them (its handler runs after).
            if _woken(wake_fd):
                size = window_size(stdout_fd) or window_size(stdin_fd)
                if size:
                    ws.send(json.dumps({"type": "resize", "cols": size[0], "rows": size[1]}))
            if stdin_fd in ready:
                data = os.read(stdin_fd, READ_BYTES)
                if not data:  # end of input (not a terminal): wait for the program's end
                    reading = False
                    continue
                ws.send(data)
        except ConnectionClosed:
            outcome.done.wait(WAIT_SECONDS)  # the exit message may still be read
            return


def _woken(fd: int) -> bool:
    """Whether SIGWINCH wrote to the (non-blocking) wake pipe; drains it."""
    try:
        return bool(os.read(fd, 64))
    except BlockingIOError:
        return False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
