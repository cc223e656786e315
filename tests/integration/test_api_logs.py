"""A bounded task log through the API: tail and follow say when its start was dropped.

Real Redis, Flask's test client; the lines are appended the way the monitor
ships them (services.monitor.logs.append_log_entries, bounded by MAXLEN ~).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from services.api.app import create_app
from services.monitor.logs import append_log_entries
from shared.infra.config import Settings
from shared.node.containers import TaskRef
from shared.state.store import Store

pytestmark = pytest.mark.redis

BOUND = 100
JOB = "root~logs"
LOG = "/api/v1/user/root/jobs/logs/tasks/main/0/log"


@pytest.fixture
def client(redis_server: str, redis_client: redis.Redis, tmp_path: Path) -> FlaskClient:
    settings = Settings(redis_url=redis_server, storage_roots=(str(tmp_path),),
                        admin_user="root", admin_password="root-password",
                        log_max_lines=BOUND)
    client = create_app(settings).test_client()
    token = client.post("/api/v1/token", json={"username": "root",
                                               "password": "root-password"}).json["token"]
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    job = {"jobName": "logs", "image": "busybox", "taskRoles": [
        {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128, "gpuNumber": 0,
         "command": "true"}]}
    assert client.post("/api/v1/jobs", json=job).status_code == 202
    return client


def ship(redis_client: redis.Redis, first: int, last: int) -> None:
    append_log_entries(redis_client, TaskRef(JOB, 0, "main", 0),
                       [f"line {n}" for n in range(first, last + 1)], BOUND)


def lines(client: FlaskClient, **query: str) -> list[str]:
    resp = client.get(LOG, query_string=query)
    assert resp.status_code == 200
    return resp.get_data(as_text=True).splitlines()


def test_a_log_within_its_bound_has_no_marker(client: FlaskClient,
                                              redis_client: redis.Redis) -> None:
    ship(redis_client, 1, 80)

    assert lines(client) == [f"line {n}" for n in range(1, 81)]


def test_a_tail_past_what_is_kept_starts_with_the_marker(client: FlaskClient,
                                                         redis_client: redis.Redis) -> None:
    ship(redis_client, 1, 1000)
    kept, _added = Store(redis_client).log_extent(JOB, 0, "main", 0)

    text = lines(client, tail="100000")

    assert text[0] == (f"[pai: {1000 - kept} earlier lines dropped; "
                       f"the log keeps the last {BOUND} lines]")
    assert text[1:] == [f"line {n}" for n in range(1001 - kept, 1001)]


def test_a_tail_within_what_is_kept_is_exact_and_unmarked(client: FlaskClient,
                                                          redis_client: redis.Redis) -> None:
    ship(redis_client, 1, 1000)

    assert lines(client, tail="20") == [f"line {n}" for n in range(981, 1001)]


def test_follow_starts_with_the_marker_then_the_lines_with_their_ids(
        client: FlaskClient, redis_client: redis.Redis) -> None:
    ship(redis_client, 1, 250)
    ship(redis_client, 251, 500)  # the entry of lines 1-250 goes: all are older than 100
    kept, _added = Store(redis_client).log_extent(JOB, 0, "main", 0)
    stop = client.put("/api/v1/user/root/jobs/logs/executionType", json={"value": "STOP"})
    assert stop.status_code == 202  # the task is settled: the follow ends after the log

    resp = client.get(LOG, query_string={"follow": "1", "tail": "100000"})
    events = resp.get_data(as_text=True).split("\n\n")

    assert events[0] == (f"data: [pai: {500 - kept} earlier lines dropped; "
                         f"the log keeps the last {BOUND} lines]")
    assert events[1].startswith("id: ") and events[1].endswith(f"data: line {501 - kept}")
    assert "event: end" in events[-2]


def test_the_extent_of_a_log_is_kept_and_ever_appended(client: FlaskClient,
                                                       redis_client: redis.Redis) -> None:
    store = Store(redis_client)
    assert store.log_extent(JOB, 0, "main", 0) == (0, 0)

    ship(redis_client, 1, 300)

    kept, added = store.log_extent(JOB, 0, "main", 0)
    assert added == 300 and BOUND <= kept <= 300

    ship(redis_client, 301, 600)  # one entry of 300: the one before it goes

    assert store.log_extent(JOB, 0, "main", 0) == (300, 600)


def test_a_tail_of_zero_is_empty_and_a_follow_from_zero_starts_at_the_end(
        client: FlaskClient, redis_client: redis.Redis) -> None:
    ship(redis_client, 1, 10)
    assert client.put("/api/v1/user/root/jobs/logs/executionType",
                      json={"value": "STOP"}).status_code == 202

    assert lines(client, tail="0") == []
    events = client.get(LOG, query_string={"follow": "1", "tail": "0"}).get_data(as_text=True)
    assert "data: line" not in events and "event: end" in events
