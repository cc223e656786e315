"""Benchmarks (docs/design.md, "Performance"): figures beside a reference from the same run.

Each `bench/bench_<name>.py` exposes `run() -> Figures`; `python -m bench
[name...]` runs them and prints what they return. A figure is a number or a
string; a table is a mapping of row name -> figures. Nothing here asserts a
time: the figures go to docs/performance-log.md (and, where they stand,
docs/performance.md), read by people.

The helpers below are what every benchmark needs: a throwaway Redis it can
fill and flush, and percentiles of timed calls.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import redis

from shared.infra.redisacl import ensure_credentials

Figure = float | int | str
Table = Mapping[str, Mapping[str, Figure]]  # row label -> column -> figure
Figures = Mapping[str, Figure | Table]

REDIS_START_SECONDS = 15.0


class BenchError(RuntimeError):
    """The benchmark could not set itself up (no redis-server, say)."""


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now (another process may take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_ping(proc: subprocess.Popen[bytes], url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    deadline = time.monotonic() + REDIS_START_SECONDS
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if client.ping():
                    return True
            except redis.ConnectionError:
                time.sleep(0.05)
        return False
    finally:
        client.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(timeout=30)


@contextmanager
def throwaway_redis() -> Iterator[str]:
    """A Redis URL whose database the benchmark may fill and flush.

    PAI_BENCH_REDIS_URL names one to reuse (its database is flushed first);
    otherwise a redis-server is started on a free 127.0.0.1 port with its
    data in a temporary directory, without persistence, and killed by its
    PID at the end.
    """
    reused = os.environ.get("PAI_BENCH_REDIS_URL")
    if reused:
        client = redis.Redis.from_url(reused)
        client.flushdb()
        client.close()
        yield reused
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise BenchError("redis-server is not on PATH: run `make bench`, or set "
                         "PAI_BENCH_REDIS_URL to a Redis database the benchmark may flush")
    with tempfile.TemporaryDirectory(prefix="pai-bench-redis-") as datadir:
        # The same ACL as deployments (no login without a password, the platform's user
        # without dangerous commands), so the figures include AUTH's cost.
        credentials = ensure_credentials(Path(datadir) / "acl")
        for _ in range(5):  # another process may take the free port first
            port = free_port()
            proc = subprocess.Popen(
                [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", datadir,
                 "--aclfile", str(credentials.acl_file),
                 "--save", "", "--appendonly", "no", "--daemonize", "no"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if _wait_for_ping(proc, credentials.url("127.0.0.1", port)):
                break
            _stop(proc)
        else:
            raise BenchError("redis-server did not start on a free port in five tries")
        try:
            yield credentials.url("127.0.0.1", port)
        finally:
            _stop(proc)


def time_calls(call: Callable[[], object], times: int, warmup: int = 3) -> list[float]:
    """Milliseconds each of `times` calls took, after `warmup` untimed ones."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest sample >= `fraction` of them."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]


def latency_figures(samples: Sequence[float]) -> dict[str, float]:
    """p50, p90 and the worst of some milliseconds, as the exec benchmarks print them."""
    return {"p50 ms": percentile(samples, 0.5), "p90 ms": percentile(samples, 0.9),
            "max ms": max(samples)}


def redis_pid(url: str) -> int | None:
    """The pid of the local redis-server serving `url` (the throwaway one),
    found by its command line; None for any other (its CPU is not shown)."""
    port = str(urlsplit(url).port)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # redis-server sets its title to "<binary> <address>:<port>"
        title = b" ".join(argv).split()
        if len(title) >= 2 and title[0].endswith(b"redis-server") \
                and title[1].rpartition(b":")[2].decode() == port:
            return int(proc.name)
    return None


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process so far (0 when unknown)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
