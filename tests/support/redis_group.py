"""A Redis Sentinel group as real redis-server processes on free 127.0.0.1
ports in a temp dir: a primary with the platform's ACL and the write guard
of shared/infra/sentinelconf.py, replicas, and sentinels watching it as
`pai`. The platform reaches it through `url` (PAI_REDIS_URL)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path

import redis

from bench.live_platform import free_port, wait_for
from shared.infra.redisacl import Credentials, ensure_credentials
from shared.infra.sentinelconf import (
    REPLICATION_FILE,
    replication_text,
    sentinel_text,
    write_private,
)

MASTER = "pai"
# Sentinel gives up on the primary after this long without an answer; the
# deployments wait 5 s, tests 1 s so their runs stay short.
DOWN_AFTER_MS = 1000


class RedisGroup:
    """One primary, its replicas and sentinels (two and three unless asked
    otherwise) as processes of this test, each stopped by its PID at the end."""

    def __init__(self, root: Path, *, replicas: int = 2, sentinels: int = 3,
                 down_after_ms: int = DOWN_AFTER_MS) -> None:
        self.root = root
        self.replicas, self.down_after_ms = replicas, down_after_ms
        self.binary = shutil.which("redis-server") or "redis-server"
        self.credentials: Credentials = ensure_credentials(root / "acl")
        write_private(root / "acl" / REPLICATION_FILE,
                      replication_text(self.credentials.operator_password))
        self.data_ports = [free_port() for _ in range(1 + replicas)]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
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
        wait_for(lambda: self._replicas_online() == self.replicas, 30, "the replicas to sync")
        for n, port in enumerate(self.sentinel_ports):
            text = (f"port {port}\nbind 127.0.0.1\ndir {self._dir(f'sentinel-{n}')}\n"
                    f"logfile {self._dir(f'sentinel-{n}')}/sentinel.log\n"
                    + sentinel_text(self.credentials.password,
                                    self.credentials.operator_password, "127.0.0.1",
                                    self.data_ports[0], name=MASTER,
                                    down_after_ms=self.down_after_ms))
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
            if int(state["num-other-sentinels"]) < len(self.sentinel_ports) - 1 \
                    or int(state["num-slaves"]) < self.replicas:
                return False
        return True
