"""SSH into a job's tasks: the API, the scheduler's port allocator, the node's
launcher, Docker and the image's sshd, all real; the host's OpenSSH client
logs in.

A job asking for SSH is submitted through the API, placed by a real
scheduler pass (its task gets an `ssh` port from the node's range), started
by the node's launcher on the test Docker engine and made RUNNING as the
monitor would (mark_task_running).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shlex
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import redis
from click.testing import CliRunner, Result
from cryptography.hazmat.primitives import serialization
from flask.testing import FlaskClient

from pai_cli.logins import Cluster, Logins, save
from pai_cli.main import cli
from services.api.app import create_app
from services.api.auth import issue_token
from services.launcher.service import Launcher
from services.launcher.worker import create_launcher_app
from services.scheduler.service import Scheduler
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.node.containers import LABEL_NODE, TaskRef
from shared.state import keys, telemetry
from shared.state.lifecycle import mark_task_running
from shared.state.retention import compact_job
from shared.state.store import Store
from tests.support.api import AuthedClient, error_of, served

pytestmark = [pytest.mark.docker, pytest.mark.redis]

WAIT_SECONDS = 30
RANGE_PORTS = 10
DAY_S = 24 * 3600
# Container names follow job ids, and other sessions share the Docker engine:
# a name of this session's own.
JOB = f"sshme-{uuid.uuid4().hex[:8]}"
URL = f"/api/v1/user/alice/jobs/{JOB}"
SSH_CLIENT = shutil.which("ssh")


def port_range_above_ephemeral() -> int:
    """The first of RANGE_PORTS free ports above the kernel's ephemeral range:
    no client socket of this host (the API's own test server included) takes
    one of them meanwhile, and other tests' nodes allocate below."""
    low_bound = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[1]) + 1
    for _ in range(100):
        low = random.randrange(low_bound, 65536 - RANGE_PORTS)
        if all(_free(port) for port in range(low, low + RANGE_PORTS)):
            return low
    pytest.fail(f"no {RANGE_PORTS} free ports above {low_bound}")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@pytest.fixture
def settings(redis_server: str, redis_client: redis.Redis, tmp_path: Path,
             docker_client: docker.DockerClient) -> Iterator[Settings]:
    node = f"node-{uuid.uuid4().hex[:8]}"
    low = port_range_above_ephemeral()
    yield Settings(redis_url=redis_server, node_name=node, node_ip="127.0.0.1",
                   storage_roots=(str(tmp_path),), docker_host=os.environ.get("DOCKER_HOST"),
                   admin_user="root", admin_password="root-password",
                   port_range=(low, low + RANGE_PORTS - 1))
    for container in docker_client.containers.list(
            all=True, filters={"label": f"{LABEL_NODE}={node}"}):
        container.remove(force=True)


@pytest.fixture
def launcher(settings: Settings, test_labels: dict[str, str]) -> Launcher:
    _, launcher = create_launcher_app(settings, extra_labels=test_labels)
    launcher.store.register_node(launcher.node)
    return launcher


def config(image: str, **extra: Any) -> dict[str, Any]:
    return {"jobName": JOB, "image": image, **extra,
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256,
                           "command": "echo job-started; sleep 300"}]}


def run_ssh_job(client: AuthedClient, launcher: Launcher, settings: Settings,
                body: dict[str, Any], *, starts: int = 1) -> str:
    """Submit through the API, place with a real scheduler pass, start on the
    launcher's node (`starts` times: a start message delivered again), and
    mark the task RUNNING; the job's id."""
    resp = client.post("/api/v1/jobs", json=body)
    assert resp.status_code == 202, resp.json
    store = launcher.store
    Scheduler(settings, store, Messenger(make_celery(settings))).run_pass()
    job_id = f"alice~{body['jobName']}"
    task = store.get_task(job_id, 0, "main", 0)
    assert task is not None and task.node == launcher.node.name, task
    for _ in range(starts):
        launcher.start_task(job_id, 0, "main", 0)
    container = launcher.runtime.find(TaskRef(job_id, 0, "main", 0))
    assert container is not None and container.status == "running"
    assert mark_task_running(store, job_id, 0, "main", 0, str(container.id))
    return job_id


def ssh_port(store: Store, job_id: str) -> int:
    task = store.get_task(job_id, 0, "main", 0)
    assert task is not None
    [port] = task.ports["ssh"]
    return port


def write_key(tmp_path: Path, text: str, name: str = "key") -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o600)
    return path


def ssh(key: Path, port: int, command: str) -> subprocess.CompletedProcess[str]:
    assert SSH_CLIENT, "the OpenSSH client is missing (.ci/run installs openssh-client)"
    return subprocess.run(
        [SSH_CLIENT, "-i", str(key), "-p", str(port), "-o", "BatchMode=yes",
         "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10",
         "-F", "/dev/null", "root@127.0.0.1", command],
        capture_output=True, text=True, timeout=60, check=False)


def wait_listening(port: int) -> None:
    """sshd forks into the background before it listens: wait until it does."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"nothing listens on port {port}")
            time.sleep(0.1)


def in_container(launcher: Launcher, job_id: str, command: str) -> str:
    container = launcher.runtime.find(TaskRef(job_id, 0, "main", 0))
    assert container is not None
    _, output = container.exec_run(["sh", "-c", command])
    return str(output.decode())


def events_of(redis_client: redis.Redis, job_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in Store(redis_client).get_events(job_id) if e["kind"] == kind]


@pytest.fixture
def ssh_job(alice: AuthedClient, launcher: Launcher, settings: Settings,
            ssh_test_image: str) -> str:
    return run_ssh_job(alice, launcher, settings, config(ssh_test_image, ssh=True))


# ------------------------------------------------------------------ login


def test_the_jobs_key_logs_in_on_the_tasks_allocated_ssh_port(
        ssh_job: str, alice: AuthedClient, launcher: Launcher, tmp_path: Path,
        settings: Settings) -> None:
    port = ssh_port(launcher.store, ssh_job)
    assert settings.port_range[0] <= port <= settings.port_range[1]

    resp = alice.get(f"{URL}/ssh")

    assert resp.status_code == 200, resp.json
    body = resp.json
    assert body["containers"] == [{"id": "main-0", "sshIp": "127.0.0.1", "sshPort": str(port)}]
    pair = body["keyPair"]
    assert pair["publicKeyFileName"] == f"{JOB}.pub" and pair["privateKeyFileName"] == JOB
    assert pair["privateKeyDirectDownloadLink"] == f"{URL}/ssh/{JOB}"
    serialization.load_ssh_private_key(pair["privateKey"].encode(), password=None)
    # the download link serves the same key, the public file the public key
    assert alice.get(pair["privateKeyDirectDownloadLink"]).get_data(as_text=True) \
        == pair["privateKey"]
    assert alice.get(f"{URL}/ssh/{JOB}.pub").get_data(as_text=True).strip() \
        == pair["publicKey"]
    # OpenPAI's variable, and the key files as sshd's StrictModes wants them
    assert in_container(launcher, ssh_job, "echo $PAI_CONTAINER_SSH_PORT").strip() == str(port)
    assert in_container(launcher, ssh_job, "stat -c '%a %u' /root/.ssh "
                        "/root/.ssh/authorized_keys").split() == ["700", "0", "600", "0"]

    wait_listening(port)
    key = write_key(tmp_path, pair["privateKey"])
    done = ssh(key, port, "echo logged-in-as-$(id -u); cat /proc/1/cmdline | tr '\\0' ' '")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "logged-in-as-0"
    assert "sleep 300" in lines[1]  # the task's own container: its command runs there


def test_a_wrong_key_and_a_password_are_refused(ssh_job: str, launcher: Launcher,
                                                tmp_path: Path) -> None:
    port = ssh_port(launcher.store, ssh_job)
    wait_listening(port)
    other = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(tmp_path / "other")], capture_output=True, check=False)
    assert other.returncode == 0, other.stderr

    done = ssh(tmp_path / "other", port, "true")

    assert done.returncode == 255
    assert "Permission denied (publickey)" in done.stderr  # no password method offered


def test_the_users_own_key_logs_in(alice: AuthedClient, launcher: Launcher, settings: Settings,
                                   ssh_test_image: str, tmp_path: Path) -> None:
    mine = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alice@laptop",
                           "-f", str(tmp_path / "mine")], capture_output=True, check=False)
    assert mine.returncode == 0, mine.stderr
    public = (tmp_path / "mine.pub").read_text().strip()
    job_id = run_ssh_job(alice, launcher, settings, config(
        ssh_test_image, ssh={"jobssh": False, "userssh": {"type": "custom", "value": public}}))
    port = ssh_port(launcher.store, job_id)
    wait_listening(port)

    assert ssh(tmp_path / "mine", port, "true").returncode == 0
    answer = alice.get(f"{URL}/ssh").json
    assert answer["keyPair"] is None  # no key pair was made for this job
    assert launcher.store.r.exists(keys.job_ssh_key(job_id)) == 0


def test_an_image_without_sshd_runs_on_and_its_log_says_so(
        alice: AuthedClient, launcher: Launcher, settings: Settings, test_image: str,
        redis_client: redis.Redis) -> None:
    job_id = run_ssh_job(alice, launcher, settings, config(test_image, ssh=True))

    container = launcher.runtime.find(TaskRef(job_id, 0, "main", 0))
    assert container is not None
    container.reload()
    assert container.status == "running"
    log = container.logs().decode()  # what the monitor ships as the task's log
    assert "[pai] SSH is not available in this task: its image has no /usr/sbin/sshd" in log
    assert "job-started" in log
    [event] = events_of(redis_client, job_id, "ssh")
    assert event["started"] is False and "no /usr/sbin/sshd" in event["message"]
    assert event["role"] == "main" and event["index"] == 0


# -------------------------------------------------------------- who may


def test_others_are_refused_admins_read_and_every_read_is_audited(
        ssh_job: str, alice: AuthedClient, bob: AuthedClient, admin: AuthedClient,
        redis_client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pai.api")
    assert error_of(bob.get(f"{URL}/ssh"), 403) == "ForbiddenUserError"
    assert error_of(bob.get(f"{URL}/ssh/{JOB}"), 403) == "ForbiddenUserError"
    assert error_of(bob.get("/api/v1/user/alice/jobs/nosuchjob/ssh"), 403)

    assert alice.get(f"{URL}/ssh").status_code == 200
    assert admin.get(f"{URL}/ssh").status_code == 200
    assert alice.get(f"{URL}/ssh/{JOB}").status_code == 200

    reads = events_of(redis_client, ssh_job, "ssh-key-read")
    assert [(e["user"], e["via"]) for e in reads] == [
        ("alice", "ssh"), ("root", "ssh"), ("alice", "key file")]
    [recorded] = telemetry.read_recorded(redis_client, [telemetry.TASK_SSH_KEY_READS])
    assert recorded.counters == {("alice",): 2.0, ("root",): 1.0}
    assert f"ssh key of job {ssh_job} read by root" in caplog.text


def test_a_job_without_ssh_is_a_clear_404(alice: AuthedClient, test_image: str) -> None:
    assert alice.post("/api/v1/jobs", json=config(test_image)).status_code == 202

    resp = alice.get(f"{URL}/ssh")

    assert error_of(resp, 404) == "NoSshError"
    assert "did not ask for SSH" in resp.json["message"]
    assert error_of(alice.get(f"{URL}/ssh/{JOB}"), 404) == "NoSshError"


# ------------------------------------------------------------ the secret


def every_value(r: redis.Redis) -> Iterator[tuple[str, str]]:
    """Every key in Redis with each value it holds, as text."""
    for raw_key in r.scan_iter(count=1000):
        key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
        kind = r.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        values: list[Any] = []
        if kind == "string":
            values = [r.get(key)]
        elif kind == "hash":
            values = list(r.hgetall(key).items())
        elif kind == "list":
            values = r.lrange(key, 0, -1)
        elif kind == "zset":
            values = r.zrange(key, 0, -1)
        elif kind == "set":
            values = list(r.smembers(key))
        elif kind == "stream":
            values = r.xrange(key)
        yield key, repr(values)


def test_the_private_key_is_in_no_other_answer_record_log_or_event(
        ssh_job: str, alice: AuthedClient, bob: AuthedClient, admin: AuthedClient,
        launcher: Launcher, redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    private = alice.get(f"{URL}/ssh").json["keyPair"]["privateKey"]
    secret = "".join(private.splitlines()[1:-1])  # the base64 body, whatever the line breaks
    fragments = [secret[i:i + 40] for i in range(0, len(secret) - 40, 40)]

    answers = [alice.get(f"{URL}/config"), alice.get(URL), alice.get("/api/v1/jobs"),
               alice.get("/api/v1/user/alice/jobs"), admin.get("/api/v1/jobs"),
               alice.get(f"{URL}/config", headers={"Accept": "text/yaml"}),
               bob.get(f"{URL}/ssh"), bob.get(f"{URL}/ssh/{JOB}"), bob.get(URL),
               alice.get(f"/api/v1/user/alice/jobs/{JOB}/tasks/main/0/log")]
    texts = {f"{at} {resp.request.path}": resp.get_data(as_text=True)
             for at, resp in enumerate(answers)}
    texts["events"] = json.dumps(Store(redis_client).get_events(ssh_job))
    texts["service logs"] = caplog.text
    container = launcher.runtime.find(TaskRef(ssh_job, 0, "main", 0))
    assert container is not None
    texts["task log"] = container.logs().decode()
    texts["container environment"] = json.dumps(container.attrs["Config"]["Env"])
    for key, value in every_value(redis_client):
        if key != keys.job_ssh_key(ssh_job):
            texts[f"redis {key}"] = value
    assert "ssh" in json.loads(texts[f"0 {URL}/config"])  # the config says SSH, not the key
    leaked = [where for where, text in texts.items()
              if any(fragment in text for fragment in fragments)]
    assert leaked == []
    # nor is it inside the container: only the public key is
    assert "PRIVATE KEY" not in in_container(launcher, ssh_job,
                                             "cat /root/.ssh/* 2>/dev/null; env")


# ------------------------------------------------------------- lifecycle


def test_the_key_goes_with_the_job(alice: AuthedClient, redis_client: redis.Redis,
                                   test_image: str) -> None:
    assert alice.post("/api/v1/jobs", json=config(test_image, ssh=True)).status_code == 202
    job_id = f"alice~{JOB}"
    key = keys.job_ssh_key(job_id)
    first = redis_client.get(key)
    assert first

    # a second submit of the name is refused and leaves the first job's key alone
    assert error_of(alice.post("/api/v1/jobs", json=config(test_image, ssh=True)),
                    409) == "ConflictJobError"
    assert redis_client.get(key) == first

    assert alice.put(f"{URL}/executionType", json={"value": "STOP"}).status_code == 202
    assert compact_job(Store(redis_client), job_id, None)
    assert redis_client.exists(key) == 0
    assert error_of(alice.get(f"{URL}/ssh"), 404) == "NoSshError"

    assert alice.delete(URL).status_code == 200
    assert alice.post("/api/v1/jobs", json=config(test_image, ssh=True)).status_code == 202
    assert redis_client.get(key) not in (None, first)  # a new job, a new key
    assert alice.put(f"{URL}/executionType", json={"value": "STOP"}).status_code == 202
    assert alice.delete(URL).status_code == 200
    assert redis_client.exists(key) == 0


def test_a_refused_submit_leaves_no_key(alice: AuthedClient, redis_client: redis.Redis,
                                        test_image: str) -> None:
    assert alice.post("/api/v1/jobs", json=config(test_image)).status_code == 202

    assert error_of(alice.post("/api/v1/jobs", json=config(test_image, ssh=True)),
                    409) == "ConflictJobError"

    assert redis_client.exists(keys.job_ssh_key(f"alice~{JOB}")) == 0


# ------------------------------------------------------------------- CLI


@pytest.fixture
def api_url(settings: Settings) -> Iterator[str]:
    """The API over HTTP on a free 127.0.0.1 port, for the CLI."""
    with served(create_app(settings)) as url:
        yield url


def cli_config(api_url: str, flask_client: FlaskClient, tmp_path: Path) -> Path:
    with flask_client.application.app_context():
        token, expires = issue_token("alice", DAY_S)
    config = tmp_path / "cli" / "config.yaml"
    logins = Logins()
    logins.put(Cluster("test", api_url, "alice", token, False, expires))
    save(config, logins)
    return config


def pai(config: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"PAI_CONFIG": str(config),
                                                     "PAI_CLUSTER": None})


def test_pai_ssh_logs_in_and_print_shows_a_command_that_does(
        ssh_job: str, api_url: str, flask_client: FlaskClient, launcher: Launcher,
        tmp_path: Path) -> None:
    wait_listening(ssh_port(launcher.store, ssh_job))
    config = cli_config(api_url, flask_client, tmp_path)

    done = pai(config, "ssh", JOB, "--", "touch", "/tmp/pai-ssh-was-here")

    assert done.exit_code == 0, done.output
    assert in_container(launcher, ssh_job, "ls /tmp/pai-ssh-was-here").strip() \
        == "/tmp/pai-ssh-was-here"
    folder = config.parent / "ssh"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    [known] = list(folder.glob("*.known_hosts"))  # this job's host key, remembered
    assert " ssh-ed25519 " in known.read_text()
    assert not list(folder.glob("key-*"))  # the key file went with the session

    printed = pai(config, "ssh", JOB, "main", "0", "--print")
    assert printed.exit_code == 0, printed.output
    argv = shlex.split(printed.stdout)
    key = Path(argv[argv.index("-i") + 1])
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    again = subprocess.run([*argv, "-o", "BatchMode=yes", "true"], capture_output=True,
                           text=True, timeout=60, check=False)
    assert again.returncode == 0, again.stderr  # the host key it knows still matches

    wrong = pai(config, "ssh", JOB, "main", "3")
    assert (wrong.exit_code, wrong.stderr) == (1, "error: role main has tasks 0..0\n")


def test_a_start_delivered_again_starts_no_second_sshd(
        alice: AuthedClient, launcher: Launcher, settings: Settings, ssh_test_image: str,
        redis_client: redis.Redis) -> None:
    job_id = run_ssh_job(alice, launcher, settings, config(ssh_test_image, ssh=True), starts=2)
    wait_listening(ssh_port(launcher.store, job_id))

    first, again = events_of(redis_client, job_id, "ssh")
    assert first["started"] and "listens on port" in first["message"]
    assert again["started"] and again["message"] == "sshd runs already"
    assert in_container(launcher, job_id, "ls -l /proc/*/exe 2>/dev/null | "
                        "grep -c /usr/sbin/sshd").strip() == "1"


def test_a_taken_ssh_port_is_said_and_the_job_runs_on(
        alice: AuthedClient, launcher: Launcher, settings: Settings, ssh_test_image: str,
        redis_client: redis.Redis) -> None:
    assert alice.post("/api/v1/jobs", json=config(ssh_test_image, ssh=True)).status_code == 202
    Scheduler(settings, launcher.store, Messenger(make_celery(settings))).run_pass()
    job_id = f"alice~{JOB}"
    port = ssh_port(launcher.store, job_id)
    squatters = []
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        squatter = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET6:
            squatter.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        squatter.bind((address, port))
        squatter.listen()
        squatters.append(squatter)
    try:
        launcher.start_task(job_id, 0, "main", 0)
    finally:
        for squatter in squatters:
            squatter.close()

    [event] = events_of(redis_client, job_id, "ssh")
    assert event["started"] is False
    assert event["message"] == f"SSH is not available: sshd did not listen on port {port} " \
                               "(is it taken?)"
    container = launcher.runtime.find(TaskRef(job_id, 0, "main", 0))
    assert container is not None
    container.reload()
    assert container.status == "running"
    assert "did not listen on port" in container.logs().decode()


def test_a_v2_job_with_the_ssh_plugin_gets_its_key_pair(alice: AuthedClient,
                                                        test_image: str) -> None:
    v2 = f"""
protocolVersion: 2
name: {JOB}
type: job
prerequisites:
  - {{name: img, type: dockerimage, uri: "{test_image}"}}
taskRoles:
  main:
    dockerImage: img
    resourcePerInstance: {{cpu: 1, memoryMB: 256}}
    commands: [sleep 60]
extras:
  com.microsoft.pai.runtimeplugin:
    - plugin: ssh
      parameters: {{jobssh: true}}
"""
    resp = alice.post("/api/v2/jobs", data=v2, headers={"Content-Type": "text/yaml"})
    assert resp.status_code == 202, resp.json
    assert resp.json["ignoredFields"] == []  # the plugin is acted on

    answer = alice.get(f"{URL}/ssh").json

    assert answer["containers"] == []  # nothing runs yet
    serialization.load_ssh_private_key(answer["keyPair"]["privateKey"].encode(), password=None)
    shown = alice.get(f"{URL}/config").get_data(as_text=True)
    assert "jobssh" in shown and "PRIVATE KEY" not in shown
