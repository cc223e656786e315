"""A batch of log lines appended on a real Redis (services.monitor.logs.
append_log_entries, the APPEND_LOG_LINES script; the format is
shared/state/logstream.py's): one entry a batch, numbered by its last line,
the cursor on it, the stream kept near its bound; a stream begun in the
legacy format goes on in it."""

from __future__ import annotations

import pytest
import redis

from services.monitor.loglines import LogCursor
from services.monitor.logs import append_log_entries, read_log_cursor
from shared.node.containers import TaskRef
from shared.state import keys, logstream
from shared.state.store import Store

REF = TaskRef("alice~loud", 0, "main", 0)
KEY = keys.task_log(REF.job_id, REF.attempt, REF.role, REF.index)
LINES, CURSOR, LEGACY = logstream.LINES_FIELD, logstream.CURSOR_FIELD, logstream.LEGACY_LINE_FIELD


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    return Store(redis_client)


def entries(client: redis.Redis) -> list[tuple[str, dict[str, str]]]:
    return client.xrange(KEY)


def lines(client: redis.Redis) -> list[str]:
    return [line for _id, line in logstream.lines_after(entries(client))]


def test_a_batch_is_one_entry_numbered_by_its_last_line_with_the_cursor(
        redis_client: redis.Redis) -> None:
    batch = ["first", "", "  spaced  ", "é ünïcode", "carriage\rreturn", "", "last"]
    cursor = LogCursor(1_795_332_975_000_000_007, 2)
    append_log_entries(redis_client, REF, batch, 1000, cursor)
    append_log_entries(redis_client, REF, ["eighth", "ninth"], 1000, LogCursor(9, 1))
    assert entries(redis_client) == [
        ("0-7", {LINES: "\n".join(batch), CURSOR: cursor.encode()}),
        ("0-9", {LINES: "eighth\nninth", CURSOR: "9:1"})]
    assert lines(redis_client) == [*batch, "eighth", "ninth"]
    assert read_log_cursor(redis_client, REF) == LogCursor(9, 1)


def test_a_batch_without_a_cursor_marks_none(redis_client: redis.Redis) -> None:
    append_log_entries(redis_client, REF, ["a", "b"], 1000)
    assert entries(redis_client) == [("0-2", {LINES: "a\nb"})]
    assert read_log_cursor(redis_client, REF) is None


def test_a_single_empty_line_is_one_numbered_line(redis_client: redis.Redis) -> None:
    append_log_entries(redis_client, REF, [""], 1000, LogCursor(5, 1))
    assert entries(redis_client) == [("0-1", {LINES: "", CURSOR: "5:1"})]


def test_a_line_holding_newlines_is_counted_as_the_lines_it_holds(
        redis_client: redis.Redis) -> None:
    append_log_entries(redis_client, REF, ["one\ntwo", "three\n"], 1000, LogCursor(5, 1))
    append_log_entries(redis_client, REF, ["five"], 1000)
    assert lines(redis_client) == ["one", "two", "three", "", "five"]
    assert [entry_id for entry_id, _ in entries(redis_client)] == ["0-4", "0-5"]


def test_the_stream_keeps_about_its_bound_of_lines(redis_client: redis.Redis,
                                                   store: Store) -> None:
    for batch in range(5):
        append_log_entries(redis_client, REF, [f"{batch}-{n}" for n in range(300)], 500)
    kept, added = store.log_extent(REF.job_id, REF.attempt, REF.role, REF.index)
    assert added == 1500
    assert kept == 600  # lines 901-1500: the entries ending at 300, 600 and 900 went
    assert lines(redis_client)[-kept:][-1] == "4-299" and len(lines(redis_client)) == kept


def test_a_line_no_utf_8_encodes_is_appended_with_a_replacement(
        redis_client: redis.Redis) -> None:
    append_log_entries(redis_client, REF, ["lone \ud800 surrogate", "next"], 1000)
    assert lines(redis_client) == ["lone ? surrogate", "next"]


def test_a_stream_begun_in_the_legacy_format_goes_on_a_line_an_entry(
        redis_client: redis.Redis, store: Store) -> None:
    redis_client.xadd(KEY, {LEGACY: "shipped before the upgrade"})
    append_log_entries(redis_client, REF, ["after", "it"], 1000, LogCursor(5, 1))
    got = entries(redis_client)
    assert [fields for _id, fields in got] == [
        {LEGACY: "shipped before the upgrade"}, {LEGACY: "after"}, {LEGACY: "it", CURSOR: "5:1"}]
    assert all(logstream.is_legacy(entry) for entry in got)
    assert read_log_cursor(redis_client, REF) == LogCursor(5, 1)
    assert [line for _id, line in store.read_log(REF.job_id, 0, "main", 0, tail=2)] == [
        "after", "it"]
    assert store.log_extent(REF.job_id, 0, "main", 0) == (3, 3)


def test_a_batch_past_an_entrys_most_lines_is_several_entries_the_cursor_on_the_last(
        redis_client: redis.Redis) -> None:
    batch = [str(n) for n in range(1, logstream.ENTRY_LINES * 2 + 201)]
    append_log_entries(redis_client, REF, batch, 10_000, LogCursor(7, 1))
    got = entries(redis_client)
    most = logstream.ENTRY_LINES
    assert [entry_id for entry_id, _ in got] == [
        f"0-{most}", f"0-{2 * most}", f"0-{2 * most + 200}"]
    assert [CURSOR in fields for _id, fields in got] == [False, False, True]
    assert lines(redis_client) == batch
