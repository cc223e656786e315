"""Which task an exec is decided on (services/api/execs.py `job_and_task`):
the job and its task of the first attempt are read together; a job on a
later attempt must be answered from that attempt's task, never the first's."""

from __future__ import annotations

import pytest
import redis
from flask.testing import FlaskClient

from shared.domain.models import Gpu, Node, TaskPlacement
from shared.infra.clock import now_ms
from shared.state.lifecycle import mark_task_running
from shared.state.placing import commit_placement
from shared.state.store import Store
from shared.state.taskexits import record_task_exit
from tests.support.api import AuthedClient, error_of, new_user

pytestmark = pytest.mark.redis


@pytest.fixture
def alice(flask_client: FlaskClient, admin: AuthedClient) -> AuthedClient:
    return new_user(flask_client, admin, "alice")


def placed_and_running(store: Store, job_id: str, attempt: int, version: int) -> None:
    assert commit_placement(store, job_id, version=version, attempt=attempt, placements=[
        TaskPlacement("main", 0, "n1", "127.0.0.1", (), 1, 128, {})],
        launch_deadline_ms=now_ms() + 60_000)
    assert mark_task_running(store, job_id, attempt, "main", 0, f"c{attempt}")


def test_a_job_on_its_second_attempt_is_answered_from_that_attempts_task(
        alice: AuthedClient, redis_client: redis.Redis) -> None:
    store = Store(redis_client)
    store.register_node(Node("n1", "127.0.0.1", cpus=8, memory_mb=8000, gpus=[Gpu(0)]))
    resp = alice.post("/api/v1/user/alice/jobs", json={
        "jobName": "retried", "image": "busybox", "retryCount": 1,
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                       "command": "sleep 300"}]})
    assert resp.status_code == 202, resp.json
    job = store.get_job("alice~retried")
    assert job is not None
    placed_and_running(store, job.id, 0, job.version)
    url = "/api/v1/user/alice/jobs/retried/tasks/main/0/exec"

    report = record_task_exit(store, job.id, 0, "main", 0, exit_code=1)
    assert report is not None and report.retried
    again = store.get_job(job.id)
    assert again is not None and again.attempt == 1
    # attempt 0's task FAILED, attempt 1's WAITS: the answer names the one it is on
    refused = alice.post(url, json={"command": ["id"]})
    assert error_of(refused, 409) == "ConflictJobError"
    assert "the task is WAITING" in refused.json["message"], refused.json

    placed_and_running(store, job.id, 1, again.version)
    other = alice.post("/api/v1/user/alice/jobs/retried/tasks/main/1/exec",
                       json={"command": ["id"]})
    assert error_of(other, 404) == "NoTaskError"


def test_a_job_with_no_record_and_a_missing_name_are_404_and_anothers_is_403(
        alice: AuthedClient, flask_client: FlaskClient, admin: AuthedClient) -> None:
    bob = new_user(flask_client, admin, "bob")
    for url in ("/api/v1/user/alice/jobs/nope/tasks/main/0/exec",
                "/api/v1/user/alice/jobs/-bad-/tasks/main/0/exec"):
        assert error_of(alice.post(url, json={"command": ["id"]}), 404) == "NoJobError"
    assert error_of(bob.post("/api/v1/user/alice/jobs/nope/tasks/main/0/exec",
                             json={"command": ["id"]}), 403) == "ForbiddenUserError"
