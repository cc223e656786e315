"""GPU-hour budgets on a real Redis: what a VC has spent this period, how the
scheduler's pass treats a VC that spent its budget, and the admin API."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from services.scheduler.service import Scheduler
from shared.domain.models import Gpu, Node, TaskPlacement
from shared.domain.states import TaskState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state import usage
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.lifecycle import mark_task_running, submit_job
from shared.state.placing import commit_placement
from shared.state.store import Store
from tests.support.api import AuthedClient, error_of
from tests.support.budgets import launched_early_today

MINUTE = 60_000


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    store = Store(redis_client)
    store.register_node(Node("n1", "127.0.0.1", cpus=16, memory_mb=32000,
                             gpus=[Gpu(i) for i in range(8)], port_range=(20000, 20100)))
    return store


@pytest.fixture
def scheduler(redis_server: str, store: Store) -> Scheduler:
    settings = Settings(redis_url=redis_server, node_lost_seconds=30)
    return Scheduler(settings, store, Messenger(make_celery(settings)))


def config(name: str, vc: str, gpus: int = 2) -> dict[str, Any]:
    return {"jobName": name, "image": "busybox", "virtualCluster": vc,
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                           "memoryMB": 128, "gpuNumber": gpus, "command": "true"}]}


def used_today(r: redis.Redis, vc: str, gpu_minutes: int) -> None:
    """Record that `vc` used `gpu_minutes` GPU-minutes today (one minute of
    that many GPUs, from today's first millisecond: inside every period)."""
    start = usage.day_start_ms(usage.day_of(now_ms()))
    pipe = r.pipeline()
    usage.record_interval(pipe, usage.Interval("bob~old", 0, "main", 0, "bob", vc, start,
                                               start + MINUTE, gpu_minutes, 1, 128))
    pipe.execute()


def budgeted(store: Store, on_exhausted: str, gpu_hours: float = 10) -> None:
    Accounts(store).put_vc(VirtualCluster("research", 4, gpu_hours_budget=gpu_hours,
                                          budget_period="week",
                                          on_budget_exhausted=on_exhausted))


def test_spend_counts_the_recorded_days_and_running_tasks_up_to_now(store: Store) -> None:
    used_today(store.r, "research", 90)
    job = submit_job(store, "alice", config("run", "research", gpus=2))
    assert commit_placement(store, job.id, version=job.version, attempt=0, placements=[
        TaskPlacement("main", 0, "n1", "127.0.0.1", (0, 1), 1, 128, {})],
        launch_deadline_ms=now_ms() + MINUTE)
    assert mark_task_running(store, job.id, 0, "main", 0, "container")
    now = launched_early_today(store, job.id) + 30 * MINUTE
    held = [a for allocs in store.all_allocations(["n1"]).values() for a in allocs]

    spent = usage.read_spend(store.r, {"research": usage.Budget(2, "week"),
                                       "default": usage.Budget(2, "day")}, held, now)

    assert spent["research"].gpu_ms == 90 * MINUTE + 2 * 30 * MINUTE
    assert spent["research"].exhausted  # 2.5 of 2 GPU-hours
    assert spent["default"].gpu_ms == 0 and not spent["default"].exhausted


def test_the_spend_read_is_the_usage_report_of_the_vc(store: Store) -> None:
    today = usage.day_start_ms(usage.day_of(now_ms()))
    spans = [usage.Interval("alice~a", 0, "main", 0, "alice", "research", today - 2 * 3600_000,
                            today + 3600_000, 2, 1, 128),  # crosses midnight into today
             usage.Interval("bob~b", 1, "main", 3, "bob", "research", today, today + 60_000,
                            5, 1, 128),
             usage.Interval("bob~c", 0, "main", 0, "bob", "default", today, today + 60_000,
                            7, 1, 128)]
    for _ in range(2):  # recorded twice (a redelivered exit): counted once
        pipe = store.r.pipeline()
        for span in spans:
            usage.record_interval(pipe, span)
        pipe.execute()
    budgets = {"research": usage.Budget(1, "day"), "default": usage.Budget(1, "month")}

    spent = usage.read_spend(store.r, budgets, [], now_ms())

    for vc, first in (("research", usage.day_of(today)),
                      ("default", usage.period_first_day("month", now_ms()))):
        days = usage.days_between(first, usage.day_of(now_ms()))
        rows = usage.report(usage.read_days(store.r, days), ["vc"],
                            usage.Filter(days[0], days[-1], vc=vc))
        assert spent[vc].gpu_ms == rows[0]["gpuSeconds"] * 1000
    assert spent["research"].gpu_ms == 2 * 3600_000 + 5 * 60_000  # today's share only


def test_a_spent_vc_that_waits_leaves_its_job_waiting_with_the_budget_reason(
        store: Store, scheduler: Scheduler) -> None:
    budgeted(store, "wait")
    used_today(store.r, "research", 11 * 60)  # 11 of its 10 GPU-hours
    job = submit_job(store, "alice", config("late", "research"))
    other = submit_job(store, "alice", config("other", "default"))

    scheduler.run_pass()

    waiting = store.get_job(job.id) or pytest.fail()
    explained = json.loads(waiting.waiting)
    assert explained["reason"] == "BudgetExhausted"
    assert explained["blockedBy"] == [{"kind": "budget", "name": "research"}]
    assert waiting.waiting_reason == ("virtual cluster research has used 11.00 of its 10 "
                                      "GPU-hour budget this week; its jobs wait for the "
                                      "next week")
    assert store.get_tasks(job.id, 0)[0].state == TaskState.WAITING
    # another VC is unaffected
    assert store.get_tasks(other.id, 0)[0].state == TaskState.LAUNCHING


def test_a_spent_vc_that_runs_as_oppo_borrows(store: Store, scheduler: Scheduler) -> None:
    budgeted(store, "oppo")
    used_today(store.r, "research", 11 * 60)
    job = submit_job(store, "alice", config("late", "research"))

    scheduler.run_pass()

    placed = store.get_job(job.id) or pytest.fail()
    assert placed.mode == "borrowed"
    assert store.get_tasks(job.id, 0)[0].state == TaskState.LAUNCHING


def test_a_vc_below_its_budget_runs_on_its_guarantee(store: Store,
                                                     scheduler: Scheduler) -> None:
    budgeted(store, "wait")
    used_today(store.r, "research", 9 * 60)  # 9 of 10
    job = submit_job(store, "alice", config("early", "research"))

    scheduler.run_pass()

    placed = store.get_job(job.id) or pytest.fail()
    assert placed.mode == "guaranteed"
    assert store.get_tasks(job.id, 0)[0].state == TaskState.LAUNCHING


def test_spending_the_budget_demotes_running_work(store: Store, scheduler: Scheduler) -> None:
    budgeted(store, "oppo")
    job = submit_job(store, "alice", config("long", "research"))
    scheduler.run_pass()
    assert (store.get_job(job.id) or pytest.fail()).mode == "guaranteed"

    used_today(store.r, "research", 11 * 60)
    scheduler.run_pass()

    assert (store.get_job(job.id) or pytest.fail()).mode == "borrowed"


# ------------------------------------------------------------------- API

def test_an_admin_sets_a_budget_and_sees_it_spent(admin: AuthedClient,
                                                  redis_client: redis.Redis) -> None:
    resp = admin.put("/api/v1/virtual-clusters/research",
                     json={"gpuQuota": 4, "gpuHoursBudget": 10, "budgetPeriod": "week",
                           "onBudgetExhausted": "wait"})
    assert resp.status_code == 201, resp.json
    used_today(redis_client, "research", 3 * 60)

    view = admin.get("/api/v1/virtual-clusters").json["research"]

    assert (view["gpuHoursBudget"], view["budgetPeriod"], view["onBudgetExhausted"],
            view["gpuHoursSpent"]) == (10, "week", "wait", 3)
    default = admin.get("/api/v1/virtual-clusters/default").json
    assert (default["gpuHoursBudget"], default["gpuHoursSpent"]) == (None, None)
    # a PUT without the budget removes it
    resp = admin.put("/api/v1/virtual-clusters/research", json={"gpuQuota": 4})
    assert resp.status_code == 200
    assert (resp.json["gpuHoursBudget"], resp.json["gpuHoursSpent"]) == (None, None)


@pytest.mark.parametrize(("body", "field"), [
    pytest.param({"gpuHoursBudget": -1}, "gpuHoursBudget", id="negative budget"),
    pytest.param({"gpuHoursBudget": "ten"}, "gpuHoursBudget", id="budget not a number"),
    pytest.param({"gpuHoursBudget": True}, "gpuHoursBudget", id="budget a boolean"),
    pytest.param({"gpuHoursBudget": 1e10}, "gpuHoursBudget", id="budget too large"),
    pytest.param({"gpuHoursBudget": 10, "budgetPeriod": "fortnight"}, "budgetPeriod",
                 id="unknown period"),
    pytest.param({"gpuHoursBudget": 10, "budgetPeriod": None}, "budgetPeriod",
                 id="period null"),
    pytest.param({"gpuHoursBudget": 10, "onBudgetExhausted": "stop"}, "onBudgetExhausted",
                 id="unknown action"),
    pytest.param({"gpuHoursBudgt": 10}, "gpuHoursBudgt", id="a misspelt field"),
])
def test_a_bad_budget_is_400_naming_the_field(admin: AuthedClient, body: dict[str, Any],
                                              field: str) -> None:
    resp = admin.put("/api/v1/virtual-clusters/research", json={"gpuQuota": 4, **body})
    assert error_of(resp, 400) == "BadRequestError"
    assert list(resp.json["fields"]) == [field]
    assert admin.get("/api/v1/virtual-clusters/research").status_code == 404


@pytest.mark.parametrize("raw", ["NaN", "Infinity"])
def test_a_budget_that_is_not_a_finite_number_is_400(admin: AuthedClient, raw: str) -> None:
    resp = admin.put("/api/v1/virtual-clusters/research",
                     data='{"gpuQuota": 4, "gpuHoursBudget": ' + raw + "}",
                     content_type="application/json")
    assert error_of(resp, 400) == "BadRequestError"
    assert admin.get("/api/v1/virtual-clusters/research").status_code == 404


def test_metrics_show_each_budget_and_its_spend(store: Store, flask_client: FlaskClient) -> None:
    budgeted(store, "oppo")
    used_today(store.r, "research", 9 * 60)

    resp = flask_client.get("/metrics")

    assert resp.status_code == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(resp.get_data(as_text=True))
               for s in family.samples if s.name.startswith("pai_vc_gpu_hours")}
    where = (("period", "week"), ("vc", "research"))
    assert samples == {("pai_vc_gpu_hours_budget", where): 10.0,
                       ("pai_vc_gpu_hours_spent", where): 9.0}
