"""The records' dict forms equal `dataclasses.asdict` (which they replace,
for its cost), and share no container with the record they came from."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from shared.domain.models import Allocation, Attempt, Job, Task
from shared.domain.states import JobState, TaskState

text = st.text(max_size=12)
small = st.integers(min_value=0, max_value=10**13)
maybe = st.none() | small

tasks = st.builds(
    Task, role=text, index=small, state=st.sampled_from(TaskState), node=st.none() | text,
    ip=st.none() | text, gpus=st.lists(small, max_size=8),
    ports=st.dictionaries(text, st.lists(small, max_size=4), max_size=3),
    container_id=st.none() | text, exit_code=maybe, diagnostics=text,
    platform_failure=st.booleans(), launched_ms=maybe, started_ms=maybe, completed_ms=maybe,
    placed_ms=maybe, retries=small)
jobs = st.builds(Job, id=text, username=text, name=text, virtual_cluster=text,
                 state=st.sampled_from(JobState), version=small, completed_ms=maybe,
                 exit_code=maybe, exit_diagnostics=text, started_ms=maybe,
                 preempt_deadline_ms=maybe, retry_after_ms=maybe, waiting=text)
attempts = st.builds(Attempt, index=small, state=text, started_ms=maybe, completed_ms=maybe,
                     exit_code=maybe, reason=text, platform_failure=st.booleans())
allocations = st.builds(Allocation, job_id=text, attempt=small, role=text, index=small,
                        node=text, gpus=st.lists(small, max_size=8).map(tuple), cpus=small,
                        memory_mb=small, ports=st.lists(small, max_size=4).map(tuple), vc=text)


@given(tasks)
def test_a_tasks_dict_is_asdicts_and_its_own(task: Task) -> None:
    data = task.to_dict()
    assert data == dataclasses.asdict(task)
    data["gpus"].append(99)
    for ports in data["ports"].values():
        ports.append(99)
    data["ports"]["new"] = [1]
    assert task.to_dict() == dataclasses.asdict(task) != data


@given(jobs)
def test_a_jobs_fields_are_its_asdicts_values_as_text(job: Job) -> None:
    fields = job.to_fields()
    assert fields == {k: "" if v is None else str(v) for k, v in dataclasses.asdict(job).items()}


@given(attempts)
def test_an_attempts_dict_is_asdicts(attempt: Attempt) -> None:
    assert attempt.to_dict() == dataclasses.asdict(attempt)
    assert Attempt.from_dict(attempt.to_dict()) == attempt


@given(allocations)
def test_an_allocations_dict_is_asdicts(alloc: Allocation) -> None:
    assert alloc.to_dict() == dataclasses.asdict(alloc)
    assert Allocation.from_dict(alloc.to_dict()) == alloc
