"""A trace simulator on the real scheduling policy: `make bench-sim`.

Replays a workload through `services.scheduler.policy.plan` (and the
`fifo_plan` baseline) with simulated time: no Redis, no Docker, no clock.
The cluster, the running jobs and the queue are rebuilt as the policy's own
snapshot types at every event; placements start jobs, preemptions stop
their victims at the end of the grace period (the work since the start is
lost: a pessimistic job that never checkpoints) and requeue them at their
old place, with the GPU time they had attained (the policy's order within a
class reads it, as the service reads it from the attempt records). One
JSON line per policy: mean and p99 job completion time (JCT = end -
submit), mean wait, GPU utilisation, preemptions, and per VC the share of
its guarantee it held while it had work, each with a `ratio` against FIFO
on the same trace.

The workload (`generate`) is synthetic, shaped after what the published
analyses of production deep-learning clusters report (Microsoft's Philly,
Jeon et al., USENIX ATC 2019; SenseTime's Helios, Hu et al., SC 2021):
most jobs use one GPU while a few large gangs hold much of the GPU time,
durations are heavy-tailed (most jobs minutes, a few days), several teams
of unequal size share the cluster, and arrivals are bursty enough that a
queue forms. The exact mix below is this module's approximation, not those
papers' figures (docs/scheduling.md lists it).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.scheduler.core import Cluster, JobRequest, NodeFree, TaskRequest
from services.scheduler.decisions import Attained, Plan, RunningJob
from services.scheduler.policy import fifo_plan, plan
from shared.domain.cluster import VcPolicy
from shared.domain.models import Allocation
from shared.domain.priority import PriorityClass

SEED = 20261125
NODES = 64
GPUS_PER_NODE = 8
GRACE_S = 30
MAX_EVENTS = 1_000_000

# (share of jobs, GPUs per task, tasks): single GPUs dominate the count,
# 8-GPU tasks and multi-node gangs the GPU time.
SIZES = ((0.62, 1, 1), (0.13, 2, 1), (0.10, 4, 1), (0.09, 8, 1), (0.04, 8, 2),
         (0.02, 8, 4))
# Log-normal durations: median 12 minutes, a long tail, cut at one day.
MEDIAN_S, SIGMA, MAX_S = 720.0, 1.6, 86400.0
# team -> (guarantee in GPUs, share of the submissions)
TEAMS = {"vision": (192, 0.40), "speech": (128, 0.25), "nlp": (96, 0.20),
         "default": (96, 0.15)}
CLASSES = ((0.10, PriorityClass.PROD), (0.80, PriorityClass.TEST), (0.10, PriorityClass.OPPO))
LOAD = 2.0  # offered GPU time / capacity over the arrival period


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    submit_s: float
    vc: str
    priority: PriorityClass
    gpus_per_task: int
    tasks: int
    duration_s: float

    @property
    def gpus(self) -> int:
        return self.gpus_per_task * self.tasks


def _pick(rng: random.Random, weighted: Sequence[tuple[Any, ...]]) -> Any:
    """One of `weighted`'s (weight, value...) rows by weight: its value, or
    its values when there are several."""
    row = rng.choices(weighted, [w[0] for w in weighted])[0]
    return row[1:] if len(row) > 2 else row[1]


def generate(jobs: int, seed: int = SEED, nodes: int = NODES) -> list[TraceJob]:
    """`jobs` jobs with Poisson arrivals paced so the offered GPU time is
    LOAD times what `nodes` nodes can serve. Deterministic for a seed."""
    rng = random.Random(seed)
    drawn = []
    for i in range(jobs):
        gpus, tasks = _pick(rng, SIZES)
        duration = min(MAX_S, max(30.0, rng.lognormvariate(math.log(MEDIAN_S), SIGMA)))
        team = rng.choices(list(TEAMS), [share for _, share in TEAMS.values()])[0]
        drawn.append((f"job-{i:05d}", team, _pick(rng, CLASSES), gpus, tasks, duration))
    work = sum(g * t * d for _, _, _, g, t, d in drawn)
    rate = len(drawn) / (work / (nodes * GPUS_PER_NODE * LOAD))  # jobs per second
    now, trace = 0.0, []
    for job_id, team, priority, gpus, tasks, duration in drawn:
        now += rng.expovariate(rate)
        trace.append(TraceJob(job_id, now, team, priority, gpus, tasks, duration))
    return trace


def guarantees(nodes: int = NODES) -> dict[str, VcPolicy]:
    """TEAMS' guarantees, scaled to the cluster's size."""
    scale = nodes * GPUS_PER_NODE / sum(g for g, _ in TEAMS.values())
    return {team: VcPolicy(int(g * scale)) for team, (g, _) in TEAMS.items()}


@dataclass
class _Run:
    job: TraceJob
    attempt: int
    start_s: float
    allocations: tuple[Allocation, ...]
    mode: str
    preempted_by: str = ""
    deadline_s: float = 0.0


@dataclass
class Result:
    """What one policy did with a trace."""

    policy: str
    jct: dict[str, float] = field(default_factory=dict)  # job id -> end - submit
    wait: dict[str, float] = field(default_factory=dict)  # job id -> first start - submit
    busy_gpu_s: float = 0.0  # while jobs still arrive
    arrivals_s: float = 0.0  # the last submit
    makespan_s: float = 0.0
    preemptions: int = 0
    ends: dict[str, int] = field(default_factory=dict)  # job id -> times it ended
    # VC -> (seconds it had work, GPU-seconds held of min(guarantee, demand))
    entitled: dict[str, list[float]] = field(default_factory=dict)
    max_busy: int = 0  # most GPUs held at once (never above capacity)
    decisions: int = 0


Policy = Callable[[Cluster, list[JobRequest], list[RunningJob], dict[str, VcPolicy], int,
                   dict[str, Attained]], Plan]


def _fifo(cluster: Cluster, queue: list[JobRequest], running: list[RunningJob],
          vcs: dict[str, VcPolicy], now_ms: int, attained: dict[str, Attained]) -> Plan:
    return fifo_plan(cluster, queue)


POLICIES: dict[str, Policy] = {"fifo": _fifo, "pai": plan}


def simulate(trace: Sequence[TraceJob], policy: str, *, nodes: int = NODES,
             vcs: dict[str, VcPolicy] | None = None, grace_s: float = GRACE_S) -> Result:
    """Replay `trace` through one policy, event by event."""
    decide, vcs = POLICIES[policy], vcs if vcs is not None else guarantees(nodes)
    capacity = nodes * GPUS_PER_NODE
    free = {f"n{i:03d}": list(range(GPUS_PER_NODE)) for i in range(nodes)}
    queue: dict[str, tuple[TraceJob, int]] = {}  # waiting: job id -> (job, attempt)
    seq = {job.job_id: i for i, job in enumerate(trace)}
    running: dict[str, _Run] = {}
    # job id -> the GPU time its ended attempts ran, and when it queued again
    attained: dict[str, Attained] = {}
    result = Result(policy, arrivals_s=max((job.submit_s for job in trace), default=0.0))
    # (time, order, kind, job id, attempt): kinds "arrive", "end", "stop"
    events: list[tuple[float, int, str, str, int]] = []
    by_id = {job.job_id: job for job in trace}
    for job in trace:
        heapq.heappush(events, (job.submit_s, len(events), "arrive", job.job_id, 0))
    now, last = 0.0, 0.0
    for _ in range(MAX_EVENTS):
        if not events:
            break
        now = events[0][0]
        _account(result, running, queue, vcs, last, now)
        last = now
        while events and events[0][0] == now:
            _, _, kind, job_id, attempt = heapq.heappop(events)
            run = running.get(job_id)
            if kind == "arrive":
                queue[job_id] = (by_id[job_id], 0)
            elif run is None or run.attempt != attempt:
                continue  # an end or stop of an attempt that is over
            elif kind == "end":
                _release(free, running.pop(job_id))
                result.jct[job_id] = now - by_id[job_id].submit_s
                result.ends[job_id] = result.ends.get(job_id, 0) + 1
            elif kind == "stop":  # preempted: its work is lost, it queues again
                _release(free, running.pop(job_id))
                queue[job_id] = (run.job, attempt + 1)
                before = attained.get(job_id, Attained()).gpu_ms
                attained[job_id] = Attained(
                    before + run.job.gpus * int((now - run.start_s) * 1000), int(now * 1000))
                result.preemptions += 1
        if not queue:
            continue
        cluster = Cluster(NodeFree(name, "10.0.0.1", list(gpus), 64, 512_000, (15000, 15100),
                                   all_gpus=tuple(range(GPUS_PER_NODE)), cpus=64,
                                   memory_mb=512_000) for name, gpus in free.items())
        requests = [_request(job, attempt, seq[job.job_id]) for job, attempt in queue.values()]
        snapshot = [RunningJob(r.job.job_id, r.job.vc, r.job.priority, r.mode,
                               int(r.start_s * 1000), r.allocations, attempt=r.attempt,
                               grace_ms=int(grace_s * 1000), preempted_by=r.preempted_by,
                               preempt_deadline_ms=int(r.deadline_s * 1000) or None)
                    for r in running.values()]
        decided = decide(cluster, requests, snapshot, vcs, int(now * 1000),
                         {job_id: attained[job_id] for job_id in queue if job_id in attained})
        result.decisions += 1
        for placed in decided.placed:
            job, attempt = queue.pop(placed.request.job_id)
            allocations = tuple(
                Allocation(job.job_id, attempt, p.role, p.index, p.node, p.gpus, 0, 0, ())
                for p in placed.placements)
            for a in allocations:
                free[a.node] = [g for g in free[a.node] if g not in a.gpus]
            running[job.job_id] = _Run(job, attempt, now, allocations, placed.mode)
            result.wait.setdefault(job.job_id, now - job.submit_s)
            heapq.heappush(events, (now + job.duration_s, len(events), "end", job.job_id,
                                    attempt))
        for job_id, mode in decided.modes.items():
            running[job_id].mode = mode
        for preemption in decided.preempt:
            victim = running[preemption.victim.job_id]
            victim.preempted_by, victim.deadline_s = preemption.by, now + grace_s
            heapq.heappush(events, (now + grace_s, len(events), "stop", victim.job.job_id,
                                    victim.attempt))
        held = capacity - sum(len(g) for g in free.values())
        result.max_busy = max(result.max_busy, held)
    result.makespan_s = now
    return result


def _request(job: TraceJob, attempt: int, seq: int) -> JobRequest:
    tasks = tuple(TaskRequest("worker", i, 1, 1000, job.gpus_per_task)
                  for i in range(job.tasks))
    return JobRequest(job.job_id, attempt, attempt, tasks, job.vc, job.priority, seq)


def _release(free: dict[str, list[int]], run: _Run) -> None:
    for a in run.allocations:
        free[a.node] = sorted(free[a.node] + list(a.gpus))


def _account(result: Result, running: dict[str, _Run], queue: dict[str, tuple[TraceJob, int]],
             vcs: dict[str, VcPolicy], start: float, end: float) -> None:
    """Charge the interval [start, end) to the GPUs held and to each VC's
    entitlement: while a VC has work waiting, it is owed min(guarantee,
    what it holds plus what it waits for)."""
    span = end - start
    if span <= 0:
        return
    arriving = max(0.0, min(end, result.arrivals_s) - start)
    held: dict[str, int] = {}
    for run in running.values():
        gpus = sum(len(a.gpus) for a in run.allocations)
        held[run.job.vc] = held.get(run.job.vc, 0) + gpus
        result.busy_gpu_s += gpus * arriving
    waiting: dict[str, int] = {}
    for job, _ in queue.values():
        if job.priority != PriorityClass.OPPO:  # oppo work is owed nothing
            waiting[job.vc] = waiting.get(job.vc, 0) + job.gpus
    for vc, wants in waiting.items():
        owed = min(vcs.get(vc, VcPolicy(0)).guarantee, held.get(vc, 0) + wants)
        if owed <= 0:
            continue
        seconds, got = result.entitled.setdefault(vc, [0.0, 0.0])
        result.entitled[vc] = [seconds + span, got + min(held.get(vc, 0), owed) / owed * span]


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)] if ordered else 0.0


def summary(result: Result, nodes: int = NODES) -> dict[str, Any]:
    jct = list(result.jct.values())
    return {
        "policy": result.policy,
        "jobs": len(jct),
        "mean_jct_s": sum(jct) / len(jct) if jct else 0.0,
        "p99_jct_s": _p99(jct),
        "mean_wait_s": sum(result.wait.values()) / len(result.wait) if result.wait else 0.0,
        # busy GPUs / all GPUs while jobs still arrive (the tail after the
        # last arrival drains with less and less to run)
        "gpu_utilisation": result.busy_gpu_s / (nodes * GPUS_PER_NODE * result.arrivals_s)
        if result.arrivals_s else 0.0,
        "preemptions": result.preemptions,
        # VC -> its mean share of what it was owed while it had work
        "vc_share_of_guarantee": {vc: got / seconds
                                  for vc, (seconds, got) in sorted(result.entitled.items())},
    }


def report(trace: Sequence[TraceJob], nodes: int = NODES) -> list[dict[str, Any]]:
    """One line per policy, with ratios against FIFO on the same trace."""
    lines = []
    baseline: dict[str, Any] | None = None
    for name in POLICIES:
        started = time.perf_counter()
        line = summary(simulate(trace, name, nodes=nodes), nodes)
        line["simulated_in_s"] = time.perf_counter() - started
        if baseline is None:
            baseline = line
        line["ratio"] = {key: line[key] / baseline[key] if baseline[key] else None
                         for key in ("mean_jct_s", "p99_jct_s", "mean_wait_s",
                                     "gpu_utilisation")}
        shares = line["vc_share_of_guarantee"]
        line["min_vc_share_of_guarantee"] = min(shares.values()) if shares else None
        lines.append(line)
    return lines


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2500)
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    trace = generate(args.jobs, args.seed, args.nodes)
    for line in report(trace, args.nodes):
        print(json.dumps({"seed": args.seed, "nodes": args.nodes, **_rounded(line)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
