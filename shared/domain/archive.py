"""A finished job's compact record: what Redis keeps of it once compacted.

A live job spreads over many keys (its config, a tasks hash per attempt, the
attempts hash, an event stream, a log stream per task attempt), each with
Redis's own overhead, and its record carries fields only a queued or running
job needs. A finished job needs none of that in that form: the API shows its
record, its config, its last attempt's tasks and every attempt. So the
retention sweep (shared/state/retention.py) folds config, attempts, the last
attempt's tasks and a short summary of its events into one compressed
string (keys.job_archive), and the other keys go. Since version 2 the
job's record goes into it too (`Archive.record`, the compacted record's
fields): a hash of a few hundred bytes beside it cost a key of its own, its
field names in full and Redis's per-key overhead, about 260 bytes a job,
where the same fields compressed with the rest add about 60. The store reads
a compacted job's record from here when it has no hash (shared/state/store).

Pure: encoding and decoding only, so the format is tested without Redis.
The format starts with a version byte; the compression dictionary belongs
to that version and never changes under it. Version 1 archives (a record
hash beside them) still read.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.domain.models import Attempt, Task

# Job fields only a queued, placed or running job uses: a finished one drops them.
RUNNING_ONLY_FIELDS = ("waiting_reason", "waiting", "mode", "preempted_by",
                       "preempt_deadline_ms", "queue_seq")
# Events an archive keeps (at most SUMMARY_EVENTS, the last ones): those the
# attempts do not tell already (a submit and each attempt's end they do).
KEPT_KINDS = frozenset({"stop-requested", "preempted"})
SUMMARY_EVENTS = 8
# Docker's short container id: what `docker ps -a` shows and accepts; the
# container of a finished task is gone, so the full id acts on nothing.
SHORT_ID = 12

_V1 = b"\x01"
_VERSION = b"\x02"
# Words the archives of version 1 are made of, so a job of a few hundred
# bytes compresses as if it were one of many (deflate's preset dictionary).
_DICTIONARY = (
    b'{"c":{"jobName":"","image":"","virtualCluster":"default","retryCount":0,'
    b'"killAllOnCompletedTaskNumber":0,"jobEnvs":{},"extras":{},"taskRoles":[{"name":"worker",'
    b'"taskNumber":1,"cpuNumber":1,"memoryMB":1024,"gpuNumber":1,"portList":[],'
    b'"command":"python train.py","minFailedTaskCount":null,"minSucceededTaskCount":null,'
    b'"shmMB":64},{"name":"ps","taskNumber":1,"cpuNumber":4,"memoryMB":8192,"gpuNumber":0,'
    b'"portList":[{"label":"","beginAt":0,"portNumber":1}],"command":"python '
    b'"}],"outputDir":"","dataDir":"","codeDir":"","jobPriorityClass":"test"},'
    b'"a":[{"index":0,"state":"FAILED","created_ms":17,"started_ms":17,"completed_ms":17,'
    b'"exit_code":1,"reason":"1 task(s) of role worker failed; worker[0]: exited with code 1",'
    b'"platform_failure":true,"preempted_by":""},{"index":1,"state":"SUCCEEDED",'
    b'"reason":"all tasks completed","exit_code":0,"state":"STOPPED","reason":"stopped by user"'
    b'}],"t":[{"role":"worker","index":1,"state":"SUCCEEDED","node":"","ip":"10.","gpus":[0],'
    b'"ports":{"default":[1]},"container_id":"","exit_code":0,"diagnostics":"",'
    b'"launched_ms":17,"started_ms":17,"completed_ms":17}],'
    b'"e":[{"kind":"submitted","time":17,"attempt":0},{"kind":"attempt-end","time":17,'
    b'"attempt":0,"state":"SUCCEEDED","retried":false},{"kind":"stop-requested","time":17,'
    b'"state":"STOPPING"}],"s":[],"f":true}'
)
# Version 2 adds the record's words, and the attempts, tasks and record laid
# out as `encode` writes them (the monitor's diagnostics among them), last:
# deflate reaches the end of its dictionary cheapest.
_DICTIONARY_V2 = _DICTIONARY + (
    b',"n":1,"r":{"virtual_cluster":"default","state":"SUCCEEDED","version":"18",'
    b'"created_ms":"17","completed_ms":"17","attempt":"1","retries":"1",'
    b'"platform_retries":"1","execution_type":"STOP","exit_code":"0","exit_diagnostics":"",'
    b'"gpus":"1","started_ms":"17","user_id":"uid-","priority":"prod","preemptions":"1",'
    b'"retry_after_ms":"17","state":"FAILED","state":"STOPPED"}}'
    b'"a":[{"index":0,"state":"SUCCEEDED","created_ms":17,"started_ms":17,"completed_ms":17,'
    b'"exit_code":0,"reason":"all tasks completed"}],"t":[{"role":"worker","index":0,'
    b'"state":"SUCCEEDED","node":"","ip":"10.","gpus":[0,1,2,3,4,5,6,7],'
    b'"ports":{"default":[15000]},"container_id":"","exit_code":0,"launched_ms":17,'
    b'"started_ms":17,"completed_ms":17},{"role":"main","index":0,"state":"FAILED",'
    b'"exit_code":1,"diagnostics":"exit code 137 (killed by SIGKILL)","exit_code":1,'
    b'"diagnostics":"exit code 1"}],"e":[],"s":[],"f":false,"n":0,"r":{"virtual_cluster":'
    b'"default","state":"SUCCEEDED","version":"18","created_ms":"17","completed_ms":"17",'
    b'"exit_code":"0","gpus":"1","started_ms":"17","user_id":"","priority":"prod"}}'
)
_DICTIONARIES = {_V1: _DICTIONARY, _VERSION: _DICTIONARY_V2}


def _compress(data: bytes, dictionary: bytes = _DICTIONARY_V2) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, dictionary)
    return packer.compress(data) + packer.flush()


def _decompress(data: bytes, dictionary: bytes = _DICTIONARY_V2) -> bytes:
    unpacker = zlib.decompressobj(-15, dictionary)
    return unpacker.decompress(data) + unpacker.flush()


def _without_defaults(data: Mapping[str, Any], keep: Iterable[str]) -> dict[str, Any]:
    """A record's dict without the fields at their default (empty) values;
    `from_dict` gives them back."""
    kept = set(keep)
    return {k: v for k, v in data.items()
            if k in kept or not (v is None or v is False or v in ("", [], {}))}


def task_ref(attempt: int, role: str, index: int) -> str:
    """One task attempt's log, as an archive names it."""
    return f"{attempt}:{role}:{index}"


@dataclass(frozen=True)
class Archive:
    """What a compacted job keeps beside its record.

    `logs_filed`: its logs were moved to the log tree; `streams` names the
    logs that stayed in Redis anyway (no log tree configured, or a file that
    could not be written), so an expiry still finds and deletes them.
    `record`: the job record's fields as compaction left them
    (retention.compacted_record), None in a version 1 archive, whose
    record is a hash of its own.
    """

    config: dict[str, Any]
    attempts: tuple[Attempt, ...] = ()
    tasks: tuple[Task, ...] = ()  # the last attempt's
    events: tuple[dict[str, Any], ...] = ()
    streams: tuple[str, ...] = ()
    logs_filed: bool = False
    last_attempt: int = field(default=0)
    record: dict[str, str] | None = None

    def encode(self) -> bytes:
        data: dict[str, Any] = {
            "c": self.config,
            "a": [_without_defaults(a.to_dict(), ("index",)) for a in self.attempts],
            "t": [_without_defaults(t.to_dict(), ("role", "index")) for t in self.tasks],
            "e": list(self.events),
            "s": list(self.streams),
            "f": self.logs_filed,
            "n": self.last_attempt,
        }
        if self.record is not None:
            data["r"] = self.record
        return _VERSION + _compress(json.dumps(data, separators=(",", ":")).encode())

    @classmethod
    def decode(cls, blob: bytes) -> Archive:
        dictionary = _DICTIONARIES.get(blob[:1])
        if dictionary is None:
            raise ValueError(f"unknown archive version {blob[:1]!r}")
        data = json.loads(_decompress(blob[1:], dictionary))
        return cls(
            config=data["c"],
            attempts=tuple(Attempt.from_dict(a) for a in data["a"]),
            tasks=tuple(Task.from_dict(t) for t in data["t"]),
            events=tuple(data["e"]),
            streams=tuple(data["s"]),
            logs_filed=bool(data["f"]),
            last_attempt=int(data.get("n", 0)),
            record=data.get("r"),
        )

    @staticmethod
    def record_of(blob: bytes) -> dict[str, str] | None:
        """Only the record of an encoded archive (None in version 1): what a
        listing needs, at half the cost of `decode` (no task or attempt is
        built)."""
        dictionary = _DICTIONARIES.get(blob[:1])
        if dictionary is None:
            raise ValueError(f"unknown archive version {blob[:1]!r}")
        record: dict[str, str] | None = json.loads(_decompress(blob[1:], dictionary)).get("r")
        return record

    def has_task(self, attempt: int, role: str, index: int) -> bool:
        """Every attempt runs every task of the config (a retry starts them all again)."""
        if not 0 <= attempt <= self.last_attempt:
            return False
        return any(r.get("name") == role and 0 <= index < int(r.get("taskNumber", 0))
                   for r in self.config.get("taskRoles", ()))

    def log_is_filed(self, attempt: int, role: str, index: int) -> bool:
        return self.logs_filed and task_ref(attempt, role, index) not in self.streams

    def tasks_of(self, attempt: int) -> list[Task]:
        """The tasks of `attempt` as kept: only the last attempt's are."""
        return list(self.tasks) if attempt == self.last_attempt else []

    def milestones(self) -> list[dict[str, Any]]:
        """The job's story in a few events: its submit and each attempt's end
        (told by the attempts), and the stops and preemptions kept, in order."""
        told: list[dict[str, Any]] = []
        for attempt in self.attempts:
            if attempt.index == 0:
                told.append({"kind": "submitted", "time": attempt.created_ms, "attempt": 0})
            if attempt.completed_ms is not None:
                retried = attempt.index < self.last_attempt
                told.append({"kind": "attempt-end", "time": attempt.completed_ms,
                             "attempt": attempt.index,
                             "state": "WAITING" if retried else attempt.state,
                             "retried": retried})
        return sorted([*told, *self.events], key=lambda e: int(e.get("time") or 0))


def summarize_events(events: Sequence[Mapping[str, Any]],
                     limit: int = SUMMARY_EVENTS) -> tuple[dict[str, Any], ...]:
    """The events an archive keeps: the last `limit` stops and preemptions.
    The task-by-task ones are told by the tasks and attempts already, and
    the rest of the story by the attempts (`Archive.milestones`)."""
    kept = [dict(e) for e in events if e.get("kind") in KEPT_KINDS]
    return tuple(kept[-limit:]) if limit > 0 else ()


def told_by_attempts(state: str, diagnostics: str, attempts: Sequence[Attempt]) -> bool:
    """Whether a finished job's diagnostics are its last attempt's reason (a
    job that succeeded or failed ends with its attempt's outcome): then the
    compacted record leaves them out and `diagnostics_of` tells them again."""
    return state in ("SUCCEEDED", "FAILED") and bool(attempts) \
        and max(attempts, key=lambda a: a.index).reason == diagnostics


def diagnostics_of(state: str, diagnostics: str, attempts: Sequence[Attempt]) -> str:
    """A job's exit diagnostics, its record's or (compacted) its last attempt's."""
    if diagnostics or state not in ("SUCCEEDED", "FAILED") or not attempts:
        return diagnostics
    return max(attempts, key=lambda a: a.index).reason


def finished_task(task: Task) -> Task:
    """A finished task as an archive keeps it: its container by short id."""
    if task.container_id:
        task.container_id = task.container_id[:SHORT_ID]
    return task
