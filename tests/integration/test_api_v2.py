"""Protocol v2 through the API on a real Redis: YAML as OpenPAI users post it,
JSON sent as YAML (OpenPAI's SDK), dry runs, configs shown back without
secrets, hostile YAML refused with 4xx, and the `/rest-server/` prefix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
import yaml

from shared.state import keys
from tests.support.api import AuthedClient

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "v2-two-roles.yaml"

V2 = """\
protocolVersion: 2
name: v2job
type: job
parameters: {steps: 3}
secrets: {token: s3cret-value}
prerequisites:
  - {name: img, type: dockerimage, uri: busybox}
taskRoles:
  worker:
    instances: 2
    dockerImage: img
    resourcePerInstance: {cpu: 1, memoryMB: 128, gpu: 0}
    commands:
      - echo <% $parameters.steps %>
      - login <% $secrets.token %>
    taskRetryCount: 1
extras:
  com.microsoft.pai.runtimeplugin: [{plugin: ssh}]
"""
YAML = {"Content-Type": "text/yaml"}


def test_v2_yaml_is_submitted_as_openpai_scripts_post_it(
        alice: AuthedClient, redis_client: redis.Redis) -> None:
    resp = alice.post("/api/v2/jobs", data=V2, headers=YAML)

    assert resp.status_code == 202, resp.json
    assert resp.json is not None
    assert resp.json["url"] == "/api/v1/user/alice/jobs/v2job"
    assert set(resp.json["ignoredFields"]) == {"extras.com.microsoft.pai.runtimeplugin"}
    assert redis_client.zrange(keys.QUEUE, 0, -1) == ["alice~v2job"]
    runs_from = json.loads(redis_client.get(keys.job_config("alice~v2job")) or "{}")
    assert runs_from["taskRoles"][0]["command"] == "echo 3\nlogin s3cret-value"
    assert runs_from["taskRoles"][0]["taskRetryCount"] == 1  # acted on, not stored only


def test_the_config_is_shown_back_as_submitted_without_secrets(alice: AuthedClient) -> None:
    """Threat: a secret (a registry or database password) written once in a
    job file is read back by anyone who may read the job's config, or lands
    in a dry run's answer, a terminal or a log."""
    dry = alice.post("/api/v2/jobs?dryRun=true", data=V2, headers=YAML)
    assert dry.status_code == 200 and "s3cret-value" not in dry.get_data(as_text=True)
    alice.post("/api/v2/jobs", data=V2, headers=YAML)

    as_yaml = alice.get("/api/v1/user/alice/jobs/v2job/config", headers={"Accept": "text/yaml"})
    as_json = alice.get("/api/v1/user/alice/jobs/v2job/config")

    assert as_yaml.mimetype == "text/yaml"
    shown = yaml.safe_load(as_yaml.get_data(as_text=True))
    assert shown["protocolVersion"] == 2 and shown["taskRoles"]["worker"]["commands"] == [
        "echo <% $parameters.steps %>", "login <% $secrets.token %>"]
    for body in (as_yaml.get_data(as_text=True), as_json.get_data(as_text=True)):
        assert "s3cret-value" not in body


def test_a_v1_registry_password_is_not_shown_back(alice: AuthedClient) -> None:
    """Threat: the registry login a job pulls its image with is read back
    from the job's config or a dry run (it is sent only to the node's engine)."""
    config = {"jobName": "private", "image": "reg.example:5000/team/img:1",
              "imageAuth": {"username": "u", "password": "registry-pw-1"},
              "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                             "memoryMB": 256, "command": "true"}]}
    dry = alice.post("/api/v1/user/alice/jobs?dryRun=true", json=config)
    assert dry.status_code == 200 and dry.json is not None
    assert dry.json["config"]["imageAuth"] == {"username": "u", "password": "******"}
    assert alice.post("/api/v1/user/alice/jobs", json=config).status_code == 202

    shown = alice.get("/api/v1/user/alice/jobs/private/config")
    assert shown.json is not None and shown.json["imageAuth"]["password"] == "******"
    assert "registry-pw-1" not in shown.get_data(as_text=True)


def test_dry_run_stores_nothing(alice: AuthedClient, redis_client: redis.Redis) -> None:
    resp = alice.post("/api/v2/jobs?dryRun=true", data=V2, headers=YAML)
    assert resp.status_code == 200 and resp.json is not None
    assert resp.json["config"]["taskRoles"][0]["taskNumber"] == 2
    assert redis_client.get(keys.job_config("alice~v2job")) is None


def test_the_sdk_sends_json_as_yaml(alice: AuthedClient) -> None:
    body = json.dumps(yaml.safe_load(V2))
    resp = alice.post("/api/v2/jobs", data=body, headers=YAML)
    assert resp.status_code == 202, resp.json


def test_v1_endpoint_takes_v2_and_v1_yaml(alice: AuthedClient) -> None:
    v2 = alice.post("/api/v1/user/alice/jobs", data=V2, headers=YAML)
    v1 = alice.post("/api/v1/user/alice/jobs", headers={"Content-Type": "application/yaml"},
                    data="jobName: v1job\nimage: busybox\ntaskRoles:\n- {name: main, "
                         "taskNumber: 1, cpuNumber: 1, memoryMB: 128, command: 'true'}\n")
    assert (v2.status_code, v1.status_code) == (202, 202), (v2.json, v1.json)


def test_the_example_two_role_job_is_accepted(alice: AuthedClient) -> None:
    resp = alice.post("/api/v2/jobs?dryRun=1", data=EXAMPLE.read_text(), headers=YAML)
    assert resp.status_code == 200, resp.json
    assert resp.json is not None
    assert [r["name"] for r in resp.json["config"]["taskRoles"]] == ["server", "worker"]


def test_errors_name_the_v2_field(alice: AuthedClient) -> None:
    bad = V2.replace("gpu: 0", "gpu: 1000")
    resp = alice.post("/api/v2/jobs", data=bad, headers=YAML)
    assert resp.status_code == 400 and resp.json is not None
    assert resp.json["code"] == "InvalidJobConfigError"
    assert list(resp.json["fields"]) == ["taskRoles.worker.resourcePerInstance.gpu"]


def test_v1_config_on_the_v2_endpoint_is_refused(alice: AuthedClient) -> None:
    resp = alice.post("/api/v2/jobs", data="jobName: x\n", headers=YAML)
    assert resp.status_code == 400 and resp.json is not None
    assert "protocolVersion" in resp.json["fields"]


HOSTILE = [
    pytest.param("a: &x [1]\nb: *x\n", id="alias"),
    pytest.param("a: " + "[" * 200 + "]" * 200 + "\n", id="deep"),
    pytest.param("a: !!python/object/apply:os.system ['true']\n", id="python-tag"),
    pytest.param("a: !!binary aGk=\n", id="binary"),
    pytest.param("? [1, 2]\n: x\n", id="non-string-key"),
    pytest.param("a: .nan\n", id="nan"),
    pytest.param("a: 1\n---\nb: 2\n", id="two-documents"),
    pytest.param("a: [1\n", id="truncated"),
    pytest.param("", id="empty"),
    pytest.param("a: " + "9" * 5000 + "\n", id="huge-int"),
]


@pytest.mark.parametrize("body", HOSTILE)
def test_hostile_yaml_gets_400(alice: AuthedClient, body: str) -> None:
    """Threat: a YAML body that makes the API run code (python tags), eat
    memory or CPU (aliases expanding to billions of nodes, deep nesting) or
    answer 500 instead of a clear 400."""
    resp = alice.post("/api/v2/jobs", data=body, headers=YAML)
    assert resp.status_code == 400, resp.get_data(as_text=True)


def test_the_rest_server_prefix_serves_the_same_api(alice: AuthedClient) -> None:
    resp = alice.post("/rest-server/api/v2/jobs", data=V2, headers=YAML)
    assert resp.status_code == 202, resp.json
    listed = alice.get("/rest-server/api/v1/jobs")
    assert listed.status_code == 200 and listed.json is not None
    assert [j["name"] for j in listed.json] == ["v2job"]


def test_the_rest_server_prefix_still_needs_a_token(flask_client: object) -> None:
    """Threat: a second path to the API that skips its authentication."""
    from flask.testing import FlaskClient
    assert isinstance(flask_client, FlaskClient)
    resp = flask_client.post("/rest-server/api/v2/jobs", data=V2, headers=YAML)
    assert resp.status_code == 401


def test_openpai_dirs_outside_every_root_are_accepted_with_a_note(
        alice: AuthedClient, tmp_path: Path) -> None:
    """OpenPAI v0.14's example naming /tmp/data and /tmp/output: accepted,
    unmounted, and said so; a folder in a root keeps today's checks (403)."""
    resp = alice.post("/api/v1/user/alice/jobs", json={
        "jobName": "tmpdirs", "image": "busybox", "dataDir": "/tmp/data",
        "outputDir": "/tmp/output",
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                       "command": "true"}]})
    assert resp.status_code == 202, resp.json
    assert resp.json is not None and len(resp.json["notes"]) == 2
    stored = alice.get("/api/v1/user/alice/jobs/tmpdirs/config").json
    assert stored is not None
    assert (stored["dataDir"], stored["outputDir"]) == ("/tmp/data", "/tmp/output")

    bobs = alice.post("/api/v1/user/alice/jobs", json={
        "jobName": "bobs", "image": "busybox", "dataDir": f"{tmp_path}/bob/in",
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                       "command": "true"}]})
    assert bobs.status_code == 403


def test_unmounted_dirs_cannot_be_claimed_by_the_submitter(alice: AuthedClient) -> None:
    """Threat: a user writes the internal `unmountedDirs` list themselves to
    have a folder inside a root (another user's) skip the mount checks."""
    resp = alice.post("/api/v1/user/alice/jobs", json={
        "jobName": "claim", "image": "busybox", "unmountedDirs": ["dataDir"],
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                       "command": "true"}]})
    assert resp.status_code == 400 and resp.json is not None
    assert "unmountedDirs" in resp.json["fields"]


def test_openpai_sdk_requests_work_unchanged(flask_client: object, alice: AuthedClient) -> None:
    """The requests OpenPAI v0.14's Python SDK (contrib/python-sdk) makes:
    a token by JSON under /rest-server/, v2 jobs as JSON text under
    `text/yaml` to /rest-server/api/v2/jobs, v1 jobs as JSON to the v1 path."""
    from flask.testing import FlaskClient
    assert isinstance(flask_client, FlaskClient)
    token = flask_client.post("/rest-server/api/v1/token", json={
        "username": "alice", "password": "secret-pw", "expiration": 3600})
    assert token.status_code == 200 and token.json is not None, token.get_data(as_text=True)
    auth = {"Authorization": f"Bearer {token.json['token']}"}
    v2 = flask_client.post("/rest-server/api/v2/jobs", json=yaml.safe_load(V2),
                           headers={**auth, "Content-Type": "text/yaml"})
    v1 = flask_client.post("/rest-server/api/v1/user/alice/jobs", headers=auth, json={
        "jobName": "sdk-v1", "image": "busybox",
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                       "command": "true"}]})
    assert (v2.status_code, v1.status_code) == (202, 202), (v2.json, v1.json)
    listed = flask_client.get("/rest-server/api/v1/user/alice/jobs", headers=auth)
    assert listed.json is not None
    assert sorted(j["name"] for j in listed.json) == ["sdk-v1", "v2job"]
