"""Per-user GPU-hour budgets within a VC: the spend of a user's period
(shared/state/usage.py) and how the policy treats a user who has spent theirs
(services/scheduler/policy.py): like a spent VC, for that user's jobs only."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scheduler.core import JobRequest
from services.scheduler.decisions import BUDGET, INSUFFICIENT, USER_BUDGET, Plan
from services.scheduler.policy import plan
from shared.domain.cluster import BORROWED, GUARANTEED, VcPolicy
from shared.domain.priority import PriorityClass
from shared.state.usage import (
    Budget,
    DayUsage,
    Spend,
    _used,
    day_start_ms,
    expires_at_ms,
    retained_from,
    vc_user_total_field,
)
from tests.support.policy import NOW, PROD, Run, World, placed, preempted, req, scenario, worlds

HOUR = 3600 * 1000
WEDNESDAY = day_start_ms("2026-11-25") + 15 * HOUR
VCS = {"research": VcPolicy(4), "default": VcPolicy(4)}


def row(day: str, user: str, vc: str, gpu_hours: float) -> DayUsage:
    return DayUsage(day, user, vc, f"{user}~j", gpu_ms=int(gpu_hours * HOUR))


USED_CASES = [
    pytest.param([row("2026-11-25", "alice", "a", 3), row("2026-11-25", "bob", "a", 2)],
                 {("a", "alice"): 3.0, ("a", ""): 5.0},
                 id="a user's budget counts their usage, the VC's everyone's"),
    pytest.param([row("2026-11-25", "alice", "b", 3)], {("a", "alice"): 0.0, ("a", ""): 0.0},
                 id="the user's usage in another VC is not this VC's"),
    pytest.param([row("2026-11-22", "alice", "a", 30), row("2026-11-23", "alice", "a", 1)],
                 {("a", "alice"): 1.0, ("a", ""): 1.0}, id="the period counts from Monday"),
    pytest.param([row("2026-11-25", "", "a", 4)], {("a", "alice"): 0.0, ("a", ""): 4.0},
                 id="a row without a user counts once, for the VC"),
]


@pytest.mark.parametrize(("rows", "expected"), USED_CASES)
def test_used_per_owner(rows: list[DayUsage], expected: dict[tuple[str, str], float]) -> None:
    budgets = dict.fromkeys(expected, Budget(10, "week"))
    used = _used(rows, budgets, WEDNESDAY)
    assert {owner: ms / HOUR for owner, ms in used.items()} == expected


def test_the_per_user_field_is_not_a_report_row() -> None:
    from shared.state.usage import parse_day
    assert parse_day("2026-11-25", {vc_user_total_field("a", "alice"): "5"}) == []


@pytest.mark.parametrize(("day", "days", "expected"), [
    pytest.param("2026-11-25", 400, day_start_ms("2026-11-25") + 401 * 24 * HOUR,
                 id="a day goes 400 days after it ended"),
    pytest.param("2026-11-25", 0, None, id="0 keeps it for ever"),
])
def test_expiry_of_a_day(day: str, days: int, expected: int | None) -> None:
    assert expires_at_ms(day, days) == expected


def test_the_oldest_day_kept() -> None:
    assert retained_from(WEDNESDAY, 400) == "2025-10-21"
    assert retained_from(WEDNESDAY, 0) is None
    # the oldest day kept is still there for another day at least
    expiry = expires_at_ms("2025-10-21", 400)
    assert expiry is not None and expiry > WEDNESDAY


# ------------------------------------------------------------- the policy

def user_spent(user: str, on_exhausted: str, hours: float = 12, vc: str = "research",
               budget: float = 10) -> dict[tuple[str, str], Spend]:
    return {(vc, user): Spend(vc, int(hours * HOUR), Budget(budget, "week", on_exhausted), user)}


USER_CASES = [
    pytest.param([req("alice~j", 2, vc="research")], [], "oppo", {"alice~j": BORROWED},
                 id="a spent user's job within the VC's guarantee runs only borrowing (oppo)"),
    pytest.param([req("alice~j", 2, vc="research")], [], "wait", {},
                 id="a spent user's job waits (wait)"),
    pytest.param([req("alice~j", 2, vc="research", cls=PROD)], [], "oppo",
                 {"alice~j": BORROWED}, id="a prod job of a spent user is oppo too"),
    pytest.param([req("alice~j", 2, vc="research"), req("bob~k", 2, vc="research", seq=1)],
                 [], "wait", {"bob~k": GUARANTEED},
                 id="another user of the VC runs on its guarantee"),
    pytest.param([req("alice~j", 4, vc="research"), req("bob~k", 4, vc="research", seq=1)],
                 [], "oppo", {"bob~k": GUARANTEED, "alice~j": BORROWED},
                 id="the other user takes the guarantee first, the spent one borrows"),
    pytest.param([req("alice~j", 2, vc="default")], [], "wait", {"alice~j": GUARANTEED},
                 id="the user's budget in one VC does not hold them in another"),
    pytest.param([req("bob~k", 4, vc="research")], [Run("alice~r", "research", {"a": 4})],
                 "wait", {"bob~k": GUARANTEED},
                 id="the spent user's running work leaves the guarantee to the others"),
]


@pytest.mark.parametrize(("queue", "runs", "on_exhausted", "expected"), USER_CASES)
def test_a_spent_users_jobs(queue: list[JobRequest], runs: list[Run], on_exhausted: str,
                            expected: dict[str, str]) -> None:
    cluster, running = scenario({"a": 8}, runs)
    result = plan(cluster, queue, running, VCS, NOW,
                  user_spent=user_spent("alice", on_exhausted))
    assert placed(result) == expected


def test_a_user_below_budget_is_unaffected() -> None:
    cluster, running = scenario({"a": 8})
    result = plan(cluster, [req("alice~j", 2, vc="research")], running, VCS, NOW,
                  user_spent=user_spent("alice", "wait", hours=9.5))
    assert placed(result) == {"alice~j": GUARANTEED}


def test_the_waiting_reason_names_the_users_budget() -> None:
    cluster, running = scenario({"a": 8})
    result = plan(cluster, [req("alice~j", 2, vc="research")], running, VCS, NOW,
                  user_spent=user_spent("alice", "wait"))
    why = result.waiting["alice~j"]
    assert why.reason == USER_BUDGET
    assert why.message == ("user alice has used 12.00 of their 10 GPU-hour budget in virtual "
                           "cluster research this week; their jobs wait for the next week")
    assert [b.to_dict() for b in why.blocked_by] == [{"kind": "userBudget", "name": "alice"}]
    assert result.positions["alice~j"] == 1


def test_an_oppo_job_of_a_spent_user_that_cannot_borrow_says_why() -> None:
    cluster, running = scenario({"a": 4}, [Run("d", "default", {"a": 4})])
    result = plan(cluster, [req("alice~j", 2, vc="research")], running, VCS, NOW,
                  user_spent=user_spent("alice", "oppo"))
    why = result.waiting["alice~j"]
    assert why.reason == INSUFFICIENT
    assert why.message.startswith("user alice has used 12.00 of their 10 GPU-hour budget "
                                  "in virtual cluster research this week, so it runs only "
                                  "as oppo")
    assert {"kind": "userBudget", "name": "alice"} in [b.to_dict() for b in why.blocked_by]
    assert not result.preempt


def test_a_spent_user_in_a_vc_that_does_not_borrow_waits() -> None:
    cluster, running = scenario({"a": 8})
    result = plan(cluster, [req("alice~j", 2, vc="research")], running,
                  {"research": VcPolicy(4, borrowing=False), "default": VcPolicy(4)}, NOW,
                  user_spent=user_spent("alice", "oppo"))
    assert result.waiting["alice~j"].reason == USER_BUDGET
    assert "research does not borrow" in result.waiting["alice~j"].message


def test_a_spent_vc_holds_before_its_users_budgets() -> None:
    cluster, running = scenario({"a": 8})
    vc_spend = Spend("research", 20 * HOUR, Budget(10, "week", "wait"))
    result = plan(cluster, [req("alice~j", 2, vc="research")], running, VCS, NOW,
                  spent={"research": vc_spend}, user_spent=user_spent("alice", "wait"))
    assert result.waiting["alice~j"].reason == BUDGET


def test_a_spent_users_running_work_is_demoted_and_preemptible() -> None:
    cluster, running = scenario({"a": 4}, [Run("alice~r", "research", {"a": 4})])
    result = plan(cluster, [req("bob~k", 4, vc="research")], running, VCS, NOW,
                  user_spent=user_spent("alice", "wait"))
    assert result.modes == {"alice~r": BORROWED}
    assert preempted(result) == {"alice~r": "bob~k"}


def test_a_waiting_spent_user_does_not_take_the_vcs_reservation() -> None:
    # alice's job (first in the queue) waits on her budget; bob's does not
    # fit now and has no one to preempt: as the VC's head it reserves the node
    cluster, running = scenario({"a": 4}, [Run("d", "default", {"a": 2})])
    result = plan(cluster, [req("alice~j", 2, vc="research"),
                            req("bob~k", 4, vc="research", seq=1)],
                  running, {"research": VcPolicy(4), "default": VcPolicy(2)}, NOW,
                  user_spent=user_spent("alice", "wait"))
    assert result.waiting["alice~j"].reason == USER_BUDGET
    assert result.reservations == {"bob~k": ("a",)}


# ------------------------------------------------------------ properties

USERS = ("alice", "bob")


@st.composite
def user_worlds(draw: st.DrawFn) -> World:
    """A world of test_policy whose jobs belong to alice or bob."""
    nodes, runs, queue, vcs, attained = draw(worlds())
    owner = {j: draw(st.sampled_from(USERS))
             for j in [r.job_id for r in runs] + [q.job_id for q in queue]}
    runs = [replace(r, job_id=f"{owner[r.job_id]}~{r.job_id}") for r in runs]
    named = {q.job_id: f"{owner[q.job_id]}~{q.job_id}" for q in queue}
    queue = [replace(q, job_id=named[q.job_id]) for q in queue]
    attained = {named[j]: a for j, a in attained.items()}
    return nodes, runs, queue, vcs, attained


def of(job_id: str) -> str:
    return job_id.partition("~")[0]


def decisions(result: Plan, skip: str) -> tuple[object, ...]:
    """What the plan decides for everyone but `skip`'s jobs."""
    return (sorted((p.request.job_id, p.mode, p.placements) for p in result.placed
                   if of(p.request.job_id) != skip),
            sorted((p.victim.job_id, p.by) for p in result.preempt),
            sorted(result.modes.items()),
            sorted((j, w) for j, w in result.waiting.items() if of(j) != skip),
            sorted(result.reservations.items()))


@settings(max_examples=300, deadline=None)
@given(world=user_worlds(), on_exhausted=st.sampled_from(["oppo", "wait"]))
def test_a_spent_user_never_gets_guaranteed_capacity(world: World, on_exhausted: str) -> None:
    nodes, runs, queue, vcs, attained = world
    cluster, running = scenario(nodes, runs)
    spent = user_spent("alice", on_exhausted, vc="a")
    result = plan(cluster, queue, running, vcs, NOW, attained, user_spent=spent)
    for p in result.placed:
        if p.request.vc == "a" and of(p.request.job_id) == "alice":
            assert p.mode == BORROWED, "a spent user's job was placed on the guarantee"
            assert on_exhausted == "oppo", "a job of a spent user who waits was placed"
    for r in running:
        if r.vc == "a" and of(r.job_id) == "alice":
            assert result.modes.get(r.job_id, r.mode) == BORROWED, \
                "a spent user's running work kept the guarantee"
    for p in result.preempt:
        by = next(q for q in queue if q.job_id == p.by)
        assert not (by.vc == "a" and of(by.job_id) == "alice"), "a spent user preempted"
    for q in queue:
        if q.job_id in result.waiting and (q.vc != "a" or of(q.job_id) != "alice"):
            assert result.waiting[q.job_id].reason != USER_BUDGET, "someone else was held"


@settings(max_examples=300, deadline=None)
@given(world=user_worlds())
def test_other_users_are_unaffected_by_a_spent_user_who_waits(world: World) -> None:
    """To everyone else, a spent user who waits is a user with no queued jobs
    in that VC (with none running there either: their running work would be
    borrowed work of its own class, which no plan without a budget has)."""
    nodes, runs, queue, vcs, attained = world
    runs = [r for r in runs if not (r.vc == "a" and of(r.job_id) == "alice")]
    cluster, running = scenario(nodes, runs)
    held = plan(cluster, queue, running, vcs, NOW, attained,
                user_spent=user_spent("alice", "wait", vc="a"))
    cluster, running = scenario(nodes, runs)
    without = plan(cluster, [q for q in queue if not (q.vc == "a" and of(q.job_id) == "alice")],
                   running, vcs, NOW, attained)
    assert decisions(held, "alice") == decisions(without, "alice")
    for q in queue:
        if q.vc == "a" and of(q.job_id) == "alice":
            assert held.waiting[q.job_id].reason == USER_BUDGET


@settings(max_examples=300, deadline=None)
@given(world=user_worlds())
def test_a_spent_user_who_runs_as_oppo_is_a_user_who_submitted_oppo(world: World) -> None:
    nodes, runs, queue, vcs, attained = world
    runs = [r for r in runs if not (r.vc == "a" and of(r.job_id) == "alice")]
    cluster, running = scenario(nodes, runs)
    held = plan(cluster, queue, running, vcs, NOW, attained,
                user_spent=user_spent("alice", "oppo", vc="a"))
    cluster, running = scenario(nodes, runs)
    as_oppo = [replace(q, priority=PriorityClass.OPPO)
               if q.vc == "a" and of(q.job_id) == "alice" else q for q in queue]
    submitted = plan(cluster, as_oppo, running, vcs, NOW, attained)
    assert decisions(held, "alice") == decisions(submitted, "alice")
    assert placed(held) == placed(submitted)


@pytest.mark.parametrize(("own", "default", "users", "expected"), [
    pytest.param({"alice": 3.0}, None, ["bob"], {"alice": 3.0},
                 id="without a default only users given their own"),
    pytest.param({"alice": 3.0}, 5.0, ["alice", "bob"], {"alice": 3.0, "bob": 5.0},
                 id="the default covers the users asked about without their own"),
    pytest.param({}, 5.0, [], {}, id="the default alone names no one"),
    pytest.param({"alice": 0.0}, 5.0, ["alice"], {"alice": 0.0},
                 id="a user's own budget of 0 is theirs, not the default"),
])
def test_the_budgets_of_a_vcs_users(own: dict[str, float], default: float | None,
                                    users: list[str], expected: dict[str, float]) -> None:
    from shared.state.accounts import VirtualCluster
    vc = VirtualCluster("research", 4, budget_period="day", on_budget_exhausted="wait",
                        user_gpu_hours_budgets=own, default_user_gpu_hours_budget=default)
    assert vc.user_budgets(users) == {("research", user): Budget(hours, "day", "wait")
                                      for user, hours in expected.items()}
