"""API capacity: submit and list latency, idle and under 500 log followers plus
64 slow-loris connections.

`pai-api` runs as it is deployed (bench/live_platform.py: the `pai-api`
entry point, gunicorn with gevent workers, default settings) on a throwaway
Redis, alone: no scheduler, launcher or monitor, so the figures are the
API's own. One client in this process, on one keep-alive connection,
alternates `POST /api/v1/user/alice/jobs` (a one-task job, a fresh name each
time) and `GET /api/v1/jobs?limit=50`, first with nothing else connected
(the reference), then under load, made by a second process (so that its
work does not share the measuring client's interpreter):

- FOLLOWERS connections follow one task's log as server-sent events
  (`?follow=1`) and read everything they are sent; a writer appends
  LINES_PER_SECOND lines a second to that log in Redis, as the monitor
  ships them, so every follower gets every line;
- SLOW_LORIS connections send a partial request header and then one byte a
  second each; when the API cuts one (PAI_API_READ_TIMEOUT_SECONDS, 10 s by
  default) it reconnects at once, so SLOW_LORIS are always open.

The follow cap per user (PAI_API_FOLLOWS_PER_USER) is raised for the run so
that one user can hold every follower; everything else is the default. The
ratio is the p99 under load over the idle p99 (the goal: at most 2).

The load process runs at nice LOAD_NICE (10): in a deployment the followers,
the slow clients and the monitor writing the log are other machines, and on
a two-core test box their own CPU would otherwise compete with the API they
are meant to load. The API itself, Redis and the measuring client keep the
default priority.

PAI_BENCH_CAPACITY_CALLS overrides the submits and lists per phase (1,000 each);
PAI_BENCH_LOAD_NICE the load process's niceness (0: the same as the API).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import selectors
import socket
import threading
import time
import uuid
from multiprocessing.connection import Connection
from urllib.parse import urlsplit

from bench import BenchError, Figure, Figures, percentile, throwaway_redis
from bench.live_platform import USER, Platform, running_platform, wait_for
from services.monitor.logs import append_log_entries
from shared.node.containers import TaskRef
from shared.state.store import connect

FOLLOWERS = 500
SLOW_LORIS = 64
LINES_PER_SECOND = 2
CALLS = 1000
WARMUP = 20
CONNECT_SECONDS = 120.0
LOAD_NICE = 10
FOLLOWED = "followed"
CPU_WINDOW_SECONDS = 10.0  # the API's CPU measured over this, without and with the load


class Followers:
    """FOLLOWERS raw connections following one log, drained by one thread."""

    def __init__(self, address: tuple[str, int], token: str, count: int) -> None:
        self.address = address
        self.request = (f"GET /api/v1/user/{USER}/jobs/{FOLLOWED}/tasks/main/0/log?follow=1 "
                        f"HTTP/1.1\r\nHost: bench\r\nAuthorization: {token}\r\n\r\n"
                        ).encode()
        self.selector = selectors.DefaultSelector()
        self.answered, self.refused, self.closed, self.bytes = 0, 0, 0, 0
        self.refusal = ""
        self.stop = threading.Event()
        for _ in range(count):
            sock = socket.create_connection(self.address, timeout=CONNECT_SECONDS)
            sock.sendall(self.request)
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, data=[b""])
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while not self.stop.is_set():
            for key, _ in self.selector.select(timeout=0.2):
                sock, head = key.fileobj, key.data
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    self.closed += 1
                    self.selector.unregister(sock)
                    sock.close()
                    continue
                self.bytes += len(chunk)
                if head is not None and head[0] is not None:
                    head[0] += chunk
                    if b"\r\n" in head[0]:
                        if head[0].startswith(b"HTTP/1.1 200"):
                            self.answered += 1
                        else:
                            self.refused += 1
                            self.refusal = head[0].split(b"\r\n", 1)[0].decode()
                        head[0] = None

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        for key in list(self.selector.get_map().values()):
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
        self.selector.close()


class SlowLoris:
    """SLOW_LORIS connections that send a header a byte a second, reopened when cut."""

    HEAD = b"GET /api/v1/jobs HTTP/1.1\r\nHost: bench\r\nX-Slow: "

    def __init__(self, address: tuple[str, int], count: int) -> None:
        self.address, self.cut = address, 0
        self.socks = [self._open() for _ in range(count)]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._trickle, daemon=True)
        self.thread.start()

    def _open(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=CONNECT_SECONDS)
        sock.sendall(self.HEAD)
        sock.setblocking(False)
        return sock

    def _trickle(self) -> None:
        while not self.stop.wait(1.0):
            for i, sock in enumerate(self.socks):
                try:
                    if sock.recv(1) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass  # still open: nothing from the server yet
                except OSError:
                    self.cut += 1
                    sock.close()
                    self.socks[i] = sock = self._open()
                with contextlib.suppress(OSError):
                    sock.send(b"a")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        for sock in self.socks:
            sock.close()


class LogWriter:
    """Appends lines to the followed task's log, as the monitor ships them."""

    def __init__(self, redis_url: str, job_id: str, per_second: float) -> None:
        self.r, self.task = connect(redis_url), TaskRef(job_id, 0, "main", 0)
        self.per_second, self.lines = per_second, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        while not self.stop.wait(1.0 / self.per_second):
            self.lines += 1
            append_log_entries(self.r, self.task, [f"step {self.lines} loss 0.1"],
                               100_000)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        self.r.close()


def _timed(pai: Platform, calls: int) -> dict[str, list[float]]:
    """Milliseconds of `calls` submits and `calls` lists, alternating."""
    samples: dict[str, list[float]] = {"submit": [], "list": []}

    def submit() -> None:
        pai.submit_accepted(pai.config(f"c-{uuid.uuid4().hex[:10]}", "true"))

    def listing() -> None:
        resp = pai.http.get(f"{pai.url}/api/v1/jobs", params={"limit": 50}, timeout=60)
        if resp.status_code != 200:
            raise BenchError(f"list answered {resp.status_code}: {resp.text}")

    for _ in range(WARMUP):
        submit()
        listing()
    for _ in range(calls):
        for name, call in (("submit", submit), ("list", listing)):
            start = time.perf_counter()
            call()
            samples[name].append((time.perf_counter() - start) * 1000)
    return samples


def _attack(address: tuple[str, int], token: str, redis_url: str, nice: int,
            ready: Connection, stop: Connection) -> None:
    """The load, in a process of its own so that it does not take the measuring
    client's interpreter: followers, slow-loris and the log writer. Sends its
    readiness (or an error), waits for `stop`, then sends its figures."""
    os.nice(nice)
    writer = LogWriter(redis_url, f"{USER}~{FOLLOWED}", LINES_PER_SECOND)
    followers = Followers(address, token, FOLLOWERS)
    loris = SlowLoris(address, SLOW_LORIS)
    try:
        try:
            wait_for(lambda: followers.answered + followers.refused >= FOLLOWERS,
                     CONNECT_SECONDS, "every follower's answer", interval=0.2)
        except BenchError as error:
            ready.send(str(error))
            return
        if followers.refused:
            ready.send(f"{followers.refused} follows were refused: {followers.refusal}")
            return
        ready.send("")
        stop.recv()
        ready.send({
            "followers still open at the end": FOLLOWERS - followers.closed,
            "slow-loris connections cut and reopened": loris.cut,
            "log lines written": writer.lines,
            "MB sent to followers": round(followers.bytes / 1e6, 2),
        })
    finally:
        loris.close()
        followers.close()
        writer.close()


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds so far of a process and its descendants
    (gunicorn's master and its workers), from /proc."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(cpu.get(pid, 0.0) for pid in tree)


def api_cpu_share(pai: Platform) -> float:
    """The API's CPU over CPU_WINDOW_SECONDS with no request of ours, as a
    share of one core."""
    root = pai.processes.pid("api")
    before = tree_cpu_seconds(root)
    time.sleep(CPU_WINDOW_SECONDS)
    return (tree_cpu_seconds(root) - before) / CPU_WINDOW_SECONDS


def run() -> Figures:
    calls = int(os.environ.get("PAI_BENCH_CAPACITY_CALLS", CALLS))
    nice = int(os.environ.get("PAI_BENCH_LOAD_NICE", LOAD_NICE))
    figures: dict[str, Figure] = {
        "followers": FOLLOWERS, "slow-loris connections": SLOW_LORIS,
        "log lines/s to every follower": LINES_PER_SECOND, "calls per phase": calls,
        "load process niceness": nice,
        "load average before": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }
    with throwaway_redis() as url, running_platform(
            url, services=("api",),
            extra_env={"PAI_API_FOLLOWS_PER_USER": str(FOLLOWERS)}) as pai:
        pai.submit_accepted(pai.config(FOLLOWED, "sleep 3600"))
        idle = _timed(pai, calls)
        quiet_cpu = api_cpu_share(pai)

        where = urlsplit(pai.url)
        address = (where.hostname or "127.0.0.1", where.port or 80)
        spawn = multiprocessing.get_context("spawn")
        (ours, theirs), (stop_ours, stop_theirs) = spawn.Pipe(), spawn.Pipe()
        attack = spawn.Process(target=_attack, daemon=True, args=(
            address, str(pai.http.headers["Authorization"]), url, nice, theirs, stop_theirs))
        attack.start()
        try:
            if not ours.poll(2 * CONNECT_SECONDS):
                raise BenchError("the load did not start")
            problem = ours.recv()
            if problem:
                raise BenchError(problem)
            loaded_cpu = api_cpu_share(pai)
            figures["api CPU, no requests, % of a core"] = round(100 * quiet_cpu, 1)
            figures["api CPU with the followers, lines and slow-loris, % of a core"] = \
                round(100 * loaded_cpu, 1)
            figures["api CPU the load adds, % of a core (goal <= 10)"] = \
                round(100 * (loaded_cpu - quiet_cpu), 1)
            loaded = _timed(pai, calls)
            figures["load average under load"] = " ".join(f"{v:.2f}" for v in os.getloadavg())
            stop_ours.send("stop")
            if ours.poll(CONNECT_SECONDS):
                figures.update(ours.recv())
        finally:
            attack.join(timeout=CONNECT_SECONDS)
            if attack.is_alive():
                attack.kill()  # the process this benchmark started
                attack.join()
    for name in ("submit", "list"):
        idle_p50, idle_p99 = percentile(idle[name], 0.5), percentile(idle[name], 0.99)
        load_p50, load_p99 = percentile(loaded[name], 0.5), percentile(loaded[name], 0.99)
        figures[f"{name} idle p50 / p99 ms"] = f"{idle_p50:.1f} / {idle_p99:.1f}"
        figures[f"{name} under load p50 / p99 ms"] = f"{load_p50:.1f} / {load_p99:.1f}"
        figures[f"{name} p99 under load / idle (goal <= 2)"] = round(load_p99 / idle_p99, 2)
    return figures
