"""API submit: accepted jobs per second, and their latency, under concurrency.

`pai-api` runs as it is deployed (gunicorn, 2 gevent workers,
access log on) on a throwaway Redis with one registered 8-GPU node, and a
client in a separate process keeps CONNECTIONS keep-alive HTTP/1.1
connections busy with `POST /api/v1/user/alice/jobs` (a one-task job, a
fresh name each time, alice's bearer token from one login). Every submit
does what it does in production: token check, schema validation, VC and
feasibility checks, the job's Redis transaction and the Celery message to
the scheduler. The scheduler does not run (its messages wait in Redis), so
this is the API's own rate.

The reference, measured in the same run with the same client and
concurrency: a trivial Flask app under the same gunicorn settings whose
endpoint parses the same JSON body and answers 202. The ratio is the
platform's accepted jobs/s over the trivial app's requests/s: what a submit
costs beside Flask and gunicorn's own floor.

PAI_BENCH_SUBMITS overrides the number of measured submits (default 6,000).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Flask, Response, request

from bench import BenchError, Figure, Figures, percentile, throwaway_redis
from bench.live_platform import (
    BIN,
    TEST_IMAGE,
    USER,
    Processes,
    free_port,
    running_platform,
    wait_for,
)
from shared.models import Gpu, Node
from shared.store import Store

CONNECTIONS = 32
SUBMITS = 6000
WARMUP_PER_CONNECTION = 20
TARGET_RATE = 1000.0
TARGET_P99_MS = 100.0
GUNICORN = ("--workers", "2", "--worker-class", "gevent", "--worker-connections", "1000",
            "--access-logfile", "-")


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
    connections: int
    per_connection: int
    warmup: int
    prefix: str


class Connection:
    """One keep-alive HTTP/1.1 connection; reopened when the server closed it
    (gunicorn closes a keep-alive connection idle for 2 s)."""

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
        raise BenchError(f"the server closed two connections in a row at {name}")

    async def _exchange(self, name: str) -> int:
        assert self.reader is not None and self.writer is not None
        load, body = self.load, job_body(name)
        head = (f"POST {load.path} HTTP/1.1\r\nHost: 127.0.0.1:{load.port}\r\n"
                f"Authorization: Bearer {load.token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        try:
            self.writer.write(head + body)
            status_line = await self.reader.readline()
        except ConnectionError:
            return 0
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
        return int(status_line.split()[1])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _connection(load: Load, number: int, start: asyncio.Event,
                      warmed: list[int]) -> tuple[list[float], Counter[int]]:
    connection = Connection(load)
    for i in range(load.warmup):
        await connection.post(f"{load.prefix}-w{number}-{i}")
    warmed.append(number)
    await start.wait()
    latencies, statuses = [], Counter[int]()
    for i in range(load.per_connection):
        began = time.perf_counter()
        status = await connection.post(f"{load.prefix}-{number}-{i}")
        latencies.append((time.perf_counter() - began) * 1000)
        statuses[status] += 1
    connection.close()
    return latencies, statuses


async def _drive(load: Load) -> tuple[list[float], dict[int, int], float]:
    start, warmed = asyncio.Event(), list[int]()
    tasks = [asyncio.create_task(_connection(load, n, start, warmed))
             for n in range(load.connections)]
    while len(warmed) < load.connections:
        await asyncio.sleep(0.01)
        for task in tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    began = time.perf_counter()
    start.set()
    results = await asyncio.gather(*tasks)
    seconds = time.perf_counter() - began
    latencies = [ms for result in results for ms in result[0]]
    statuses: Counter[int] = Counter()
    for _, counted in results:
        statuses.update(counted)
    return latencies, dict(statuses), seconds


def drive(load: Load) -> tuple[list[float], dict[int, int], float]:
    """Runs in the client process: latencies (ms), statuses, measured seconds."""
    return asyncio.run(_drive(load))


def measure(load: Load) -> tuple[list[float], dict[int, int], float]:
    with ProcessPoolExecutor(max_workers=1) as client:
        return client.submit(drive, load).result()


# ----------------------------------------------------------- the reference


def trivial_app() -> Flask:
    """The reference: parse the JSON body, answer 202 (gunicorn loads this)."""
    app = Flask("trivial")

    @app.post("/api/v1/user/<username>/jobs")
    def accept(username: str) -> tuple[Response | dict[str, Any], int]:
        body = json.loads(request.data)
        return {"name": body["jobName"], "username": username, "state": "WAITING"}, 202

    return app


def reference(work_dir: Path, per_connection: int) -> tuple[list[float], dict[int, int], float]:
    port = free_port()
    processes = Processes(work_dir)
    processes.start("trivial", [str(BIN / "gunicorn"), *GUNICORN, "--bind",
                                f"127.0.0.1:{port}", "bench.bench_api_submit:trivial_app()"],
                    os.environ)
    try:
        def answers() -> bool:
            processes.check_alive()
            try:
                with socket.create_connection(("127.0.0.1", port), 0.5):
                    return True
            except OSError:
                return False
        wait_for(answers, 30, "the reference gunicorn", interval=0.05)
        return measure(Load(port, f"/api/v1/user/{USER}/jobs", "none", CONNECTIONS,
                            per_connection, WARMUP_PER_CONNECTION, "ref"))
    finally:
        processes.stop_all()


# ------------------------------------------------------------------- run


def _row(latencies: list[float], statuses: dict[int, int], seconds: float,
         accepted_status: int) -> dict[str, Figure]:
    accepted = statuses.get(accepted_status, 0)
    return {"requests": len(latencies), "accepted": accepted,
            "per s": accepted / seconds, "p50 ms": percentile(latencies, 0.5),
            "p99 ms": percentile(latencies, 0.99), "max ms": max(latencies)}


def run() -> Figures:
    submits = int(os.environ.get("PAI_BENCH_SUBMITS", SUBMITS))
    per_connection = max(1, submits // CONNECTIONS)
    with throwaway_redis() as url, tempfile.TemporaryDirectory(prefix="pai-bench-") as tmp:
        ref = reference(Path(tmp), per_connection)
        with running_platform(url, services=("api",)) as pai:
            Store.from_url(url).register_node(Node(
                "gpu-node-0", "127.0.0.1", cpus=64, memory_mb=512 * 1024,
                gpus=[Gpu(i) for i in range(8)], port_range=(15000, 40000)))
            token = str(pai.http.headers["Authorization"]).removeprefix("Bearer ")
            port = int(pai.env["PAI_API_PORT"])
            ours = measure(Load(port, f"/api/v1/user/{USER}/jobs", str(token), CONNECTIONS,
                                per_connection, WARMUP_PER_CONNECTION, "bench"))
            stored = Store.from_url(url).r.zcard("pai:jobs")
    platform_row, reference_row = _row(*ours, 202), _row(*ref, 202)
    if platform_row["accepted"] != platform_row["requests"]:
        raise BenchError(f"only {platform_row['accepted']} of {platform_row['requests']} "
                         f"submits were accepted: {ours[1]}")
    rate, p99 = float(platform_row["per s"]), float(platform_row["p99 ms"])
    return {
        "client": f"1 process, asyncio, {CONNECTIONS} keep-alive connections",
        "server": "gunicorn " + " ".join(GUNICORN),
        "jobs stored": stored,
        "POST /api/v1/user/alice/jobs": {"pai-api": platform_row,
                                         "trivial Flask (reference)": reference_row},
        "ratio jobs/s vs reference": rate / float(reference_row["per s"]),
        f"jobs/s vs target {TARGET_RATE:.0f}": rate / TARGET_RATE,
        f"p99 vs target {TARGET_P99_MS:.0f} ms": p99 / TARGET_P99_MS,
    }
