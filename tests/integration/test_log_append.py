"""A batch of log lines appended on a real Redis (services.monitor.logs.
append_log_entries, the APPEND_LOG_LINES script): one entry a line, in
order, the cursor on the last only, the stream kept near its bound."""

from __future__ import annotations

import redis

from services.monitor.loglines import LogCursor
from services.monitor.logs import CURSOR_FIELD, LINE_FIELD, append_log_entries, read_log_cursor
from shared.node.containers import TaskRef
from shared.state import keys

REF = TaskRef("alice~loud", 0, "main", 0)
KEY = keys.task_log(REF.job_id, REF.attempt, REF.role, REF.index)


def entries(client: redis.Redis) -> list[dict[str, str]]:
    return [fields for _id, fields in client.xrange(KEY)]


def test_each_line_is_an_entry_in_order_and_only_the_last_has_the_cursor(
        redis_client: redis.Redis) -> None:
    lines = ["first", "", "  spaced  ", "é ünïcode", "carriage\rreturn", "", "last"]
    cursor = LogCursor(1_795_332_975_000_000_007, 2)
    append_log_entries(redis_client, REF, lines, 1000, cursor)
    got = entries(redis_client)
    assert [fields[LINE_FIELD] for fields in got] == lines
    assert [CURSOR_FIELD in fields for fields in got] == [False] * 6 + [True]
    assert read_log_cursor(redis_client, REF) == cursor


def test_a_batch_without_a_cursor_marks_no_line(redis_client: redis.Redis) -> None:
    append_log_entries(redis_client, REF, ["a", "b"], 1000)
    assert entries(redis_client) == [{LINE_FIELD: "a"}, {LINE_FIELD: "b"}]
    assert read_log_cursor(redis_client, REF) is None


def test_a_single_empty_line_is_one_entry(redis_client: redis.Redis) -> None:
    append_log_entries(redis_client, REF, [""], 1000, LogCursor(5, 1))
    assert entries(redis_client) == [{LINE_FIELD: "", CURSOR_FIELD: "5:1"}]


def test_a_line_holding_newlines_is_appended_as_the_lines_it_holds(
        redis_client: redis.Redis) -> None:
    append_log_entries(redis_client, REF, ["one\ntwo", "three\n"], 1000, LogCursor(5, 1))
    assert [fields[LINE_FIELD] for fields in entries(redis_client)] == [
        "one", "two", "three", ""]
    assert entries(redis_client)[-1][CURSOR_FIELD] == "5:1"


def test_the_stream_is_cut_back_near_its_bound(redis_client: redis.Redis) -> None:
    for batch in range(5):
        append_log_entries(redis_client, REF, [f"{batch}-{n}" for n in range(300)], 500)
    length = redis_client.xlen(KEY)
    assert 500 <= length < 1500
    assert entries(redis_client)[-1][LINE_FIELD] == "4-299"


def test_a_line_no_utf_8_encodes_is_appended_with_a_replacement(
        redis_client: redis.Redis) -> None:
    append_log_entries(redis_client, REF, ["lone \ud800 surrogate", "next"], 1000)
    assert [fields[LINE_FIELD] for fields in entries(redis_client)] == [
        "lone ? surrogate", "next"]
