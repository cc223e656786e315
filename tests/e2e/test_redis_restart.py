"""Redis is the system of record: restart it (append-only file on) under a
running platform and no job is lost."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from bench.live_platform import Platform, free_port, wait_for
from tests.support.platform import gate, open_gate, running_platform
from tests.support.redis_server import redis_credentials, start_redis, stop_redis


class OwnRedis:
    """A redis-server of this test's own, restartable on the same port and data."""

    def __init__(self, datadir: Path) -> None:
        self.datadir, self.port = datadir, free_port()
        self.binary = shutil.which("redis-server") or "redis-server"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = start_redis(self.binary, self.datadir, self.port)
        assert self.proc is not None, "redis-server did not start"

    @property
    def url(self) -> str:
        return redis_credentials(self.datadir).url("127.0.0.1", self.port)

    def stop(self) -> None:
        if self.proc is not None:
            stop_redis(self.proc)  # SIGTERM: Redis flushes its append-only file and exits
            self.proc = None


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path_factory.mktemp("own-redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def on_own_redis(platform: Platform, own_redis: OwnRedis, docker_client: docker.DockerClient,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    run_dir = tmp_path_factory.mktemp("redis-restart")
    storage = run_dir / "storage"
    storage.mkdir()
    storage.chmod(0o777)
    env = {**platform.env, "PAI_REDIS_URL": own_redis.url,
           "PAI_API_PORT": str(free_port()), "PAI_MONITOR_PORT": str(free_port()),
           "PAI_NODE_NAME": f"e2e-redis-{uuid.uuid4().hex[:8]}",
           "PAI_STORAGE_ROOTS": str(storage), "PAI_PORT_RANGE": "25000-25999"}
    with running_platform(env, run_dir, docker_client, platform.image) as pai:
        yield pai


def test_a_redis_restart_loses_no_job(on_own_redis: Platform, own_redis: OwnRedis) -> None:
    pai = on_own_redis
    running, queued = "across-restart", "queued-across-restart"
    assert pai.submit(pai.config(running, "echo before; " + gate() + "echo after")) \
        .status_code == 202
    pai.wait_state(running, "RUNNING")
    assert pai.submit(pai.config(queued, "echo queued ran", gpus=8)).status_code == 202

    own_redis.stop()
    own_redis.start()
    open_gate(pai, running)  # the job ran through the restart

    first = pai.wait_state(running, timeout=180)
    second = pai.wait_state(queued, timeout=180)
    assert first["jobStatus"]["state"] == second["jobStatus"]["state"] == "SUCCEEDED"
    wait_for(lambda: "after" in pai.log(running, "main"), what="the last line of the log")
    assert "before" in pai.log(running, "main")
    assert "queued ran" in pai.log(queued, "main")
