"""The platform as processes, for the benchmarks that drive it end to end.

The same approach as tests/e2e/conftest.py (which needs pytest): the real
`pai-api`, `pai-scheduler`, `pai-launcher` and `pai-monitor` entry points,
started from this virtualenv with their own `PAI_*` environment on a
throwaway Redis and the Docker engine DOCKER_HOST names, as `make up` runs
them. Everything started here is stopped by its PID, and every container of
the run's node (label `pai.node=<node>`) or of the run's reference loop
(label `pai.bench=<run id>`) is removed at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import DockerException, ImageNotFound

from bench import BenchError

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
TEST_IMAGE = "pai-test/busybox:latest"
BENCH_LABEL = "pai.bench"
ADMIN, ADMIN_PASSWORD = "bench-admin", "bench-admin-password"
USER, USER_PASSWORD = "alice", "alice-password"
READY_SECONDS = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(check: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")


def docker_engine() -> docker.DockerClient:
    """The engine DOCKER_HOST names, with the test image on it."""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DockerException as error:
        raise BenchError(
            f"no Docker engine answers ({error}); run `make bench`, or export the runtime's "
            "settings first: set -a; . .run/env; set +a") from None
    try:
        client.images.get(TEST_IMAGE)
    except ImageNotFound:
        raise BenchError(f"{TEST_IMAGE} is missing: run scripts/build-test-image.sh") from None
    return client


def run_id() -> str:
    return uuid.uuid4().hex[:8]


def remove_containers(client: docker.DockerClient, label: str) -> int:
    """Remove every container carrying `label` (key=value); how many there were."""
    found = client.containers.list(all=True, filters={"label": label}, ignore_removed=True)
    for container in found:
        with contextlib.suppress(DockerException):
            container.remove(force=True)
    return len(found)


class Processes:
    """Child processes, each in its own session, stopped by PID at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        self.procs[name] = subprocess.Popen(
            list(argv), env=dict(env), cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise BenchError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)


class Platform:
    """api + scheduler + launcher + monitor of one node, over HTTP."""

    SERVICES = ("api", "scheduler", "launcher", "monitor")

    def __init__(self, redis_url: str, work_dir: Path, *, gpus: int = 8,
                 services: Sequence[str] = SERVICES,
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.node = f"bench-{run_id()}"
        storage = work_dir / "storage"
        storage.mkdir(exist_ok=True)
        storage.chmod(0o777)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PAI_")}
        self.env.update({
            "PAI_REDIS_URL": redis_url,
            "PAI_API_HOST": "127.0.0.1",
            "PAI_API_PORT": str(free_port()),
            "PAI_MONITOR_PORT": str(free_port()),
            "PAI_NODE_NAME": self.node,
            "PAI_NODE_IP": "127.0.0.1",
            "PAI_NODE_VIRTUAL_GPUS": str(gpus),
            "PAI_NODE_CPUS": "16",
            "PAI_NODE_MEMORY_MB": "16384",
            "PAI_STORAGE_ROOTS": str(storage),
            "PAI_PORT_RANGE": "22000-22999",
            "PAI_ADMIN_USER": ADMIN,
            "PAI_ADMIN_PASSWORD": ADMIN_PASSWORD,
            **(extra_env or {}),
        })
        if "DOCKER_HOST" in os.environ:
            self.env["PAI_DOCKER_HOST"] = os.environ["DOCKER_HOST"]
        self.services = tuple(services)
        self.url = f"http://127.0.0.1:{self.env['PAI_API_PORT']}"
        self.processes = Processes(work_dir)
        self.http = requests.Session()
        self.admin = requests.Session()

    def start(self) -> None:
        for service in self.services:
            self.processes.start(service, [str(BIN / f"pai-{service}")], self.env)
        wait_until(self._ready, READY_SECONDS, "the platform to come up", interval=0.2)
        resp = self.admin.post(f"{self.url}/api/v1/user",
                               json={"username": USER, "password": USER_PASSWORD}, timeout=30)
        if resp.status_code not in (201, 409):
            raise BenchError(f"creating user {USER} answered {resp.status_code}: {resp.text}")
        self.http.headers["Authorization"] = f"Bearer {self.token(USER, USER_PASSWORD)}"

    def token(self, username: str, password: str) -> str:
        resp = requests.post(f"{self.url}/api/v1/token",
                             json={"username": username, "password": password}, timeout=30)
        resp.raise_for_status()
        token: str = resp.json()["token"]
        return token

    def _ready(self) -> bool:
        self.processes.check_alive()
        try:
            if "Authorization" not in self.admin.headers:
                self.admin.headers["Authorization"] = \
                    f"Bearer {self.token(ADMIN, ADMIN_PASSWORD)}"
            if "launcher" not in self.services:
                return True
            nodes = self.admin.get(f"{self.url}/api/v1/nodes", timeout=5).json()
        except requests.RequestException:
            return False
        return any(n["name"] == self.node and n["state"] == "READY" for n in nodes)

    def stop(self) -> None:
        self.processes.stop_all()
        self.http.close()
        self.admin.close()

    # ------------------------------------------------------------------ HTTP

    def submit(self, config: dict[str, Any]) -> None:
        resp = self.http.post(f"{self.url}/api/v1/user/{USER}/jobs", json=config, timeout=30)
        if resp.status_code != 202:
            raise BenchError(f"submit answered {resp.status_code}: {resp.text}")

    def detail(self, name: str) -> dict[str, Any]:
        resp = self.http.get(f"{self.url}/api/v1/user/{USER}/jobs/{name}", timeout=30)
        resp.raise_for_status()
        body: dict[str, Any] = resp.json()
        return body

    def config(self, name: str, command: str, *, gpus: int = 0,
               memory_mb: int = 128) -> dict[str, Any]:
        return {"jobName": name, "image": TEST_IMAGE,
                "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                               "memoryMB": memory_mb, "gpuNumber": gpus,
                               "command": command}]}


@contextmanager
def running_platform(redis_url: str, **options: Any) -> Iterator[Platform]:
    """A started platform on `redis_url`; stopped, and its containers removed, after."""
    client = docker_engine() if "launcher" in options.get("services", Platform.SERVICES) \
        else None
    with tempfile.TemporaryDirectory(prefix="pai-bench-") as work_dir:
        platform = Platform(redis_url, Path(work_dir), **options)
        try:
            platform.start()
            yield platform
        finally:
            platform.stop()
            if client is not None:
                remove_containers(client, f"pai.node={platform.node}")
                client.close()
