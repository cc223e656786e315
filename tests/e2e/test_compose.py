"""The single-box trial as a user runs it: docker-compose.yml, built and started
with Docker Compose on this machine's engine, a job through the API, the
metrics in Prometheus, and `down -v` leaving nothing behind.

Registry: none is reachable here, so scripts/compose-offline-images.sh builds
stand-ins from Debian's packages: a debootstrap'd base for pai's own image
(BASE_IMAGE), redis-server (REDIS_IMAGE) and prometheus (PROMETHEUS_IMAGE).
Grafana (profile `dashboards`) is not started: Debian has no package of it.

Networking: the test engine runs with --bridge=none (scripts/runtime.sh), so
Compose's default bridge network cannot exist. The test adds
deploy/compose/host-network.yml: every service on the host's network,
listening on a loopback address of its own (127.x.y.z, chosen free) on its
usual ports, with the service names resolved to that address, so
Prometheus' scrape targets and PAI_REDIS_URL are those of the main file.
docker-compose 1.29 refuses published ports together with host networking,
so the two files are resolved with `config` and the published ports dropped;
everything else is docker-compose.yml as users run it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import socket
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
import requests
import yaml

from bench import BenchError
from bench.live_platform import wait_for
from shared.domain.storage import task_log_parts

pytestmark = [pytest.mark.compose, pytest.mark.docker, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = (ROOT / "docker-compose.yml", ROOT / "deploy" / "compose" / "host-network.yml")
OFFLINE_IMAGES = ROOT / "scripts" / "compose-offline-images.sh"
PAI_IMAGE = "pai-test/pai:compose"
PROMETHEUS_CONFIG = "deploy/prometheus/prometheus.yml"
SCRAPED_JOBS = {"pai-api", "pai-monitor"}  # job names in PROMETHEUS_CONFIG
# The ports the services listen on (host-network.yml): all must be free on the chosen address.
SERVICE_PORTS = (6379, 9186, 9187, 9090)
ADMIN = ("admin", "admin-password")  # the compose file's dev-mode defaults
BUILD_SECONDS = 600
COMMAND_SECONDS = 180


def compose_command() -> list[str]:
    """Compose v2 (`docker compose`) where installed, else docker-compose 1.29."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        if subprocess.run(["docker", "compose", "version"], capture_output=True,
                          timeout=30, check=False).returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("neither `docker compose` nor docker-compose is installed "
                "(scripts/compose-offline-images.sh installs Debian's docker-compose as root)")


def compose_variables() -> set[str]:
    """Every ${NAME} the compose files read: the caller's values must not leak in."""
    text = "".join(path.read_text() for path in COMPOSE_FILES)
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def docker_socket() -> str:
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        pytest.fail(f"the compose test mounts the engine's socket: DOCKER_HOST={host} is not one")
    return host.removeprefix("unix://")


def free_loopback_address() -> str:
    """A 127.x.y.z on which every service port is free (a wildcard listener takes all)."""
    candidates = [f"127.{random.randint(1, 254)}.{random.randint(0, 254)}.{random.randint(2, 254)}"
                  for _ in range(20)]
    for address in candidates:
        try:
            for port in SERVICE_PORTS:
                with socket.socket() as sock:
                    sock.bind((address, port))
        except OSError:
            continue
        return address
    pytest.fail(f"ports {SERVICE_PORTS} are taken on every loopback address tried: "
                "is something listening on 0.0.0.0 on one of them?")


@dataclass
class Stack:
    """A running compose project and how to reach it."""

    project: str
    command: list[str]
    file: Path
    env: dict[str, str]
    address: str
    node: str
    storage: Path
    engine: docker.DockerClient

    @property
    def api(self) -> str:
        return f"http://{self.address}:9186"

    @property
    def prometheus(self) -> str:
        return f"http://{self.address}:9090"

    def compose(self, *args: str, timeout: float = COMMAND_SECONDS) -> str:
        result = subprocess.run([*self.command, "-p", self.project, "-f", str(self.file), *args],
                                env=self.env, cwd=ROOT, capture_output=True, text=True,
                                timeout=timeout, check=False)
        if result.returncode != 0:
            pytest.fail(f"compose {' '.join(args)} failed ({result.returncode}):\n"
                        f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result.stdout

    def containers(self) -> list[Any]:
        return self.engine.containers.list(
            all=True, filters={"label": f"com.docker.compose.project={self.project}"})

    def job_containers(self) -> list[Any]:
        return self.engine.containers.list(all=True, filters={"label": f"pai.node={self.node}"})

    def service(self, name: str) -> Any:
        for container in self.containers():
            if container.labels.get("com.docker.compose.service") == name:
                return container
        pytest.fail(f"no container for service {name}")

    def logs(self) -> str:
        with contextlib.suppress(Exception):
            return self.compose("logs", "--no-color", "--tail", "40")
        return ""


def resolve_files(command: list[str], env: dict[str, str], out: Path) -> None:
    """docker-compose.yml + host-network.yml, resolved, less the published ports."""
    files = [arg for path in COMPOSE_FILES for arg in ("-f", str(path))]
    result = subprocess.run([*command, *files, "config"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=COMMAND_SECONDS, check=False)
    assert result.returncode == 0, f"compose {' '.join(files)} config failed:\n{result.stderr}"
    config = yaml.safe_load(result.stdout)
    # The `ha` profile (replicas and sentinels, docs/high-availability.md)
    # is not started here and has no host-network variant: left out.
    config["services"] = {name: service for name, service in config["services"].items()
                          if "ha" not in service.get("profiles", ())}
    for service in config["services"].values():
        assert service.get("network_mode") == "host", service
        service.pop("ports", None)
    out.write_text(yaml.safe_dump(config, sort_keys=False))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, docker_client: docker.DockerClient,
          test_image: str) -> Iterator[Stack]:
    if not (ROOT / PROMETHEUS_CONFIG).is_file():
        pytest.fail(f"{PROMETHEUS_CONFIG} is missing: docker-compose.yml mounts deploy/prometheus")
    work = tmp_path_factory.mktemp("compose")
    settings_file = work / "offline-images.env"
    subprocess.run(["bash", str(OFFLINE_IMAGES), str(settings_file)], check=True,
                   timeout=BUILD_SECONDS)
    command = compose_command()
    suffix = uuid.uuid4().hex[:8]
    storage = work / "storage"
    storage.mkdir()
    address = free_loopback_address()
    settings = dict(line.split("=", 1) for line in settings_file.read_text().split())
    settings.update({
        "PAI_IMAGE": PAI_IMAGE,
        "HOST_NETWORK_IP": address,
        "DOCKER_SOCKET": docker_socket(),
        "PAI_STORAGE_ROOT": str(storage),
        "PAI_NODE_NAME": f"compose-{suffix}",
    })
    leaking = compose_variables() | {"COMPOSE_FILE", "COMPOSE_PROJECT_NAME", "COMPOSE_PROFILES"}
    env = {k: v for k, v in os.environ.items() if k not in leaking and not k.startswith("PAI_")}
    env.update(settings)
    # The repository's own .env (a user's) must not change what is tested: an explicit one.
    env_file = work / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    command = [*command, "--env-file", str(env_file)]

    resolved = work / "compose.resolved.yml"
    resolve_files(command, env, resolved)
    stack = Stack(project=f"paicompose{suffix}", command=command, file=resolved, env=env,
                  address=address, node=settings["PAI_NODE_NAME"], storage=storage,
                  engine=docker_client)
    started = time.monotonic()
    stack.compose("build", timeout=BUILD_SECONDS)
    print(f"\ncompose build: {time.monotonic() - started:.0f} s")
    try:
        stack.compose("up", "-d")
        yield stack
    finally:
        # Also when a test failed half-way; the last test checks this leaves nothing.
        with contextlib.suppress(BaseException):
            stack.compose("down", "-v", "--remove-orphans")
        for container in stack.job_containers():
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)


# Services that run once and exit 0 by design.
ONE_SHOT = {"redis-credentials", "storage-init"}


def healthy(stack: Stack) -> bool:
    states = {}
    for container in stack.containers():
        with contextlib.suppress(docker.errors.NotFound):
            container.reload()  # a listed container's attrs lack the health state
            states[container.labels["com.docker.compose.service"]] = container.attrs["State"]
    for name, state in states.items():
        if name in ONE_SHOT and state["Status"] == "exited" and state.get("ExitCode") == 0:
            continue  # its work (the Redis credentials) is done
        if state["Status"] in ("exited", "dead"):
            pytest.fail(f"{name} exited ({state.get('ExitCode')}):\n{stack.logs()}")
    running = {name: s for name, s in states.items() if name not in ONE_SHOT}
    return len(running) == 5 and all(
        s.get("Health", {}).get("Status") == "healthy" for s in running.values())


def login(stack: Stack) -> requests.Session:
    session = requests.Session()
    resp = session.post(f"{stack.api}/api/v1/token",
                        json={"username": ADMIN[0], "password": ADMIN[1]}, timeout=10)
    resp.raise_for_status()
    session.headers["Authorization"] = f"Bearer {resp.json()['token']}"
    return session


def job_state(session: requests.Session, stack: Stack, name: str) -> dict[str, Any]:
    resp = session.get(f"{stack.api}/api/v1/user/{ADMIN[0]}/jobs/{name}", timeout=10)
    resp.raise_for_status()
    detail: dict[str, Any] = resp.json()
    return detail


def prometheus_query(stack: Stack, query: str) -> list[dict[str, Any]]:
    resp = requests.get(f"{stack.prometheus}/api/v1/query", params={"query": query}, timeout=10)
    resp.raise_for_status()
    result: list[dict[str, Any]] = resp.json()["data"]["result"]
    return result


def _portal_offers_the_example(stack: Stack) -> None:
    """The portal answers from the image, and its editor opens on the example
    the image carries (a trial user's first submit)."""
    portal = requests.Session()
    login = portal.get(f"{stack.api}/login", timeout=10)
    assert login.status_code == 200
    token = re.search(r'name="csrf_token" value="([^"]+)"', login.text)
    assert token, login.text
    resp = portal.post(f"{stack.api}/login", timeout=10, allow_redirects=False,
                       data={"csrf_token": token.group(1), "username": ADMIN[0],
                             "password": ADMIN[1], "next": "/submit"})
    assert resp.status_code == 302, resp.text
    editor = portal.get(f"{stack.api}/submit", timeout=10)
    assert editor.status_code == 200 and "hello-world" in editor.text


def test_services_come_up_healthy(stack: Stack) -> None:
    started = time.monotonic()
    wait_for(lambda: healthy(stack), timeout=180, interval=1,
             what="every service to report healthy")
    print(f"\ncompose up to healthy: {time.monotonic() - started:.0f} s")
    assert requests.get(f"{stack.api}/healthz", timeout=5).json()["status"] == "ok"
    _portal_offers_the_example(stack)
    for service in ("api", "scheduler"):
        uid = stack.service(service).exec_run(["id", "-u"]).output.decode().strip()
        assert uid == "10001", f"{service} runs as uid {uid}, not the image's user pai"


def test_hello_world_succeeds_through_the_api(stack: Stack) -> None:
    session = login(stack)

    def node_ready() -> bool:
        nodes = session.get(f"{stack.api}/api/v1/nodes", timeout=10).json()
        return any(n["name"] == stack.node and n["state"] == "READY" for n in nodes)

    try:
        wait_for(node_ready, timeout=60, interval=0.5, what=f"node {stack.node} to be READY")
    except BenchError as error:  # say why: the node's view carries its reasons
        nodes = session.get(f"{stack.api}/api/v1/nodes", timeout=10).json()
        raise AssertionError(f"{error}; nodes: {nodes}") from error
    config = json.loads((ROOT / "examples" / "hello-world.json").read_text())
    resp = session.post(f"{stack.api}/api/v1/user/{ADMIN[0]}/jobs", json=config, timeout=10)
    assert resp.status_code == 202, resp.text

    detail = wait_for(
        lambda: (d := job_state(session, stack, "hello-world"))["jobStatus"]["state"]
        in ("SUCCEEDED", "FAILED", "STOPPED") and d,
        timeout=120, interval=0.5, what="hello-world to finish")

    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail["jobStatus"]
    log = session.get(f"{stack.api}/api/v1/user/{ADMIN[0]}/jobs/hello-world/tasks/main/0/log",
                      timeout=10).text
    assert "Hello from hello-world, task main[0] on 127.0.0.1:" in log
    # The output folder is on the host, where the job container's bind mount put it.
    assert (stack.storage / ADMIN[0] / "hello-world" / "output").is_dir()
    # Its full log, written by the node agent (root) into the log tree, belongs
    # to the group pai (PAI_LOG_GROUP): the api (user pai) reads it, the
    # scheduler (user pai) may file logs beside it; others get nothing.
    log_file = stack.storage.joinpath(".pai-logs", *task_log_parts(
        f"{ADMIN[0]}~hello-world", 0, "main", 0))
    wait_for(lambda: log_file.is_file() and b"Hello from" in log_file.read_bytes(),
             timeout=30, interval=0.5, what="hello-world's log file in the log tree")
    info = log_file.stat()
    assert (info.st_gid, stat.S_IMODE(info.st_mode)) == (10001, 0o660)
    assert stat.S_IMODE(log_file.parent.stat().st_mode) == 0o2770
    read = stack.service("api").exec_run(["cat", str(log_file)], user="pai")
    assert read.exit_code == 0, read.output
    assert b"Hello from hello-world, task main[0]" in read.output
    writable = stack.service("scheduler").exec_run(["test", "-w", str(log_file.parent)],
                                                   user="pai")
    assert writable.exit_code == 0, "the scheduler may not file logs in the tree"


def test_prometheus_scrapes_the_stack_and_loads_the_rules(stack: Stack) -> None:
    def scraped_jobs() -> set[str]:
        resp = requests.get(f"{stack.prometheus}/api/v1/targets", timeout=10)
        active = resp.json()["data"]["activeTargets"]
        return {t["labels"]["job"] for t in active if t["health"] == "up"}

    # The api (platform metrics) and the node agent's monitor (node metrics);
    # deploy/prometheus/prometheus.yml names them by their compose services.
    wait_for(lambda: scraped_jobs() >= SCRAPED_JOBS, timeout=120, interval=2,
             what=f"Prometheus to scrape {sorted(SCRAPED_JOBS)}")
    # hello-world (the test before) succeeded: the next scrape counts it.
    wait_for(lambda: prometheus_query(stack, 'pai_jobs{state="SUCCEEDED"} >= 1'), timeout=90,
             interval=2, what="pai_jobs{state=SUCCEEDED} in Prometheus")
    groups = requests.get(f"{stack.prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
    shipped = {group["name"] for path in (ROOT / "deploy" / "prometheus" / "rules").glob("*.yml")
               for group in yaml.safe_load(path.read_text())["groups"]}
    assert shipped, "deploy/prometheus/rules holds no rule group"
    assert {g["name"] for g in groups} >= shipped, "prometheus did not load every rule file"
    assert any(rule["type"] == "alerting" for g in groups for rule in g["rules"])


def test_down_removes_everything_job_containers_included(stack: Stack) -> None:
    session = login(stack)
    sleeper = {"jobName": "sleeper", "image": "pai-test/busybox:latest",
               "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                              "memoryMB": 128, "command": "sleep 600"}]}
    resp = session.post(f"{stack.api}/api/v1/user/{ADMIN[0]}/jobs", json=sleeper, timeout=10)
    assert resp.status_code == 202, resp.text
    wait_for(lambda: job_state(session, stack, "sleeper")["jobStatus"]["state"] == "RUNNING",
             timeout=60, interval=0.5, what="the sleeper to run")
    assert stack.job_containers(), "the running job has no container"
    volumes_before = [v.name for v in stack.engine.volumes.list()
                      if v.name.startswith(f"{stack.project}_")]
    assert volumes_before, "the stack made no named volumes (redis-data, prometheus-data)"

    started = time.monotonic()
    stack.compose("down", "-v", "--remove-orphans")
    print(f"\ncompose down -v: {time.monotonic() - started:.0f} s")

    assert stack.containers() == []
    assert stack.job_containers() == [], "a job container outlived `docker-compose down`"
    left = [v.name for v in stack.engine.volumes.list() if v.name.startswith(f"{stack.project}_")]
    assert left == []
