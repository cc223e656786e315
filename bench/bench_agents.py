"""The control plane's cost per node: lightweight node agents, no containers.

Each agent is a `bench.lightagent.Agent`: the real `LeaseKeeper` and the
launcher's renewals, no Docker; their turns are spread over the heartbeat,
as independent machines' are. Meanwhile 1-GPU jobs are submitted at a steady rate and the
real `Scheduler.run_pass` runs once a second, placing them until the
cluster is full (no launcher starts them: the launch timeout is set past the
run, so none is sent again).

Reported for each size: the scheduler's pass time (p50, max), the placements,
the heartbeats made (two renewals each), and Redis's CPU over the steady window, in all and per
node; the growth of Redis's CPU per node from the smallest size to the
largest says whether the cost per node stays flat (O(N)) or grows with the
cluster (O(N^2): a cluster-wide read per node).

PAI_BENCH_AGENTS overrides the sizes (comma separated; 50,200 by default),
PAI_BENCH_AGENT_SECONDS the steady window (65 s: past one peer refresh).
"""

from __future__ import annotations

import os
import threading
import time
from typing import cast

from bench import (
    BenchError,
    Figure,
    Figures,
    Table,
    cpu_seconds,
    percentile,
    redis_pid,
    throwaway_redis,
)
from bench.lightagent import Agent, Tally, drive_agents
from services.scheduler.service import Scheduler
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state.lifecycle import submit_job
from shared.state.store import Store

SIZES = (50, 200)
WINDOW_SECONDS = 65.0
SUBMITS_PER_SECOND = 20
PASS_SECONDS = 1.0
JOB = {"image": "busybox", "taskRoles": [{
    "name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 1000,
    "gpuNumber": 1, "command": "sleep 3600"}]}


def one_size(count: int, window: float) -> dict[str, Figure]:
    with throwaway_redis() as url:
        settings = Settings(redis_url=url, launch_timeout_seconds=3600.0)
        store = Store.from_url(url)
        server = redis_pid(url)
        agents = [Agent(settings, store, f"agent-{i:04d}", f"10.1.{i // 250}.{i % 250 + 1}")
                  for i in range(count)]
        scheduler = Scheduler(settings, store, Messenger(make_celery(settings)))
        stop, tally = threading.Event(), Tally()
        driver = threading.Thread(target=drive_agents, daemon=True,
                                  args=(agents, settings.heartbeat_seconds, stop, tally))
        driver.start()
        try:
            time.sleep(settings.heartbeat_seconds)  # every agent renewed once: steady from here
            passes: list[float] = []
            placed = submitted = 0
            redis_cpu, counted = cpu_seconds(server), tally.made
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < window:
                while submitted < elapsed * SUBMITS_PER_SECOND:
                    submit_job(store, f"user{submitted % 16:02d}",
                               {**JOB, "jobName": f"job-{submitted:06d}"})
                    submitted += 1
                began = time.perf_counter()
                placed += scheduler.run_pass().placed
                passes.append((time.perf_counter() - began) * 1000)
                time.sleep(max(0.0, PASS_SECONDS - (time.perf_counter() - began)))
            seconds = time.monotonic() - started
            redis_cpu, made = cpu_seconds(server) - redis_cpu, tally.made - counted
        finally:
            stop.set()
            driver.join(10)
            store.r.close()
    if tally.failed:
        raise BenchError(f"{tally.failed} renewals failed on a local Redis")
    figures: dict[str, Figure] = {
        "window s": seconds, "heartbeats/s": made / seconds, "submitted": submitted,
        "placed": placed, "pass p50 ms": percentile(passes, 0.5), "pass max ms": max(passes)}
    if server is not None:
        figures["Redis CPU %"] = redis_cpu / seconds * 100
        figures["Redis CPU ms/s per node"] = redis_cpu / seconds * 1000 / count
    return figures


def run() -> Figures:
    sizes = [int(s) for s in os.environ.get("PAI_BENCH_AGENTS", ",".join(map(str, SIZES)))
             .split(",")]
    window = float(os.environ.get("PAI_BENCH_AGENT_SECONDS", WINDOW_SECONDS))
    table = {f"{count} agents": one_size(count, window) for count in sizes}
    figures: dict[str, Figure | Table] = {"agents (no containers), heartbeat 5 s": table}
    per_node = [row.get("Redis CPU ms/s per node") for row in table.values()]
    if len(sizes) > 1 and all(isinstance(v, float) and v > 0 for v in per_node):
        first, last = cast(float, per_node[0]), cast(float, per_node[-1])
        figures["Redis CPU per node, largest vs smallest size"] = last / first
        figures["nodes, largest vs smallest size"] = sizes[-1] / sizes[0]
    return figures
