"""A job's attempts and their tasks: each attempt's tasks in one hash (task
key -> JSON), the attempts in another, read back from the archive once a
job is compacted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from shared.domain.models import Allocation, Attempt, Task, task_key
from shared.domain.states import TaskState
from shared.state import keys
from shared.state.store import Pipe, Reader, StoreCore


class TasksMixin(StoreCore):
    """A job's attempts and each attempt's tasks."""

    def write_tasks(self, pipe: Pipe, job_id: str, attempt: int, tasks: Iterable[Task]) -> None:
        mapping = _task_fields(tasks)
        if mapping:
            pipe.hset(keys.job_tasks(job_id, attempt), mapping=mapping)

    def read_tasks(self, reader: Reader, job_id: str, attempt: int) -> dict[str, Task]:
        return _tasks_from(reader.hgetall(keys.job_tasks(job_id, attempt)))

    def get_tasks(self, job_id: str, attempt: int) -> list[Task]:
        tasks: Iterable[Task] = self.read_tasks(self.r, job_id, attempt).values()
        if not tasks:
            archive = self.read_archive(self.r, job_id)
            tasks = archive.tasks_of(attempt) if archive is not None else []
        return _in_task_order(tasks)

    def read_tasks_many(self, attempts: Sequence[tuple[str, int]]) -> list[dict[str, Task]]:
        """The tasks of each (job id, attempt), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for job_id, attempt in attempts:
            pipe.hgetall(keys.job_tasks(job_id, attempt))
        return [_tasks_from(raw) for raw in (pipe.execute() if attempts else [])]

    def allocation_tasks(self, allocations: Sequence[Allocation]) -> list[Task | None]:
        """The task each allocation was made for (None: gone), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for alloc in allocations:
            pipe.hget(keys.job_tasks(alloc.job_id, alloc.attempt),
                      task_key(alloc.role, alloc.index))
        return [Task.from_dict(json.loads(raw)) if raw else None
                for raw in (pipe.execute() if allocations else [])]

    def write_attempt(self, pipe: Pipe, job_id: str, attempt: Attempt) -> None:
        pipe.hset(keys.job_attempts(job_id), str(attempt.index),
                  json.dumps(attempt.to_dict(), separators=(",", ":")))

    def read_attempt(self, reader: Reader, job_id: str, index: int) -> Attempt | None:
        raw = reader.hget(keys.job_attempts(job_id), str(index))
        return Attempt.from_dict(json.loads(raw)) if raw else None

    def read_attempts_many(self, wanted: Sequence[tuple[str, Sequence[int]]]
                           ) -> list[list[Attempt | None]]:
        """For each (job id, attempt indexes), those attempts' records (None:
        not there), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for job_id, indexes in wanted:
            pipe.hmget(keys.job_attempts(job_id), [str(i) for i in indexes])
        return [[Attempt.from_dict(json.loads(raw)) if raw else None for raw in raws]
                for raws in (pipe.execute() if wanted else [])]

    def get_attempts(self, job_id: str) -> list[Attempt]:
        raw: dict[str, str] = self.r.hgetall(keys.job_attempts(job_id))
        if not raw:
            archive = self.read_archive(self.r, job_id)
            return list(archive.attempts) if archive is not None else []
        return sorted((Attempt.from_dict(json.loads(v)) for v in raw.values()),
                      key=lambda a: a.index)

    def task_exists(self, job_id: str, attempt: int, role: str, index: int) -> bool:
        if self.r.hexists(keys.job_tasks(job_id, attempt), task_key(role, index)):
            return True
        archive = self.read_archive(self.r, job_id)
        return archive is not None and archive.has_task(attempt, role, index)

    def get_task(self, job_id: str, attempt: int, role: str, index: int) -> Task | None:
        """One task of one attempt, without reading its siblings."""
        raw = self.r.hget(keys.job_tasks(job_id, attempt), task_key(role, index))
        return Task.from_dict(json.loads(raw)) if raw else None

    def task_settled(self, job_id: str, attempt: int, role: str, index: int) -> bool:
        """The task reached a final state, or does not exist at all."""
        task = self.get_task(job_id, attempt, role, index)
        return task is None or task.state.is_final


def _tasks_from(raw: dict[str, str]) -> dict[str, Task]:
    """An attempt's tasks from its hash (task key -> JSON)."""
    return {k: Task.from_dict(json.loads(v)) for k, v in raw.items()}


def _in_task_order(tasks: Iterable[Task]) -> list[Task]:
    return sorted(tasks, key=lambda t: (t.role, t.index))


def _task_fields(tasks: Iterable[Task]) -> dict[str, str]:
    return {t.key: json.dumps(t.to_dict(), separators=(",", ":")) for t in tasks}


def task_is_live(task: Task) -> bool:
    return task.state in (TaskState.LAUNCHING, TaskState.RUNNING)
