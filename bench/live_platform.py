"""The platform as processes: the one harness of the benchmarks and of tests/e2e.

The real `pai-api`, `pai-scheduler`, `pai-launcher` and `pai-monitor` entry
points, started from this virtualenv with their own `PAI_*` environment on a
throwaway Redis and the Docker engine DOCKER_HOST names, as `make up` runs
them. Everything started here is stopped by its PID, and every container of
the run's node (label `pai.node=<node>`) or of a benchmark's reference loop
(label `pai.bench=<run id>`) is removed at the end.

Nothing here needs pytest: a platform that does not come up, or a condition
that never holds, raises BenchError; tests/e2e/conftest.py wraps this module
in fixtures and turns a start-up failure into a test failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
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
from docker.types import Mount

from bench import BenchError, free_port, throwaway_redis
from services.launcher.runtime import NO_NEW_PRIVILEGES
from shared.domain.capabilities import dropped_capabilities
from shared.infra.config import Settings

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
TEST_IMAGE = "pai-test/busybox:latest"
BENCH_LABEL = "pai.bench"
# The platforms the benchmarks start give jobs these ports (so NET_BIND_SERVICE is dropped).
BENCH_PORT_RANGE = (22000, 22999)
ADMIN, ADMIN_PASSWORD = "bench-admin", "bench-admin-password"
USER, USER_PASSWORD = "alice", "alice-password"
SERVICES = ("api", "scheduler", "launcher", "monitor")
FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
READY_SECONDS = 60.0


def wait_for(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
             interval: float = 0.1) -> Any:
    """Poll until `check` returns something truthy, and return it; BenchError
    after `timeout` seconds, so no wait can hang a run."""
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


@contextmanager
def reference_engine() -> Iterator[tuple[docker.DockerClient, str]]:
    """The engine and a fresh run label for a benchmark's bare-Docker reference;
    every container labelled with it (or a label starting with it, such as
    a warm-up's) is removed at the end."""
    client, run = docker_engine(), run_id()
    try:
        yield client, run
    finally:
        for container in client.containers.list(all=True, filters={"label": BENCH_LABEL},
                                                ignore_removed=True):
            if container.labels.get(BENCH_LABEL, "").startswith(run):
                with contextlib.suppress(DockerException):
                    container.remove(force=True)
        client.close()


def bare_container(client: docker.DockerClient, run: str, name: str, command: str,
                   output: Path, *, memory_mb: int, shm_mb: int = 64,
                   environment: Mapping[str, str] | None = None,
                   labels: Mapping[str, str] | None = None) -> Any:
    """A container created as the launcher creates a task's (host network, one
    CPU, the memory asked for and no swap, the shm, an init, the output folder
    bound, and its confinement: the capabilities it drops, no new privileges,
    the pids limit), but straight through the Docker SDK: what the platform
    is measured against."""
    return client.containers.create(
        TEST_IMAGE, [command], name=name, entrypoint=["/bin/sh", "-c"],
        labels={BENCH_LABEL: run, **(labels or {})}, environment=dict(environment or {}),
        network_mode="host", nano_cpus=10**9, mem_limit=f"{memory_mb}m",
        memswap_limit=f"{memory_mb}m", shm_size=f"{shm_mb}m", privileged=False, init=True,
        cap_drop=dropped_capabilities(BENCH_PORT_RANGE), security_opt=[NO_NEW_PRIVILEGES],
        pids_limit=Settings().container_pids_limit,
        mounts=[Mount(str(output), str(output), type="bind", read_only=False)])


class Processes:
    """Child processes, each in its own session, stopped by PID at the end.

    Each writes to `<log_dir>/<name>.log`; a restarted one appends to it."""

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

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Send `sig` to the process group of `name`; SIGKILL it if it
        outlives 20 s (a SIGKILL test wants it dead at once, not gracefully)."""
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)


def platform_env(redis_url: str, run_dir: Path, *, node: str, gpus: int = 8,
                 port_range: str = f"{BENCH_PORT_RANGE[0]}-{BENCH_PORT_RANGE[1]}",
                 admin: tuple[str, str] = (ADMIN, ADMIN_PASSWORD),
                 extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of one node's services: this process's own without its
    `PAI_*` settings, then the node's, on fresh ports and a storage root
    `<run_dir>/storage` that job containers (any uid) may write to."""
    storage = run_dir / "storage"
    storage.mkdir(exist_ok=True)
    storage.chmod(0o777)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAI_")}
    env.update({
        "PAI_REDIS_URL": redis_url,
        "PAI_API_HOST": "127.0.0.1",
        "PAI_API_PORT": str(free_port()),
        "PAI_MONITOR_PORT": str(free_port()),
        # Several nodes share this machine: each answers its peers on a port
        # of its own, and keeps its fence journal apart
        "PAI_NODE_PEER_PORT": "0",
        "PAI_NODE_STATE_DIR": str(run_dir / "node-state"),
        "PAI_NODE_NAME": node,
        "PAI_NODE_IP": "127.0.0.1",
        "PAI_NODE_VIRTUAL_GPUS": str(gpus),
        "PAI_NODE_CPUS": "16",
        "PAI_NODE_MEMORY_MB": "16384",
        "PAI_STORAGE_ROOTS": str(storage),
        "PAI_PORT_RANGE": port_range,
        "PAI_ADMIN_USER": admin[0],
        "PAI_ADMIN_PASSWORD": admin[1],
        **(extra_env or {}),
    })
    if "DOCKER_HOST" in os.environ:
        env["PAI_DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    return env


class Platform:
    """The services of one node as processes, and its API over HTTP.

    `admin` is logged in as the environment's admin, `http` as USER once
    `up()` returned."""

    def __init__(self, env: Mapping[str, str], run_dir: Path, *,
                 services: Sequence[str] = SERVICES,
                 docker_client: docker.DockerClient | None = None,
                 image: str = TEST_IMAGE) -> None:
        self.env = dict(env)
        self.run_dir = run_dir
        self.services = tuple(services)
        self.docker = docker_client
        self.image = image
        self.url = f"http://127.0.0.1:{self.env['PAI_API_PORT']}"
        self.node = self.env["PAI_NODE_NAME"]
        self.storage = Path(self.env["PAI_STORAGE_ROOTS"].split(",")[0])
        self.processes = Processes(run_dir)
        self.http = requests.Session()
        self.admin = requests.Session()

    # -------------------------------------------------------------- processes

    def up(self) -> None:
        """Start the api, and once the admin can log in the node's services;
        wait until the node is READY (only until the api answers when there
        is no launcher), then log USER in.

        The api first, as a cluster is brought up: its bootstrap writes the
        shared storage's identity, which the node's monitor checks as it
        starts and then only every 30 s (shared/node/health.py); started
        together, the node could stay NOT_READY past the wait."""
        if "api" in self.services:
            self.start("api")
            wait_for(self._api_answers, READY_SECONDS, "the api to answer")
        for service in self.services:
            if service != "api":
                self.start(service)
        wait_for(self._ready, READY_SECONDS, "the platform to come up")
        self.create_user(USER, USER_PASSWORD)
        self.login(self.http, USER, USER_PASSWORD)

    def start(self, service: str) -> None:
        self.processes.start(service, [str(BIN / f"pai-{service}")], self.env)

    def kill(self, service: str, sig: int = signal.SIGKILL) -> None:
        self.processes.stop(service, sig)

    def log_tail(self, service: str, lines: int = 40) -> str:
        return self.processes.tail(service, lines)

    def shutdown(self) -> None:
        self.processes.stop_all()
        self.http.close()
        self.admin.close()

    def _api_answers(self) -> bool:
        self.processes.check_alive()
        try:
            self.login(self.admin, self.env["PAI_ADMIN_USER"], self.env["PAI_ADMIN_PASSWORD"])
        except requests.RequestException:
            return False
        return True

    def _ready(self) -> bool:
        self.processes.check_alive()
        try:
            if "Authorization" not in self.admin.headers:
                self.login(self.admin, self.env["PAI_ADMIN_USER"],
                           self.env["PAI_ADMIN_PASSWORD"])
            if "launcher" not in self.services:
                return True
            nodes = self.admin.get(f"{self.url}/api/v1/nodes", timeout=5).json()
        except requests.RequestException:
            return False
        return any(n["name"] == self.node and n["state"] == "READY" for n in nodes)

    # ------------------------------------------------------------------- HTTP

    def token(self, username: str, password: str) -> str:
        resp = requests.post(f"{self.url}/api/v1/token",
                             json={"username": username, "password": password}, timeout=30)
        resp.raise_for_status()
        token: str = resp.json()["token"]
        return token

    def login(self, session: requests.Session, username: str, password: str) -> None:
        session.headers["Authorization"] = f"Bearer {self.token(username, password)}"

    def create_user(self, username: str, password: str) -> None:
        resp = self.admin.post(f"{self.url}/api/v1/user",
                               json={"username": username, "password": password}, timeout=30)
        if resp.status_code not in (201, 409):
            raise BenchError(f"creating user {username} answered {resp.status_code}: "
                             f"{resp.text}")

    def submit(self, config: dict[str, Any], user: str = USER) -> requests.Response:
        return self.http.post(f"{self.url}/api/v1/user/{user}/jobs", json=config, timeout=30)

    def submit_accepted(self, config: dict[str, Any], user: str = USER) -> None:
        """Submit, and raise BenchError unless the API accepted the job."""
        resp = self.submit(config, user)
        if resp.status_code != 202:
            raise BenchError(f"submit answered {resp.status_code}: {resp.text}")

    def detail(self, name: str, user: str = USER) -> dict[str, Any]:
        resp = self.http.get(f"{self.url}/api/v1/user/{user}/jobs/{name}", timeout=30)
        resp.raise_for_status()
        body: dict[str, Any] = resp.json()
        return body

    def stop(self, name: str, user: str = USER) -> requests.Response:
        """Ask the platform to stop job `name` (the services keep running)."""
        return self.http.put(f"{self.url}/api/v1/user/{user}/jobs/{name}/executionType",
                             json={"value": "STOP"}, timeout=30)

    def log_url(self, name: str, role: str = "main", index: int = 0, user: str = USER) -> str:
        return f"{self.url}/api/v1/user/{user}/jobs/{name}/tasks/{role}/{index}/log"

    def log(self, name: str, role: str, index: int = 0, user: str = USER,
            attempt: int | None = None, tail: int | None = None) -> str:
        """The task's log as the API serves it: all of it (up to the API's
        default), or its last `tail` lines."""
        params = {} if attempt is None else {"attempt": attempt}
        if tail is not None:
            params["tail"] = tail
        resp = self.http.get(self.log_url(name, role, index, user), params=params, timeout=120)
        resp.raise_for_status()
        return resp.text

    def wait_state(self, name: str, states: set[str] | str = FINAL, user: str = USER,
                   timeout: float = 120) -> dict[str, Any]:
        """The job's detail once its state is one of `states`."""
        wanted = {states} if isinstance(states, str) else states

        def reached() -> dict[str, Any] | None:
            detail = self.detail(name, user)
            return detail if detail["jobStatus"]["state"] in wanted else None

        found: dict[str, Any] = wait_for(reached, timeout,
                                         f"job {name} to reach {sorted(wanted)}")
        return found

    def job_containers(self, name: str | None = None, user: str = USER) -> list[Any]:
        """The node's containers (of job `name` only, when given)."""
        if self.docker is None:
            raise BenchError("this platform was started without a Docker client")
        filters: dict[str, Any] = {"label": [f"pai.node={self.node}"]}
        if name is not None:
            filters["label"].append(f"pai.job={user}~{name}")
        return list(self.docker.containers.list(all=True, filters=filters, ignore_removed=True))

    def config(self, name: str, command: str, *, tasks: int = 1, gpus: int = 0,
               memory_mb: int = 128, **extra: Any) -> dict[str, Any]:
        """A one-role job on the test image."""
        return {"jobName": name, "image": self.image,
                "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1,
                               "memoryMB": memory_mb, "gpuNumber": gpus,
                               "command": command}],
                **extra}


@contextmanager
def running(env: Mapping[str, str], run_dir: Path, *, services: Sequence[str] = SERVICES,
            docker_client: docker.DockerClient | None = None,
            image: str = TEST_IMAGE) -> Iterator[Platform]:
    """A platform up with `env` (see Platform.up); at the end its services
    stopped and, given `docker_client`, its node's containers removed."""
    platform = Platform(env, run_dir, services=services, docker_client=docker_client,
                        image=image)
    try:
        platform.up()
        yield platform
    finally:
        platform.shutdown()
        if docker_client is not None:
            remove_containers(docker_client, f"pai.node={platform.node}")


@contextmanager
def running_platform(redis_url: str, *, gpus: int = 8, services: Sequence[str] = SERVICES,
                     extra_env: Mapping[str, str] | None = None) -> Iterator[Platform]:
    """A benchmark's platform on `redis_url`, in a temporary directory, with
    the Docker engine when it runs a launcher."""
    client = docker_engine() if "launcher" in services else None
    try:
        with tempfile.TemporaryDirectory(prefix="pai-bench-") as work_dir:
            env = platform_env(redis_url, Path(work_dir), node=f"bench-{run_id()}", gpus=gpus,
                               extra_env=extra_env)
            with running(env, Path(work_dir), services=services,
                         docker_client=client) as platform:
                yield platform
    finally:
        if client is not None:
            client.close()


@contextmanager
def one_task_running(job: str) -> Iterator[tuple[Platform, Any]]:
    """A benchmark's platform on a throwaway Redis with one task running
    (`sleep 3600`, job `job` of USER): the platform and the task's container,
    for what is measured against a running task (exec, terminals)."""
    with throwaway_redis() as url, running_platform(url) as pai:
        pai.submit_accepted(pai.config(job, "sleep 3600"))
        pai.wait_state(job, "RUNNING")
        [container] = pai.job_containers(job)
        yield pai, container
