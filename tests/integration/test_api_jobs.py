"""The jobs API on a real Redis, through Flask's test client (no services)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from services.api.app import create_app
from shared import keys
from shared.config import Settings
from shared.models import Gpu, Node
from shared.store import Store


class AuthedClient:
    """The test client, sending one user's token with every request."""

    def __init__(self, client: FlaskClient, token: str) -> None:
        self.client, self.headers = client, {"Authorization": f"Bearer {token}"}

    def __getattr__(self, method: str) -> Any:
        call = getattr(self.client, method)
        return lambda *args, **kw: call(*args, headers={**self.headers,
                                                        **kw.pop("headers", {})}, **kw)


def login(client: FlaskClient, username: str, password: str) -> str:
    resp = client.post("/api/v1/token", json={"username": username, "password": password})
    assert resp.status_code == 200, resp.json
    token: str = resp.json["token"]  # type: ignore[index]
    return token


@pytest.fixture
def flask_client(redis_server: str, redis_client: redis.Redis, tmp_path: Path) -> FlaskClient:
    settings = Settings(redis_url=redis_server, storage_roots=(str(tmp_path),),
                        admin_user="root", admin_password="root-password")
    return create_app(settings).test_client()


@pytest.fixture
def admin(flask_client: FlaskClient) -> AuthedClient:
    return AuthedClient(flask_client, login(flask_client, "root", "root-password"))


@pytest.fixture
def client(flask_client: FlaskClient, admin: AuthedClient) -> AuthedClient:
    """Alice, an ordinary user of the default VC."""
    for name in ("alice", "bob"):
        created = admin.post("/api/v1/user", json={"username": name, "password": "secret-pw"})
        assert created.status_code == 201
    return AuthedClient(flask_client, login(flask_client, "alice", "secret-pw"))


def config(name: str = "mnist", **extra: Any) -> dict[str, Any]:
    return {"jobName": name, "image": "busybox",
            "taskRoles": [{"name": "main", "taskNumber": 2, "cpuNumber": 1, "memoryMB": 128,
                           "command": "echo hi"}], **extra}


def test_submit_stores_a_waiting_job_and_asks_for_a_pass(
        client: AuthedClient, redis_client: redis.Redis) -> None:
    resp = client.post("/api/v1/user/alice/jobs", json=config(authFile="x"))

    assert resp.status_code == 202
    assert resp.json == {"name": "mnist", "username": "alice", "state": "WAITING",
                         "url": "/api/v1/user/alice/jobs/mnist", "ignoredFields": ["authFile"]}
    assert redis_client.zrange(keys.QUEUE, 0, -1) == ["alice~mnist"]
    assert redis_client.llen("scheduler") == 1  # the Celery message for a pass


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
    bad = config(retryCount=-1, colour="blue")
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
