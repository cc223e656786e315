"""GPU-hour budgets on the running platform: a spent VC's job waits with the
budget reason until an admin raises the budget, or runs borrowed (as oppo)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from bench.live_platform import Platform, wait_for

pytestmark = pytest.mark.docker


@contextmanager
def budgeted_vc(pai: Platform, name: str, **fields: Any) -> Iterator[str]:
    """A VC alice may use, with `fields`; deleted (and so taken from alice) after."""
    url = f"{pai.url}/api/v1/virtual-clusters/{name}"
    assert pai.admin.put(url, json=fields, timeout=30).status_code == 201
    assert pai.admin.put(f"{pai.url}/api/v1/user/alice/virtualClusters",
                         json={"virtualClusters": ["default", name]},
                         timeout=30).status_code == 200
    try:
        yield url
    finally:
        pai.admin.delete(url, timeout=30)


def test_a_spent_vcs_job_waits_for_the_budget_then_runs(
        platform: Platform, unique: Callable[[str], str]) -> None:
    vc, name = unique("spent"), unique("budgeted")
    with budgeted_vc(platform, vc, gpuQuota=0, gpuHoursBudget=0,
                     onBudgetExhausted="wait") as url:
        platform.submit_accepted(platform.config(name, "sleep 1", gpus=1, virtualCluster=vc))

        def waits_for_the_budget() -> dict[str, Any] | None:
            waiting = platform.detail(name)["jobStatus"].get("waiting") or {}
            return waiting if waiting.get("reason") == "BudgetExhausted" else None

        waiting = wait_for(waits_for_the_budget, 60, "the job to wait for its budget")
        assert f"virtual cluster {vc} has used 0.00 of its 0 GPU-hour budget" \
            in waiting["message"]
        assert {"kind": "budget", "name": vc} in waiting["blockedBy"]
        assert platform.detail(name)["jobStatus"]["state"] == "WAITING"

        assert platform.admin.put(url, json={"gpuQuota": 0, "gpuHoursBudget": 100,
                                             "onBudgetExhausted": "wait"},
                                  timeout=30).status_code == 200
        done = platform.wait_state(name)
        assert done["jobStatus"]["state"] == "SUCCEEDED"
        spent = platform.admin.get(url, timeout=30).json()["gpuHoursSpent"]
        assert spent > 0  # its run counts against the budget


def test_a_spent_vcs_job_runs_borrowed_as_oppo(platform: Platform,
                                               unique: Callable[[str], str]) -> None:
    vc, name = unique("oppo"), unique("oppo-run")
    # guaranteed 1 GPU: without the budget its 1-GPU job would run guaranteed
    with budgeted_vc(platform, vc, gpuQuota=1, gpuHoursBudget=0, onBudgetExhausted="oppo"):
        platform.submit_accepted(platform.config(name, "sleep 1", gpus=1, virtualCluster=vc))
        done = platform.wait_state(name)
        assert (done["jobStatus"]["state"], done["jobStatus"]["mode"]) == ("SUCCEEDED",
                                                                           "borrowed")


def test_a_user_who_spent_their_budget_waits_while_another_runs_guaranteed(
        platform: Platform, unique: Callable[[str], str]) -> None:
    vc, hers, theirs = unique("ubudget"), unique("hers"), unique("theirs")
    admin = platform.env["PAI_ADMIN_USER"]
    with budgeted_vc(platform, vc, gpuQuota=1, onBudgetExhausted="wait") as url:
        assert platform.admin.put(f"{url}/budgets/alice", json={"gpuHoursBudget": 0},
                                  timeout=30).status_code == 201
        platform.submit_accepted(platform.config(hers, "sleep 1", gpus=1, virtualCluster=vc))

        def waits_for_her_budget() -> dict[str, Any] | None:
            waiting = platform.detail(hers)["jobStatus"].get("waiting") or {}
            return waiting if waiting.get("reason") == "UserBudgetExhausted" else None

        waiting = wait_for(waits_for_her_budget, 60, "alice's job to wait for her budget")
        assert (f"user alice has used 0.00 of their 0 GPU-hour budget in virtual cluster "
                f"{vc}") in waiting["message"]
        assert {"kind": "userBudget", "name": "alice"} in waiting["blockedBy"]

        # another user of the VC (the admin, without a budget) runs on its guarantee
        resp = platform.admin.post(f"{platform.url}/api/v1/user/{admin}/jobs", timeout=30,
                                   json=platform.config(theirs, "sleep 1", gpus=1,
                                                        virtualCluster=vc))
        assert resp.status_code == 202, resp.text

        def finished() -> dict[str, Any] | None:
            detail: dict[str, Any] = platform.admin.get(
                f"{platform.url}/api/v1/user/{admin}/jobs/{theirs}", timeout=30).json()
            return detail if detail["jobStatus"]["state"] == "SUCCEEDED" else None

        done = wait_for(finished, 120, "the other user's job to succeed")
        assert done["jobStatus"]["mode"] == "guaranteed"
        assert platform.detail(hers)["jobStatus"]["state"] == "WAITING"

        assert platform.admin.put(f"{url}/budgets/alice", json={"gpuHoursBudget": 100},
                                  timeout=30).status_code == 200
        assert platform.wait_state(hers)["jobStatus"]["state"] == "SUCCEEDED"
        spent = platform.admin.get(f"{url}/budgets/alice", timeout=30).json()
        assert spent["gpuHoursSpent"] > 0  # her run counts against her budget
