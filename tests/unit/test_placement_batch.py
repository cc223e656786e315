"""The batch commit writes task and allocation records byte for byte as
their own `to_dict` would (the readers parse them with `from_dict`)."""

from __future__ import annotations

import json

import pytest

from shared.domain.models import Allocation, Task
from shared.domain.states import TaskState
from shared.state.placing import _record_json


def launching_task() -> Task:
    task = Task(role="worker", index=3)
    task.state, task.node, task.ip = TaskState.LAUNCHING, "gpu-01", "10.0.0.7"
    task.gpus, task.ports, task.launched_ms = [0, 5], {"default": [20001], "ssh": [20002]}, 17
    return task


@pytest.mark.parametrize("record", [
    Task(role="main", index=0),
    launching_task(),
    Allocation("alice~a", 2, "worker", 3, "gpu-01", (0, 5), 8, 64_000, (20001, 20002), "vision"),
    Allocation("alice~b", 0, "main", 0, "cpu-01", (), 1, 128, ()),
], ids=["waiting task", "launching task", "allocation", "cpu-only allocation"])
def test_record_json_is_to_dict_as_json(record: Task | Allocation) -> None:
    assert _record_json(record) == json.dumps(record.to_dict(), separators=(",", ":"))
    assert type(record).from_dict(json.loads(_record_json(record))) == record
