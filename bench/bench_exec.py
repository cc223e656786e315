"""Exec round trip on an idle node, beside bare Docker.

The whole platform runs as processes (bench/live_platform.py) on a
throwaway Redis and the Docker engine DOCKER_HOST names. One job of one task
(`sleep 3600`) runs; then, alternating, one at a time:

- platform: `POST /api/v1/user/alice/jobs/<job>/tasks/main/0/exec` with
  `["true"]`, timed from just before the request to the answer (API, the
  request and its call on the node's stream written with the caller's lease
  in one script, the launcher's claim, checks, Docker exec, answer through
  Redis, BLPOP);
- reference: the Docker SDK's exec_create + exec_start + exec_inspect of the
  same command in the same container, as the launcher makes them.

PAI_BENCH_ROUNDS overrides the 50 rounds of each. Besides the ratio of the
two p50s (the target's), it prints what the platform adds in paired rounds
(each exec through the platform minus the bare one after it), which a drift
of the engine's pace within the run moves less.
"""

from __future__ import annotations

import os
import time

from bench import BenchError, Figures, latency_figures, percentile
from bench.live_platform import USER, one_task_running

ROUNDS = 50
WARMUP = 3
JOB = "exec-bench"


def run() -> Figures:
    rounds = int(os.environ.get("PAI_BENCH_ROUNDS", ROUNDS))
    with one_task_running(JOB) as (pai, container):
        api = pai.docker.api  # type: ignore[union-attr]
        exec_url = f"{pai.url}/api/v1/user/{USER}/jobs/{JOB}/tasks/main/0/exec"

        def through_platform() -> float:
            start = time.perf_counter()
            resp = pai.http.post(exec_url, json={"command": ["true"]}, timeout=60)
            took = (time.perf_counter() - start) * 1000
            if resp.status_code != 200 or resp.json()["exitCode"] != 0:
                raise BenchError(f"exec answered {resp.status_code}: {resp.text[:200]}")
            return took

        def bare_docker() -> float:
            start = time.perf_counter()
            exec_id = api.exec_create(container.id, ["true"])["Id"]
            api.exec_start(exec_id)
            code = api.exec_inspect(exec_id)["ExitCode"]
            took = (time.perf_counter() - start) * 1000
            if code != 0:
                raise BenchError(f"bare exec exited {code}")
            return took

        for _ in range(WARMUP):
            through_platform()
            bare_docker()
        platform, reference = [], []
        for _ in range(rounds):
            platform.append(through_platform())
            reference.append(bare_docker())
        pai.stop(JOB)
    # Each platform exec against the bare one right after it: the engine's
    # pace drifts by milliseconds within a run, which moves both p50s; the
    # paired differences show what the platform adds with less of that drift.
    added = [ours - bare for ours, bare in zip(platform, reference, strict=True)]
    return {
        "rounds": f"{rounds} of each, alternating, idle node, command ['true']",
        "exec round trip": {"platform (POST .../exec)": latency_figures(platform),
                            "bare Docker SDK exec (reference)": latency_figures(reference)},
        "ratio p50 platform vs reference": percentile(platform, 0.5)
        / percentile(reference, 0.5),
        "added by the platform, ms: median of paired rounds": percentile(added, 0.5),
        "added by the platform, ms: mean of paired rounds": sum(added) / len(added),
    }
