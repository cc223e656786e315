"""OpenPAI's data, output and script prerequisites and the SSH barrier, end to
end on the real services and Docker engine: protocol v2 jobs submitted over
HTTP, their runner in the container fetching data (an http URL served here,
a path in the user's storage), running callbacks, writing outputs into the
user's folder, and a failed step named in the task's exit reason."""

from __future__ import annotations

import copy
import functools
import http.server
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from bench import BenchError
from bench.live_platform import USER, Platform
from tests.support.platform import one_node_platform

JOB_SECONDS = 180


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A plain HTTP server on 127.0.0.1 (the tasks share the host's network)."""
    folder = tmp_path_factory.mktemp("www")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", folder
    finally:
        server.shutdown()
        thread.join(timeout=30)


def submit_v2(platform: Platform, job: dict[str, Any]) -> dict[str, Any]:
    answer = platform.http.post(f"{platform.url}/api/v2/jobs", data=yaml.safe_dump(job),
                                headers={"Content-Type": "text/yaml"}, timeout=30)
    assert answer.status_code == 202, answer.text
    try:
        return platform.wait_state(job["name"], timeout=JOB_SECONDS)
    except BenchError:
        logs = {role: platform.log(job["name"], role, 0, tail=20) for role in job["taskRoles"]}
        pytest.fail(f"job {job['name']} did not end: {platform.detail(job['name'])}, "
                    f"its logs: {logs}")


def v2_job(name: str, image: str, prerequisites: list[dict[str, Any]],
           role: dict[str, Any]) -> dict[str, Any]:
    return {"protocolVersion": 2, "name": name, "type": "job",
            "prerequisites": [{"name": "image", "type": "dockerimage", "uri": image},
                              *prerequisites],
            "taskRoles": {"train": {"instances": 1, "dockerImage": "image",
                                    "resourcePerInstance": {"cpu": 1, "memoryMB": 128},
                                    **role}}}


def test_data_is_fetched_callbacks_run_and_outputs_land(
        platform: Platform, served: tuple[str, Path], test_image: str) -> None:
    url, www = served
    (www / "train.csv").write_text("1,2\n3,4\n")
    name = f"prereq-{uuid.uuid4().hex[:8]}"
    labels = platform.storage / USER / "datasets" / "labels"
    labels.mkdir(parents=True, exist_ok=True)
    (labels / "classes.txt").write_text("cat\ndog\n")
    model = platform.storage / USER / name / "model"
    job = v2_job(name, test_image, [
        {"name": "mnist", "type": "data", "uri": [f"{url}/train.csv", str(labels)]},
        {"name": "model", "type": "output", "uri": str(model)},
        {"name": "setup", "type": "script", "plugin": "com.microsoft.pai.runtimeplugin.cmd",
         "callbacks": [{"event": "taskStarts", "commands": ["echo set up > /tmp/setup"]},
                       {"event": "taskSucceeds",
                        "commands": ["echo after the commands >> /pai/output/model/done"]}]},
    ], {"data": "mnist", "output": "model", "prerequisites": ["setup"], "commands": [
        "cat /tmp/setup",
        "cp /pai/data/mnist/train.csv /pai/output/model/copy.csv",
        "cat /pai/data/mnist/labels/classes.txt > /pai/output/model/classes.txt",
        "echo '<% $data.uri[0] %>' > /pai/output/model/rendered.txt",
    ]})

    detail = submit_v2(platform, job)

    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail["jobStatus"]
    assert (model / "copy.csv").read_text() == "1,2\n3,4\n"
    assert (model / "classes.txt").read_text() == "cat\ndog\n"
    assert (model / "rendered.txt").read_text() == f"{url}/train.csv\n"
    assert (model / "done").read_text() == "after the commands\n"
    log = platform.log(name, "train")
    assert "[pai] data prerequisite mnist: fetching its uri" in log
    assert "set up" in log


def test_a_data_uri_that_cannot_be_fetched_fails_the_task_naming_it(
        platform: Platform, served: tuple[str, Path], test_image: str) -> None:
    url, _ = served
    name = f"prereq-404-{uuid.uuid4().hex[:8]}"
    job = v2_job(name, test_image, [
        {"name": "missing", "type": "data", "uri": f"{url}/not-there.tar"},
    ], {"data": "missing", "commands": ["echo the commands ran"]})

    detail = submit_v2(platform, job)

    status = detail["jobStatus"]
    assert status["state"] == "FAILED", status
    assert "data prerequisite missing: fetching its uri failed" in status["appExitDiagnostics"]
    assert "the commands ran" not in platform.log(name, "train")


def test_a_failing_task_starts_callback_fails_the_task_naming_it(
        platform: Platform, test_image: str) -> None:
    name = f"prereq-cb-{uuid.uuid4().hex[:8]}"
    job = v2_job(name, test_image, [
        {"name": "install", "type": "script", "callbacks": [
            {"event": "taskStarts", "commands": ["echo installing", "exit 3"]}]},
    ], {"prerequisites": ["install"], "commands": ["echo the commands ran"]})

    detail = submit_v2(platform, job)

    status = detail["jobStatus"]
    assert status["state"] == "FAILED", status
    assert "script prerequisite install: its taskStarts commands failed" \
        in status["appExitDiagnostics"]
    log = platform.log(name, "train")
    assert "installing" in log and "the commands ran" not in log


def test_the_commands_own_exit_code_is_kept(platform: Platform, test_image: str) -> None:
    name = f"prereq-exit-{uuid.uuid4().hex[:8]}"
    job = v2_job(name, test_image, [
        {"name": "noop", "type": "script", "callbacks": [
            {"event": "taskStarts", "commands": ["true"]}]},
    ], {"prerequisites": ["noop"], "commands": ["exit 7"]})

    detail = submit_v2(platform, job)

    assert detail["jobStatus"]["state"] == "FAILED"
    assert detail["jobStatus"]["appExitCode"] == 7


@pytest.fixture(scope="module")
def ssh_platform(redis_server: str, docker_client: docker.DockerClient, ssh_test_image: str,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with one_node_platform(redis_server, docker_client, ssh_test_image,
                           tmp_path_factory.mktemp("barrier"), db=7, name="barrier",
                           port_range="33000-33999") as pai:
        yield pai


def test_the_ssh_barrier_waits_for_every_tasks_sshd(ssh_platform: Platform,
                                                    ssh_test_image: str) -> None:
    """As in OpenPAI's Horovod example: a master and workers that wait; each
    task starts its commands only once every task's sshd answers."""
    name = f"barrier-{uuid.uuid4().hex[:8]}"
    job = v2_job(name, ssh_test_image, [], {
        "completion": {"minSucceededInstances": 1},
        "commands": ["echo master past the barrier"]})
    job["taskRoles"]["worker"] = {**copy.deepcopy(job["taskRoles"]["train"]), "instances": 2,
                                  "commands": ["echo worker past the barrier", "sleep 3600"]}
    del job["taskRoles"]["worker"]["completion"]
    job["extras"] = {"com.microsoft.pai.runtimeplugin": [
        {"plugin": "ssh", "parameters": {"jobssh": True, "sshbarrier": True}}]}

    detail = submit_v2(ssh_platform, job)

    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail["jobStatus"]
    master = ssh_platform.log(name, "train", 0).splitlines()
    assert master.index("[pai] SSH barrier: waiting for the sshd of 3 task(s)") \
        < master.index("[pai] SSH barrier: every task's sshd answers") \
        < master.index("master past the barrier"), master
    # The workers waited too (they are stopped once the master succeeded,
    # maybe before their own last check: the job's end does not wait for them).
    for index in (0, 1):
        assert "[pai] SSH barrier: waiting for the sshd of 3 task(s)" \
            in ssh_platform.log(name, "worker", index)
