"""The chaos run's invariants over what the platform recorded. Pure.

The job event streams say when each task of each attempt was given its GPUs
and ports (`placed`, with every task's node, GPUs and ports) and when the
platform settled it (`task-exit`); an allocation is released only after
that. Two tasks holding one GPU or one port of one node over overlapping
spans means the platform gave it twice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Held:
    """One task attempt holding one GPU or port of one node from `start` to `end` (ms)."""

    what: str  # "gpu 3" or "port 22001"
    node: str
    task: str  # job/attempt/role/index
    start: int
    end: float  # math.inf while never settled


def holdings(job_id: str, events: Sequence[Mapping[str, Any]]) -> list[Held]:
    """What each task of the job held, and for how long, from its events."""
    ends: dict[tuple[int, str, int], int] = {}
    for event in events:
        if event["kind"] == "task-exit":
            ends.setdefault((event["attempt"], event["role"], event["index"]), event["time"])
    held = []
    for event in events:
        if event["kind"] != "placed":
            continue
        for task in event.get("tasks", ()):
            key = (event["attempt"], task["role"], task["index"])
            end = ends.get(key, math.inf)
            name = f"{job_id}/{key[0]}/{key[1]}/{key[2]}"
            held += [Held(f"gpu {g}", task["node"], name, event["time"], end)
                     for g in task["gpus"]]
            held += [Held(f"port {p}", task["node"], name, event["time"], end)
                     for p in task["ports"]]
    return held


def overlaps(held: Iterable[Held]) -> list[str]:
    """Every pair of tasks that held the same GPU or port of a node at once."""
    by_resource: dict[tuple[str, str], list[Held]] = {}
    for h in held:
        by_resource.setdefault((h.node, h.what), []).append(h)
    found = []
    for (node, what), spans in sorted(by_resource.items()):
        spans.sort(key=lambda h: (h.start, h.end))
        latest: Held | None = None  # the span reaching furthest so far
        for span in spans:
            if latest is not None and span.start < latest.end:
                found.append(f"{what} of {node}: {latest.task} until {latest.end} and "
                             f"{span.task} from {span.start}")
            if latest is None or span.end > latest.end:
                latest = span
    return found


def unsettled(held: Iterable[Held]) -> list[str]:
    """Tasks placed and never settled (their allocation can never be released)."""
    return sorted({h.task for h in held if h.end == math.inf})


def duplicated_runs(runs: Mapping[str, int]) -> list[str]:
    """Run markers (job/attempt-role-index -> lines) of tasks that started twice."""
    return sorted(name for name, count in runs.items() if count > 1)


def charged_mismatch(kind_charged: int, retries: int,
                     attempts: Sequence[Mapping[str, Any]]) -> str | None:
    """What is wrong with a final job's charged retries, or None.

    Charged retries are exactly its attempts that failed by its own fault
    (the last excepted: it ended the job), and never more than its script can
    cause; a platform failure (lost node, vanished container) is not one."""
    own = [a for a in attempts if a.get("state") == "FAILED" and not a.get("platformFailure")]
    charged = len(own) - (1 if attempts and own and attempts[-1] is own[-1] else 0)
    if retries != charged:
        return f"retries {retries}, but {charged} attempts before the last failed by the job"
    if retries > kind_charged:
        return f"retries {retries}, more than its script causes ({kind_charged})"
    return None
