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
