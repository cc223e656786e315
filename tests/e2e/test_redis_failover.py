"""Redis high availability: kill -9 the primary under a running platform and
Sentinel's promotion of a replica loses no job (docs/high-availability.md).

A group of one primary and two replicas (append-only files on, the
platform's ACL, the write guard of shared/infra/sentinelconf.py) and three
sentinels, all real redis-server processes on free 127.0.0.1 ports in a temp
dir; the platform's services reach it through one `redis+sentinel://`
setting. The API is probed all along: 503 is allowed while the primary
switches, a 500 never.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import docker
import pytest
import redis
import requests

from bench.live_platform import Platform, free_port, platform_env, wait_for
from shared.infra.redisacl import Credentials, ensure_credentials
from shared.infra.sentinelconf import (
    REPLICATION_FILE,
    replication_text,
    sentinel_text,
    write_private,
)
from tests.e2e.conftest import running_platform

pytestmark = [pytest.mark.docker, pytest.mark.redis]

MASTER = "pai"
# Sentinel gives up on the primary after this long without an answer; the
# deployments wait 5 s, this test 1 s so its run stays short.
DOWN_AFTER_MS = 1000
JOBS_BEFORE, JOBS_DURING = 10, 3
JOB_COMMAND = "echo started; sleep 3; echo finished"


class RedisGroup:
    """One primary, two replicas and three sentinels as processes of this
    test, each stopped by its PID at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.binary = shutil.which("redis-server") or "redis-server"
        self.credentials: Credentials = ensure_credentials(root / "acl")
        write_private(root / "acl" / REPLICATION_FILE,
                      replication_text(self.credentials.operator_password))
        self.data_ports = [free_port() for _ in range(3)]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """The platform's setting: every sentinel, the primary's name, database 0."""
        sentinels = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://pai:{self.credentials.password}@{sentinels}/{MASTER}/0"

    def start(self) -> None:
        for n, port in enumerate(self.data_ports):
            replica_of = f"replicaof 127.0.0.1 {self.data_ports[0]}\n" if n else ""
            self._run(f"redis-{n}", self._data_conf(n, port) + replica_of)
        wait_for(lambda: self._replicas_online() == 2, 30, "both replicas to sync")
        for n, port in enumerate(self.sentinel_ports):
            text = (f"port {port}\nbind 127.0.0.1\ndir {self._dir(f'sentinel-{n}')}\n"
                    f"logfile {self._dir(f'sentinel-{n}')}/sentinel.log\n"
                    + sentinel_text(self.credentials.password,
                                    self.credentials.operator_password, "127.0.0.1",
                                    self.data_ports[0], name=MASTER,
                                    down_after_ms=DOWN_AFTER_MS))
            self._run(f"sentinel-{n}", text, sentinel=True)
        wait_for(self._sentinels_agree, 30, "the sentinels to see each other and the replicas")

    def kill_primary(self) -> int:
        """kill -9 the current primary; its port."""
        port = self.primary_port()
        name = f"redis-{self.data_ports.index(port)}"
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait(timeout=10)
        return port

    def primary_port(self) -> int:
        """The primary's port as a sentinel that answers names it."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError), self._sentinel(port) as client:
                _host, primary = client.sentinel_get_master_addr_by_name(MASTER)
                return int(primary)
        raise AssertionError("no sentinel answers")

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def _dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(exist_ok=True)
        return path

    def _data_conf(self, n: int, port: int) -> str:
        data = self._dir(f"redis-{n}")
        return (f"port {port}\nbind 127.0.0.1\nprotected-mode yes\ndir {data}\n"
                f"logfile {data}/redis.log\naclfile {self.credentials.acl_file}\n"
                f"appendonly yes\nsave \"\"\ndaemonize no\n"
                f"include {self.root / 'acl' / REPLICATION_FILE}\n")

    def _run(self, name: str, conf: str, *, sentinel: bool = False) -> None:
        path = self._dir(name) / "server.conf"
        write_private(path, conf)  # holds passwords; a sentinel rewrites its own
        argv = [self.binary, str(path), *(["--sentinel"] if sentinel else [])]
        self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)

    def _operator(self, port: int) -> redis.Redis:
        return redis.Redis.from_url(self.credentials.url("127.0.0.1", port, operator=True),
                                    socket_connect_timeout=0.5, socket_timeout=2)

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, username="pai",
                           password=self.credentials.password, decode_responses=True,
                           socket_connect_timeout=0.5, socket_timeout=2)

    def _replicas_online(self) -> int:
        try:
            with self._operator(self.data_ports[0]) as client:
                info = client.info("replication")
        except redis.RedisError:
            return 0
        return sum(1 for key, value in info.items()
                   if key.startswith("slave") and isinstance(value, dict)
                   and value.get("state") == "online")

    def _sentinels_agree(self) -> bool:
        for port in self.sentinel_ports:
            try:
                with self._sentinel(port) as client:
                    state = client.sentinel_master(MASTER)
            except redis.RedisError:
                return False
            if int(state["num-other-sentinels"]) < 2 or int(state["num-slaves"]) < 2:
                return False
        return True


class ApiProbe:
    """Reads the job list over and over from a thread, counting answers by
    status, until stopped: the API's face during the switch."""

    def __init__(self, pai: Platform) -> None:
        self.pai = pai
        self.statuses: dict[int, int] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with requests.Session() as session:
            session.headers.update(self.pai.http.headers)
            while not self.done.wait(0.05):
                try:
                    status = session.get(f"{self.pai.url}/api/v1/jobs", timeout=30).status_code
                except requests.RequestException:
                    status = 0
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def __enter__(self) -> ApiProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=60)


def answered(call: Callable[[], requests.Response], what: str) -> requests.Response:
    """The first answer of `call` that is not a 503 (Retry-After: the switch)."""
    def attempt() -> requests.Response | None:
        resp = call()
        assert resp.status_code != 500, f"{what}: 500 {resp.text}"
        if resp.status_code == 503:
            assert resp.headers.get("Retry-After"), "a 503 says when to come back"
            return None
        return resp

    found: requests.Response = wait_for(attempt, 60, what, interval=0.2)
    return found


def final_state(pai: Platform, name: str) -> dict[str, Any]:
    def settled() -> dict[str, Any] | None:
        resp = answered(lambda: pai.http.get(f"{pai.url}/api/v1/user/alice/jobs/{name}",
                                             timeout=30), f"the detail of {name}")
        assert resp.status_code == 200, f"job {name} lost: {resp.status_code} {resp.text}"
        detail: dict[str, Any] = resp.json()
        return detail if detail["jobStatus"]["state"] in {"SUCCEEDED", "FAILED",
                                                          "STOPPED"} else None

    found: dict[str, Any] = wait_for(settled, 120, f"job {name} to finish", interval=0.5)
    return found


@pytest.fixture
def redis_group(tmp_path: Path) -> Iterator[RedisGroup]:
    group = RedisGroup(tmp_path / "redis-ha")
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture
def on_sentinel(redis_group: RedisGroup, docker_client: docker.DockerClient, test_image: str,
                tmp_path: Path) -> Iterator[Platform]:
    run_dir = tmp_path / "platform"
    run_dir.mkdir()
    env = platform_env(redis_group.url, run_dir, node=f"e2e-ha-{uuid.uuid4().hex[:8]}",
                       port_range="24000-24999",
                       extra_env={"PAI_HEARTBEAT_SECONDS": "1",
                                  "PAI_LAUNCH_TIMEOUT_SECONDS": "20"})
    with running_platform(env, run_dir, docker_client, test_image) as pai:
        yield pai


def test_killing_the_primary_loses_no_job(on_sentinel: Platform,
                                          redis_group: RedisGroup) -> None:
    """Threat: the primary dies mid-run (kill -9, no chance to flush). Every
    job submitted before and during the switch reaches SUCCEEDED with its
    whole log, the services follow the new primary without a restart, and
    the API answers 503 at worst, never 500."""
    pai = on_sentinel
    before = [f"before-{n}" for n in range(JOBS_BEFORE)]  # 8 GPUs: two of them queue
    for name in before:
        pai.submit_accepted(pai.config(name, JOB_COMMAND, gpus=1))
    wait_for(lambda: pai.detail(before[0])["jobStatus"]["state"] == "RUNNING", 60,
             "the first job to run")

    with ApiProbe(pai) as probe:
        old_primary = redis_group.kill_primary()
        during = [f"during-{n}" for n in range(JOBS_DURING)]
        for name in during:
            resp = answered(partial(pai.submit, pai.config(name, JOB_COMMAND, gpus=1)),
                            f"submitting {name}")
            # 409: an earlier try that answered 503 had in fact been stored.
            assert resp.status_code in (202, 409), resp.text
        wait_for(lambda: redis_group.primary_port() != old_primary, 60,
                 "Sentinel to promote a replica")
        details = {name: final_state(pai, name) for name in before + during}

    assert probe.statuses.get(500, 0) == 0, probe.statuses
    assert probe.statuses.get(200, 0) > 0, probe.statuses
    states = {name: d["jobStatus"]["state"] for name, d in details.items()}
    assert set(states.values()) == {"SUCCEEDED"}, states
    for name in before + during:
        log = answered(partial(pai.http.get, pai.log_url(name), timeout=30),
                       f"the log of {name}").text
        assert "finished" in log, f"{name}: {log!r}"
