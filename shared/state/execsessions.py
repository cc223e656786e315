"""Interactive exec: a terminal in a task's running container, carried through Redis.

The API never holds a node's Docker socket, so a terminal session travels
through Redis between the API (which holds the user's WebSocket) and the
node's launcher (which holds Docker's exec socket):

- keys.exec_session: the session's request, a hash that lives while the API
  renews it (SESSION_TTL_SECONDS, renewed every RENEW_SECONDS). The launcher
  claims it once (a call read again finds it claimed) and writes its
  heartbeat in it (`beat`). When the hash is gone -- the client left and the
  API deleted it, or the API died and it expired -- the launcher kills the
  exec'd process and ends.
- keys.exec_session_input: a list the API appends the user's keystrokes and
  resizes to, the launcher pops. At most INPUT_MAX_ENTRIES entries wait:
  past that the API stops reading the WebSocket until the launcher catches
  up (back-pressure, nothing dropped).
- keys.exec_session_output: a stream the launcher appends the terminal's
  output to, the API reads (XREAD BLOCK) and deletes once sent (a batch at
  a time, services/api/exectty.py). At most OUTPUT_MAX_ENTRIES entries, sent
  or not, are kept: past that the launcher stops reading the
  exec's socket (back-pressure: the program blocks on its terminal, as on a
  slow ssh link). Its first entry says the session started (or why not),
  its last one the exit code and why the session ended.

Every key expires, and each write is a script that checks the session still
exists first, so a session that ended leaves nothing behind. Terminal bytes
travel as latin-1 text (one character per byte): the platform's Redis
clients decode replies as text.

The pure parts live here too: the control messages of the WebSocket, the
window size rules, the input entries and when a session must end.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.state import keys, scripts
from shared.state.execs import ExecRequest, claim_hash

DEFAULT_ARGV = ("/bin/sh",)
DEFAULT_COLS, DEFAULT_ROWS = 80, 24
MAX_WINDOW = 10_000  # columns or rows a window may have
MAX_CONTROL_BYTES = 80 * 1024  # a text frame (a start message carries an argv of 64 KiB)
READ_BYTES = 16 * 1024  # the launcher's reads of the exec's socket: one output entry at most
INPUT_MAX_ENTRIES = 64  # keystroke entries waiting for the launcher (4 MiB at most)
OUTPUT_MAX_ENTRIES = 256  # output entries waiting for the API (4 MiB at most)
SESSION_TTL_SECONDS = 30  # a session whose API stopped renewing it ends this late
RENEW_SECONDS = 10  # the API renews the session (and its user's lease) this often
NODE_LOST_SECONDS = 30  # no heartbeat for this long: the API ends the session
START_WAIT_SECONDS = 30  # how long the API waits for a start message after the upgrade

BEAT = "beat"


class Refusal(StrEnum):
    """Why a launcher did not start a session."""

    NOT_RUNNING = "not-running"
    BUSY = "busy"


class EndReason(StrEnum):
    """Why a session ended (the exit message's and the audit's `reason`)."""

    EXITED = "exited"  # the program ended
    IDLE = "idle"  # no byte either way for the idle time
    MAX_DURATION = "max-duration"  # the session reached its longest length
    CLIENT_GONE = "client-gone"  # the client closed or vanished
    NODE_LOST = "node-lost"  # the node's launcher stopped answering
    REFUSED = "refused"  # the node did not start it (not running there, or busy)


@dataclass(frozen=True)
class TtyRequest:
    """An interactive exec: the command (its `timeout_seconds` is the
    session's longest length), its window, and its idle limit."""

    exec: ExecRequest
    cols: int
    rows: int
    idle_seconds: float

    @property
    def id(self) -> str:
        return self.exec.id

    @classmethod
    def new(cls, *, cols: int, rows: int, idle_seconds: float, **fields: Any) -> TtyRequest:
        return cls(ExecRequest(id=uuid.uuid4().hex, **fields), cols, rows, idle_seconds)

    def to_fields(self) -> dict[str, str]:
        return {**self.exec.to_fields(), "cols": str(self.cols), "rows": str(self.rows),
                "idle": repr(self.idle_seconds)}

    @classmethod
    def from_fields(cls, session_id: str, raw: dict[str, str]) -> TtyRequest:
        return cls(ExecRequest.from_fields(session_id, raw), int(raw["cols"]),
                   int(raw["rows"]), float(raw["idle"]))


# ------------------------------------------------------------------ pure parts


class ControlError(ValueError):
    """A text frame the protocol does not know (the message says why)."""


@dataclass(frozen=True)
class Resize:
    cols: int
    rows: int


@dataclass(frozen=True)
class Start:
    argv: list[str] | None  # None: the default shell
    window: Resize | None


def exit_message(exit_code: int | None, reason: EndReason, message: str = "") -> str:
    """The server's last text frame before it closes the WebSocket."""
    body: dict[str, Any] = {"type": "exit", "exitCode": exit_code, "reason": reason.value}
    if message:
        body["message"] = message
    return json.dumps(body)


def error_message(status: int, message: str) -> str:
    """A text frame for a session refused after the upgrade (its node said no)."""
    return json.dumps({"type": "error", "status": status, "message": message})


# The input list's entries: a tag character, then the payload.
_DATA, _RESIZE = "d", "r"


def input_data(data: bytes) -> str:
    return _DATA + data.decode("latin-1")


def input_resize(resize: Resize) -> str:
    return f"{_RESIZE}{resize.cols},{resize.rows}"


def parse_input(entry: str) -> bytes | Resize:
    """An input entry back: the bytes to write, or a resize."""
    if entry.startswith(_RESIZE):
        cols, _, rows = entry[1:].partition(",")
        return Resize(int(cols), int(rows))
    return entry[1:].encode("latin-1")


def end_reason(now: float, started: float, last_activity: float, idle_seconds: float,
               max_seconds: float) -> EndReason | None:
    """Whether a session that still runs must end now (times from one monotonic clock)."""
    if now - started >= max_seconds:
        return EndReason.MAX_DURATION
    if now - last_activity >= idle_seconds:
        return EndReason.IDLE
    return None


def node_lost(now_ms: int, started_ms: int, beat_ms: int | None) -> bool:
    """Whether the launcher stopped answering: no heartbeat for NODE_LOST_SECONDS
    (counted from the session's start before its first)."""
    return now_ms - (beat_ms if beat_ms is not None else started_ms) > NODE_LOST_SECONDS * 1000


# ------------------------------------------------------------------ in Redis


def _keys(session_id: str) -> list[str]:
    return [keys.exec_session(session_id), keys.exec_session_input(session_id),
            keys.exec_session_output(session_id)]


def _pairs(fields: dict[str, str]) -> list[str]:
    return [part for pair in fields.items() for part in pair]


def write_request(pipe: Any, request: TtyRequest) -> None:
    """Queue the session's hash and its expiry on `pipe` (the API renews it)."""
    key = keys.exec_session(request.id)
    pipe.hset(key, mapping=request.to_fields())
    pipe.expire(key, SESSION_TTL_SECONDS)


@dataclass(frozen=True)
class Entry:
    """One output entry, as the API reads it."""

    id: str
    data: bytes = b""
    started: bool = False
    refused: Refusal | None = None
    ended: EndReason | None = None
    exit_code: int | None = None
    message: str = ""

    @classmethod
    def from_fields(cls, entry_id: str, raw: dict[str, str]) -> Entry:
        if "d" in raw:
            return cls(entry_id, data=raw["d"].encode("latin-1"))
        if "started" in raw:
            return cls(entry_id, started=True)
        if "refused" in raw:
            return cls(entry_id, refused=Refusal(raw["refused"]), message=raw.get("message", ""))
        code = raw.get("exit", "")
        return cls(entry_id, ended=EndReason(raw.get("reason", EndReason.EXITED.value)),
                   exit_code=int(code) if code.lstrip("-").isdigit() else None,
                   message=raw.get("message", ""))


class Sessions:
    """Both sides' writes and reads of the sessions in Redis."""

    def __init__(self, r: Any) -> None:
        self.r = r

    # ---- the launcher's side

    def claim(self, session_id: str, node: str, claimer: str) -> TtyRequest | None:
        """The session, if this call took it for `node`; None when it is gone,
        names another node, or was taken before."""
        fields = claim_hash(self.r, keys.exec_session(session_id), node, claimer)
        return None if fields is None else TtyRequest.from_fields(session_id, fields)

    def put_output(self, session_id: str, fields: dict[str, str]) -> int:
        """Append an output entry: 1 added, 0 full, -1 the session is gone."""
        key, _, output = _keys(session_id)
        return int(scripts.run(self.r, scripts.PUT_TERMINAL_OUTPUT, [key, output],
                               [OUTPUT_MAX_ENTRIES, SESSION_TTL_SECONDS * 1000,
                                *_pairs(fields)]))

    def put_data(self, session_id: str, data: bytes) -> int:
        return self.put_output(session_id, {"d": data.decode("latin-1")})

    def beat(self, session_id: str, now_ms: int) -> bool:
        """The launcher's heartbeat; False when the session is gone (its
        client left): HSET only on a hash that exists."""
        return bool(scripts.run(self.r, scripts.HSET_IF_EXISTS, [keys.exec_session(session_id)],
                                [BEAT, str(now_ms)]))

    def take_input(self, session_id: str, wait_seconds: float) -> list[bytes | Resize]:
        """What the user typed (and resizes), waiting up to `wait_seconds` for
        the first; everything waiting is taken at once."""
        key = keys.exec_session_input(session_id)
        # BLMPOP: the first keystroke and any after it in one round trip (a
        # BLPOP then an LPOP for the rest made every keystroke wait for two)
        found = self.r.blmpop(wait_seconds, 1, key, direction="LEFT", count=INPUT_MAX_ENTRIES)
        if not found:
            return []
        return [parse_input(e) for e in found[1]]

    def end(self, session_id: str, exit_code: int | None, reason: EndReason,
            message: str = "") -> None:
        """The session's last entry (if its client still waits) and the end of its keys."""
        fields = {"exit": "" if exit_code is None else str(exit_code), "reason": reason.value}
        if message:
            fields["message"] = message
        scripts.run(self.r, scripts.END_TERMINAL, _keys(session_id),
                    [SESSION_TTL_SECONDS * 1000, *_pairs(fields)])

    def refuse(self, session_id: str, refusal: Refusal, message: str = "") -> None:
        self.put_output(session_id, {"refused": refusal.value, "message": message})

    # ---- the API's side

    def push_input(self, session_id: str, entry: str) -> int:
        """Queue input for the launcher: 1 queued, 0 full, -1 the session is gone."""
        key, input_key, _ = _keys(session_id)
        return int(scripts.run(self.r, scripts.PUSH_TERMINAL_INPUT, [key, input_key],
                               [INPUT_MAX_ENTRIES, SESSION_TTL_SECONDS * 1000, entry]))

    def renew(self, session_id: str) -> dict[str, str] | None:
        """Keep the session alive; its fields (the launcher's heartbeat among
        them), or None when it is gone (the launcher ended it)."""
        key = keys.exec_session(session_id)
        pipe = self.r.pipeline(transaction=True)
        pipe.expire(key, SESSION_TTL_SECONDS)
        pipe.hgetall(key)
        renewed, fields = pipe.execute()
        return dict(fields) if renewed else None

    def read_output(self, session_id: str, after: str, block_ms: int) -> list[Entry]:
        """Output entries after `after`, waiting up to `block_ms` for one."""
        found = self.r.xread({keys.exec_session_output(session_id): after}, block=block_ms,
                             count=64)
        if not found:
            return []
        _, entries = found[0]
        return [Entry.from_fields(entry_id, dict(fields)) for entry_id, fields in entries]

    def delivered(self, session_id: str, entry_ids: list[str]) -> None:
        """Drop output entries the client has been sent (room for the launcher)."""
        if entry_ids:
            self.r.xdel(keys.exec_session_output(session_id), *entry_ids)

    def close(self, session_id: str) -> None:
        """The API's end of a session: every key goes; the launcher, finding
        its session gone, kills the program."""
        self.r.delete(*_keys(session_id))
