"""The whole platform as real processes (api, scheduler, launcher, monitor),
on the session's throwaway Redis and the real Docker engine, the way
`make up` runs it. Tests talk to it over HTTP only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import requests

FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
SERVICES = ("api", "scheduler", "launcher", "monitor")
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.1,
             what: str = "condition") -> Any:
    """Poll until `check` returns something truthy; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


class Platform:
    def __init__(self, env: dict[str, str], run_dir: Path, docker_client: docker.DockerClient,
                 image: str) -> None:
        self.env = env
        self.run_dir = run_dir
        self.docker = docker_client
        self.image = image
        self.url = f"http://127.0.0.1:{env['PAI_API_PORT']}"
        self.node = env["PAI_NODE_NAME"]
        self.storage = Path(env["PAI_STORAGE_ROOTS"])
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.http = requests.Session()
        self.admin = requests.Session()

    # -------------------------------------------------------------- processes

    def start(self, service: str) -> None:
        log = open(self.run_dir / f"{service}.log", "ab")  # noqa: SIM115
        self.procs[service] = subprocess.Popen(
            [str(BIN / f"pai-{service}")], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def kill(self, service: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(service)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for service in list(self.procs):
            self.kill(service, signal.SIGTERM)

    def log_tail(self, service: str, lines: int = 40) -> str:
        path = self.run_dir / f"{service}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) \
            if path.exists() else ""

    def wait_ready(self) -> None:
        def ready() -> bool:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    pytest.fail(f"{name} exited:\n{self.log_tail(name)}")
            try:
                if "Authorization" not in self.admin.headers:
                    self.login(self.admin, self.env["PAI_ADMIN_USER"],
                               self.env["PAI_ADMIN_PASSWORD"])
                nodes = self.admin.get(f"{self.url}/api/v1/nodes", timeout=2).json()
            except requests.RequestException:
                return False
            return any(n["name"] == self.node and n["state"] == "READY" for n in nodes)

        wait_for(ready, timeout=60, what="the platform to come up")

    def login(self, session: requests.Session, username: str, password: str) -> None:
        resp = session.post(f"{self.url}/api/v1/token",
                            json={"username": username, "password": password}, timeout=10)
        resp.raise_for_status()
        session.headers["Authorization"] = f"Bearer {resp.json()['token']}"

    def create_user(self, username: str, password: str) -> None:
        resp = self.admin.post(f"{self.url}/api/v1/user",
                               json={"username": username, "password": password}, timeout=10)
        assert resp.status_code in (201, 409), resp.text

    # ------------------------------------------------------------------- HTTP

    def submit(self, config: dict[str, Any], user: str = "alice") -> requests.Response:
        return self.http.post(f"{self.url}/api/v1/user/{user}/jobs", json=config, timeout=10)

    def detail(self, name: str, user: str = "alice") -> dict[str, Any]:
        resp = self.http.get(f"{self.url}/api/v1/user/{user}/jobs/{name}", timeout=10)
        resp.raise_for_status()
        body: dict[str, Any] = resp.json()
        return body

    def stop(self, name: str, user: str = "alice") -> requests.Response:
        return self.http.put(f"{self.url}/api/v1/user/{user}/jobs/{name}/executionType",
                             json={"value": "STOP"}, timeout=10)

    def log(self, name: str, role: str, index: int = 0, user: str = "alice",
            attempt: int | None = None) -> str:
        params = {} if attempt is None else {"attempt": attempt}
        resp = self.http.get(
            f"{self.url}/api/v1/user/{user}/jobs/{name}/tasks/{role}/{index}/log",
            params=params, timeout=10)
        resp.raise_for_status()
        return resp.text

    def wait_state(self, name: str, states: set[str] | str = FINAL, user: str = "alice",
                   timeout: float = 120) -> dict[str, Any]:
        wanted = {states} if isinstance(states, str) else states

        def reached() -> dict[str, Any] | None:
            detail = self.detail(name, user)
            return detail if detail["jobStatus"]["state"] in wanted else None

        found: dict[str, Any] = wait_for(reached, timeout=timeout,
                                         what=f"job {name} to reach {sorted(wanted)}")
        return found

    def job_containers(self, name: str | None = None, user: str = "alice") -> list[Any]:
        filters: dict[str, Any] = {"label": [f"pai.node={self.node}"]}
        if name is not None:
            filters["label"].append(f"pai.job={user}~{name}")
        return list(self.docker.containers.list(all=True, filters=filters, ignore_removed=True))

    def config(self, name: str, command: str, *, tasks: int = 1, gpus: int = 0,
               **extra: Any) -> dict[str, Any]:
        """A one-role job on the test image."""
        return {
            "jobName": name, "image": self.image,
            "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1,
                           "memoryMB": 128, "gpuNumber": gpus, "command": command}],
            **extra,
        }


@contextlib.contextmanager
def running_platform(env: dict[str, str], run_dir: Path, docker_client: docker.DockerClient,
                     image: str) -> Iterator[Platform]:
    """Every service up with `env`, user alice logged in; at the end the
    services stopped and the node's job containers removed."""
    pai = Platform(env, run_dir, docker_client, image)
    for service in SERVICES:
        pai.start(service)
    try:
        pai.wait_ready()
        pai.create_user("alice", "alice-password")
        pai.login(pai.http, "alice", "alice-password")
        yield pai
    finally:
        pai.stop_all()
        for container in docker_client.containers.list(
                all=True, filters={"label": f"pai.node={env['PAI_NODE_NAME']}"},
                ignore_removed=True):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


@pytest.fixture(scope="session")
def platform(redis_server: str, docker_client: docker.DockerClient, test_image: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    run_dir = tmp_path_factory.mktemp("platform")
    storage = run_dir / "storage"
    storage.mkdir()
    storage.chmod(0o777)
    node = f"e2e-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAI_")}
    env.update({
        "PAI_REDIS_URL": redis_server.rsplit("/", 1)[0] + "/1",
        "PAI_API_HOST": "127.0.0.1",
        "PAI_API_PORT": str(_free_port()),
        "PAI_MONITOR_PORT": str(_free_port()),
        "PAI_NODE_NAME": node,
        "PAI_NODE_IP": "127.0.0.1",
        "PAI_NODE_VIRTUAL_GPUS": "8",
        "PAI_NODE_CPUS": "16",
        "PAI_NODE_MEMORY_MB": "16384",
        "PAI_STORAGE_ROOTS": str(storage),
        "PAI_PORT_RANGE": "21000-21999",
        "PAI_HEARTBEAT_SECONDS": "1",
        "PAI_LAUNCH_TIMEOUT_SECONDS": "20",
        "PAI_ADMIN_USER": "root",
        "PAI_ADMIN_PASSWORD": "root-password",
    })
    if "DOCKER_HOST" in os.environ:
        env["PAI_DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    with running_platform(env, run_dir, docker_client, test_image) as pai:
        yield pai


@pytest.fixture
def unique() -> Callable[[str], str]:
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:8]}"
