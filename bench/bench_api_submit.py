"""API submit: accepted jobs per second and their latency, beside the framework floor.

`pai-api` runs as it is deployed (its own entry point: gunicorn with the
settings of services/api/serving.py) on a throwaway Redis with one
registered 8-GPU node, and a client in a separate process keeps CLIENTS
keep-alive HTTP/1.1 connections busy with `POST /api/v1/user/alice/jobs` (a
one-task job, a fresh name each time, alice's bearer token from one login).
Every submit does what it does in production: token check, schema
validation, VC and feasibility checks, the job's Redis write and the
scheduler's wake-up. The scheduler does not run (its messages wait in
Redis), so this is the API's own rate.

The floor, measured in the same run with the same client and concurrency:
a minimal Flask app served by the same gunicorn settings, the same gevent
patching and the same body-deadline middleware as `pai-api` (`serve_floor`
below), whose endpoint parses the JSON body, makes one Redis write through
the platform's Redis client and answers 202. The ratio is pai-api's
accepted jobs/s over the floor's requests/s: what a submit costs beyond
gunicorn, Flask and one Redis round trip.

Beside them, the write's ceiling: the floor's app whose endpoint makes a
submit's own write instead of its one `HSET` (`queue_new_job`, the record,
its indexes, its queue place, its event and the pass flag in one script),
with the config validated once at start and no token, checks or hooks.
No submit that writes what pai writes can beat it, so its ratio to the floor
is what the write alone leaves of the floor's rate.

Also printed: CPU milliseconds per request of each server's processes
(master and workers, from /proc), steadier than rates on a shared machine.

Environment:
- PAI_BENCH_SUBMITS: measured submits per server (default 10,000);
- PAI_BENCH_ROUNDS: rounds of the three servers, one after another (default 1);
- PAI_BENCH_API_WORKERS: PAI_API_WORKERS for every server (default: its default);
- PAI_BENCH_PYSPY: a path prefix; py-spy records pai-api's processes during
  the (last) measured round into `<prefix>.raw` (collapsed stacks, what
  flame graph tools read).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import BenchError, Figure, Figures, percentile, throwaway_redis
from bench.live_platform import (
    BIN,
    TEST_IMAGE,
    USER,
    Processes,
    free_port,
    platform_env,
    run_id,
    running,
    wait_for,
)
from shared.domain.models import Gpu, Node
from shared.state.store import Store

CLIENTS = 16
SUBMITS = 10_000
WARMUP_PER_CLIENT = 20
# The raised targets (docs/design.md, "Performance"): 2,000 jobs/s, p99 50 ms,
# at least 0.75 of the floor's rate in the same run.
TARGET_RATE = 2000.0
TARGET_P99_MS = 50.0
TARGET_RATIO = 0.75
FLOOR_KEY = "pai:bench:floor"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def job_body(name: str) -> bytes:
    return json.dumps({
        "jobName": name, "image": TEST_IMAGE,
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256,
                       "gpuNumber": 1, "command": "python train.py"}],
    }).encode()


# -------------------------------------------------------------- the client


@dataclass(frozen=True)
class Load:
    port: int
    path: str
    token: str
    clients: int
    per_client: int
    warmup: int
    prefix: str


class Connection:
    """One keep-alive HTTP/1.1 connection; reopened when the server closed it."""

    def __init__(self, load: Load) -> None:
        self.load = load
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, name: str) -> int:
        for _ in range(2):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(
                    "127.0.0.1", self.load.port)
            status = await self._exchange(name)
            if status:
                return status
            self.close()  # closed by the server before it read the request: again
        return 0  # counted as an error

    async def _exchange(self, name: str) -> int:
        assert self.reader is not None and self.writer is not None
        load, body = self.load, job_body(name)
        head = (f"POST {load.path} HTTP/1.1\r\nHost: 127.0.0.1:{load.port}\r\n"
                f"Authorization: Bearer {load.token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        try:
            self.writer.write(head + body)
            status_line = await self.reader.readline()
            if not status_line:
                return 0
            length = 0
            while True:
                line = await self.reader.readline()
                if line in (b"\r\n", b""):
                    break
                key, _, value = line.partition(b":")
                if key.strip().lower() == b"content-length":
                    length = int(value)
            if length:
                await self.reader.readexactly(length)
        except (ConnectionError, asyncio.IncompleteReadError):
            return 0
        return int(status_line.split()[1])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _client(load: Load, number: int, start: asyncio.Event,
                  warmed: list[int]) -> tuple[list[float], Counter[int]]:
    connection = Connection(load)
    for i in range(load.warmup):
        await connection.post(f"{load.prefix}-w{number}-{i}")
    warmed.append(number)
    await start.wait()
    latencies, statuses = [], Counter[int]()
    for i in range(load.per_client):
        began = time.perf_counter()
        status = await connection.post(f"{load.prefix}-{number}-{i}")
        latencies.append((time.perf_counter() - began) * 1000)
        statuses[status] += 1
    connection.close()
    return latencies, statuses


@dataclass
class Measured:
    latencies: list[float]
    statuses: dict[int, int]
    seconds: float
    cpu_seconds: float = 0.0


async def _drive(load: Load) -> Measured:
    start, warmed = asyncio.Event(), list[int]()
    tasks = [asyncio.create_task(_client(load, n, start, warmed)) for n in range(load.clients)]
    deadline = time.monotonic() + 120
    while len(warmed) < load.clients:
        if time.monotonic() > deadline:
            raise BenchError("the clients did not finish their warm-up in 120 s")
        await asyncio.sleep(0.01)
        for task in tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    began = time.perf_counter()
    start.set()
    results = await asyncio.gather(*tasks)
    seconds = time.perf_counter() - began
    statuses: Counter[int] = Counter()
    for _, counted in results:
        statuses.update(counted)
    return Measured([ms for result in results for ms in result[0]], dict(statuses), seconds)


def drive(load: Load) -> Measured:
    """Runs in the client process."""
    return asyncio.run(_drive(load))


def _tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) of `root` and its live descendants."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()
        stats[int(entry.name)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += int(stats[pid][11]) + int(stats[pid][12])  # utime, stime
        todo.extend(children.get(pid, []))
    return total / CLOCK_TICKS


@contextmanager
def _profiled(pid: int, prefix: str | None) -> Iterator[None]:
    """py-spy records `pid` and its children while the block runs (when asked)."""
    if not prefix:
        yield
        return
    spy = shutil.which("py-spy") or str(BIN / "py-spy")
    out = Path(prefix).with_suffix(".raw")
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--subprocesses",
                             "--format", "raw", "--rate", "200", "--nonblocking",
                             "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # py-spy attaches before the load starts
        yield
    finally:
        proc.send_signal(2)  # SIGINT: py-spy writes its file and exits
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def measure(load: Load, server_pid: int, profile: str | None = None) -> Measured:
    with ProcessPoolExecutor(max_workers=1) as client, _profiled(server_pid, profile):
        future = client.submit(drive, Load(load.port, load.path, load.token, load.clients,
                                           0, load.warmup, f"{load.prefix}-warm"))
        future.result()  # warm-up alone, outside the CPU count
        cpu_before = _tree_cpu_seconds(server_pid)
        found = client.submit(drive, Load(load.port, load.path, load.token, load.clients,
                                          load.per_client, 0, load.prefix)).result()
        found.cpu_seconds = _tree_cpu_seconds(server_pid) - cpu_before
        return found


# ---------------------------------------------------------------- the floor


def _submit_app(name: str, write: Callable[[str, dict[str, Any]], Any]) -> Any:
    """Flask, one JSON parse, `write(username, body)`, 202."""
    from flask import Flask, request

    app = Flask(name)

    @app.post("/api/v1/user/<username>/jobs")
    def accept(username: str) -> tuple[dict[str, Any], int]:
        body = json.loads(request.data)
        write(username, body)
        return {"name": body["jobName"], "username": username, "state": "WAITING"}, 202

    return app


def floor_app() -> Any:
    """Flask, one JSON parse, one Redis write, 202: what any submit must pay."""
    from shared.infra.config import load_settings
    from shared.state.store import connect

    redis_client = connect(load_settings().redis_url)
    return _submit_app("floor", lambda username, body: redis_client.hset(
        FLOOR_KEY, f"{username}~{body['jobName']}", "WAITING"))


def ceiling_app() -> Any:
    """The floor's app with a submit's own write for its one `HSET`: what no
    submit writing what pai writes can beat."""
    from shared.domain.jobspec import validate_job_config
    from shared.domain.models import JobSpec
    from shared.infra.config import load_settings
    from shared.state.lifecycle import queue_new_job
    from shared.state.store import Store, connect

    settings = load_settings()
    store = Store(connect(settings.redis_url))
    validated = validate_job_config(json.loads(job_body("ceiling")), username=USER,
                                    storage_roots=settings.storage_roots).config

    def write(username: str, body: dict[str, Any]) -> None:
        config = {**validated, "jobName": body["jobName"]}
        queue_new_job(store, username, config, spec=JobSpec.from_config(config))

    return _submit_app("ceiling", write)


APPS = {"floor": floor_app, "ceiling": ceiling_app}


def serve_floor(app: str = "floor") -> None:
    """The floor (or the write's ceiling) under pai-api's own server: run as
    `python -c` after gevent's patching, served exactly as
    services/api/run.py serves the API."""
    from services.api.run import serve

    serve(lambda _settings: APPS[app]())


@contextmanager
def running_floor(env: Mapping[str, str], work_dir: Path,
                  app: str = "floor") -> Iterator[tuple[int, int]]:
    """The floor server (or the write's ceiling, `app`): (port, master pid)."""
    port = free_port()
    processes = Processes(work_dir)
    command = ("from gevent import monkey; monkey.patch_all(); "
               f"from bench.bench_api_submit import serve_floor; serve_floor({app!r})")
    processes.start(app, [sys.executable, "-c", command], {**env, "PAI_API_PORT": str(port)})
    try:
        def answers() -> bool:
            processes.check_alive()
            try:
                with socket.create_connection(("127.0.0.1", port), 0.5):
                    return True
            except OSError:
                return False
        wait_for(answers, 30, f"the {app}'s gunicorn", interval=0.05)
        yield port, processes.pid(app)
    finally:
        processes.stop_all()


# ------------------------------------------------------------------- run


def _row(found: Measured) -> dict[str, Figure]:
    accepted = found.statuses.get(202, 0)
    requests = len(found.latencies)
    return {"requests": requests, "accepted": accepted, "errors": requests - accepted,
            "per s": accepted / found.seconds, "p50 ms": percentile(found.latencies, 0.5),
            "p99 ms": percentile(found.latencies, 0.99), "max ms": max(found.latencies),
            "CPU ms/request": found.cpu_seconds * 1000 / max(1, requests)}


def run() -> Figures:
    submits = int(os.environ.get("PAI_BENCH_SUBMITS", SUBMITS))
    rounds = max(1, int(os.environ.get("PAI_BENCH_ROUNDS", 1)))
    profile = os.environ.get("PAI_BENCH_PYSPY") or None
    per_client = max(1, submits // CLIENTS)
    path = f"/api/v1/user/{USER}/jobs"
    table: dict[str, dict[str, Figure]] = {}
    ratios: list[float] = []
    ceilings: list[float] = []  # the write's ceiling over the floor, each round
    with throwaway_redis() as url, tempfile.TemporaryDirectory(prefix="pai-bench-") as tmp:
        work = Path(tmp)
        env = platform_env(url, work, node=f"bench-{run_id()}")
        if os.environ.get("PAI_BENCH_API_WORKERS"):  # every server: they share the settings
            env["PAI_API_WORKERS"] = os.environ["PAI_BENCH_API_WORKERS"]
        with running(env, work, services=("api",)) as pai, \
                running_floor(env, work) as (floor_port, floor_pid), \
                running_floor(env, work, "ceiling") as (ceiling_port, ceiling_pid):
            store = Store.from_url(url)
            store.register_node(Node(
                "gpu-node-0", "127.0.0.1", cpus=64, memory_mb=512 * 1024,
                gpus=[Gpu(i) for i in range(8)], port_range=(15000, 40000)))
            token = str(pai.http.headers["Authorization"]).removeprefix("Bearer ")
            pai_port, pai_pid = int(pai.env["PAI_API_PORT"]), pai.processes.pid("api")
            for n in range(rounds):
                last = n == rounds - 1
                floor = measure(Load(floor_port, path, "none", CLIENTS, per_client,
                                     WARMUP_PER_CLIENT, f"floor{n}"), floor_pid)
                ceiling = measure(Load(ceiling_port, path, "none", CLIENTS, per_client,
                                       WARMUP_PER_CLIENT, f"ceiling{n}"), ceiling_pid)
                ours = measure(Load(pai_port, path, token, CLIENTS, per_client,
                                    WARMUP_PER_CLIENT, f"bench{n}"), pai_pid,
                               profile if last else None)
                suffix = f", round {n + 1}" if rounds > 1 else ""
                table["pai-api" + suffix] = _row(ours)
                table["floor: Flask + 1 Redis write" + suffix] = _row(floor)
                table["ceiling: the floor + a submit's write" + suffix] = _row(ceiling)
                ratios.append(float(table["pai-api" + suffix]["per s"])
                              / float(table["floor: Flask + 1 Redis write" + suffix]["per s"]))
                ceilings.append(float(table["ceiling: the floor + a submit's write" + suffix]
                                      ["per s"])
                                / float(table["floor: Flask + 1 Redis write" + suffix]["per s"]))
            stored = int(store.r.zcard("pai:jobs"))
            store.r.close()
    ours_rows = [row for label, row in table.items() if label.startswith("pai-api")]
    rate = min(float(row["per s"]) for row in ours_rows)
    p99 = max(float(row["p99 ms"]) for row in ours_rows)
    errors = sum(int(row["errors"]) for row in ours_rows)
    load_average = os.getloadavg()
    return {
        "client": f"1 process, asyncio, {CLIENTS} keep-alive connections, "
                  f"{per_client * CLIENTS} submits per server per round",
        "server": "the pai-api entry point's gunicorn settings (services/api/serving.py), "
                  f"for all three; PAI_API_WORKERS={env.get('PAI_API_WORKERS', 'default')}",
        "load average at the end": " ".join(f"{x:.2f}" for x in load_average),
        "jobs stored": stored,
        "POST /api/v1/user/alice/jobs": table,
        "ratio jobs/s vs floor": min(ratios),
        f"ratio vs target {TARGET_RATIO}": min(ratios) / TARGET_RATIO,
        "the write's ceiling vs floor (its best round)": max(ceilings),
        "errors": errors,
        f"jobs/s vs target {TARGET_RATE:.0f}": rate / TARGET_RATE,
        f"p99 vs target {TARGET_P99_MS:.0f} ms": p99 / TARGET_P99_MS,
        "profile": str(Path(profile).with_suffix(".raw")) if profile else "",
    }
