"""Interactive exec: a terminal in a task's running container over a WebSocket.

`GET .../tasks/<role>/<index>/exec?tty=1` with `Upgrade: websocket`. Before
the upgrade the view answers as the POST does: 403/404 (not the job's owner
nor an admin / no such job or task), 409 (the task is not running), 429 (the
caller holds PAI_EXEC_TTY_PER_USER sessions: a lease each, as log follows,
services/api/follows.py, under keys.exec_tty_leases), 503 (this process
serves as many as it may). After it, binary frames are the terminal's bytes
both ways, text frames JSON control messages (shared/state/execsessions.py).

The API never reaches the node's Docker engine: the session travels through
Redis (shared/state/execsessions.py) to the node's launcher (services/launcher/
exectty.py). Under gunicorn's gevent worker the session is a greenlet, its
output read with XREAD BLOCK on a Redis pool of its own, as log follows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, current_app, request
from marshmallow import ValidationError
from simple_websocket import ConnectionClosed, Server
from wsproto.events import CloseConnection, Message, TextMessage
from wsproto.utilities import LocalProtocolError

from services.api.auth import current_user
from services.api.errors import ApiError
from services.api.execs import job_and_task, running_node
from services.api.execschemas import ControlMessageSchema
from services.api.follows import Caps, FollowLeases, _ProcessSlots
from services.api.platform import extension_of, platform
from services.api.queries import ExecTtyQuerySchema, load_query, takes_query
from shared.domain.jobspec import flat_errors
from shared.infra.clock import now_ms
from shared.state import execsessions, keys, nodecalls, telemetry
from shared.state.execsessions import (
    ControlError,
    EndReason,
    Refusal,
    Resize,
    Sessions,
    Start,
    TtyRequest,
)
from shared.state.store import Store, connect, dedicated

bp = Blueprint("exectty", __name__, url_prefix="/api/v1")
log = logging.getLogger("pai.api")

EXTENSION = "pai.exectty"
READ_BLOCK_MS = 1000
RECEIVE_SECONDS = 1.0
SEND_TIMEOUT_SECONDS = 30.0
FULL_WAIT_SECONDS = 0.05
# Output entries sent are deleted (room for the launcher) this many at a
# time: a command for every keystroke's echo was a fifth of a session's CPU.
# The stream's bound (OUTPUT_MAX_ENTRIES) counts them until then.
DELETE_BATCH = 32
# A client that keeps sending while the node is behind is cut off past this
# many messages buffered in the API (the WebSocket reader does not stop).
MAX_BUFFERED_MESSAGES = 2 * execsessions.INPUT_MAX_ENTRIES
# WebSocket close codes (RFC 6455 section 7.4.1)
CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TRY_LATER, CLOSE_ERROR = 1000, 1008, 1013, 1011


def parse_control(text: str) -> Resize | Start:
    """A text frame from the client, loaded by `ControlMessageSchema`;
    ControlError (its message says why) for one the protocol refuses."""
    if len(text.encode("utf-8", "surrogatepass")) > execsessions.MAX_CONTROL_BYTES:
        raise ControlError("a control message holds at most "
                           f"{execsessions.MAX_CONTROL_BYTES // 1024} KiB")
    try:
        raw = json.loads(text)
    except ValueError:
        raise ControlError("a text frame must be a JSON object") from None
    try:
        message = ControlMessageSchema().load(raw)
    except ValidationError as error:
        raise ControlError("; ".join(problem for problems in flat_errors(error.messages).values()
                                     for problem in problems)) from None
    window = Resize(message["cols"], message["rows"]) if "cols" in message else None
    if message["type"] == "resize":
        assert window is not None  # the schema asks a resize for both sides
        return window
    command = message.get("command")
    return Start(list(command) if command is not None else None, window)


@dataclass
class _Ttys:
    """The sessions' caps and their Redis pool: each session holds two of its
    connections for its whole life (`dedicated`), one for its output (XREAD
    BLOCK) and one for its input, never the connections requests need."""

    caps: Caps
    store: Store


def _ttys() -> _Ttys:
    def create() -> _Ttys:
        settings = platform().settings
        slots = max(1, settings.api_worker_connections // 4)
        store = Store(connect(settings.redis_url, pool_size=2 * slots))
        caps = Caps(FollowLeases(store, settings.exec_tty_per_user, key=keys.exec_tty_leases),
                    _ProcessSlots(slots),
                    busy="this API process serves as many terminal sessions as it may",
                    capped="{user} already holds {cap} terminal sessions, the most one user "
                           "may at once; close one first")
        return _Ttys(caps, store)

    return extension_of(current_app, EXTENSION, create)


# A GET without `Upgrade: websocket` reaches the view too, for a clear 400.
@bp.route("/user/<username>/jobs/<name>/tasks/<role>/<int:index>/exec", methods=["GET"],
          websocket=True)
@bp.route("/user/<username>/jobs/<name>/tasks/<role>/<int:index>/exec", methods=["GET"])
@takes_query(ExecTtyQuerySchema())
def terminal(username: str, name: str, role: str, index: int) -> Response:
    """A terminal in a task's running container, over a WebSocket.
    ---
    get:
      summary: Interactive exec (WebSocket)
      description: |
        Send `Upgrade: websocket` (RFC 6455) with the bearer token in the
        Authorization header. After `101 Switching Protocols`, binary
        messages carry the terminal's bytes both ways; text messages are JSON
        control messages. Client to server: `{"type": "start", "command":
        [...], "cols": N, "rows": N}` first when the query names no command
        (the command may be left out: the image's /bin/sh), then
        `{"type": "resize", "cols": N, "rows": N}` at any time. Server to
        client: `{"type": "exit", "exitCode": n, "reason": "exited" | "idle" |
        "max-duration" | "node-lost"}` before it closes, or `{"type":
        "error", "status": 409 | 503 | 504, "message": ...}` when the node
        did not start the session. A session with no byte either way for
        PAI_EXEC_IDLE_SECONDS, or older than PAI_EXEC_MAX_SESSION_SECONDS,
        is closed. By its last message the session counts against no cap:
        the next may open at once.
      parameters:
      - {in: header, name: Upgrade, required: true, schema: {type: string, enum: [websocket]}}
      - {in: header, name: Sec-WebSocket-Version, schema: {type: string, enum: ["13"]}}
      - {in: header, name: Sec-WebSocket-Key, schema: {type: string},
         description: "RFC 6455's handshake key (16 random bytes, base64)"}
      errors: [400, 403, 404, 409, 429, 503]
      responses:
        101: {description: the WebSocket is open}
    """
    job, task = job_and_task(username, name, role, index)
    pai = platform()
    query = load_query()
    if request.environ.get("HTTP_UPGRADE", "").lower() != "websocket":
        raise ApiError("BadRequestError", "this is the interactive exec: open a WebSocket "
                       "(Upgrade: websocket); run one command with POST on this path", 400)
    node = running_node(job, task, role, index)
    caller = current_user()
    state = _ttys()
    ws: Server | None = None
    session: _Session | None = None
    try:
        with state.caps.held(caller.username) as lease:
            try:
                ws = Server(request.environ, max_message_size=execsessions.MAX_CONTROL_BYTES)
            except Exception as error:  # a handshake wsproto refused, or no sockets
                raise ApiError("BadRequestError", f"not a WebSocket handshake this server "
                               f"can accept: {error or type(error).__name__}", 400) from None
            session = _Session(ws, state, caller.username, lease, TtyRequest.new(
                job_id=job.id, attempt=job.attempt, role=role, index=index, node=node,
                argv=query.get("command") or [], user=caller.username,
                timeout_seconds=int(pai.settings.exec_max_session_seconds),
                cols=query["cols"], rows=query["rows"],
                idle_seconds=pai.settings.exec_idle_seconds))
            session.run("command" not in query, pai.settings.exec_answer_margin_seconds)
    finally:
        # The slot, the lease and the session's connections are back before
        # the client hears the end, so it may open the next session at once.
        if session is not None:
            session.hang_up()
        elif ws is not None:
            _close_ws(ws, CLOSE_NORMAL)
    return _upgraded(ws)


class _Session:
    """One session, from its start message to its close."""

    def __init__(self, ws: Server, state: _Ttys, username: str, lease: str,
                 request: TtyRequest) -> None:
        self.ws, self.state, self.username, self.lease = ws, state, username, lease
        self.request = request
        # Each pump on a connection of its own, held for the session: the
        # output's (read, delete, renew, close) and the input's (push)
        self.output = Sessions(dedicated(state.store.r))
        self.inputs = Sessions(dedicated(state.store.r))
        self.over = threading.Event()  # the client left, or the session said its last
        self.last_id = "0-0"  # the last output entry sent
        self.sent: list[str] = []  # output entries sent and not yet deleted
        self.sending = threading.Lock()  # both pumps send: one whole message at a time
        self.last: tuple[int, str] | None = None  # the close code and message `hang_up` sends

    def run(self, wait_start: bool, answer_seconds: float) -> None:
        """The session, until it is over; its connections are back in the
        pool when this returns (its last message is `hang_up`'s)."""
        try:
            self._run(wait_start, answer_seconds)
        finally:
            self.over.set()
            try:
                self.output.r.close()
            finally:
                self.inputs.r.close()

    def _run(self, wait_start: bool, answer_seconds: float) -> None:
        pending: list[bytes | Resize] = []
        if wait_start:
            started = self._start_message(pending)
            if started is None:
                return
            self.request = started
        self._record()
        try:
            if not self._wait_started(answer_seconds):
                return
            for item in pending:
                self._push(item)
            typing = threading.Thread(target=self._pump_input, daemon=True)
            typing.start()
            self._pump_output()
        finally:
            self.over.set()
            self.output.close(self.request.id)

    def _start_message(self, pending: list[bytes | Resize]) -> TtyRequest | None:
        """The request the first message makes: a start message (its command
        and window), or the default shell for keystrokes or a resize."""
        argv, window = list(execsessions.DEFAULT_ARGV), None
        try:
            message = self.ws.receive(timeout=execsessions.START_WAIT_SECONDS)
        except ConnectionClosed:
            return None
        if message is None:
            self._close(CLOSE_POLICY, execsessions.error_message(
                400, f"no start message within {execsessions.START_WAIT_SECONDS} s"))
            return None
        if isinstance(message, bytes):
            pending.append(message)
        else:
            try:
                control = parse_control(message)
            except ControlError as error:
                self._close(CLOSE_POLICY, execsessions.error_message(400, str(error)))
                return None
            if isinstance(control, Start):
                argv, window = control.argv or argv, control.window
            else:
                window = control
        window = window or Resize(self.request.cols, self.request.rows)
        return dataclasses.replace(self.request, exec=dataclasses.replace(
            self.request.exec, argv=argv), cols=window.cols, rows=window.rows)

    def _record(self) -> None:
        """The session, the call to its node and the audit of it, written together."""
        store, request = platform().store, self.request
        pipe = store.pipeline(atomic=True)
        execsessions.write_request(pipe, request)
        nodecalls.send(pipe, request.exec.node, nodecalls.Kind.TTY, request.id)
        store.add_event(pipe, request.exec.job_id, "exec-session", user=request.exec.user,
                        attempt=request.exec.attempt, role=request.exec.role,
                        index=request.exec.index, argv=request.exec.argv, session=request.id)
        telemetry.record(pipe, telemetry.TASK_EXEC_SESSIONS, {"user": request.exec.user})
        pipe.execute()
        log.info("exec session %s by %s in %s attempt %d %s[%d] on %s: %s", request.id[:12],
                 request.exec.user, request.exec.job_id, request.exec.attempt,
                 request.exec.role, request.exec.index, request.exec.node, request.exec.argv)

    def _wait_started(self, answer_seconds: float) -> bool:
        """Whether the node started the session (it tells the client why not)."""
        deadline = time.monotonic() + answer_seconds
        while time.monotonic() < deadline:
            for entry in self.output.read_output(self.request.id, "0-0", READ_BLOCK_MS):
                self.output.delivered(self.request.id, [entry.id])
                if entry.started:
                    self.last_id = entry.id
                    return True
                status = 409 if entry.refused == Refusal.NOT_RUNNING else 503
                self._close(CLOSE_TRY_LATER if status == 503 else CLOSE_POLICY,
                            execsessions.error_message(status, entry.message or "refused"))
                return False
            self.output.renew(self.request.id)
        self._close(CLOSE_TRY_LATER, execsessions.error_message(
            504, f"node {self.request.exec.node} did not answer in time"))
        return False

    def _pump_output(self) -> None:
        """The node's output to the client, until the session ends."""
        renewed_at = time.monotonic()
        started_ms = now_ms()
        while not self.over.is_set():
            entries = self.output.read_output(self.request.id, self.last_id, READ_BLOCK_MS)
            for entry in entries:
                self.last_id = entry.id
                if entry.ended is not None:
                    self._close(CLOSE_NORMAL, execsessions.exit_message(
                        entry.exit_code, entry.ended, entry.message))
                    return
                try:
                    self._send(entry.data)
                except (ConnectionClosed, OSError):  # gone, or not reading
                    return
            self.sent.extend(e.id for e in entries)
            if len(self.sent) >= DELETE_BATCH:
                self.output.delivered(self.request.id, self.sent)
                self.sent = []
            if time.monotonic() - renewed_at >= execsessions.RENEW_SECONDS:
                renewed_at = time.monotonic()
                if not self._renew(started_ms):
                    return

    def _renew(self, started_ms: int) -> bool:
        """Keep the session and its lease; False when it must end here."""
        self.state.caps.leases.renew(self.username, self.lease)
        fields = self.output.renew(self.request.id)
        beat = (fields or {}).get(execsessions.BEAT)
        if fields is None or execsessions.node_lost(now_ms(), started_ms,
                                                     int(beat) if beat else None):
            self._close(CLOSE_ERROR, execsessions.exit_message(
                None, EndReason.NODE_LOST, f"node {self.request.exec.node} stopped answering"))
            return False
        return True

    def _pump_input(self) -> None:
        """The client's keystrokes and resizes to the node, until it leaves."""
        try:
            while not self.over.is_set():
                message = self.ws.receive(timeout=RECEIVE_SECONDS)
                if message is None:
                    continue
                if isinstance(message, bytes):
                    if not self._push(message):
                        return
                    continue
                try:
                    control = parse_control(message)
                except ControlError as error:
                    self._send(execsessions.error_message(400, str(error)))
                    continue
                if isinstance(control, Start):
                    self._send(execsessions.error_message(
                        400, "the session has started: resize or keystrokes only"))
                elif not self._push(control):
                    return
        except (ConnectionClosed, OSError):
            pass
        finally:
            self.over.set()

    def _push(self, item: bytes | Resize) -> bool:
        """Queue input for the node, waiting while its list is full; False
        when the session is over (or the client floods while it waits)."""
        entry = execsessions.input_resize(item) if isinstance(item, Resize) \
            else execsessions.input_data(item)
        while not self.over.is_set():
            added = self.inputs.push_input(self.request.id, entry)
            if added != 0:
                return added > 0
            if len(getattr(self.ws, "input_buffer", ())) > MAX_BUFFERED_MESSAGES:
                self._close(CLOSE_POLICY, execsessions.error_message(
                    429, "input arrives faster than the task reads it"))
                return False
            time.sleep(FULL_WAIT_SECONDS)
        return False

    def _send(self, data: bytes | str) -> None:
        with self.sending:
            _send(self.ws, data)

    def _close(self, code: int, text: str) -> None:
        """End the session with this last message (the first one said wins),
        sent by `hang_up` once the session has given back what it holds."""
        with self.sending:
            self.last = self.last or (code, text)
        self.over.set()

    def hang_up(self) -> None:
        """The last message, if the session said one, then the close frame."""
        with self.sending:
            code, text = self.last or (CLOSE_NORMAL, None)
            if text is not None:
                with contextlib.suppress(ConnectionClosed, OSError):
                    _send(self.ws, text)
            _close_ws(self.ws, code)


def _send(ws: Server, data: bytes | str) -> None:
    """One message to the client, whole or not at all within SEND_TIMEOUT_SECONDS.
    simple-websocket's own send writes once and drops what the socket did
    not take (under gevent, a slow reader's output would be cut), and waits
    forever for a client that stopped reading: a session, and its slot, must
    not."""
    try:
        if not ws.connected:
            raise LocalProtocolError("closed")
        frame = ws.ws.send(Message(data=data) if isinstance(data, bytes)
                           else TextMessage(data=data))
    except LocalProtocolError:  # closed here, or the client's close frame just came in
        raise ConnectionClosed(ws.close_reason, ws.close_message) from None
    _write(ws, frame)


def _close_ws(ws: Server, code: int) -> None:
    """The close frame, under the same deadline; the connection is done either way."""
    if not ws.connected:
        return
    try:
        _write(ws, ws.ws.send(CloseConnection(code)))
    except (OSError, LocalProtocolError):
        pass
    finally:
        ws.connected = False


def _write(ws: Server, frame: bytes) -> None:
    """All of `frame`, or TimeoutError (and the connection shut) when the
    client does not take it within SEND_TIMEOUT_SECONDS."""
    view = memoryview(frame)
    deadline = time.monotonic() + SEND_TIMEOUT_SECONDS
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            with contextlib.suppress(OSError):
                ws.sock.shutdown(socket.SHUT_RDWR)
            raise TimeoutError("the client does not read what it is sent")
        _, writable, _ = select.select([], [ws.sock], [], left)
        if writable:
            try:
                view = view[ws.sock.send(view, socket.MSG_DONTWAIT):]
            except BlockingIOError:
                continue


def _upgraded(ws: Server) -> Response:
    """The view's return once its WebSocket closed: the connection is done,
    nothing more is written (as flask-sock does for each server)."""

    class _Done(Response):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if ws.mode == "gunicorn":
                raise StopIteration()  # gunicorn's signal: the handler took the socket
            if ws.mode == "werkzeug":
                return super().__call__(*args, **kwargs)
            return []

    return _Done()
