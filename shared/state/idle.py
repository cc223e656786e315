"""Idle GPUs: a task holding GPUs it does not use, decided in one place.

A task is idle from the first of an unbroken run of samples
(shared/state/tasksamples.py) in which every GPU it holds is known and below
PAI_IDLE_GPU_PERCENT. Once that run is PAI_IDLE_GPU_SECONDS long the task
is flagged: job detail shows `idleSince`, the portal's home page lists it,
the node exporter serves pai_task_gpu_idle_seconds for it. A VC
whose `idleGpuAction` is `stop` has such a task's job stopped once it stayed
idle a further PAI_IDLE_GPU_GRACE_SECONDS, through the normal stop path,
with the reason in its diagnostics; `notify` (the default) only flags.

A sample with any GPU unknown ends the run (unknown is not idle), as does
any GPU at or above the threshold. A task with no GPUs is never idle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.domain.exits import STOPPED_BY_PLATFORM
from shared.domain.models import Task, attempt_task_key, parse_attempt_task_key
from shared.domain.states import TaskState
from shared.state import keys, tasksamples
from shared.state.tasksamples import Sample


class IdleAction(StrEnum):
    NOTIFY = "notify"
    STOP = "stop"


@dataclass(frozen=True)
class IdlePolicy:
    percent: float = 5.0
    window_ms: int = 1_800_000
    grace_ms: int = 1_800_000
    action: IdleAction = IdleAction.NOTIFY


@dataclass(frozen=True)
class Verdict:
    since_ms: int | None  # start of the current idle run; None: not idle now
    flagged: bool  # idle for the whole window
    stop: bool  # and for the grace after it, in a VC that stops idle jobs


def is_idle(sample: Sample, percent: float) -> bool:
    gpus = sample.gpu_percent
    return bool(gpus) and all(p is not None and p < percent for p in gpus)


def idle_run(since_ms: int | None, samples: Iterable[Sample], percent: float) -> int | None:
    """Fold samples (oldest first) into the idle run's start: `since_ms` is
    the start before them (None: not idle)."""
    for sample in samples:
        if not is_idle(sample, percent):
            since_ms = None
        elif since_ms is None:
            since_ms = sample.time_ms
    return since_ms


def verdict(since_ms: int | None, now_ms: int, policy: IdlePolicy) -> Verdict:
    if since_ms is None:
        return Verdict(None, False, False)
    idle_for = now_ms - since_ms
    flagged = idle_for >= policy.window_ms
    stop = (flagged and policy.action == IdleAction.STOP
            and idle_for >= policy.window_ms + policy.grace_ms)
    return Verdict(since_ms, flagged, stop)


def decide(since_ms: int | None, samples: Iterable[Sample], now_ms: int,
           policy: IdlePolicy) -> Verdict:
    """Samples in, flag and stop out: the run so far, extended by `samples`."""
    return verdict(idle_run(since_ms, samples, policy.percent), now_ms, policy)


def stop_reason(since_ms: int, policy: IdlePolicy) -> str:
    return (f"{STOPPED_BY_PLATFORM}its GPUs stayed below {policy.percent:g}% "
            f"utilisation for {(policy.window_ms + policy.grace_ms) // 1000} s "
            f"(idle since {since_ms} ms; the VC's idleGpuAction is stop)")


# ------------------------------------------- a node's runs and samples (Redis)


def idle_runs(reader: Any, node: str) -> dict[str, int]:
    """Attempt task key -> start of its idle run, as the node's monitor last judged."""
    return {key: int(raw) for key, raw in (reader.hgetall(keys.idle_tasks(node)) or {}).items()
            if str(raw).isdigit()}


@dataclass(frozen=True)
class SampleTaken:
    job_id: str
    attempt: int
    role: str
    index: int
    sample: Sample


def keep_round(client: Any, node: str, taken: Iterable[SampleTaken], runs: dict[str, int],
               maxlen: int) -> None:
    """One sampling round of a node: each task's sample on its stream, and the
    node's idle runs replaced by `runs`, in one MULTI (a reader never sees the
    idle hash half rewritten)."""
    pipe = client.pipeline()
    for one in taken:
        tasksamples.add(pipe, one.job_id, one.attempt, one.role, one.index, one.sample, maxlen)
    pipe.delete(keys.idle_tasks(node))
    if runs:
        pipe.hset(keys.idle_tasks(node), mapping={k: str(v) for k, v in runs.items()})
    pipe.execute()


# ------------------------------------------------- reading the flags (Redis)


def flagged_tasks(reader: Any, job_id: str, attempt: int, tasks: Iterable[Task], now_ms: int,
                  window_ms: int) -> dict[tuple[str, int], int]:
    """(role, index) -> idleSince of the job's running tasks flagged idle now,
    as their nodes' monitors last judged them (keys.idle_tasks)."""
    running = [t for t in tasks if t.state == TaskState.RUNNING and t.node]
    if not running:
        return {}
    pipe = reader.pipeline(transaction=False)
    for task in running:
        pipe.hget(keys.idle_tasks(task.node or ""),
                  attempt_task_key(job_id, attempt, task.role, task.index))
    found = {}
    for task, raw in zip(running, pipe.execute(), strict=True):
        if raw and str(raw).isdigit() and now_ms - int(raw) >= window_ms:
            found[(task.role, task.index)] = int(raw)
    return found


@dataclass(frozen=True)
class IdleTask:
    node: str
    job_id: str
    attempt: int
    role: str
    index: int
    since_ms: int


def flagged_on(reader: Any, nodes: Iterable[str], now_ms: int,
               window_ms: int) -> list[IdleTask]:
    """Every task flagged idle on these nodes, longest idle first (the portal's home)."""
    names = list(nodes)
    if not names:
        return []
    pipe = reader.pipeline(transaction=False)
    for node in names:
        pipe.hgetall(keys.idle_tasks(node))
    found = []
    for node, fields in zip(names, pipe.execute(), strict=True):
        for key, raw in (fields or {}).items():
            if str(raw).isdigit() and now_ms - int(raw) >= window_ms:
                job_id, attempt, role, index = parse_attempt_task_key(key)
                found.append(IdleTask(node, job_id, attempt, role, index, int(raw)))
    return sorted(found, key=lambda t: (t.since_ms, t.job_id, t.role, t.index))
