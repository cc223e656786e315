"""The chaos run's checks, on hand-made histories: each catches what it names."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos import audit
from tests.chaos.workload import CHARGED, EXPECTED, KINDS, fault_plan, workload


def placed(time: int, attempt: int, *tasks: tuple[str, int, str, list[int], list[int]]
           ) -> dict[str, Any]:
    return {"kind": "placed", "time": time, "attempt": attempt,
            "tasks": [{"role": r, "index": i, "node": n, "gpus": g, "ports": p}
                      for r, i, n, g, p in tasks]}


def exited(time: int, attempt: int, role: str = "main", index: int = 0) -> dict[str, Any]:
    return {"kind": "task-exit", "time": time, "attempt": attempt, "role": role,
            "index": index}


def test_a_gpu_given_again_only_after_release_is_no_overlap() -> None:
    held = (audit.holdings("a", [placed(0, 0, ("main", 0, "n0", [1], [22000])), exited(10, 0)])
            + audit.holdings("b", [placed(10, 0, ("main", 0, "n0", [1], [22000])),
                                   exited(20, 0)]))
    assert audit.overlaps(held) == []
    assert audit.unsettled(held) == []


@pytest.mark.parametrize("resource", ["gpu", "port"])
def test_a_gpu_or_port_held_by_two_tasks_at_once_is_found(resource: str) -> None:
    first = ("main", 0, "n0", [1], [22000]) if resource == "gpu" else ("main", 0, "n0", [],
                                                                        [22000])
    second = ("main", 0, "n0", [1], [22001]) if resource == "gpu" else ("main", 0, "n0", [2],
                                                                         [22000])
    held = (audit.holdings("a", [placed(0, 0, first), exited(10, 0)])
            + audit.holdings("b", [placed(5, 0, second), exited(20, 0)]))
    found = audit.overlaps(held)
    assert len(found) == 1 and resource in found[0]


def test_the_same_gpu_on_two_nodes_is_no_overlap() -> None:
    held = (audit.holdings("a", [placed(0, 0, ("main", 0, "n0", [1], [])), exited(10, 0)])
            + audit.holdings("b", [placed(5, 0, ("main", 0, "n1", [1], [])), exited(20, 0)]))
    assert audit.overlaps(held) == []


def test_a_task_never_settled_holds_for_ever_and_is_reported() -> None:
    held = audit.holdings("a", [placed(0, 0, ("main", 0, "n0", [0], []))])
    later = audit.holdings("b", [placed(100, 0, ("main", 0, "n0", [0], [])), exited(200, 0)])
    assert audit.unsettled(held) == ["a/0/main/0"]
    assert len(audit.overlaps(held + later)) == 1


def test_each_attempt_of_a_retried_job_holds_on_its_own() -> None:
    events = [placed(0, 0, ("main", 0, "n0", [0], [])), exited(5, 0),
              placed(6, 1, ("main", 0, "n0", [0], [])), exited(9, 1)]
    assert audit.overlaps(audit.holdings("a", events)) == []


def test_a_task_that_started_twice_in_one_attempt_is_a_duplicate() -> None:
    assert audit.duplicated_runs({"j/0-main-0": 1, "j/0-main-1": 2, "j/1-main-0": 1}) == [
        "j/0-main-1"]


@pytest.mark.parametrize(("charged", "retries", "attempts", "wrong"), [
    pytest.param(1, 1, [{"state": "FAILED"}, {"state": "FAILED"}], False, id="fail-for-good"),
    pytest.param(1, 1, [{"state": "FAILED"}, {"state": "SUCCEEDED"}], False,
                 id="failed-once-then-succeeded"),
    pytest.param(0, 0, [{"state": "FAILED", "platformFailure": True},
                        {"state": "SUCCEEDED"}], False, id="node-lost-not-charged"),
    pytest.param(0, 1, [{"state": "FAILED", "platformFailure": True},
                        {"state": "SUCCEEDED"}], True, id="node-lost-charged"),
    pytest.param(0, 1, [{"state": "FAILED"}, {"state": "SUCCEEDED"}], True,
                 id="more-than-the-script-causes"),
])
def test_charged_retries_count_only_the_jobs_own_failures(
        charged: int, retries: int, attempts: list[dict[str, Any]], wrong: bool) -> None:
    assert (audit.charged_mismatch(charged, retries, attempts) is not None) is wrong


def test_the_workload_is_the_same_for_a_seed_and_has_every_kind() -> None:
    first = workload(7, 60, "img", 8)
    assert first == workload(7, 60, "img", 8)
    assert {j.kind for j in first} == {k for k, _ in KINDS} == set(EXPECTED) == set(CHARGED)
    assert len({j.name for j in first}) == 60
    gang = next(j for j in first if j.kind == "gang")
    assert gang.config["taskRoles"][0]["gpuNumber"] * 2 > 8  # one task per node


def test_the_fault_plan_is_the_same_for_a_seed_and_loses_one_node() -> None:
    plan = fault_plan(3, 60)
    assert plan == fault_plan(3, 60)
    assert [f.target for f in plan].count("lose") == 1
    assert all(0 < f.at_s <= 60 for f in plan)
    assert len(plan) > 10
