"""Exec into a running task: the API, the node's launcher and Docker, all real.

The API runs in Flask's test client; the node's launcher reads its node's
calls (services/launcher/calls.py) on a thread, its containers on the test
Docker engine. A task is made RUNNING as the monitor would (mark_task_running)
once its container started.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import redis
from flask.testing import FlaskClient

from services.api import execs as api_execs
from services.api.app import create_app
from services.api.follows import FollowLeases
from services.launcher.service import Launcher
from services.launcher.worker import create_launcher_app
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.node.containers import LABEL_NODE, TaskRef
from shared.state import execs, keys, nodecalls, telemetry
from shared.state.execs import ExecRequest, Outcome
from shared.state.store import Store
from shared.state.taskexits import record_task_exit
from tests.support.api import AuthedClient, error_of, signed_in
from tests.support.launcher_rig import JOB, run_task, serving_calls
from tests.support.polling import wait_for
from tests.support.threads import looping

pytestmark = [pytest.mark.docker, pytest.mark.redis]

WAIT_SECONDS = 30
EXEC_URL = f"/api/v1/user/alice/jobs/{JOB}/tasks/main/0/exec"


@pytest.fixture
def settings(redis_server: str, redis_client: redis.Redis, tmp_path: Path,
             docker_client: docker.DockerClient, test_image: str) -> Iterator[Settings]:
    node = f"node-{uuid.uuid4().hex[:8]}"
    yield Settings(redis_url=redis_server, node_name=node, node_ip="127.0.0.1",
                   storage_roots=(str(tmp_path),), docker_host=os.environ.get("DOCKER_HOST"),
                   admin_user="root", admin_password="root-password",
                   exec_max_timeout_seconds=120)
    for container in docker_client.containers.list(
            all=True, filters={"label": f"{LABEL_NODE}={node}"}):
        container.remove(force=True)


@pytest.fixture
def launcher(settings: Settings, test_labels: dict[str, str]) -> Launcher:
    _, launcher = create_launcher_app(settings, extra_labels=test_labels)
    launcher.store.register_node(launcher.node)
    return launcher


@pytest.fixture
def worker(launcher: Launcher) -> Iterator[Launcher]:
    """The node's launcher, reading its node's calls."""
    with serving_calls(launcher):
        yield launcher


@pytest.fixture
def running(redis_client: redis.Redis, launcher: Launcher, alice: AuthedClient,
            test_image: str) -> str:
    return run_task(Store(redis_client), launcher, test_image)


def exec_(client: AuthedClient, command: list[str], **extra: Any) -> Any:
    return client.post(EXEC_URL, json={"command": command, **extra})


def in_container(launcher: Launcher, job_id: str, command: str) -> str:
    """What `sh -c command` prints in the task's container, run by the test."""
    container = launcher.runtime.find(TaskRef(job_id, 0, "main", 0))
    assert container is not None
    _, output = container.exec_run(["sh", "-c", command])
    return str(output.decode())


# ------------------------------------------------------------------- API


def test_the_owner_gets_the_output_and_exit_code(worker: Launcher, running: str,
                                                 alice: AuthedClient) -> None:
    resp = exec_(alice, ["sh", "-c", "echo out; echo err >&2; echo $PAI_JOB_NAME; exit 3"])

    assert resp.status_code == 200, resp.json
    body = resp.json
    # each stream in its order; between the two, as Docker delivers them
    assert sorted(body.pop("output").splitlines()) == ["debugme", "err", "out"]
    assert body == {"exitCode": 3, "truncated": False, "timedOut": False}


def test_success_and_a_missing_program(worker: Launcher, running: str,
                                       alice: AuthedClient) -> None:
    ok = exec_(alice, ["echo", "hello", "world"])
    assert ok.status_code == 200 and ok.json["exitCode"] == 0
    assert ok.json["output"] == "hello world\n"

    missing = exec_(alice, ["no-such-program"])
    assert missing.status_code == 200, missing.json
    assert missing.json["exitCode"] not in (0, None)


def test_output_is_capped_at_one_mebibyte(worker: Launcher, running: str,
                                          alice: AuthedClient) -> None:
    resp = exec_(alice, ["sh", "-c", "yes abcdefg | head -c 3000000; exit 7"])

    assert resp.status_code == 200, resp.json
    assert resp.json["truncated"] is True and resp.json["exitCode"] == 7
    assert len(resp.json["output"].encode()) == execs.MAX_OUTPUT_BYTES
    assert resp.json["output"].startswith("abcdefg\nabcdefg\n")


def test_another_user_is_refused_and_an_admin_may(worker: Launcher, running: str,
                                                  bob: AuthedClient, admin: AuthedClient,
                                                  redis_client: redis.Redis) -> None:
    assert error_of(exec_(bob, ["id"]), 403) == "ForbiddenUserError"
    assert redis_client.xlen(keys.job_events(running)) > 0
    events = Store(redis_client).get_events(running)
    assert not [e for e in events if e["kind"] == "exec"]  # nothing ran for bob

    resp = exec_(admin, ["echo", "as admin"])
    assert resp.status_code == 200 and resp.json["output"] == "as admin\n"


def test_unknown_job_and_task_are_404(worker: Launcher, running: str,
                                      alice: AuthedClient) -> None:
    assert error_of(alice.post("/api/v1/user/alice/jobs/nope/tasks/main/0/exec",
                               json={"command": ["id"]}), 404) == "NoJobError"
    assert error_of(alice.post(f"/api/v1/user/alice/jobs/{JOB}/tasks/main/5/exec",
                               json={"command": ["id"]}), 404) == "NoTaskError"
    assert error_of(alice.post(f"/api/v1/user/alice/jobs/{JOB}/tasks/other/0/exec",
                               json={"command": ["id"]}), 404) == "NoTaskError"


def test_bad_bodies_are_400(worker: Launcher, running: str, alice: AuthedClient) -> None:
    assert error_of(exec_(alice, []), 400) == "BadRequestError"
    assert error_of(exec_(alice, ["echo", "a\0b"]), 400) == "BadRequestError"
    assert error_of(exec_(alice, ["id"], timeoutSec=121), 400) == "BadRequestError"
    assert error_of(alice.post(EXEC_URL, data="not json",
                               content_type="application/json"), 400) == "BadRequestError"


def test_a_finished_task_is_409(worker: Launcher, running: str, alice: AuthedClient,
                                redis_client: redis.Redis) -> None:
    record_task_exit(Store(redis_client), running, 0, "main", 0, exit_code=0, diagnostics="")

    assert error_of(exec_(alice, ["id"]), 409) == "ConflictJobError"


def test_a_container_gone_behind_the_records_back_is_409(
        worker: Launcher, running: str, alice: AuthedClient) -> None:
    container = worker.runtime.find(TaskRef(running, 0, "main", 0))
    assert container is not None
    container.stop(timeout=0)  # the monitor has not seen it exit yet

    resp = exec_(alice, ["id"])
    assert error_of(resp, 409) == "ConflictJobError"
    assert worker.node.name in resp.json["message"]


def test_the_command_is_killed_at_its_timeout(worker: Launcher, running: str,
                                              alice: AuthedClient) -> None:
    resp = exec_(alice, ["sh", "-c", "echo started; sleep 301; echo never"], timeoutSec=1)

    assert resp.status_code == 200, resp.json
    assert resp.json["timedOut"] is True
    assert resp.json["output"] == "started\n"
    assert resp.json["exitCode"] != 0
    container = worker.runtime.find(TaskRef(running, 0, "main", 0))
    assert container is not None
    deadline = time.monotonic() + WAIT_SECONDS
    while any("sleep 301" in " ".join(p) for p in container.top()["Processes"]):
        assert time.monotonic() < deadline, "the timed-out command still runs"
        time.sleep(0.1)
    assert container.status == "running"  # the task itself goes on


def test_every_exec_is_audited(worker: Launcher, running: str, alice: AuthedClient,
                               admin: AuthedClient, redis_client: redis.Redis) -> None:
    exec_(alice, ["echo", "one"])
    exec_(admin, ["echo", "two"])
    exec_(alice, ["echo", "three"])

    events = [e for e in Store(redis_client).get_events(running) if e["kind"] == "exec"]
    assert [(e["user"], e["argv"]) for e in events] == [
        ("alice", ["echo", "one"]), ("root", ["echo", "two"]), ("alice", ["echo", "three"])]
    assert all(e["role"] == "main" and e["index"] == 0 and e["attempt"] == 0 for e in events)
    [recorded] = telemetry.read_recorded(redis_client, [telemetry.TASK_EXECS])
    assert recorded.counters == {("alice",): 2.0, ("root",): 1.0}


def test_past_the_users_cap_is_429(worker: Launcher, running: str, alice: AuthedClient,
                                   settings: Settings, redis_client: redis.Redis) -> None:
    leases = FollowLeases(Store(redis_client), settings.exec_per_user, key=keys.exec_leases)
    held = [leases.acquire("alice") for _ in range(settings.exec_per_user)]
    assert all(held)

    resp = exec_(alice, ["id"])
    assert error_of(resp, 429) == "TooManyRequestsError"
    assert resp.headers["Retry-After"]

    leases.release("alice", str(held[0]))
    assert exec_(alice, ["true"]).status_code == 200
    # the exec gave its own lease back
    assert redis_client.zcard(keys.exec_leases("alice")) == settings.exec_per_user - 1


def _exec_writes(redis_client: redis.Redis, job_id: str, node: str) -> tuple[int, int, int]:
    """What an exec writes, counted: the job's exec events, the calls ever
    sent to the node (taken ones are deleted: the stream's own count of
    entries added), the leases alice holds."""
    events = [e for e in Store(redis_client).get_events(job_id) if e["kind"] == "exec"]
    calls = keys.node_calls(node)
    sent = redis_client.xinfo_stream(calls)["entries-added"] if redis_client.exists(calls) else 0
    return len(events), int(sent), redis_client.zcard(keys.exec_leases("alice"))


TOKEN_CHANGES: list[Any] = [
    pytest.param(lambda alice, admin: alice.delete("/api/v1/token"), id="the token logged out"),
    pytest.param(lambda alice, admin: admin.delete("/api/v1/user/alice/tokens"),
                 id="every token of the user revoked"),
    pytest.param(lambda alice, admin: admin.put("/api/v1/user/alice/password",
                                                json={"newPassword": "another-pw"}),
                 id="the password changed"),
]


@pytest.mark.parametrize("change", TOKEN_CHANGES)
def test_a_token_revoked_since_the_last_exec_runs_nothing(
        worker: Launcher, running: str, alice: AuthedClient, admin: AuthedClient,
        redis_client: redis.Redis, settings: Settings, change: Any) -> None:
    """An exec may decide on the token check this process remembers (as a
    submit does); its write holds to it, so a token revoked a moment ago
    writes nothing: no request, no call to the node, no audit, no lease."""
    assert exec_(alice, ["true"]).status_code == 200  # the check is remembered now
    before = _exec_writes(redis_client, running, settings.node_name)
    assert change(alice, admin).status_code < 300

    assert error_of(exec_(alice, ["id"]), 401) == "UnauthorizedUserError"
    assert _exec_writes(redis_client, running, settings.node_name) == before


@pytest.mark.parametrize("url", [
    "/api/v1/user/alice/jobs/no-such-job/tasks/main/0/exec",  # 404 on a fresh check
    f"/api/v1/user/alice/jobs/{JOB}/tasks/no-such-role/0/exec",  # 404
    f"/api/v1/user/root/jobs/{JOB}/tasks/main/0/exec",  # 404 or 403: another user's name
], ids=["no such job", "no such task", "another user's name"])
def test_a_revoked_token_learns_nothing_of_the_jobs(worker: Launcher, running: str,
                                                    alice: AuthedClient, url: str) -> None:
    """What the job holds is answered only on a token that holds now: a
    refusal decided on a remembered check is decided again on a fresh one."""
    assert exec_(alice, ["true"]).status_code == 200
    assert alice.delete("/api/v1/token").status_code == 200
    assert error_of(alice.post(url, json={"command": ["id"]}), 401) == "UnauthorizedUserError"


def test_an_admin_demoted_since_the_last_exec_cannot_exec_into_others_jobs(
        worker: Launcher, running: str, bob: AuthedClient, admin: AuthedClient,
        redis_client: redis.Redis, settings: Settings) -> None:
    """bob's remembered check says admin; the write holds to the admin flag
    it read, so once it is taken away the exec into alice's job is decided
    again on a fresh check: 403, nothing written."""
    assert admin.put("/api/v1/user/bob/admin", json={"value": True}).status_code == 200
    assert exec_(bob, ["true"]).status_code == 200  # alice's job, as an admin
    before = _exec_writes(redis_client, running, settings.node_name)
    assert admin.put("/api/v1/user/bob/admin", json={"value": False}).status_code == 200

    assert error_of(exec_(bob, ["id"]), 403) == "ForbiddenUserError"
    assert _exec_writes(redis_client, running, settings.node_name) == before
    assert redis_client.zcard(keys.exec_leases("bob")) == 0


def test_a_change_that_leaves_the_exec_allowed_still_runs_it(
        worker: Launcher, running: str, alice: AuthedClient, admin: AuthedClient,
        redis_client: redis.Redis, settings: Settings) -> None:
    """The user's record changed (so the remembered check does not hold), but
    the token does and alice still owns the job: decided again on a fresh
    check, the exec runs, once."""
    assert exec_(alice, ["true"]).status_code == 200
    events, calls, _ = _exec_writes(redis_client, running, settings.node_name)
    assert admin.put("/api/v1/user/alice/admin", json={"value": True}).status_code == 200

    resp = exec_(alice, ["echo", "again"])
    assert resp.status_code == 200 and resp.json["output"] == "again\n"
    assert _exec_writes(redis_client, running, settings.node_name) == (events + 1, calls + 1, 0)


def test_past_the_cap_on_a_remembered_check_is_429_and_takes_nothing(
        worker: Launcher, running: str, alice: AuthedClient, settings: Settings,
        redis_client: redis.Redis) -> None:
    assert exec_(alice, ["true"]).status_code == 200
    leases = FollowLeases(Store(redis_client), settings.exec_per_user, key=keys.exec_leases)
    assert all(leases.acquire("alice") for _ in range(settings.exec_per_user))
    before = _exec_writes(redis_client, running, settings.node_name)

    assert error_of(exec_(alice, ["id"]), 429) == "TooManyRequestsError"
    assert _exec_writes(redis_client, running, settings.node_name) == before


def test_a_node_with_every_exec_slot_taken_is_503(worker: Launcher, running: str,
                                                  alice: AuthedClient,
                                                  settings: Settings) -> None:
    for _ in range(settings.exec_slots_per_node):
        assert worker.exec_slots.acquire(blocking=False)
    try:
        resp = exec_(alice, ["id"])
        assert error_of(resp, 503) == "ServiceUnavailableError"
        assert resp.headers["Retry-After"]
    finally:
        for _ in range(settings.exec_slots_per_node):
            worker.exec_slots.release()
    assert exec_(alice, ["true"]).status_code == 200


def test_an_api_process_waiting_for_all_it_may_is_503(worker: Launcher, running: str,
                                                      alice: AuthedClient,
                                                      flask_client: FlaskClient) -> None:
    assert exec_(alice, ["true"]).status_code == 200
    state = flask_client.application.extensions[api_execs.EXTENSION]
    while state.caps.slots.take():  # bounded by the slots
        pass
    try:
        assert error_of(exec_(alice, ["id"]), 503) == "ServiceUnavailableError"
    finally:
        state.caps.slots.used = 0
    assert exec_(alice, ["true"]).status_code == 200


def test_a_node_that_does_not_answer_is_504(launcher: Launcher, settings: Settings,
                                            redis_client: redis.Redis, test_image: str) -> None:
    quick = create_app(dataclasses.replace(settings, exec_answer_margin_seconds=0.2))
    client: FlaskClient = quick.test_client()
    admin = signed_in(client, "root")
    assert admin.post("/api/v1/user", json={"username": "alice",
                                            "password": "secret-pw"}).status_code == 201
    run_task(Store(redis_client), launcher, test_image)  # no launcher reads the node's calls

    resp = signed_in(client, "alice").post(EXEC_URL, json={"command": ["id"], "timeoutSec": 1})
    assert error_of(resp, 504) == "GatewayTimeoutError"
    assert redis_client.zcard(keys.exec_leases("alice")) == 0


def test_an_answer_from_a_launcher_that_keeps_the_lease_leaves_it_to_the_api(
        launcher: Launcher, running: str, alice: AuthedClient,
        redis_client: redis.Redis) -> None:
    """A launcher of an earlier version answers without giving the caller's
    lease back: the API gives it back itself, so the cap is not held until
    the lease expires."""
    calls = nodecalls.CallReader(redis_client, launcher.node.name)
    calls.join()

    named: list[str] = []

    def answer_as_before(stop: threading.Event) -> None:
        while not stop.is_set() and not named:
            for call in calls.take(1, 100):
                request, _ = launcher.claims.claim(call.request_id, launcher.node.name,
                                                   "earlier")
                assert request is not None
                named.append(request.lease)
                redis_client.rpush(keys.exec_result(request.id), json.dumps(
                    {"outcome": "done", "exitCode": 0, "output": "", "truncated": False,
                     "timedOut": False, "message": ""}))

    with looping(answer_as_before):
        assert exec_(alice, ["true"]).status_code == 200

    assert named and named[0]  # the API named its lease to the launcher

    assert redis_client.zcard(keys.exec_leases("alice")) == 0


# -------------------------------------------------------------- launcher
# -------------------------------------------------------------- launcher


def forge(redis_client: redis.Redis, job_id: str, node: str, argv: list[str], *,
          attempt: int = 0, index: int = 0, answer_by_ms: int = 0) -> ExecRequest:
    """A request written straight into Redis, as the API would (or an attacker)."""
    request = ExecRequest.new(job_id=job_id, attempt=attempt, role="main", index=index,
                              node=node, argv=argv, timeout_seconds=10, user="alice",
                              answer_by_ms=answer_by_ms)
    pipe = redis_client.pipeline()
    execs.write_request(pipe, request)
    pipe.execute()
    return request


def test_a_call_read_twice_runs_the_command_once(worker: Launcher, running: str,
                                                 redis_client: redis.Redis) -> None:
    request = forge(redis_client, running, worker.node.name,
                    ["sh", "-c", "echo ran >> /tmp/ran; echo done"])
    pipe = redis_client.pipeline()
    nodecalls.send(pipe, worker.node.name, nodecalls.Kind.EXEC, request.id)
    nodecalls.send(pipe, worker.node.name, nodecalls.Kind.EXEC, request.id)  # the same again
    pipe.execute()

    result = execs.wait_result(redis_client, request.id, WAIT_SECONDS)
    assert result is not None and result.outcome == Outcome.DONE
    assert result.output == "done\n"
    wait_for(lambda: redis_client.xlen(keys.node_calls(worker.node.name)) == 0,
             "both calls handled")
    assert in_container(worker, running, "cat /tmp/ran") == "ran\n"
    assert redis_client.llen(keys.exec_result(request.id)) == 0  # one answer only


def test_a_request_for_another_node_does_nothing(launcher: Launcher, running: str,
                                                 redis_client: redis.Redis) -> None:
    request = forge(redis_client, running, "node-elsewhere", ["sh", "-c", "touch /tmp/forged"])
    launcher.exec_command(request.id)

    assert not redis_client.exists(keys.exec_result(request.id))
    assert redis_client.hget(keys.exec_request(request.id), execs.CLAIMED) is None
    assert in_container(launcher, running, "ls /tmp/forged 2>&1 || true").endswith(
        "No such file or directory\n")


def test_a_request_for_another_attempt_is_not_run(launcher: Launcher, running: str,
                                                  redis_client: redis.Redis) -> None:
    request = forge(redis_client, running, launcher.node.name,
                    ["sh", "-c", "touch /tmp/forged"], attempt=1)
    launcher.exec_command(request.id)

    result = execs.wait_result(redis_client, request.id, WAIT_SECONDS)
    assert result is not None and result.outcome == Outcome.NOT_RUNNING
    assert in_container(launcher, running, "ls /tmp/forged 2>&1 || true").endswith(
        "No such file or directory\n")


def test_a_call_naming_another_task_than_its_request_is_checked_on_the_requests(
        launcher: Launcher, running: str, redis_client: redis.Redis) -> None:
    """The task a call names is read beside the claim, but only the request
    decides: an entry pointing at the running task while its request is for a
    task the job does not have does not run the command in the running one."""
    request = forge(redis_client, running, launcher.node.name,
                    ["sh", "-c", "touch /tmp/forged"], index=1)
    launcher.exec_command(request.id, nodecalls.TaskAt(running, 0, "main", 0))

    result = execs.wait_result(redis_client, request.id, WAIT_SECONDS)
    assert result is not None and result.outcome == Outcome.NOT_RUNNING
    assert in_container(launcher, running, "ls /tmp/forged 2>&1 || true").endswith(
        "No such file or directory\n")


def test_a_call_naming_its_requests_task_runs_it(launcher: Launcher, running: str,
                                                 redis_client: redis.Redis) -> None:
    request = forge(redis_client, running, launcher.node.name, ["echo", "ran"])
    launcher.exec_command(request.id, nodecalls.TaskAt(running, 0, "main", 0))

    result = execs.wait_result(redis_client, request.id, WAIT_SECONDS)
    assert result is not None and result.outcome == Outcome.DONE
    assert result.output == "ran\n"


def test_the_answer_gives_the_callers_lease_back_with_it(launcher: Launcher, running: str,
                                                       redis_client: redis.Redis) -> None:
    request = dataclasses.replace(
        forge(redis_client, running, launcher.node.name, ["true"]), lease="lease-1")
    redis_client.hset(keys.exec_request(request.id), "lease", request.lease)
    redis_client.zadd(keys.exec_leases("alice"), {"lease-1": now_ms() + 60_000,
                                                  "lease-2": now_ms() + 60_000})
    launcher.exec_command(request.id)

    result = execs.wait_result(redis_client, request.id, WAIT_SECONDS)
    assert result is not None and result.outcome == Outcome.DONE and result.lease_returned
    assert redis_client.zrange(keys.exec_leases("alice"), 0, -1) == ["lease-2"]


def test_an_expired_or_unknown_request_does_nothing(launcher: Launcher, running: str,
                                                    redis_client: redis.Redis) -> None:
    launcher.exec_command("no-such-request")
    assert not redis_client.exists(keys.exec_result("no-such-request"))


def test_a_request_read_after_the_api_stopped_waiting_is_not_run(
        launcher: Launcher, running: str, redis_client: redis.Redis) -> None:
    """Its caller got a 504 (a launcher down, then back) and may have sent the
    command again: running the first copy now would run it twice."""
    late = forge(redis_client, running, launcher.node.name, ["sh", "-c", "touch /tmp/late"],
                 answer_by_ms=now_ms() - 1)
    launcher.exec_command(late.id)

    assert not redis_client.exists(keys.exec_result(late.id))  # nobody waits for it
    assert redis_client.hget(keys.exec_request(late.id), execs.CLAIMED) is not None
    assert in_container(launcher, running, "ls /tmp/late 2>&1 || true").endswith(
        "No such file or directory\n")
