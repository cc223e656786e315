"""pai across test hosts: the control plane on one, node agents on three.

The control-plane host runs Redis (its append-only file, its ACL), the API
and the scheduler; each node host runs its own Docker engine and the node
agent (`pai-node-agent`, the command docs/multi-node.md gives operators),
with no PAI_NODE_IP: each finds its address from its route to the control
plane. Storage roots are one folder every host sees (the hosts share this
machine's filesystem, as NFS would share it).

Every process is started by this module and stopped by its PID
(bench.live_platform.Processes); the hosts are torn down by tests/cluster/hosts.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from bench.live_platform import BIN, Processes
from shared.infra.redisacl import ensure_credentials
from tests.cluster.hosts import Engine, Hosts
from tests.cluster.observer import Observer

ADMIN = ("admin", "admin-password")
REDIS_PORT = 6379
API_PORT = 9186
# Short figures, so that faults play out in seconds: a node fences after 6 s
# without a renewal (SIGKILL 3 s later), and is lost after 6 + 3 + 10 = 19 s.
TIMINGS = {"PAI_HEARTBEAT_SECONDS": "1", "PAI_NODE_LEASE_SECONDS": "6",
           "PAI_NODE_FENCE_GRACE_SECONDS": "3", "PAI_NODE_LOST_SECONDS": "10",
           "PAI_NODE_SETTLE_SECONDS": "5", "PAI_LAUNCH_TIMEOUT_SECONDS": "20"}
LOST_AFTER_SECONDS = 19
FENCE_BOUND_SECONDS = 15.0  # the target for two live copies of one task
WAIT_SECONDS = 120
AGENT_STOP_SECONDS = 60  # a node agent gives its children 40 s to stop


CLOCK_SKEW_DIR = Path(__file__).parent / "clockskew"


def skewed_clock(seconds: float) -> dict[str, str]:
    """The environment that sets an agent's wall clock `seconds` off, in
    each of its Python processes (tests/cluster/clockskew/sitecustomize.py)."""
    path = os.pathsep.join(p for p in (str(CLOCK_SKEW_DIR), os.environ.get("PYTHONPATH"))
                           if p)
    return {"PYTHONPATH": path, "PAI_TEST_CLOCK_SKEW_SECONDS": str(seconds)}


def wait_for(check: Callable[[], Any], what: str, seconds: float = WAIT_SECONDS) -> Any:
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            last = check()
            if last:
                return last
        time.sleep(0.25)
    raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what} (last: {last!r})")


class Cluster:
    def __init__(self, work: Path, nodes: int = 3) -> None:
        self.work = work
        (work / "logs").mkdir(parents=True)
        self.storage = work / "storage"
        self.storage.mkdir()
        self.storage.chmod(0o777)
        self.hosts = Hosts(work)
        self.processes = Processes(work / "logs")
        self.cp = self.hosts.add("cp")
        self.nodes = {f"n{i}": self.hosts.add(f"n{i}") for i in range(1, nodes + 1)}
        self.engines: dict[str, Engine] = {}
        self.redis_dir = work / "redis"
        self.redis_dir.mkdir()
        self.credentials = ensure_credentials(self.redis_dir / "acl")
        self.redis_url = self.credentials.url(self.cp.ip, REDIS_PORT)
        self.url = f"http://{self.cp.ip}:{API_PORT}"
        self.http = requests.Session()
        self.http.trust_env = False  # the test hosts are reached directly, never by a proxy
        self.observer: Observer | None = None

    # ------------------------------------------------------------ start-up

    def start(self) -> None:
        for name, host in self.nodes.items():
            self.engines[name] = self.hosts.start_engine(host)
        self.start_redis()
        self.processes.start("api", self.cp.nsenter(str(BIN / "pai-api")),
                             self.env(PAI_API_HOST=self.cp.ip, PAI_API_PORT=str(API_PORT)))
        self.processes.start("scheduler", self.cp.nsenter(str(BIN / "pai-scheduler")),
                             self.env())
        for name in self.nodes:
            self.start_agent(name)
        wait_for(lambda: self.http.get(f"{self.url}/healthz", timeout=2).ok, "the API")
        self.login()
        wait_for(lambda: all(n["state"] == "READY" for n in self.node_views()) and
                 len(self.node_views()) == len(self.nodes), "every node to be READY")
        self.observer = Observer({name: engine.client() for name, engine in
                                  self.engines.items()})
        self.observer.start()

    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("PAI_")
                and k not in ("DOCKER_HOST",)}
        return {**base, **TIMINGS, "PAI_REDIS_URL": self.redis_url,
                "PAI_STORAGE_ROOTS": str(self.storage), "PAI_LOG_LEVEL": "INFO",
                "PAI_ADMIN_USER": ADMIN[0], "PAI_ADMIN_PASSWORD": ADMIN[1], **extra}

    def start_redis(self) -> None:
        options = {"aclfile": [str(self.credentials.acl_file)], "bind": [self.cp.ip, "127.0.0.1"],
                   "port": [str(REDIS_PORT)], "dir": [str(self.redis_dir)], "save": [""],
                   "appendonly": ["yes"], "appendfsync": ["everysec"], "daemonize": ["no"],
                   "protected-mode": ["yes"]}
        argv = [shutil.which("redis-server") or "redis-server",
                *(a for name, values in options.items() for a in (f"--{name}", *values))]
        self.processes.start("redis", self.cp.nsenter(*argv), self.env())
        wait_for(lambda: self._redis_answers(), "Redis", 30)

    def _redis_answers(self) -> bool:
        probe = subprocess.run(self.cp.nsenter("redis-cli", "--user", "pai", "-p",
                                               str(REDIS_PORT), "ping"),
                               capture_output=True, text=True, timeout=5,
                               env={**os.environ, "REDISCLI_AUTH": self.credentials.password})
        return "PONG" in probe.stdout

    def agent_env(self, name: str, *, node_name: str | None = None, engine: str | None = None
                  ) -> dict[str, str]:
        engine_of = self.engines[engine or name]
        return self.env(PAI_NODE_NAME=node_name or name, PAI_DOCKER_HOST=engine_of.socket,
                        PAI_NODE_VIRTUAL_GPUS="2", PAI_NODE_CPUS="8",
                        PAI_NODE_MEMORY_MB="8192", PAI_PORT_RANGE="21000-21999",
                        PAI_NODE_STATE_DIR=str(self.work / f"state-{name}"))

    def start_agent(self, name: str, *, prefix: tuple[str, ...] = (),
                    extra_env: dict[str, str] | None = None) -> None:
        host = self.nodes[name]
        self.processes.start(f"agent-{name}",
                             host.nsenter(*prefix, str(BIN / "pai-node-agent")),
                             {**self.agent_env(name), **(extra_env or {})})

    def stop_agent(self, name: str) -> None:
        """Stop the agent and wait for every process of its group: a wrapper
        (unshare) may die before the agent's launcher and monitor
        have, and a new agent started meanwhile would (rightly) be refused."""
        group = self.processes.pid(f"agent-{name}")
        self.processes.stop(f"agent-{name}")
        deadline = time.monotonic() + AGENT_STOP_SECONDS
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)

    # ----------------------------------------------------------- the API

    def login(self) -> None:
        reply = self.http.post(f"{self.url}/api/v1/token", json={
            "username": ADMIN[0], "password": ADMIN[1]}, timeout=10)
        reply.raise_for_status()
        self.http.headers["Authorization"] = f"Bearer {reply.json()['token']}"

    def node_views(self) -> list[dict[str, Any]]:
        reply = self.http.get(f"{self.url}/api/v1/nodes", timeout=10)
        reply.raise_for_status()
        views: list[dict[str, Any]] = reply.json()
        return views

    def wait(self, check: Callable[[], Any], what: str, seconds: float = WAIT_SECONDS) -> Any:
        """`wait_for`, and on a timeout the cluster as the API shows it (each
        node's state and reason, each waiting job's reason) in the error."""
        try:
            return wait_for(check, what, seconds)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.describe()}") from None

    def describe(self) -> str:
        lines = []
        with contextlib.suppress(requests.RequestException):
            for node in self.node_views():
                lines.append(f"node {node['name']}: {node['state']} {node.get('conditionReason')}")
            reply = self.http.get(f"{self.url}/api/v1/jobs", params={"username": ADMIN[0]},
                                  timeout=10)
            for job in reply.json():
                lines.append(f"job {job['name']}: {job['state']} {job.get('waitingReason')}")
        return "\n".join(lines)

    def node_view(self, name: str) -> dict[str, Any]:
        return next(n for n in self.node_views() if n["name"] == name)

    def submit(self, name: str, command: str, *, tasks: int = 1, gpus: int = 1,
               retry: int = 0, **extra: Any) -> None:
        config = {"jobName": name, "image": "pai-test/busybox:latest", "retryCount": retry,
                  "taskRoles": [{"name": "main", "taskNumber": tasks, "cpuNumber": 1,
                                 "memoryMB": 128, "gpuNumber": gpus, "command": command}],
                  **extra}
        reply = self.http.post(f"{self.url}/api/v1/user/{ADMIN[0]}/jobs", json=config,
                               timeout=10)
        assert reply.status_code == 202, reply.text

    def job(self, name: str) -> dict[str, Any]:
        reply = self.http.get(f"{self.url}/api/v1/user/{ADMIN[0]}/jobs/{name}", timeout=10)
        reply.raise_for_status()
        detail: dict[str, Any] = reply.json()
        return detail

    def running_on(self, name: str, attempt: int = 0) -> list[str] | None:
        """The nodes of the job's tasks once all of `attempt`'s run, else None."""
        detail = self.job(name)
        if detail["jobStatus"]["attemptIndex"] != attempt:
            return None
        tasks = [t for role in detail["taskRoles"].values() for t in role["taskStatuses"]]
        if tasks and all(t["taskState"] == "RUNNING" for t in tasks):
            return [t["containerNodeName"] for t in tasks]
        return None

    def task_log(self, name: str, role: str, index: int) -> str:
        reply = self.http.get(f"{self.url}/api/v1/user/{ADMIN[0]}/jobs/{name}/tasks/{role}/"
                              f"{index}/log", timeout=30)
        reply.raise_for_status()
        return reply.text

    def exec(self, name: str, command: list[str], role: str = "main",
             index: int = 0) -> dict[str, Any]:
        """`pai exec`: the answer of the task's node, through the API."""
        reply = self.http.post(f"{self.url}/api/v1/user/{ADMIN[0]}/jobs/{name}/tasks/{role}/"
                               f"{index}/exec", json={"command": command}, timeout=60)
        assert reply.status_code == 200, reply.text
        answer: dict[str, Any] = reply.json()
        return answer

    def cordon(self, node: str, schedulable: bool) -> None:
        reply = self.http.put(f"{self.url}/api/v1/nodes/{node}",
                              json={"schedulable": schedulable}, timeout=10)
        assert reply.status_code == 200, reply.text

    def stop_job(self, name: str) -> None:
        self.http.put(f"{self.url}/api/v1/user/{ADMIN[0]}/jobs/{name}/executionType",
                      json={"value": "STOP"}, timeout=10)

    # ------------------------------------------------------------ teardown

    def close(self) -> list[str]:
        if self.observer is not None:
            self.observer.stop()
        for engine in self.engines.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine.pid, signal.SIGCONT)  # a test that froze one
        self.processes.stop_all()
        return self.hosts.close()

    def log(self, service: str) -> str:
        return self.processes.tail(service, 60)

