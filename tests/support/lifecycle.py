"""Driving shared/state/lifecycle.py by hand: placing a job's tasks, and calls
raced from threads on connections of their own."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from shared.domain.models import Gpu, Job, Node, TaskPlacement
from shared.state import keys
from shared.state.placing import commit_placement
from shared.state.store import Store

DEADLINE_MS = 2**41  # a launch deadline far in the future


def job_of(store: Store, job_id: str) -> Job:
    job = store.get_job(job_id)
    assert job is not None
    return job


def placements(store: Store, job_id: str, node: str = "n1") -> list[TaskPlacement]:
    """Every task of the current attempt on `node`, one free GPU and port each."""
    job = job_of(store, job_id)
    if not store.r.exists(keys.node(node)):
        store.register_node(Node(node, "10.0.0.1", cpus=1024, memory_mb=1 << 30,
                                 gpus=[Gpu(i) for i in range(1024)]))
    first = len(store.get_allocations(store.r, node))  # past what earlier tests took
    return [
        TaskPlacement(role=t.role, index=t.index, node=node, ip="10.0.0.1",
                      gpus=(first + i,), cpus=1, memory_mb=512,
                      ports={"default": [20000 + first + i]})
        for i, t in enumerate(store.get_tasks(job_id, job.attempt))
    ]


def place(store: Store, job_id: str, node: str = "n1", mode: str = "") -> None:
    job = job_of(store, job_id)
    assert commit_placement(store, job_id, version=job.version, attempt=job.attempt,
                            placements=placements(store, job_id, node),
                            launch_deadline_ms=DEADLINE_MS, mode=mode)


ROUNDS = 50  # a race's runs: enough to meet each interleaving


def race(redis_server: str, *calls: Callable[[Store], Any]) -> list[Any]:
    """Run each call in its own thread with its own connection, all at one moment."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []
    stores = [Store.from_url(redis_server) for _ in calls]

    def run(i: int) -> None:
        try:
            stores[i].r.ping()  # connect before the barrier, so the calls line up
            barrier.wait(timeout=30)
            results[i] = calls[i](stores[i])
        except BaseException as exc:  # reported to the test below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for s in stores:
        s.r.close()
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    return results
