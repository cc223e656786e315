"""What really runs, asked of every node's engine directly (never of pai).

Twice a second the observer lists each engine's running job containers and
remembers, per container, when it was first and last seen running, on which
node, for which task (job, role, index: the same across attempts and
submissions), and the GPUs and port its environment gave it. From that alone
it checks the invariants:

- never two live containers of one task for longer than the fencing bound
  (`overlaps`: the longest time two containers of one task ran together);
- no GPU and no port of a node used by two containers at once;
- after a given moment, which containers were still running.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import docker

from shared.node.containers import LABEL_ATTEMPT, LABEL_INDEX, LABEL_JOB, LABEL_ROLE

POLL_SECONDS = 0.5


@dataclass
class Sighting:
    container: str
    node: str
    task: tuple[str, str, str]  # job, role, index
    attempt: str
    first: float
    last: float
    gpus: frozenset[str] = frozenset()
    port: str = ""


@dataclass
class Observer:
    engines: Mapping[str, docker.DockerClient]  # node -> its engine
    seen: dict[str, Sighting] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # when the last round over every engine began (monotonic): what a round
    # that ended saw is at least that fresh
    round_began: float = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name="observer")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            began = time.monotonic()
            for node, engine in self.engines.items():
                with contextlib.suppress(Exception):  # a frozen engine: seen again later
                    self._look(node, engine)
            self.round_began = began

    def looked_since(self, moment: float) -> bool:
        """Whether a whole round over the engines began after `moment`."""
        return self.round_began > moment

    def _look(self, node: str, engine: docker.DockerClient) -> None:
        now = time.monotonic()
        for container in engine.containers.list(filters={"label": LABEL_JOB,
                                                         "status": "running"}):
            with self._lock:
                sighting = self.seen.get(container.id)
                if sighting is not None:
                    sighting.last = now
                    continue
            labels = container.labels
            env = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"] or [])
            gpus = frozenset(g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g)
            with self._lock:
                self.seen[container.id] = Sighting(
                    container.id, node, (labels[LABEL_JOB], labels[LABEL_ROLE],
                                         labels[LABEL_INDEX]),
                    labels[LABEL_ATTEMPT], now, now, gpus,
                    env.get("PAI_CURRENT_CONTAINER_PORT", ""))

    def sightings(self) -> list[Sighting]:
        with self._lock:
            return list(self.seen.values())

    def overlaps(self) -> dict[tuple[str, str, str], float]:
        """Per task that ever ran twice at once: the longest overlap, seconds."""
        by_task: dict[tuple[str, str, str], list[Sighting]] = defaultdict(list)
        for sighting in self.sightings():
            by_task[sighting.task].append(sighting)
        found = {}
        for task, seen in by_task.items():
            worst = max((_together(a, b) for i, a in enumerate(seen) for b in seen[i + 1:]),
                        default=0.0)
            if worst > 0:
                found[task] = worst
        return found

    def doubly_used(self) -> list[str]:
        """Each GPU or port of a node that two containers held at once."""
        clashes = []
        seen = self.sightings()
        for i, a in enumerate(seen):
            for b in seen[i + 1:]:
                if a.node != b.node or _together(a, b) <= POLL_SECONDS:
                    continue
                shared = (a.gpus & b.gpus) | ({a.port} & {b.port} - {""})
                if shared:
                    clashes.append(f"{a.node}: {sorted(shared)} held by {a.task} attempt "
                                   f"{a.attempt} and {b.task} attempt {b.attempt}")
        return clashes

    def running_after(self, moment: float) -> list[Sighting]:
        """Containers seen running later than `moment` (monotonic)."""
        return [s for s in self.sightings() if s.last > moment]

    def ran_between(self, task: tuple[str, str, str], start: float, end: float,
                    ) -> list[Sighting]:
        return [s for s in self.sightings() if s.task == task and s.first <= end
                and s.last >= start]

    def status(self) -> dict[str, Any]:
        return {"containers": len(self.seen), "overlaps": self.overlaps(),
                "doublyUsed": self.doubly_used()}


def _together(a: Sighting, b: Sighting) -> float:
    return max(0.0, min(a.last, b.last) - max(a.first, b.first))
