"""Submit -> task container running, on an idle node, beside bare Docker.

The whole platform runs as processes (api, scheduler, launcher, monitor of one
8-GPU node; bench/live_platform.py) on a throwaway Redis and the Docker engine
DOCKER_HOST names. Rounds alternate between the platform and the reference,
one job at a time, each on an idle node (the previous job has ended):

- platform: t0 just before `POST /api/v1/user/alice/jobs` (a one-task job on
  the test image: 1 CPU, 256 MB, `sleep 1`), t1 the container's
  `State.StartedAt` (docker inspect, as soon as Docker reports the start);
- reference: t0 just before a bare Docker SDK `containers.create` + `start`
  of the same image and command with the launcher's flags (host network,
  CPU/memory/shm limits, init, labels, the output bind mount), t1 its
  `State.StartedAt` the same way.

Both are times on this machine's one clock. The platform's rounds also say
where the time went: the submit's HTTP answer, the placement (the task's
launchedTime), the container start, and when the API recorded RUNNING
(startedTime, set by the monitor).

Then 20 runs of examples/hello-world.json (its own echo command), one after
another: submit -> RUNNING as the API records it (startedTime - t0) and as
a client polling `GET .../jobs/<name>` every 10 ms first sees it.

PAI_BENCH_ROUNDS overrides the 20 rounds of each.
"""

from __future__ import annotations

import calendar
import json
import os
import queue
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker

from bench import BenchError, Figure, Figures, percentile, throwaway_redis
from bench.live_platform import (
    REPO,
    TEST_IMAGE,
    Platform,
    bare_container,
    reference_engine,
    running_platform,
)

ROUNDS = 20
COMMAND = "sleep 1"
MEMORY_MB = 256
SHM_MB = 64
POLL_SECONDS = 0.01
JOB_SECONDS = 60.0
TARGET_RATIO = 1.3
TARGET_P99_S = 1.0
FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def started_at_ns(stamp: str) -> int:
    """Docker's RFC 3339 `StartedAt` (UTC, nanoseconds) as epoch nanoseconds."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return seconds * 10**9 + int((fraction + "000000000")[:9])


class StartWatch:
    """Docker's container start events, by the `pai.job` label or container name."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.stream = client.events(decode=True, filters={"type": "container",
                                                          "event": "start"})
        self.starts: queue.Queue[dict[str, Any]] = queue.Queue()
        self.thread = threading.Thread(target=self._follow, daemon=True,
                                       name="bench-docker-events")
        self.thread.start()

    def _follow(self) -> None:
        try:
            for event in self.stream:
                self.starts.put(event)
        except Exception:  # closed at the end
            return

    def wait(self, attribute: str, value: str, timeout: float) -> str:
        """The id of the container whose start event carries attribute=value."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"no container with {attribute}={value} started")
            try:
                event = self.starts.get(timeout=left)
            except queue.Empty:
                continue
            if (event.get("Actor", {}).get("Attributes") or {}).get(attribute) == value:
                return str(event["id"])

    def close(self) -> None:
        self.stream.close()


@contextmanager
def start_watch(client: docker.DockerClient) -> Iterator[StartWatch]:
    watch = StartWatch(client)
    try:
        yield watch
    finally:
        watch.close()


def reference_round(client: docker.DockerClient, watch: StartWatch, work_dir: Path,
                    run: str, number: int) -> float:
    """Seconds from before a bare create+start to the container's StartedAt."""
    output = work_dir / f"ref-output-{number}"
    output.mkdir()
    name = f"pai-bench-ref-{run}-{number}"
    labels = {"pai.job": f"reference~{number}", "pai.attempt": "0", "pai.role": "main",
              "pai.index": "0"}
    t0 = time.time_ns()
    container = bare_container(
        client, run, name, COMMAND, output, memory_mb=MEMORY_MB, shm_mb=SHM_MB, labels=labels,
        environment={"PAI_JOB_NAME": f"reference-{number}", "PAI_TASK_ROLE_NAME": "main"})
    container.start()
    watch.wait("name", name, JOB_SECONDS)
    started = started_at_ns(client.api.inspect_container(container.id)["State"]["StartedAt"])
    container.remove(force=True)
    return (started - t0) / 1e9


def wait_final(pai: Platform, name: str, interval: float = 0.05) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_SECONDS
    while time.monotonic() < deadline:
        detail = pai.detail(name)
        if detail["jobStatus"]["state"] in FINAL:
            return detail
        time.sleep(interval)
    raise BenchError(f"job {name} did not finish within {JOB_SECONDS:.0f} s")


def wait_gone(client: docker.DockerClient, container: str) -> None:
    """Until the monitor has removed the container: the next round finds the node idle."""
    deadline = time.monotonic() + JOB_SECONDS
    while time.monotonic() < deadline:
        try:
            client.api.inspect_container(container)
        except docker.errors.NotFound:
            return
        time.sleep(0.02)
    raise BenchError(f"container {container[:12]} was not removed")


def platform_round(pai: Platform, client: docker.DockerClient, watch: StartWatch,
                   number: int) -> dict[str, float]:
    """Seconds from before the submit to each milestone of the job's start."""
    name = f"latency-{number}"
    config = pai.config(name, COMMAND, memory_mb=MEMORY_MB)
    t0 = time.time_ns()
    pai.submit_accepted(config)
    answered = time.time_ns()
    container = watch.wait("pai.job", f"alice~{name}", JOB_SECONDS)
    started = started_at_ns(client.api.inspect_container(container)["State"]["StartedAt"])
    detail = wait_final(pai, name)
    if detail["jobStatus"]["state"] != "SUCCEEDED":
        raise BenchError(f"job {name} ended {detail['jobStatus']['state']}")
    wait_gone(client, container)
    task = detail["taskRoles"]["main"]["taskStatuses"][0]
    t0_ms = t0 / 1e6
    return {"submit answered": (answered - t0) / 1e9,
            "placed (launchedTime)": (task["launchedTime"] - t0_ms) / 1e3,
            "container StartedAt": (started - t0) / 1e9,
            "RUNNING recorded": (detail["jobStatus"]["startedTime"] - t0_ms) / 1e3}


def hello_world_round(pai: Platform, client: docker.DockerClient, watch: StartWatch,
                      number: int) -> tuple[float, float]:
    """(submit -> RUNNING recorded by the API, submit -> RUNNING seen by polling)."""
    config = json.loads((REPO / "examples" / "hello-world.json").read_text())
    config["jobName"] = name = f"hello-world-{number}"
    t0 = time.time()
    pai.submit_accepted(config)
    seen = None
    deadline = time.monotonic() + JOB_SECONDS
    while seen is None and time.monotonic() < deadline:
        status = pai.detail(name)["jobStatus"]
        if status["startedTime"] is not None or status["state"] in FINAL:
            seen = time.time() - t0
        else:
            time.sleep(POLL_SECONDS)
    detail = wait_final(pai, name)
    if seen is None or detail["jobStatus"]["state"] != "SUCCEEDED":
        raise BenchError(f"{name} ended {detail['jobStatus']['state']}")
    wait_gone(client, watch.wait("pai.job", f"alice~{name}", JOB_SECONDS))
    return detail["jobStatus"]["startedTime"] / 1e3 - t0, seen


def _stats(samples: list[float]) -> dict[str, Figure]:
    return {"p50 ms": percentile(samples, 0.5) * 1000, "p99 ms": percentile(samples, 0.99) * 1000,
            "min ms": min(samples) * 1000, "max ms": max(samples) * 1000}


def run() -> Figures:
    rounds = int(os.environ.get("PAI_BENCH_ROUNDS", ROUNDS))
    with reference_engine() as (client, run_label), throwaway_redis() as url, \
            tempfile.TemporaryDirectory(prefix="pai-bench-") as tmp, \
            running_platform(url) as pai, start_watch(client) as watch:
        # One untimed round of each: images and code paths warm.
        reference_round(client, watch, Path(tmp), run_label, -1)
        platform_round(pai, client, watch, -1)
        reference, milestones = [], []
        for number in range(rounds):
            reference.append(reference_round(client, watch, Path(tmp), run_label, number))
            milestones.append(platform_round(pai, client, watch, number))
        hello = [hello_world_round(pai, client, watch, number) for number in range(rounds)]
    started = [m["container StartedAt"] for m in milestones]
    table = {label: _stats([m[label] for m in milestones]) for label in milestones[0]}
    table["bare SDK create+start (reference)"] = _stats(reference)
    ratio = percentile(started, 0.5) / percentile(reference, 0.5)
    return {
        "rounds": f"{rounds} of each, alternating, idle node; p99 of {rounds} is the maximum",
        "job": f"1 task, 1 CPU, {MEMORY_MB} MB, {COMMAND!r}, {TEST_IMAGE}",
        "submit -> (seconds after t0)": table,
        "ratio p50 StartedAt vs reference": ratio,
        f"p50 ratio vs target {TARGET_RATIO}": ratio / TARGET_RATIO,
        f"p99 StartedAt vs target {TARGET_P99_S:.0f} s": percentile(started, 0.99)
        / TARGET_P99_S,
        "hello-world submit -> RUNNING": {
            "recorded (startedTime)": _stats([h[0] for h in hello]),
            f"seen polling every {POLL_SECONDS * 1000:.0f} ms": _stats([h[1] for h in hello]),
        },
    }
