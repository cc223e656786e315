"""Task container names and labels (shared/node/containers.py): one container per
task retry, each mapped back to its task and retry from its labels alone."""

from __future__ import annotations

import pytest

from shared.node.containers import (
    LABEL_TASK_RETRY,
    TaskRef,
    container_name,
    task_labels,
    task_ref_from_labels,
)

JOB = "alice~train"


def test_a_first_container_keeps_the_name_it_always_had() -> None:
    # Containers made before task retries existed are still found by name.
    assert container_name(JOB, 0, "main", 1) == container_name(JOB, 0, "main", 1, 0)
    assert "-r" not in container_name(JOB, 0, "main", 1).removeprefix("pai-alice-train")


@pytest.mark.parametrize("other", [
    pytest.param(TaskRef(JOB, 0, "main", 1, 1), id="the next retry"),
    pytest.param(TaskRef(JOB, 0, "main", 1, 2), id="a later retry"),
    pytest.param(TaskRef(JOB, 1, "main", 1, 0), id="the next job attempt"),
    pytest.param(TaskRef(JOB, 0, "main", 11, 0), id="another task"),
])
def test_every_task_retry_has_a_name_of_its_own(other: TaskRef) -> None:
    assert TaskRef(JOB, 0, "main", 1).container_name != other.container_name


@pytest.mark.parametrize("ref", [
    pytest.param(TaskRef(JOB, 0, "main", 0), id="first container"),
    pytest.param(TaskRef(JOB, 2, "ps.0", 3, 4), id="fourth retry"),
])
def test_labels_map_back_to_the_task_and_its_retry(ref: TaskRef) -> None:
    labels = task_labels(ref, node="n1", username="alice", vc="default")
    assert task_ref_from_labels(labels) == ref
    assert (LABEL_TASK_RETRY in labels) == bool(ref.retry)


@pytest.mark.parametrize("labels", [
    pytest.param(None, id="none"),
    pytest.param({"other": "x"}, id="not ours"),
    pytest.param({"pai.job": JOB, "pai.attempt": "0", "pai.role": "main", "pai.index": "0",
                  LABEL_TASK_RETRY: "one"}, id="retry not a number"),
])
def test_labels_that_name_no_task(labels: dict[str, str] | None) -> None:
    assert task_ref_from_labels(labels) is None
