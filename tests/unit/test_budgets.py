"""GPU-hour budgets: the spend of a VC's period (shared/state/usage.py) and how the
policy treats a VC that has spent its budget (services/scheduler/policy.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from services.scheduler.core import JobRequest
from services.scheduler.decisions import BUDGET, INSUFFICIENT, QUOTA
from services.scheduler.policy import plan
from shared.domain.cluster import BORROWED, GUARANTEED, VcPolicy
from shared.state.usage import Budget, DayUsage, Spend, day_start_ms, period_first_day, spend
from tests.support.policy import (
    NOW,
    PROD,
    Run,
    World,
    placed,
    preempted,
    req,
    run_plan,
    scenario,
    worlds,
)

HOUR = 3600 * 1000
WEDNESDAY = day_start_ms("2026-11-25") + 15 * HOUR  # 15:00 UTC


@pytest.mark.parametrize(("period", "now", "first"), [
    pytest.param("day", WEDNESDAY, "2026-11-25", id="a day is the UTC day"),
    pytest.param("week", WEDNESDAY, "2026-11-23", id="a week starts on Monday"),
    pytest.param("week", day_start_ms("2026-11-23"), "2026-11-23",
                 id="Monday's first millisecond is in its own week"),
    pytest.param("week", day_start_ms("2026-11-23") - 1, "2026-11-16",
                 id="Sunday's last millisecond is in the week before"),
    pytest.param("month", WEDNESDAY, "2026-11-01", id="a month starts on the 1st"),
    pytest.param("month", day_start_ms("2026-12-01") - 1, "2026-11-01",
                 id="the month's last millisecond is still in it"),
])
def test_period_first_day(period: str, now: int, first: str) -> None:
    assert period_first_day(period, now) == first


def test_an_unknown_period_is_refused() -> None:
    with pytest.raises(ValueError, match="fortnight"):
        period_first_day("fortnight", WEDNESDAY)


def row(day: str, vc: str, gpu_hours: float, user: str = "alice") -> DayUsage:
    return DayUsage(day, user, vc, f"{user}~j", gpu_ms=int(gpu_hours * HOUR))


SPEND_CASES = [
    pytest.param([row("2026-11-25", "a", 3), row("2026-11-25", "a", 2, "bob")],
                 Budget(10, "day"), 5.0, False, id="every user's usage of the VC adds up"),
    pytest.param([row("2026-11-24", "a", 30), row("2026-11-25", "a", 1)],
                 Budget(10, "day"), 1.0, False, id="yesterday is not in today's budget"),
    pytest.param([row("2026-11-24", "a", 30), row("2026-11-25", "a", 1)],
                 Budget(10, "week"), 31.0, True, id="this week counts from Monday"),
    pytest.param([row("2026-11-22", "a", 30)], Budget(10, "week"), 0.0, False,
                 id="last Sunday is last week"),
    pytest.param([row("2026-11-25", "b", 30)], Budget(10, "month"), 0.0, False,
                 id="another VC's usage is not this one's"),
    pytest.param([row("2026-11-01", "a", 10)], Budget(10, "month"), 10.0, True,
                 id="using exactly the budget spends it"),
    pytest.param([], Budget(0, "month"), 0.0, True, id="a zero budget is spent from the start"),
]


@pytest.mark.parametrize(("rows", "budget", "hours", "exhausted"), SPEND_CASES)
def test_spend_of_a_period(rows: list[DayUsage], budget: Budget, hours: float,
                           exhausted: bool) -> None:
    spent = spend(rows, {"a": budget}, WEDNESDAY)["a"]
    assert spent.gpu_hours == hours
    assert spent.exhausted is exhausted


# ------------------------------------------------------------- the policy

def spent(vc: str, on_exhausted: str, hours: float = 12, budget: float = 10) -> Spend:
    return Spend(vc, int(hours * HOUR), Budget(budget, "week", on_exhausted))


VCS = {"research": VcPolicy(4), "default": VcPolicy(4)}

BUDGET_CASES = [
    pytest.param([req("j", 2, vc="research")], [], "oppo", {"j": BORROWED},
                 id="a spent VC's job within its guarantee runs only borrowing (oppo)"),
    pytest.param([req("j", 2, vc="research")], [], "wait", {},
                 id="a spent VC's job waits (wait)"),
    pytest.param([req("j", 2, vc="research", cls=PROD)], [], "oppo", {"j": BORROWED},
                 id="a prod job of a spent VC is oppo too"),
    pytest.param([req("j", 2, vc="research"), req("d", 2, seq=1)], [], "wait",
                 {"d": GUARANTEED}, id="another VC is unaffected"),
]


@pytest.mark.parametrize(("queue", "runs", "on_exhausted", "expected"), BUDGET_CASES)
def test_a_spent_vcs_jobs(queue: list[JobRequest], runs: list[Run], on_exhausted: str,
                          expected: dict[str, str]) -> None:
    cluster, running = scenario({"a": 8}, runs)
    result = plan(cluster, queue, running, VCS, NOW,
                  spent={"research": spent("research", on_exhausted)})
    assert placed(result) == expected


def test_a_vc_below_its_budget_is_unaffected() -> None:
    cluster, running = scenario({"a": 8})
    result = plan(cluster, [req("j", 2, vc="research")], running, VCS, NOW,
                  spent={"research": spent("research", "wait", hours=9.5)})
    assert placed(result) == {"j": GUARANTEED}


def test_the_waiting_reason_names_the_budget() -> None:
    cluster, running = scenario({"a": 8})
    result = plan(cluster, [req("j", 2, vc="research")], running, VCS, NOW,
                  spent={"research": spent("research", "wait")})
    why = result.waiting["j"]
    assert why.reason == BUDGET
    assert why.message == ("virtual cluster research has used 12.00 of its 10 GPU-hour "
                           "budget this week; its jobs wait for the next week")
    assert [b.to_dict() for b in why.blocked_by] == [{"kind": "budget", "name": "research"}]
    assert result.positions["j"] == 1


def test_an_oppo_job_of_a_spent_vc_that_cannot_borrow_says_why() -> None:
    # the other VC's guaranteed work holds every GPU: nothing to borrow
    cluster, running = scenario({"a": 4}, [Run("d", "default", {"a": 4})])
    result = plan(cluster, [req("j", 2, vc="research")], running,
                  {"research": VcPolicy(4), "default": VcPolicy(4)}, NOW,
                  spent={"research": spent("research", "oppo")})
    why = result.waiting["j"]
    assert why.reason == INSUFFICIENT
    assert why.message.startswith("virtual cluster research has used 12.00 of its 10 "
                                  "GPU-hour budget this week, so it runs only as oppo")
    assert {"kind": "budget", "name": "research"} in [b.to_dict() for b in why.blocked_by]
    assert not result.preempt, "oppo work preempted someone"


def test_a_spent_vc_that_does_not_borrow_waits_for_the_next_period() -> None:
    cluster, running = scenario({"a": 8})
    result = plan(cluster, [req("j", 2, vc="research")], running,
                  {"research": VcPolicy(4, borrowing=False), "default": VcPolicy(4)}, NOW,
                  spent={"research": spent("research", "oppo")})
    assert result.waiting["j"].reason == BUDGET
    assert "does not borrow" in result.waiting["j"].message
    assert result.waiting["j"].reason != QUOTA


def test_a_spent_vcs_running_work_is_demoted_and_preemptible() -> None:
    # research's running job holds the whole node in its guarantee; once
    # research is spent it is borrowed work, and default's job may take its place
    result = run_plan({"a": 4}, [req("d", 4)], [Run("r", "research", {"a": 4})],
                      {"research": VcPolicy(4), "default": VcPolicy(4)})
    assert "r" not in preempted(result), "without a budget, guaranteed work stays"
    cluster, running = scenario({"a": 4}, [Run("r", "research", {"a": 4})])
    result = plan(cluster, [req("d", 4)], running,
                  {"research": VcPolicy(4), "default": VcPolicy(4)}, NOW,
                  spent={"research": spent("research", "wait")})
    assert result.modes == {"r": BORROWED}
    assert preempted(result) == {"r": "d"}


def test_a_new_period_promotes_the_work_back() -> None:
    cluster, running = scenario({"a": 8}, [Run("r", "research", {"a": 2}, mode=BORROWED)])
    result = plan(cluster, [], running, VCS, NOW,
                  spent={"research": spent("research", "oppo", hours=0)})
    assert result.modes == {"r": GUARANTEED}


@settings(max_examples=300, deadline=None)
@given(world=worlds())
def test_a_spent_vc_never_gets_guaranteed_capacity(world: World) -> None:
    nodes, runs, queue, vcs, attained = world
    cluster, running = scenario(nodes, runs)
    budgets = {"a": spent("a", "oppo"), "b": spent("b", "wait"),
               "default": spent("default", "wait", hours=1)}  # default is below budget
    result = plan(cluster, queue, running, vcs, NOW, attained, spent=budgets)
    for p in result.placed:
        if p.request.vc in ("a", "b"):
            assert p.mode == BORROWED, "a spent VC's job was placed on its guarantee"
            assert p.request.vc != "b", "a job of a VC that waits was placed"
    for r in running:
        if r.vc in ("a", "b"):
            assert result.modes.get(r.job_id, r.mode) == BORROWED, \
                "a spent VC's running work kept its guarantee"
    for job_id in (p.by for p in result.preempt):
        assert next(q.vc for q in queue if q.job_id == job_id) not in ("a", "b"), \
            "a spent VC's job preempted someone"
    for q in queue:
        if q.vc == "b":
            assert result.waiting[q.job_id].reason == BUDGET
        elif q.vc == "default" and q.job_id in result.waiting:
            assert result.waiting[q.job_id].reason != BUDGET, "a VC below budget was held"
