"""Task logs on the real platform: a 100,000-line job, tails of it, and follow latency.

The platform runs as processes (bench/live_platform.py: api, scheduler,
launcher, monitor on a throwaway Redis and the Docker engine DOCKER_HOST
names), with its default log bound (PAI_LOG_MAX_LINES = 100,000).

- Shipping: a job runs `seq 1 100000`; the figure is the time from submit
  until the last line is in the task's stream, where the API reads it (its
  newest entry asked for every 5 ms; `GET .../log?tail=1` then must answer
  `100000`), beside a bare Docker SDK run of the same command in the same
  image until the container exited (create, start, run, wait); and the
  engine's own floor for any shipper: the same run with its log followed
  through the engine's API from the start, read as fast as it comes and
  thrown away, until the last line arrived.
- Tails: `GET .../log?tail=N` of that finished job, every answer checked
  line by line (the last N numbers), beside a bare XRANGE with redis-py of
  the stream's entries that hold those lines (an entry holds a shipped batch
  of lines: shared/state/logstream.py), in the same run.
- Follow: a job prints 300 lines, one every ~30 ms, each carrying the time it
  was printed (the kernel's boot-time clock, /proc/uptime: 10 ms steps, so a
  latency reads up to 10 ms high); a client follows the log as server-sent
  events from before the container starts and notes when each line arrives.
  Beside it, the same script in a bare container followed with the Docker
  SDK's `logs(stream=True, follow=True)`: the engine's own delivery, which
  the platform's log shipping reads from.

Nothing is asserted; docs/performance-log.md records the figures.
"""

from __future__ import annotations

import os
import platform as host
import time
import uuid
from collections.abc import Iterator

import redis

from bench import BenchError, Figure, Figures, percentile, throwaway_redis, time_calls
from bench.live_platform import (
    BENCH_LABEL,
    TEST_IMAGE,
    USER,
    Platform,
    docker_engine,
    running_platform,
    wait_for,
)
from shared.node.engine import EngineCalls
from shared.state import keys, logstream
from shared.state.store import Store

LINES = 100_000
TAILS = (100, 1_000, 10_000, 100_000)
TAIL_REQUESTS = {100: 50, 1_000: 50, 10_000: 20, 100_000: 10}
FOLLOW_LINES = 300
# Each line: "<uptime seconds> <n>", printed about every 30 ms.
FOLLOW_SCRIPT = (f"i=0; while [ $i -lt {FOLLOW_LINES} ]; do i=$((i+1)); "
                 "read up idle < /proc/uptime; echo \"$up $i\"; sleep 0.03; done")
WAIT_SECONDS = 300.0
SHIP_POLL_SECONDS = 0.005


def boot_seconds() -> float:
    """The clock /proc/uptime shows (CLOCK_BOOTTIME), here and in every container."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


# ------------------------------------------------------------------ shipping


def ship(pai: Platform, redis_url: str) -> tuple[str, float]:
    """Submit the 100,000-line job; seconds until its last line is readable:
    in its stream, where the API reads it, then checked through the API. The
    stream's newest entry is asked for every SHIP_POLL_SECONDS (about 0.1 ms
    of Redis each), not an API request every 50 ms: one would round the
    figure up by up to 50 ms, the other would take a core's share from the
    run it measures."""
    name = f"loud-{uuid.uuid4().hex[:6]}"
    key = keys.task_log(f"{USER}~{name}", 0, "main", 0)
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        start = time.perf_counter()
        pai.submit_accepted(pai.config(name, f"seq 1 {LINES}"))
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            newest = client.xrevrange(key, count=1)
            if newest and logstream.entry_lines(newest[0])[-1][1] == str(LINES):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"the last line was not shipped in {WAIT_SECONDS:.0f} s")
            time.sleep(SHIP_POLL_SECONDS)
        seconds = time.perf_counter() - start
    if pai.log(name, "main", tail=1).splitlines() != [str(LINES)]:
        raise BenchError("the last line shipped is not the API's tail=1")
    wait_for(lambda: pai.detail(name)["jobStatus"]["state"] == "SUCCEEDED", WAIT_SECONDS,
             "the job to succeed", interval=0.02)
    return name, seconds


def bare_run_seconds(command: str, *, follow_log: bool = False) -> float:
    """Seconds from create until the bare container exited or, with
    `follow_log`, until the engine's follow of its log handed over its last
    byte (read in HTTP/1.0 blocks, as the monitor reads it)."""
    client = docker_engine()
    engine = EngineCalls(client)
    container = None
    try:
        start = time.perf_counter()
        container = client.containers.run(TEST_IMAGE, ["/bin/sh", "-c", command], detach=True,
                                          labels={BENCH_LABEL: uuid.uuid4().hex[:8]},
                                          network_mode="host")
        if follow_log:
            response = engine.follow_log(str(container.id))
            try:
                while response.read1(1 << 16):
                    pass
            finally:
                response.close()
        else:
            container.wait(timeout=WAIT_SECONDS)
        return time.perf_counter() - start
    finally:
        if container is not None:
            container.remove(force=True)
        engine.close()
        client.close()


# --------------------------------------------------------------------- tails


def tails(pai: Platform, name: str, redis_url: str) -> tuple[dict[str, dict[str, Figure]], int]:
    """Timed, checked tails of the finished job; and how many lines its stream keeps."""
    key = keys.task_log(f"{USER}~{name}", 0, "main", 0)
    table: dict[str, dict[str, Figure]] = {}
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        legacy = logstream.is_legacy(client.xrevrange(key, count=1)[0])  # a tree before it
        for lines in TAILS:
            expected = [str(n) for n in range(LINES - lines + 1, LINES + 1)]

            def checked(lines: int = lines, expected: list[str] = expected) -> None:
                if pai.log(name, "main", tail=lines).splitlines() != expected:
                    raise BenchError(f"tail={lines} did not answer the last {lines} lines")

            def bare_read(n: int = lines) -> object:  # the entries holding them
                if legacy:
                    return client.xrevrange(key, count=n)
                return client.xrange(key, min=f"(0-{LINES - n}")

            samples = time_calls(checked, TAIL_REQUESTS[lines], warmup=1)
            bare = time_calls(bare_read, TAIL_REQUESTS[lines], warmup=1)
            table[f"tail={lines}"] = {
                "p50 ms": percentile(samples, 0.5), "p99 ms": percentile(samples, 0.99),
                "XRANGE p50 ms": percentile(bare, 0.5),
                "ratio p50": percentile(samples, 0.5) / percentile(bare, 0.5)}
        kept, _added = Store(client).log_extent(f"{USER}~{name}", 0, "main", 0)
    return table, kept


# -------------------------------------------------------------------- follow


def _printed_at(line: str) -> float | None:
    stamp, _, _number = line.partition(" ")
    try:
        return float(stamp)
    except ValueError:
        return None


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    for raw in lines:
        if raw.startswith("event: end"):
            return
        if raw.startswith("data: "):
            yield raw[len("data: "):]


def follow_latencies(pai: Platform) -> list[float]:
    """Milliseconds from print to receipt of each line, following through the API."""
    name = f"ticks-{uuid.uuid4().hex[:6]}"
    pai.submit_accepted(pai.config(name, FOLLOW_SCRIPT))
    latencies = []
    with pai.http.get(pai.log_url(name), params={"follow": 1, "tail": 0}, stream=True,
                      timeout=WAIT_SECONDS) as resp:
        resp.raise_for_status()
        for line in _sse_data(resp.iter_lines(decode_unicode=True)):
            received = boot_seconds()
            printed = _printed_at(line)
            if printed is not None:
                latencies.append((received - printed) * 1000)
    if len(latencies) < FOLLOW_LINES * 0.9:
        raise BenchError(f"follow received {len(latencies)} of {FOLLOW_LINES} lines")
    return latencies


def bare_follow_latencies() -> list[float]:
    """The same, reading the container's log from the engine directly."""
    client = docker_engine()
    container = client.containers.run(TEST_IMAGE, ["/bin/sh", "-c", FOLLOW_SCRIPT], detach=True,
                                      labels={"pai.bench": uuid.uuid4().hex[:8]},
                                      network_mode="host")
    latencies = []
    try:
        pending = b""
        for chunk in container.logs(stream=True, follow=True):
            received = boot_seconds()
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                printed = _printed_at(raw.decode(errors="replace"))
                if printed is not None:
                    latencies.append((received - printed) * 1000)
    finally:
        container.remove(force=True)
        client.close()
    return latencies


def _summary(samples: list[float]) -> dict[str, Figure]:
    return {"lines": len(samples), "p50 ms": percentile(samples, 0.5),
            "p99 ms": percentile(samples, 0.99), "max ms": max(samples)}


def run() -> Figures:
    with throwaway_redis() as url, running_platform(url) as pai:
        name, ship_seconds = ship(pai, url)
        bare_seconds = bare_run_seconds(f"seq 1 {LINES}")
        engine_seconds = bare_run_seconds(f"seq 1 {LINES}", follow_log=True)
        tail_table, stream_length = tails(pai, name, url)
        platform_follow = follow_latencies(pai)
    bare_follow = bare_follow_latencies()
    follow = {"through the API (SSE)": _summary(platform_follow),
              "bare docker logs --follow": _summary(bare_follow)}
    return {
        "machine": f"{os.cpu_count()} CPUs, Python {host.python_version()}",
        "lines": LINES,
        "submit -> last line readable s": ship_seconds,
        "bare docker run of the job s": bare_seconds,
        "ratio": ship_seconds / bare_seconds,
        "bare run, its log followed to the end s": engine_seconds,
        "ratio to the engine's follow": ship_seconds / engine_seconds,
        "stream length (bound 100,000)": stream_length,
        "GET .../log?tail=N (checked)": tail_table,
        "follow: print -> receipt": follow,
    }
