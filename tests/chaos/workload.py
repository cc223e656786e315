"""The chaos run's jobs: each with the final state its script determines.

Pure: a seed gives the same jobs every time. Every task first appends one
line to `<outputDir>/runs/<attempt>-<role>-<index>` (a run marker), so the
audit can count how often each task of each attempt really started; then it
does what its kind says:

- `ok`: sleeps a little and exits 0 -> SUCCEEDED;
- `retry` (retryCount 1): its first attempt that gets to run the script
  fails, the next succeeds -> SUCCEEDED. Whether an attempt "got to run" is a
  file in outputDir, so a platform failure before it (a lost node, a
  vanished container) is not a failure of the job's, and since those are
  not charged to retryCount the job still succeeds;
- `fail` (retryCount 1): always exits 7 -> FAILED after two charged attempts;
- `stop`: sleeps for ever; the run stops it once it is RUNNING -> STOPPED;
- `killall`: three tasks, killAllOnCompletedTaskNumber 1, task 0 ends at once
  and the others sleep for ever -> SUCCEEDED;
- `gang`: two tasks of more GPUs than half a node, so one per node
  -> SUCCEEDED (a gang across both nodes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

KINDS = (("ok", 0.42), ("retry", 0.14), ("fail", 0.10), ("stop", 0.10),
         ("killall", 0.12), ("gang", 0.12))
EXPECTED = {"ok": "SUCCEEDED", "retry": "SUCCEEDED", "fail": "FAILED", "stop": "STOPPED",
            "killall": "SUCCEEDED", "gang": "SUCCEEDED"}
# Charged retries each kind ends with (platform failures are not charged).
CHARGED = {"ok": 0, "retry": 1, "fail": 1, "stop": 0, "killall": 0, "gang": 0}
FOREVER = "sleep 100000"
RUNS = "runs"

MARK = ('r="$PAI_OUTPUT_DIR/' + RUNS + '"; mkdir -p "$r"; '
        'echo "$PAI_CURRENT_CONTAINER_PORT $CUDA_VISIBLE_DEVICES" >> '
        '"$r/$PAI_JOB_ATTEMPT_ID-$PAI_CURRENT_TASK_ROLE_NAME-'
        '$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX"; ')


@dataclass(frozen=True)
class ChaosJob:
    name: str
    kind: str
    config: dict[str, Any]

    @property
    def expected_state(self) -> str:
        return EXPECTED[self.kind]

    @property
    def charged_retries(self) -> int:
        return CHARGED[self.kind]


def _role(name: str, command: str, *, tasks: int = 1, gpus: int = 0) -> dict[str, Any]:
    return {"name": name, "taskNumber": tasks, "cpuNumber": 1, "memoryMB": 100,
            "gpuNumber": gpus, "command": MARK + command}


def _short(rng: random.Random) -> str:
    return f"sleep {rng.choice(('0.2', '0.5', '1', '2'))}"


def chaos_job(rng: random.Random, seed: int, number: int, kind: str, image: str,
              gpus_per_node: int) -> ChaosJob:
    config: dict[str, Any] = {"jobName": f"chaos-{seed}-{number:03d}-{kind}", "image": image,
                              "retryCount": 0}
    if kind == "ok":
        config["taskRoles"] = [_role("main", _short(rng) + "; echo done",
                                     gpus=rng.choice((0, 1, 1, 2)))]
    elif kind == "retry":
        config["retryCount"] = 1
        config["taskRoles"] = [_role("main", _short(rng) + '; [ -e "$r/failed" ] && exit 0; '
                                     'touch "$r/failed"; exit 3', gpus=rng.choice((0, 1)))]
    elif kind == "fail":
        config["retryCount"] = 1
        config["taskRoles"] = [_role("main", _short(rng) + "; exit 7", gpus=rng.choice((0, 1)))]
    elif kind == "stop":
        config["taskRoles"] = [_role("main", FOREVER, gpus=rng.choice((0, 1)))]
    elif kind == "killall":
        config["killAllOnCompletedTaskNumber"] = 1
        config["taskRoles"] = [_role(
            "worker", '[ "$PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX" = 0 ] && { '
            + _short(rng) + "; exit 0; }; " + FOREVER, tasks=3, gpus=1)]
    elif kind == "gang":
        config["taskRoles"] = [_role("worker", _short(rng), tasks=2,
                                     gpus=gpus_per_node // 2 + 1)]
    else:
        raise ValueError(f"no such kind: {kind}")
    return ChaosJob(config["jobName"], kind, config)


def workload(seed: int, count: int, image: str, gpus_per_node: int) -> list[ChaosJob]:
    """`count` jobs, kinds drawn by KINDS' weights; each kind at least once."""
    rng = random.Random(seed)
    kinds = [kind for kind, _ in KINDS]
    drawn = kinds + rng.choices(kinds, [w for _, w in KINDS], k=max(0, count - len(kinds)))
    rng.shuffle(drawn)
    return [chaos_job(rng, seed, i, kind, image, gpus_per_node)
            for i, kind in enumerate(drawn[:max(count, len(kinds))])]


@dataclass(frozen=True)
class Fault:
    """At `at_s` into the run, kill -9 `target` and start it `down_s` later.

    Targets are "redis", "api", "scheduler", or "launcher#i" / "monitor#i":
    a service of the i-th live node at that moment. "lose" kills the machine
    of the live node running the most tasks then, for good."""

    at_s: float
    target: str
    down_s: float


SERVICE_TARGETS = ("redis", "api", "scheduler", "launcher#0", "monitor#0", "launcher#1",
                   "monitor#1")


def fault_plan(seed: int, seconds: float, *, first_s: float = 4.0) -> list[Fault]:
    """kill -9s every 2-6 s over `seconds`, and one node lost for good in the
    middle of the run. Deterministic for a seed."""
    rng = random.Random(seed * 7919 + 1)
    plan, at = [], first_s
    while at < seconds:
        plan.append(Fault(round(at, 2), rng.choice(SERVICE_TARGETS),
                          round(rng.uniform(0.3, 3.0), 2)))
        at += rng.uniform(2.0, 6.0)
    plan.append(Fault(round(seconds * rng.uniform(0.35, 0.55), 2), "lose", 0.0))
    return sorted(plan, key=lambda f: f.at_s)
