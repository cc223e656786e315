"""Exec: run a command in a task's running container, through its node's launcher.

The API never holds a node's Docker socket. It writes an exec request
(keys.exec_request: a hash that expires) and, in the same transaction, a call
naming it on the node's stream of calls (shared/state/nodecalls.py). The
launcher claims the request in one script (it exists, names this node, and
nobody claimed it: a call read again finds it claimed and does nothing),
checks that the task still runs there in the job's current attempt, runs the
command with Docker's exec API in a bounded pool, and pushes the outcome on
keys.exec_result, where the API waits for it (BLPOP), giving the caller's
lease of its cap back in the same transaction. Both keys expire, so an
answer nobody waits for, or a request no launcher took, leaves nothing
behind.

The pure parts live here too: the argv rules, the output cap, the reader of
Docker's multiplexed stream, and the check that a host PID belongs to a
container before the launcher kills it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shared.infra import links
from shared.infra.config import MAX_EXEC_TIMEOUT_SECONDS
from shared.state import followleases, keys, scripts

MAX_OUTPUT_BYTES = 1024 * 1024  # stdout and stderr together, as one answer carries them
MAX_ARGS = 1024  # arguments of one command
MAX_ARGV_BYTES = 64 * 1024  # UTF-8 bytes of every argument together
# The ceiling of any exec's timeout; PAI_EXEC_MAX_TIMEOUT_SECONDS sets a lower one.
MAX_TIMEOUT_SECONDS = MAX_EXEC_TIMEOUT_SECONDS
DEFAULT_TIMEOUT_SECONDS = 30
# How long the request and its answer stay in Redis past the command's timeout.
KEEP_SECONDS = 60

CLAIMED = "claimed"  # the request's field a launcher sets when it takes it


def claim_hash(r: Any, key: str, node: str, claimer: str) -> dict[str, str] | None:
    """Take the request or session hash at `key` for `node` (scripts.CLAIM_EXEC):
    its fields, or None when it is gone, names another node, or was taken."""
    return _claimed_fields(_claim(r, key, node, claimer))


def _claim(target: Any, key: str, node: str, claimer: str) -> Any:
    """The claim's script on `target`, a client (its reply) or a pipeline (queued)."""
    return scripts.run(target, scripts.CLAIM_EXEC, [key], [node, claimer, CLAIMED])


def _claimed_fields(raw: Any) -> dict[str, str] | None:
    if not raw:
        return None
    values = [v.decode() if isinstance(v, bytes) else str(v) for v in raw]
    return dict(zip(values[::2], values[1::2], strict=True))


class Outcome(StrEnum):
    """How a launcher answered an exec request."""

    DONE = "done"  # the command ran (maybe killed at its timeout)
    NOT_RUNNING = "not-running"  # the task has no running container on this node now
    BUSY = "busy"  # the node runs as many execs as it may


@dataclass(frozen=True)
class ExecRequest:
    """What the API asks one node to run, and for whom."""

    id: str
    job_id: str
    attempt: int
    role: str
    index: int
    node: str
    argv: list[str]
    timeout_seconds: int
    user: str
    # when the API stops waiting for the answer (the cluster's clock, ms); 0
    # for a request written by an API of an earlier version
    answer_by_ms: int = 0
    # the caller's lease of its cap on execs (keys.exec_leases of `user`),
    # which the answer gives back; "" from an API of an earlier version
    lease: str = ""

    @classmethod
    def new(cls, **fields: Any) -> ExecRequest:
        return cls(id=uuid.uuid4().hex, **fields)

    def to_fields(self) -> dict[str, str]:
        return {"job": self.job_id, "attempt": str(self.attempt), "role": self.role,
                "index": str(self.index), "node": self.node, "argv": json.dumps(self.argv),
                "timeout": str(self.timeout_seconds), "user": self.user,
                "answer_by": str(self.answer_by_ms), "lease": self.lease}

    @classmethod
    def from_fields(cls, request_id: str, raw: dict[str, str]) -> ExecRequest:
        return cls(id=request_id, job_id=raw["job"], attempt=int(raw["attempt"]),
                   role=raw["role"], index=int(raw["index"]), node=raw["node"],
                   argv=[str(a) for a in json.loads(raw["argv"])],
                   timeout_seconds=int(raw["timeout"]), user=raw["user"],
                   answer_by_ms=int(raw.get("answer_by") or 0), lease=raw.get("lease", ""))

    def abandoned(self, now_ms: int) -> bool:
        """Whether the API stopped waiting for the answer: the caller was told
        504, and may already have sent the command again, so it is not run.
        (A launcher down past a request's wait reads it only once back.)"""
        return 0 < self.answer_by_ms < now_ms


@dataclass(frozen=True)
class ExecResult:
    outcome: Outcome
    exit_code: int | None = None
    output: str = ""
    truncated: bool = False
    timed_out: bool = False
    message: str = ""
    # the answer gave the caller's lease back (False from a launcher of an
    # earlier version, or for a request that named none: the API gives it back)
    lease_returned: bool = False

    def to_json(self) -> str:
        return json.dumps({"outcome": self.outcome.value, "exitCode": self.exit_code,
                           "output": self.output, "truncated": self.truncated,
                           "timedOut": self.timed_out, "message": self.message,
                           "leaseReturned": self.lease_returned})

    @classmethod
    def from_json(cls, text: str) -> ExecResult:
        raw = json.loads(text)
        return cls(Outcome(raw["outcome"]), raw.get("exitCode"), raw.get("output", ""),
                   bool(raw.get("truncated")), bool(raw.get("timedOut")),
                   raw.get("message", ""), bool(raw.get("leaseReturned")))


# ------------------------------------------------------------------ pure parts


def argv_problems(argv: list[str]) -> list[str]:
    """What is wrong with a command line (none: it may be run)."""
    problems = []
    if not argv:
        problems.append("give the command to run: at least one argument")
    if len(argv) > MAX_ARGS:
        problems.append(f"at most {MAX_ARGS} arguments")
    if not argv or not argv[0]:
        problems.append("the program name must not be empty")
    if any("\0" in a for a in argv):
        problems.append("arguments must not contain NUL characters")
    if sum(len(a.encode("utf-8", "surrogatepass")) for a in argv) > MAX_ARGV_BYTES:
        problems.append(f"the arguments together must fit in {MAX_ARGV_BYTES // 1024} KiB")
    return problems


@dataclass
class OutputCap:
    """The first `limit` bytes of what a command prints; the rest only counted."""

    limit: int = MAX_OUTPUT_BYTES
    kept: bytearray = field(default_factory=bytearray)
    seen: int = 0

    def feed(self, data: bytes) -> None:
        self.seen += len(data)
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    @property
    def truncated(self) -> bool:
        return self.seen > len(self.kept)

    def text(self) -> str:
        """The bytes kept, as text (a character the cap cut in two, or bytes
        that are not UTF-8, show as U+FFFD)."""
        return bytes(self.kept).decode("utf-8", errors="replace")


_HEADER = struct.Struct(">BxxxL")  # stream (0 stdin, 1 stdout, 2 stderr), 3 zero bytes, size


def demux(buffer: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Docker's multiplexed stream (a container without a TTY) cut into
    (stream, payload) frames, and the bytes of a frame not complete yet."""
    frames = []
    offset = 0
    while len(buffer) - offset >= _HEADER.size:
        stream, size = _HEADER.unpack_from(buffer, offset)
        end = offset + _HEADER.size + size
        if end > len(buffer):
            break
        frames.append((stream, buffer[offset + _HEADER.size:end]))
        offset = end
    return frames, buffer[offset:]


_CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")


def in_container(cgroup_text: str, container_id: str) -> bool:
    """Whether /proc/<pid>/cgroup (its text) puts the process in the container:
    the container's full id is a component of its cgroup path on every line
    (cgroupfs `/docker/<id>`, systemd `/system.slice/docker-<id>.scope`)."""
    if not _CONTAINER_ID.match(container_id):
        return False
    lines = [line for line in cgroup_text.splitlines() if line.strip()]
    if not lines:
        return False
    pattern = re.compile(rf"(^|[/-]){container_id}(\.scope)?(/|$)")
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3 or not pattern.search(parts[2]):
            return False
    return True


def answer_seconds(timeout_seconds: int, margin_seconds: float) -> float:
    """How long the API waits for a node's answer."""
    return timeout_seconds + margin_seconds


# ------------------------------------------------------------------ in Redis


def write_request(pipe: Any, request: ExecRequest) -> None:
    """Queue the request's hash and its expiry on `pipe`."""
    key = keys.exec_request(request.id)
    pipe.hset(key, mapping=request.to_fields())
    pipe.expire(key, request.timeout_seconds + KEEP_SECONDS)


class Claims:
    """The launcher's side of the requests in Redis."""

    def __init__(self, r: Any) -> None:
        self.r = r

    def claim(self, request_id: str, node: str, claimer: str,
              reads: Callable[[Any], None] = lambda pipe: None
              ) -> tuple[ExecRequest | None, list[Any]]:
        """The request, if this call took it for `node` (None when it is gone,
        names another node, or was taken before: a call read again), and the
        replies of the reads `reads` queues beside the claim, in its round trip."""
        pipe = self.r.pipeline(transaction=False)
        _claim(pipe, keys.exec_request(request_id), node, claimer)
        reads(pipe)
        raw, *replies = pipe.execute()
        fields = _claimed_fields(raw)
        return (None if fields is None else ExecRequest.from_fields(request_id, fields)), replies

    def answer(self, request: ExecRequest, result: ExecResult) -> None:
        """Push the answer, and give the caller's lease back in the same
        transaction: the exec is over for its cap once it is answered, before
        the API's wait wakes."""
        key = keys.exec_result(request.id)
        pipe = self.r.pipeline(transaction=True)
        if request.lease:
            followleases.queue_release(pipe, keys.exec_leases(request.user), request.lease)
            result = dataclasses.replace(result, lease_returned=True)
        pipe.rpush(key, result.to_json())
        pipe.pexpire(key, KEEP_SECONDS * 1000)
        pipe.execute()


def wait_result(r: Any, request_id: str, seconds: float) -> ExecResult | None:
    """The node's answer, or None when none came within `seconds`: BLPOPs of
    at most links.BLOCK_CHUNK_SECONDS each, inside the connection's timeout."""
    deadline = time.monotonic() + seconds
    found = None
    while found is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        found = r.blpop([keys.exec_result(request_id)],
                        timeout=max(0.01, min(left, links.BLOCK_CHUNK_SECONDS)))
    _, text = found
    return ExecResult.from_json(text.decode() if isinstance(text, bytes) else text)
