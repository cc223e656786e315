"""The test Redis servers: started as deployments run Redis (the platform's
ACL, no login without a password, an append-only file), stopped by PID, and
the operator's URL beside each platform URL for what only an operator may
do (flushing a database)."""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from shared.infra.redisacl import Credentials, ensure_credentials


def redis_credentials(datadir: Path) -> Credentials:
    """The ACL of a test redis-server kept in `datadir` (same passwords across
    restarts): tests run Redis exactly as deployments do, no login without a password."""
    return ensure_credentials(datadir / "acl")


def start_redis(binary: str, datadir: Path, port: int) -> subprocess.Popen[bytes] | None:
    """Start redis-server on `port`; None when it died (e.g. someone took the port)."""
    credentials = redis_credentials(datadir)
    options = {
        "aclfile": str(credentials.acl_file),
        "protected-mode": "yes",
        "bind": "127.0.0.1",
        "port": str(port),
        "dir": str(datadir),
        "save": "",  # no RDB snapshots: the append-only file is what the platform uses
        "appendonly": "yes",
        "daemonize": "no",
        "logfile": str(datadir / "redis.log"),
    }
    proc = subprocess.Popen(
        [binary, *(arg for name, value in options.items() for arg in (f"--{name}", value))],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis.from_url(credentials.url("127.0.0.1", port),
                                  socket_connect_timeout=0.5)
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return None
            try:
                if client.ping():
                    return proc
            except redis.ConnectionError:
                time.sleep(0.05)
    finally:
        client.close()
    stop_redis(proc)
    return None


def stop_redis(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# The operator URL of each test redis-server, by its platform URL: flushing a
# database is an operator's command, not the platform's.
_admin_urls: dict[str, str] = {}


def remember_operator(platform_url: str, operator: str) -> None:
    _admin_urls[platform_url] = operator


def operator_url(platform_url: str) -> str:
    """The operator's URL for the test Redis at `platform_url` (the same URL
    when it came from PAI_TEST_REDIS_URL, whose user is the caller's own)."""
    return _admin_urls.get(platform_url, platform_url)


@dataclass
class OwnRedis:
    """A redis-server of one test's own (the `own_redis` fixture), which the
    test may stop, freeze (SIGSTOP: a black hole, its port still open) or
    restart."""

    url: str
    proc: subprocess.Popen[bytes]
    datadir: Path
    port: int

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
