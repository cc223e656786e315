"""Retention's pure parts: the archive format, how a log file is made whole,
the log file cap, what a compacted record drops, and the size settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.monitor.logfile import within_cap
from shared.domain.archive import (
    Archive,
    diagnostics_of,
    finished_task,
    summarize_events,
    task_ref,
    told_by_attempts,
)
from shared.domain.models import Attempt, Job, Task
from shared.domain.states import JobState, TaskState
from shared.infra.config import ConfigError, load_settings
from shared.infra.settingtypes import parse_size
from shared.state.logfiles import KEEP, Repair, cut_marker, make_whole, numbered_tail, plan_repair
from shared.state.retention import compacted_record

CONFIG = {"jobName": "mnist", "image": "busybox", "taskRoles": [
    {"name": "ps", "taskNumber": 1, "command": "true"},
    {"name": "worker", "taskNumber": 4, "command": "true"}]}


def archive(**changes: object) -> Archive:
    fields: dict[str, object] = {
        "config": CONFIG,
        "attempts": (Attempt(index=0, state="FAILED", created_ms=100, started_ms=110,
                             completed_ms=200, exit_code=1, reason="worker[1] failed"),
                     Attempt(index=1, state="SUCCEEDED", created_ms=200, started_ms=210,
                             completed_ms=300, exit_code=0, reason="all tasks completed")),
        "tasks": (Task(role="worker", index=0, state=TaskState.SUCCEEDED, node="n1",
                       ip="10.0.0.1", gpus=[0], ports={"default": [15000]},
                       container_id="0123456789ab", exit_code=0, started_ms=210,
                       completed_ms=290),),
        "events": ({"kind": "stop-requested", "time": 250, "state": "STOPPING"},),
        "streams": (task_ref(0, "ps", 0),),
        "logs_filed": True,
        "last_attempt": 1,
    }
    fields.update(changes)
    return Archive(**fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------ archive


def test_an_archive_reads_back_as_it_was_written() -> None:
    original = archive()

    assert Archive.decode(original.encode()) == original


def test_an_exit_code_of_zero_survives_the_dropping_of_defaults() -> None:
    decoded = Archive.decode(archive().encode())

    assert decoded.tasks[0].exit_code == 0 and decoded.attempts[1].exit_code == 0


# Written by version 1 (before the record moved into the archive): a finished
# single-task job, its record a hash of its own.
V1_BLOB = (b"\x01\xabF/\ns\xf3@\xf9\x10Q\x1e&\x95\x16W&\xe5W(\xe1(\xb2r\x81A\x8d%\xef"
           b"\xc3\xb3&\xc8\x12\xa0\xbdx2\x15\xb2/Q\xf2\x95\x81\x01ZT\x18\x1a\xa0\xc7\x85"
           b"\x11H\rj\xf4\xe2M\xc6\x18i\x11\xea|\xfc\xae\x82\xa6\xc4<C\xb4\xb4\x04K\x07"
           b"\x18\xa1\n\xd4\x02\x92\x06\x00")


def test_an_archive_with_the_jobs_record_reads_back_as_it_was_written() -> None:
    original = archive(record={"state": "SUCCEEDED", "version": "18", "created_ms": "100",
                               "user_id": "uid-alice", "exit_code": "0"})

    assert Archive.decode(original.encode()) == original
    assert Archive.record_of(original.encode()) == original.record


@given(st.dictionaries(st.sampled_from(["state", "version", "created_ms", "exit_diagnostics",
                                        "user_id", "priority", "virtual_cluster"]),
                       st.text(max_size=80), max_size=7))
def test_any_record_reads_back_whole_and_alone(record: dict[str, str]) -> None:
    blob = archive(record=record).encode()

    assert Archive.decode(blob).record == record == Archive.record_of(blob)


def test_an_archive_of_version_1_still_reads_without_a_record() -> None:
    decoded = Archive.decode(V1_BLOB)

    assert decoded.record is None and Archive.record_of(V1_BLOB) is None
    assert decoded.config["jobName"] == "mnist" and decoded.logs_filed
    assert [(a.index, a.state, a.completed_ms) for a in decoded.attempts] == \
        [(0, "SUCCEEDED", 200)]
    assert [(t.role, t.index, t.node, t.exit_code) for t in decoded.tasks] == \
        [("main", 0, "n1", 0)]


def test_an_archive_of_another_version_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown archive version"):
        Archive.decode(b"\x07" + archive().encode()[1:])
    with pytest.raises(ValueError, match="unknown archive version"):
        Archive.record_of(b"\x07" + archive().encode()[1:])


@given(st.dictionaries(st.text(max_size=8), st.text(max_size=40), max_size=6),
       st.lists(st.integers(min_value=-255, max_value=255), max_size=4))
def test_any_config_and_exit_codes_round_trip(envs: dict[str, str], codes: list[int]) -> None:
    original = archive(config={**CONFIG, "jobEnvs": envs},
                       attempts=tuple(Attempt(index=n, exit_code=c) for n, c in enumerate(codes)))

    assert Archive.decode(original.encode()) == original


@pytest.mark.parametrize(("attempt", "role", "index", "exists"), [
    pytest.param(0, "worker", 3, True, id="an earlier attempt's task exists"),
    pytest.param(1, "ps", 0, True, id="the last attempt's task exists"),
    pytest.param(1, "worker", 4, False, id="an index past taskNumber does not"),
    pytest.param(2, "worker", 0, False, id="an attempt that never was does not"),
    pytest.param(0, "chief", 0, False, id="a role the config lacks does not"),
    pytest.param(-1, "ps", 0, False, id="a negative attempt does not"),
])
def test_which_tasks_a_compacted_job_had(attempt: int, role: str, index: int,
                                         exists: bool) -> None:
    assert archive().has_task(attempt, role, index) is exists


@pytest.mark.parametrize(("logs_filed", "ref", "filed"), [
    pytest.param(True, (0, "worker", 1), True, id="filed"),
    pytest.param(True, (0, "ps", 0), False, id="a stream that stayed in Redis"),
    pytest.param(False, (0, "worker", 1), False, id="no log tree: everything stayed"),
])
def test_where_a_compacted_jobs_log_is(logs_filed: bool, ref: tuple[int, str, int],
                                       filed: bool) -> None:
    assert archive(logs_filed=logs_filed).log_is_filed(*ref) is filed


def test_only_the_last_attempts_tasks_are_kept() -> None:
    assert archive().tasks_of(1) == list(archive().tasks)
    assert archive().tasks_of(0) == []


def test_the_milestones_tell_the_submit_each_attempts_end_and_the_kept_events() -> None:
    kinds = [(e["kind"], e["time"]) for e in archive().milestones()]

    assert kinds == [("submitted", 100), ("attempt-end", 200), ("stop-requested", 250),
                     ("attempt-end", 300)]
    assert archive().milestones()[1]["state"] == "WAITING"  # the retried attempt


def test_the_event_summary_keeps_the_last_stops_and_preemptions_only() -> None:
    events = [{"kind": "task-exit", "time": n} for n in range(20)] + \
        [{"kind": "preempted", "time": 100 + n} for n in range(12)]

    kept = summarize_events(events, limit=8)

    assert [e["time"] for e in kept] == list(range(104, 112))


def test_a_finished_task_keeps_its_container_by_short_id() -> None:
    task = Task(role="main", index=0, container_id="f" * 64)

    assert finished_task(task).container_id == "f" * 12


# ------------------------------------------------------------------ a log made whole


@pytest.mark.parametrize(("file_lines", "cut", "kept", "added", "tail_matches", "expected"), [
    pytest.param(500, False, 100, 500, True, KEEP, id="every line is in the file"),
    pytest.param(0, False, 0, 0, False, KEEP, id="nothing was ever shipped"),
    pytest.param(300, True, 100, 900, False, KEEP, id="a file cut at its cap stays cut"),
    pytest.param(400, False, 100, 500, True, KEEP,
                 id="a batch lost before the stream's window cannot be filled"),
    pytest.param(450, False, 100, 500, False, Repair(keep=False, prefix=400),
                 id="a batch lost inside the window: the file's start, then the stream"),
    pytest.param(0, False, 500, 500, False, Repair(keep=False),
                 id="no file, the stream kept all: the stream"),
    pytest.param(0, False, 100, 500, False, Repair(keep=False, dropped=400),
                 id="no file, the stream was trimmed: a marker, then the stream"),
    pytest.param(150, False, 100, 500, False, Repair(keep=False, prefix=150, dropped=250),
                 id="a short file and a trimmed stream: both, the gap marked"),
])
def test_how_a_log_file_is_made_whole(file_lines: int, cut: bool, kept: int, added: int,
                                      tail_matches: bool, expected: Repair) -> None:
    assert plan_repair(file_lines=file_lines, cut=cut, kept=kept, added=added,
                       tail_matches=tail_matches) == expected


# ------------------------------------------------------------------ the file cap


@pytest.mark.parametrize(("lines", "size", "cap", "written", "cut"), [
    pytest.param(["ab", "cd"], 0, 0, b"ab\ncd\n", False, id="no cap"),
    pytest.param(["ab", "cd"], 0, 6, b"ab\ncd\n", False, id="exactly at the cap"),
    pytest.param(["ab", "cd"], 0, 5, b"ab\n" + (cut_marker(5) + "\n").encode(), True,
                 id="the line that crosses the cap is not written, the marker is"),
    pytest.param(["abcdef"], 2, 5, (cut_marker(5) + "\n").encode(), True,
                 id="no room for a whole line: only the marker"),
    pytest.param(["é"], 0, 10, "é\n".encode(), False, id="sizes are bytes, not characters"),
    pytest.param([], 0, 10, b"", False, id="no lines"),
])
def test_the_log_file_cap(lines: list[str], size: int, cap: int, written: bytes,
                          cut: bool) -> None:
    assert within_cap(lines, size, cap) == (written, cut)


# ------------------------------------------------------------------ a compacted record


def test_a_compacted_record_drops_what_only_a_live_job_uses_and_its_defaults() -> None:
    job = Job(id="alice~mnist", username="alice", name="mnist", virtual_cluster="default",
              state=JobState.SUCCEEDED, version=9, created_ms=1, completed_ms=5, exit_code=0,
              waiting_reason="old reason", waiting='{"reason": "' + "x" * 80 + '"}',
              queue_seq=7, gpus=2, user_id="u1", exit_diagnostics="all tasks completed")
    attempts = [Attempt(index=0, reason="all tasks completed")]

    record = compacted_record(job, attempts)

    assert set(record) == {"state", "version", "created_ms", "completed_ms", "exit_code",
                           "gpus", "user_id"}
    restored = Job.from_fields({"id": job.id, **record})
    restored.exit_diagnostics = diagnostics_of(restored.state.value,
                                               restored.exit_diagnostics, attempts)
    assert restored == Job(**{**job.__dict__, "waiting_reason": "", "waiting": "",
                              "queue_seq": 0})


@pytest.mark.parametrize(("state", "diagnostics", "reason", "told"), [
    pytest.param("FAILED", "worker[0] failed", "worker[0] failed", True,
                 id="a failure its last attempt tells"),
    pytest.param("SUCCEEDED", "all tasks completed", "all tasks completed", True,
                 id="a success its last attempt tells"),
    pytest.param("STOPPED", "", "stopped by user", False,
                 id="a stop keeps its empty diagnostics"),
    pytest.param("FAILED", "node lost", "something else", False,
                 id="diagnostics the attempt does not tell stay"),
])
def test_which_diagnostics_the_last_attempt_tells(state: str, diagnostics: str, reason: str,
                                                  told: bool) -> None:
    attempts = [Attempt(index=0, reason="first"), Attempt(index=1, reason=reason)]

    assert told_by_attempts(state, diagnostics, attempts) is told
    kept = "" if told else diagnostics
    assert diagnostics_of(state, kept, attempts) == diagnostics


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize(("raw", "size"), [
    pytest.param("1048576", 1048576, id="bytes"),
    pytest.param("2gb", 2 * 1024**3, id="gb is 1024^3, as Redis reads it"),
    pytest.param("2g", 2 * 1000**3, id="g is 1000^3, as Redis reads it"),
    pytest.param("512MB", 512 * 1024**2, id="any case"),
    pytest.param(" 64kb ", 64 * 1024, id="spaces around"),
])
def test_sizes_read_as_redis_reads_them(raw: str, size: int) -> None:
    assert parse_size("PAI_X", raw) == size


@pytest.mark.parametrize("raw", ["", "gb", "1.5gb", "-1", "10tb", "1 gb"])
def test_a_malformed_size_names_the_setting(raw: str) -> None:
    with pytest.raises(ConfigError, match="PAI_X must be a size"):
        parse_size("PAI_X", raw)


def test_retention_settings_and_their_defaults() -> None:
    defaults = load_settings({})
    assert (defaults.retention_days, defaults.log_max_bytes_per_task) == (90, 1024**3)

    chosen = load_settings({"PAI_RETENTION_DAYS": "0", "PAI_LOG_MAX_BYTES_PER_TASK": "10mb",
                            "PAI_REDIS_MAXMEMORY": "1gb",
                            "PAI_RETENTION_COMPACT_AFTER_SECONDS": "60"})
    assert (chosen.retention_days, chosen.log_max_bytes_per_task,
            chosen.redis_maxmemory_bytes, chosen.retention_compact_after_seconds) == \
        (0, 10 * 1024**2, 1024**3, 60.0)


# ------------------------------------------------------------------ files


def test_a_file_cut_at_its_cap_is_kept_as_it_is(tmp_path: Path) -> None:
    log_file = tmp_path / "root~big" / "0" / "main-0.log"
    log_file.parent.mkdir(parents=True)
    log_file.write_text("a\nb\n" + cut_marker(4) + "\n")

    repair = make_whole(str(tmp_path), "root~big", 0, "main", 0, ["y", "z"], added=100)

    assert repair == KEEP
    assert log_file.read_text() == "a\nb\n" + cut_marker(4) + "\n"


def test_a_file_missing_a_batch_in_the_window_is_rewritten_whole(tmp_path: Path) -> None:
    log_file = tmp_path / "root~gap" / "0" / "main-0.log"
    log_file.parent.mkdir(parents=True)
    log_file.write_text("".join(f"{n}\n" for n in [*range(1, 6), *range(8, 10)]))

    make_whole(str(tmp_path), "root~gap", 0, "main", 0, [str(n) for n in range(4, 10)], added=9)

    assert log_file.read_text() == "".join(f"{n}\n" for n in range(1, 10))
    assert list(numbered_tail(str(tmp_path), ("root~gap", "0", "main-0.log"), 2)) == \
        [(8, "8"), (9, "9")]
    assert list(numbered_tail(str(tmp_path), ("root~gap", "0", "main-0.log"), 0, after=7)) == \
        [(8, "8"), (9, "9")]
