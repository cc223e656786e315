"""The jobs API on a real Redis, through Flask's test client (no services)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from shared.domain.models import Gpu, Node
from shared.state import keys, passwake
from shared.state.store import Store
from tests.support.api import AuthedClient, config


@pytest.fixture
def client(alice: AuthedClient, bob: AuthedClient) -> AuthedClient:
    """Alice, an ordinary user of the default VC (Bob exists too)."""
    return alice


def test_submit_stores_a_waiting_job_and_asks_for_a_pass(
        client: AuthedClient, redis_client: redis.Redis) -> None:
    resp = client.post("/api/v1/user/alice/jobs", json=config(authFile="x"))

    assert resp.status_code == 202
    assert resp.json == {"name": "mnist", "username": "alice", "state": "WAITING",
                         "url": "/api/v1/user/alice/jobs/mnist", "ignoredFields": ["authFile"]}
    assert redis_client.zrange(keys.QUEUE, 0, -1) == ["alice~mnist"]
    # a pass asked for, for new work (shared/state/passwake.py)
    assert redis_client.lrange(keys.SCHEDULER_WAKE, 0, -1) == [passwake.NEW_WORK]


def test_detail_has_the_openpai_shape(client: AuthedClient) -> None:
    client.post("/api/v1/user/alice/jobs", json=config())

    body = client.get("/api/v1/user/alice/jobs/mnist").json
    assert body is not None

    assert body["name"] == "mnist"
    status = body["jobStatus"]
    assert status["state"] == "WAITING" and status["username"] == "alice"
    assert status["executionType"] == "START" and status["retries"] == 0
    assert isinstance(status["createdTime"], int) and status["completedTime"] is None
    tasks = body["taskRoles"]["main"]["taskStatuses"]
    assert [t["taskIndex"] for t in tasks] == [0, 1]
    assert tasks[0]["taskState"] == "WAITING"
    assert set(tasks[0]) >= {"containerId", "containerIp", "containerPorts", "containerGpus",
                             "containerNodeName", "containerExitCode", "containerLog"}
    assert [a["attemptIndex"] for a in body["attempts"]] == [0]


def test_config_round_trips_normalized(client: AuthedClient, tmp_path: Path) -> None:
    client.post("/api/v1/user/alice/jobs", json=config())
    stored = client.get("/api/v1/user/alice/jobs/mnist/config").json
    assert stored is not None
    assert stored["taskRoles"][0]["shmMB"] == 64
    assert stored["outputDir"] == f"{tmp_path}/alice/mnist/output"


def test_invalid_config_names_every_field(client: AuthedClient) -> None:
    bad = config(retryCount=-3, colour="blue")
    bad["taskRoles"][0]["memoryMB"] = 1
    resp = client.post("/api/v1/user/alice/jobs", json=bad)
    assert resp.status_code == 400
    assert resp.json is not None
    assert resp.json["code"] == "InvalidJobConfigError"
    assert set(resp.json["fields"]) == {"retryCount", "colour", "taskRoles.0.memoryMB"}


@pytest.mark.parametrize("body", [b"", b"{", b"[1, 2]", b"\xff\xfe", b"null"],
                         ids=["empty", "truncated", "a list", "not utf-8", "null"])
def test_malformed_bodies_get_400(client: AuthedClient, body: bytes) -> None:
    resp = client.post("/api/v1/user/alice/jobs", data=body,
                       content_type="application/json")
    assert resp.status_code == 400
    assert resp.json is not None and resp.json["code"] == "InvalidJobConfigError"


def test_huge_body_gets_413(client: AuthedClient) -> None:
    resp = client.post("/api/v1/user/alice/jobs", data=b"x" * (2 * 1024 * 1024),
                       content_type="application/json")
    assert resp.status_code == 413
    assert resp.json is not None and resp.json["code"] == "RequestEntityTooLargeError"


def test_duplicate_name_conflicts(client: AuthedClient, admin: AuthedClient) -> None:
    assert client.post("/api/v1/user/alice/jobs", json=config()).status_code == 202
    resp = client.post("/api/v1/user/alice/jobs", json=config())
    assert resp.status_code == 409 and resp.json is not None
    assert resp.json["code"] == "ConflictJobError"
    assert admin.post("/api/v1/user/bob/jobs", json=config()).status_code == 202


def test_infeasible_job_is_refused_at_submit(client: AuthedClient,
                                             redis_client: redis.Redis) -> None:
    Store(redis_client).register_node(Node("n1", "127.0.0.1", cpus=8, memory_mb=8000,
                                           gpus=[Gpu(i) for i in range(4)]))
    job = config()
    job["taskRoles"][0]["gpuNumber"] = 8
    resp = client.post("/api/v1/user/alice/jobs", json=job)
    assert resp.status_code == 400 and resp.json is not None
    assert resp.json["fields"] == {
        "taskRoles.0.gpuNumber": ["needs 8 GPUs on one node; the largest node has 4"]}
    assert client.get("/api/v1/user/alice/jobs/mnist").status_code == 404


def test_dry_run_stores_nothing(client: AuthedClient, redis_client: redis.Redis) -> None:
    resp = client.post("/api/v1/user/alice/jobs?dryRun=true", json=config())
    assert resp.status_code == 200 and resp.json is not None
    assert resp.json["config"]["jobName"] == "mnist"
    assert redis_client.zcard(keys.JOBS) == 0


def test_stop_a_waiting_job_ends_it_at_once(client: AuthedClient) -> None:
    client.post("/api/v1/user/alice/jobs", json=config())
    resp = client.put("/api/v1/user/alice/jobs/mnist/executionType", json={"value": "STOP"})
    assert resp.status_code == 202
    body = client.get("/api/v1/user/alice/jobs/mnist").json
    assert body is not None
    assert body["jobStatus"]["state"] == "STOPPED"
    assert body["jobStatus"]["executionType"] == "STOP"
    bad = client.put("/api/v1/user/alice/jobs/mnist/executionType", json={"value": "GO"})
    assert bad.status_code == 400


def test_unknown_job_is_404(client: AuthedClient) -> None:
    for path in ("", "/config", "/tasks/main/0/log"):
        resp = client.get(f"/api/v1/user/alice/jobs/nope{path}")
        assert resp.status_code == 404 and resp.json is not None
        assert resp.json["code"] == "NoJobError"


def test_log_tail(client: AuthedClient, redis_client: redis.Redis) -> None:
    client.post("/api/v1/user/alice/jobs", json=config())
    Store(redis_client).append_log("alice~mnist", 0, "main", 1,
                                   [f"line {i}" for i in range(10)], max_lines=1000)
    resp = client.get("/api/v1/user/alice/jobs/mnist/tasks/main/1/log?tail=3")
    assert resp.status_code == 200
    assert resp.get_data(as_text=True) == "line 7\nline 8\nline 9\n"


def test_list_newest_first_with_filters(client: AuthedClient, admin: AuthedClient) -> None:
    for name in ("a", "b", "c"):
        client.post("/api/v1/user/alice/jobs", json=config(name))
    admin.post("/api/v1/user/bob/jobs", json=config("d"))
    rows = client.get("/api/v1/jobs?username=alice").json
    assert rows is not None and [r["name"] for r in rows] == ["c", "b", "a"]
    page = client.get("/api/v1/jobs?limit=2&offset=1&withTotalCount=true").json
    assert page is not None and page["totalCount"] == 4
    assert [r["name"] for r in page["data"]] == ["c", "b"]


def test_healthz(client: AuthedClient) -> None:
    assert client.get("/healthz").json == {"status": "ok", "redis": "ok"}
