"""Short jobs end to end: throughput of many tiny 1-GPU jobs on one 8-GPU node.

The whole platform runs as processes (bench/live_platform.py) with one node
declaring 8 virtual GPUs. JOBS jobs, each one task of 1 GPU, 1 CPU, 128 MB
running `true` on the test image, are submitted one after another over HTTP;
at most 8 run at once (one per GPU), the rest wait for a GPU to be released.
The clock runs from just before the first submit to the last job's
completedTime (the platform recorded it SUCCEEDED): submit, placement, launch,
the container's run, its exit and log, the release and the next placement.

The reference, measured in the same run: a plain Docker loop at the same
parallelism, 8 threads each taking the next of JOBS containers and running
it to completion with the Docker SDK (create with the launcher's flags,
start, wait, remove), run once before the platform and once after and
counted as one run of twice the jobs. Both rates are jobs per second; the
ratio is the platform's over the loop's (target: at least TARGET_RATIO).

A job's latency is counted alike on both sides: from its submit to its
exit recorded (the platform's createdTime to completedTime), and for the
loop, whose jobs are all there when it starts, from the loop's start to its
container's exit seen by `wait`. Most of it is the wait for a GPU in a
burst of JOBS on GPUS. The platform's p50 over the loop's is the latency
ratio (target: at most TARGET_LATENCY_RATIO). The loop's container cycle,
create to removed, is printed beside it: the service time of one job.

Beside the rates, the CPU each side spent per job over its timed run (user
+ system, from /proc): each service's process tree, Redis, and the Docker
engine (dockerd, containerd, the shims, runc), and for the loop its own
process and the engine. On a machine with few cores the run is CPU-bound,
so the ratio follows these: the engine's share is the same on both sides.
The engine's figure includes whatever else the engine did meanwhile.

PAI_BENCH_JOBS overrides the number of jobs (default 200).
"""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import redis

from bench import BenchError, Figure, Figures, percentile, redis_pid, throwaway_redis
from bench.bench_capacity import tree_cpu_seconds
from bench.live_platform import Platform, bare_container, reference_engine, running_platform
from shared.domain.models import Job
from shared.domain.states import JobState
from shared.state import keys

JOBS = 200  # the figure: 200 one-GPU jobs
GPUS = 8
COMMAND = "true"
MEMORY_MB = 128
TIMEOUT_SECONDS = 180.0
TARGET_RATIO = 0.95
TARGET_LATENCY_RATIO = 1.2  # the platform's p50 job latency over the loop's, at most
POLL_SECONDS = 0.25  # how often the bench looks whether every job has ended


ENGINE_PROCESSES = ("dockerd", "containerd", "runc")
ENGINE_PROCESS_PREFIX = "containerd-shim"  # /proc truncates the shims' names


# ------------------------------------------------------------- CPU per job


def engine_cpu_seconds() -> float:
    """User + system CPU seconds so far of the Docker engine's processes."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as stat:
                name, _, rest = stat.read().partition(" (")[2].rpartition(")")
        except OSError:
            continue  # gone meanwhile
        if name in ENGINE_PROCESSES or name.startswith(ENGINE_PROCESS_PREFIX):
            fields = rest.split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


class CpuMeter:
    """CPU seconds of named process trees (and the engine) between two readings."""

    ENGINE = "Docker engine"

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots
        self._start = self._read()

    def _read(self) -> dict[str, float]:
        seconds = {name: tree_cpu_seconds(pid) for name, pid in self.roots.items()}
        seconds[self.ENGINE] = engine_cpu_seconds()
        return seconds

    def per_job_ms(self, jobs: int) -> dict[str, float]:
        end = self._read()
        return {name: 1000 * (end[name] - self._start[name]) / jobs for name in end}


# ------------------------------------------------------------ the reference


def docker_loop(client: docker.DockerClient, work_dir: Path, run: str, jobs: int,
                workers: int) -> tuple[float, list[float], list[float]]:
    """Seconds for `workers` threads to run `jobs` containers to completion;
    each container's create-to-removed seconds; and each job's latency as
    the platform's is counted: every job of the loop is there from its start
    (a burst submitted at once), and ends when its container's exit is seen."""
    numbers = itertools.count()
    lock = threading.Lock()
    cycles: list[float] = []
    latencies: list[float] = []

    def worker() -> None:
        while True:
            with lock:
                number = next(numbers)
            if number >= jobs:
                return
            output = work_dir / f"loop-{run}-{number}"
            output.mkdir()
            began = time.perf_counter()
            container = bare_container(
                client, run, f"pai-bench-loop-{run}-{number}", COMMAND, output,
                memory_mb=MEMORY_MB,
                environment={"PAI_JOB_NAME": f"loop-{number}", "CUDA_VISIBLE_DEVICES": "0"})
            container.start()
            if container.wait(timeout=TIMEOUT_SECONDS)["StatusCode"] != 0:
                raise BenchError(f"loop container {number} failed")
            ended = time.perf_counter()
            container.remove(force=True)
            with lock:
                cycles.append(time.perf_counter() - began)
                latencies.append(ended - started)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for future in [pool.submit(worker) for _ in range(workers)]:
            future.result()
    return time.perf_counter() - started, cycles, latencies


# ------------------------------------------------------------- the platform


def platform_burst(pai: Platform, url: str, jobs: int, prefix: str) -> tuple[float, list[Job]]:
    """Seconds from before the first submit to the last job's completedTime."""
    r = redis.Redis.from_url(url, decode_responses=True)
    succeeded = keys.state_jobs(JobState.SUCCEEDED)
    failed = [keys.state_jobs(s) for s in (JobState.FAILED, JobState.STOPPED)]
    before = int(r.zcard(succeeded))
    t0_ms = time.time() * 1000
    for number in range(jobs):
        pai.submit_accepted(pai.config(f"{prefix}-{number}", COMMAND, gpus=1, memory_mb=MEMORY_MB))
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while int(r.zcard(succeeded)) < before + jobs:
        if any(r.zcard(k) for k in failed):
            raise BenchError("a short job failed or stopped; see the services' logs")
        if time.monotonic() > deadline:
            raise BenchError(f"only {int(r.zcard(succeeded)) - before} of {jobs} jobs ended "
                             f"in {TIMEOUT_SECONDS:.0f} s")
        # The clock stops at the records' completedTime, not here: a slow poll
        # costs the measure nothing, and takes no CPU from the platform.
        time.sleep(POLL_SECONDS)
    pipe = r.pipeline(transaction=False)
    for number in range(jobs):
        pipe.hgetall(keys.job(f"alice~{prefix}-{number}"))
    records = [Job.from_fields(fields) for fields in pipe.execute()]
    r.close()
    last = max(job.completed_ms or 0 for job in records)
    return (last - t0_ms) / 1000, records


def run() -> Figures:
    jobs = int(os.environ.get("PAI_BENCH_JOBS", JOBS))
    with reference_engine() as (client, run_label), \
            tempfile.TemporaryDirectory(prefix="pai-bench-") as tmp:
        docker_loop(client, Path(tmp), run_label + "w", GPUS, GPUS)  # warm, untimed
        # The loop runs before and after the platform and counts as one run
        # of twice the jobs: the engine's speed drifts over minutes (its rate
        # moved by a fifth over a day here), and the side measured second
        # would otherwise carry all of that drift.
        loop_meter = CpuMeter({"loop (this process)": os.getpid()})
        before_seconds, cycles, latencies = docker_loop(client, Path(tmp), run_label + "a",
                                                        jobs, GPUS)
        loop_cpu_before = loop_meter.per_job_ms(jobs)
        with throwaway_redis() as url, running_platform(url, gpus=GPUS) as pai:
            platform_burst(pai, url, GPUS, "warm")  # untimed
            roots = {service: pai.processes.pid(service) for service in pai.services}
            store_pid = redis_pid(url)
            if store_pid is not None:
                roots["redis"] = store_pid
            meter = CpuMeter(roots)
            seconds, records = platform_burst(pai, url, jobs, "short")
            platform_cpu = meter.per_job_ms(jobs)
        loop_meter = CpuMeter({"loop (this process)": os.getpid()})
        after_seconds, more_cycles, more_latencies = docker_loop(
            client, Path(tmp), run_label + "b", jobs, GPUS)
        loop_cpu = {name: (ms + loop_cpu_before[name]) / 2
                    for name, ms in loop_meter.per_job_ms(jobs).items()}
    cycles += more_cycles
    latencies += more_latencies
    loop_seconds = (before_seconds + after_seconds) / 2
    in_platform = [((job.completed_ms or 0) - job.created_ms) / 1000 for job in records]
    rate, reference = jobs / seconds, jobs / loop_seconds
    table: dict[str, dict[str, Figure]] = {
        "platform (submit -> SUCCEEDED)": {
            "seconds": seconds, "jobs/s": rate,
            "p50 job s": percentile(in_platform, 0.5), "p99 job s": percentile(in_platform, 0.99)},
        "Docker loop (reference)": {
            "seconds": loop_seconds, "jobs/s": reference,
            "p50 job s": percentile(latencies, 0.5), "p99 job s": percentile(latencies, 0.99)},
    }
    engine = CpuMeter.ENGINE
    cpu: dict[str, dict[str, Figure]] = {
        name: {"platform": ms, "Docker loop": "-"}
        for name, ms in platform_cpu.items() if name != engine}
    cpu["loop (this process)"] = {"platform": "-",
                                  "Docker loop": loop_cpu["loop (this process)"]}
    cpu["all but the engine"] = {
        "platform": sum(ms for name, ms in platform_cpu.items() if name != engine),
        "Docker loop": loop_cpu["loop (this process)"]}
    cpu[engine] = {"platform": platform_cpu[engine], "Docker loop": loop_cpu[engine]}
    ratio = rate / reference
    latency_ratio = percentile(in_platform, 0.5) / percentile(latencies, 0.5)
    return {
        "jobs": f"{jobs} x (1 task, 1 GPU, 1 CPU, {MEMORY_MB} MB, {COMMAND!r}) on {GPUS} GPUs",
        "reference": f"{GPUS} threads: create, start, wait, remove; run before and after "
                     f"the platform ({jobs / before_seconds:.1f} and "
                     f"{jobs / after_seconds:.1f} jobs/s), counted as one run",
        "throughput": table,
        "loop container cycle (create to removed)": f"p50 {percentile(cycles, 0.5):.3f} s, "
                                                    f"p99 {percentile(cycles, 0.99):.3f} s",
        "CPU ms per job": cpu,
        "ratio jobs/s vs reference": ratio,
        f"ratio vs target {TARGET_RATIO}": ratio / TARGET_RATIO,
        "ratio p50 job latency vs reference": latency_ratio,
        f"ratio p50 job latency vs target {TARGET_LATENCY_RATIO}":
            latency_ratio / TARGET_LATENCY_RATIO,
    }
