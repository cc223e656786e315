"""The platform as processes that the chaos run kills: Redis (append-only),
the API, the scheduler, and nodes of a launcher and a monitor each.

Built on bench/live_platform.py's Processes (each child in its own session,
stopped by PID). Every node runs on this machine's one Docker engine with
its own name, virtual GPUs, port range and monitor port, as separate
machines would; "losing" a node kills its two services and its containers
(the machine died) and never starts them again.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import requests
from docker.errors import DockerException

from bench import BenchError, free_port
from bench.live_platform import BIN, Processes, platform_env, wait_for
from shared.node.containers import LABEL_NODE
from tests.support.redis_server import redis_credentials, start_redis

ADMIN = ("root", "root-password")
USER = ("alice", "alice-password")
NODE_SERVICES = ("launcher", "monitor")


class ChaosRedis:
    """A redis-server with its append-only file, killed and restarted on one port."""

    def __init__(self, datadir: Path) -> None:
        self.datadir, self.port = datadir, free_port()
        self.binary = shutil.which("redis-server") or "redis-server"
        self.proc: subprocess.Popen[bytes] | None = None
        self.down_since: float | None = None

    @property
    def url(self) -> str:
        return redis_credentials(self.datadir).url("127.0.0.1", self.port)

    @property
    def operator_url(self) -> str:
        return redis_credentials(self.datadir).url("127.0.0.1", self.port, operator=True)

    def start(self) -> None:
        for _ in range(3):  # the port may linger a moment after a kill
            self.proc = start_redis(self.binary, self.datadir, self.port)
            if self.proc is not None:
                self.down_since = None
                return
            time.sleep(0.2)
        raise RuntimeError(f"redis-server did not restart on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None
            self.down_since = time.monotonic()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
            self.proc = None


@dataclass
class Calls:
    """Every answer the API gave the run, by status; 5xx the rules forbid, in detail."""

    statuses: Counter[int] = field(default_factory=Counter)
    refused: int = 0  # no answer: the API (or its port) was down
    forbidden: list[str] = field(default_factory=list)  # 5xx other than 503 + Retry-After
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, method: str, path: str, response: requests.Response | None) -> None:
        with self.lock:
            if response is None:
                self.refused += 1
                return
            self.statuses[response.status_code] += 1
            if response.status_code >= 500 and not (
                    response.status_code == 503 and response.headers.get("Retry-After")):
                self.forbidden.append(f"{method} {path}: {response.status_code} "
                                      f"{response.text[:200]}")

    @property
    def unavailable(self) -> int:
        return self.statuses[503]


class Api:
    """An HTTP client of the API that never raises for a dead API: every
    call returns the response, or None when nothing answered."""

    def __init__(self, url: str, calls: Calls) -> None:
        self.url, self.calls = url, calls
        self.session = requests.Session()
        self.lock = threading.Lock()

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response | None:
        try:
            response = self.session.request(method, self.url + path, timeout=15, **kwargs)
        except requests.RequestException:
            response = None
        self.calls.record(method, path.split("?")[0], response)
        return response

    def login(self, username: str, password: str, deadline_s: float = 60) -> None:
        def token() -> str | None:
            resp = self.call("POST", "/api/v1/token",
                             json={"username": username, "password": password})
            return resp.json()["token"] if resp is not None and resp.status_code == 200 \
                else None
        self.session.headers["Authorization"] = \
            f"Bearer {wait_for(token, deadline_s, f'{username} to log in')}"

    def until(self, method: str, path: str, ok: tuple[int, ...], deadline_s: float = 90,
              **kwargs: Any) -> requests.Response:
        """Repeat the call until it answers one of `ok` (through restarts)."""
        last: list[requests.Response | None] = [None]

        def once() -> requests.Response | None:
            resp = last[0] = self.call(method, path, **kwargs)
            return resp if resp is not None and resp.status_code in ok else None
        try:
            found: requests.Response = wait_for(once, deadline_s, f"{method} {path} -> {ok}",
                                                interval=0.25)
        except BenchError as error:
            answer = "nothing" if last[0] is None else \
                f"{last[0].status_code} {last[0].text[:300]}"
            raise BenchError(f"{error}; the last answer: {answer}") from None
        return found


class ChaosCluster:
    """Redis, the API, the scheduler and a set of nodes, each killable."""

    def __init__(self, run_dir: Path, *, gpus_per_node: int, lost_seconds: float,
                 docker_client: docker.DockerClient) -> None:
        self.run_dir = run_dir
        self.gpus_per_node = gpus_per_node
        self.docker = docker_client
        self.redis = ChaosRedis(run_dir / "redis")
        self.redis.datadir.mkdir()
        self.processes = Processes(run_dir)
        self.env = platform_env(self.redis.url, run_dir, node="unused", admin=ADMIN,
                                extra_env={
                                    "PAI_HEARTBEAT_SECONDS": "1",
                                    "PAI_NODE_LOST_SECONDS": str(lost_seconds),
                                    # A lost node is declared lost after
                                    # lease + grace + 10 s: keep it short,
                                    # and longer than a Redis restart
                                    "PAI_NODE_LEASE_SECONDS": "5",
                                    "PAI_NODE_FENCE_GRACE_SECONDS": "1",
                                    "PAI_LAUNCH_TIMEOUT_SECONDS": "20",
                                    # No compaction within the run: it folds
                                    # the placed events the audit reads into
                                    # an attempt summary
                                    "PAI_RETENTION_COMPACT_AFTER_SECONDS": "3600",
                                    "PAI_LOG_LEVEL": "INFO"})
        self.url = f"http://127.0.0.1:{self.env['PAI_API_PORT']}"
        self.storage = Path(self.env["PAI_STORAGE_ROOTS"])
        # Node names are unique to the run: monitors stop any container of
        # their node's name that their Redis does not know, so two runs on one
        # Docker engine with the same node names would stop each other's.
        self.prefix = f"c{uuid.uuid4().hex[:6]}"
        self.nodes: dict[str, dict[str, str]] = {}  # name -> its services' environment
        self.lost: set[str] = set()
        self.down: set[str] = set()  # services killed and not yet restarted
        self.calls = Calls()

    # ----------------------------------------------------------- services

    def add_node(self, short: str, port_base: int) -> str:
        """Start a node's services; its full name."""
        name = f"{self.prefix}-{short}"
        self.nodes[name] = {**self.env, "PAI_NODE_NAME": name,
                            "PAI_NODE_VIRTUAL_GPUS": str(self.gpus_per_node),
                            "PAI_PORT_RANGE": f"{port_base}-{port_base + 499}",
                            "PAI_MONITOR_PORT": str(free_port())}
        for service in NODE_SERVICES:
            self.start(f"{service}@{name}")
        return name

    def services(self) -> list[str]:
        """Every service that can be killed now (a lost node's are gone for good)."""
        return ["redis", "api", "scheduler"] + [f"{s}@{n}" for n in self.nodes
                                                if n not in self.lost for s in NODE_SERVICES]

    def start(self, service: str) -> None:
        self.down.discard(service)
        if service == "redis":
            self.redis.start()
            return
        program, _, node = service.partition("@")
        env = self.nodes[node] if node else self.env
        self.processes.start(service, [str(BIN / f"pai-{program}")], env)

    def kill(self, service: str) -> None:
        """kill -9, as a crash or an OOM kill would."""
        self.down.add(service)
        if service == "redis":
            self.redis.kill()
        else:
            self.processes.stop(service, signal.SIGKILL)

    def lose_node(self, name: str) -> int:
        """The machine dies: its services and its containers; how many containers."""
        for service in NODE_SERVICES:
            with contextlib.suppress(KeyError):
                self.processes.stop(f"{service}@{name}", signal.SIGKILL)
        self.lost.add(name)
        # Never started again, even if it was down (killed) when the machine died.
        self.down -= {f"{service}@{name}" for service in NODE_SERVICES}
        return self.remove_containers(name)

    def remove_containers(self, node: str) -> int:
        found = self.containers(node)
        for container in found:
            with contextlib.suppress(DockerException):
                container.remove(force=True)
        return len(found)

    def containers(self, node: str) -> list[Any]:
        return list(self.docker.containers.list(
            all=True, filters={"label": f"{LABEL_NODE}={node}"}, ignore_removed=True))

    def restart_down(self) -> None:
        """Start every killed service again (Redis first: the others need it)."""
        for service in sorted(self.down, key=lambda s: s != "redis"):
            self.start(service)

    def died(self) -> list[str]:
        """Services that exited without being killed: each is a finding."""
        return [name for name, proc in self.processes.procs.items() if proc.poll() is not None]

    def tail(self, service: str, lines: int = 60) -> str:
        return self.processes.tail(service, lines)

    def shutdown(self) -> None:
        self.processes.stop_all()
        for node in self.nodes:
            self.remove_containers(node)
        self.redis.stop()

    def start_all(self, port_bases: Mapping[str, int]) -> None:
        """Redis, the API, the scheduler, and a node per `port_bases` entry."""
        for service in ("redis", "api", "scheduler"):
            self.start(service)
        for short, port_base in port_bases.items():
            self.add_node(short, port_base)

    # --------------------------------------------------------------- HTTP

    def api(self) -> Api:
        return Api(self.url, self.calls)

    def sign_in(self, ready_s: float = 60) -> tuple[Api, Api]:
        """The admin's and USER's clients, once every live node is READY."""
        admin, api = self.api(), self.api()
        admin.login(*ADMIN)
        admin.until("POST", "/api/v1/user", (201, 409),
                    json={"username": USER[0], "password": USER[1]})
        api.login(*USER)
        wait_for(lambda: self.live_nodes_ready(admin), ready_s, "the nodes to be READY")
        return admin, api

    def live_nodes_ready(self, admin: Api) -> bool:
        resp = admin.call("GET", "/api/v1/nodes")
        if resp is None or resp.status_code != 200:
            return False
        states = {n["name"]: n["state"] for n in resp.json()}
        return all(states.get(n) == "READY" for n in self.nodes if n not in self.lost)


def free_and_total(nodes: list[Mapping[str, Any]], name: str) -> tuple[int, int]:
    """(free, total) GPUs of a node as GET /api/v1/nodes shows it."""
    node = next(n for n in nodes if n["name"] == name)
    return int(node["gpuFree"]), int(node["gpuTotal"])
