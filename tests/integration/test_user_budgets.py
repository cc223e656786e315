"""Per-user GPU-hour budgets within a VC, and the retention of usage days, on
a real Redis: what a user spent, how the scheduler's pass treats a user who
spent their budget while another user of the VC is below theirs, the admin
API, the metrics, and usage days that expire."""

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
from shared.state import keys, retention, usage
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.lifecycle import mark_task_running, submit_job
from shared.state.placing import commit_placement
from shared.state.store import Store
from tests.support.api import AuthedClient, error_of, new_user
from tests.support.budgets import launched_early_today

MINUTE = 60_000
DAY = 24 * 3600_000


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


def config(name: str, vc: str = "research", gpus: int = 2) -> dict[str, Any]:
    return {"jobName": name, "image": "busybox", "virtualCluster": vc,
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                           "memoryMB": 128, "gpuNumber": gpus, "command": "true"}]}


def used_today(r: redis.Redis, user: str, vc: str, gpu_minutes: int) -> None:
    """Record that `user` used `gpu_minutes` GPU-minutes in `vc` today."""
    start = usage.day_start_ms(usage.day_of(now_ms()))
    pipe = r.pipeline()
    usage.record_interval(pipe, usage.Interval(f"{user}~old", 0, "main", 0, user, vc, start,
                                               start + MINUTE, gpu_minutes, 1, 128))
    pipe.execute()


def research_with_budget(store: Store, on_exhausted: str, user: str = "alice",
                         gpu_hours: float = 10) -> None:
    """research: 4 guaranteed GPUs and no budget of its own; `user` has 10
    GPU-hours a week of their own in it."""
    accounts = Accounts(store)
    accounts.put_vc(VirtualCluster("research", 4, budget_period="week",
                                   on_budget_exhausted=on_exhausted))
    if accounts.get_user(user) is None:
        accounts.create_user(user, "secret-pw", virtual_clusters=["research"])
    accounts.set_user_budget("research", user, gpu_hours)


# -------------------------------------------------------------- the pass

def test_a_spent_user_waits_while_another_user_runs_on_the_guarantee(
        store: Store, scheduler: Scheduler) -> None:
    research_with_budget(store, "wait")
    used_today(store.r, "alice", "research", 11 * 60)  # 11 of her 10 GPU-hours
    used_today(store.r, "bob", "research", 50 * 60)  # bob has no budget of his own
    late = submit_job(store, "alice", config("late"))
    other = submit_job(store, "bob", config("other"))

    scheduler.run_pass()

    waiting = store.get_job(late.id) or pytest.fail()
    explained = json.loads(waiting.waiting)
    assert explained["reason"] == "UserBudgetExhausted"
    assert explained["blockedBy"] == [{"kind": "userBudget", "name": "alice"}]
    assert waiting.waiting_reason == ("user alice has used 11.00 of their 10 GPU-hour budget "
                                      "in virtual cluster research this week; their jobs "
                                      "wait for the next week")
    assert store.get_tasks(late.id, 0)[0].state == TaskState.WAITING
    placed = store.get_job(other.id) or pytest.fail()
    assert placed.mode == "guaranteed"
    assert store.get_tasks(other.id, 0)[0].state == TaskState.LAUNCHING


def test_a_spent_user_who_runs_as_oppo_borrows_while_another_is_guaranteed(
        store: Store, scheduler: Scheduler) -> None:
    research_with_budget(store, "oppo")
    research_with_budget(store, "oppo", user="bob", gpu_hours=100)
    used_today(store.r, "alice", "research", 11 * 60)
    used_today(store.r, "bob", "research", 60)  # 1 of his 100
    late = submit_job(store, "alice", config("late"))
    other = submit_job(store, "bob", config("other"))

    scheduler.run_pass()

    assert (store.get_job(late.id) or pytest.fail()).mode == "borrowed"
    assert store.get_tasks(late.id, 0)[0].state == TaskState.LAUNCHING
    assert (store.get_job(other.id) or pytest.fail()).mode == "guaranteed"
    assert store.get_tasks(other.id, 0)[0].state == TaskState.LAUNCHING


def test_spending_a_users_budget_demotes_their_running_work(
        store: Store, scheduler: Scheduler) -> None:
    research_with_budget(store, "oppo")
    mine = submit_job(store, "alice", config("long"))
    scheduler.run_pass()
    assert (store.get_job(mine.id) or pytest.fail()).mode == "guaranteed"

    used_today(store.r, "alice", "research", 11 * 60)
    scheduler.run_pass()

    assert (store.get_job(mine.id) or pytest.fail()).mode == "borrowed"


def test_the_pass_reads_the_budgets_of_users_with_work_only(
        store: Store, scheduler: Scheduler) -> None:
    research_with_budget(store, "wait")  # alice
    research_with_budget(store, "wait", user="bob")  # bob: no work anywhere
    research_with_budget(store, "wait", user="carol")  # carol: work in default only
    submit_job(store, "alice", config("queued"))
    submit_job(store, "carol", config("elsewhere", vc="default"))
    queue, _ = scheduler.reader.queue(store.snapshot().queued, now_ms())
    vcs = Accounts(store).list_vcs()

    _, user_spent = scheduler._spent(vcs, store.all_allocations(["n1"]), queue, now_ms())

    assert list(user_spent) == [("research", "alice")]


def test_a_users_spend_is_their_usage_in_the_vc_running_tasks_included(store: Store) -> None:
    used_today(store.r, "alice", "research", 90)
    used_today(store.r, "bob", "research", 30)
    used_today(store.r, "alice", "default", 45)
    job = submit_job(store, "alice", config("run", gpus=2))
    assert commit_placement(store, job.id, version=job.version, attempt=0, placements=[
        TaskPlacement("main", 0, "n1", "127.0.0.1", (0, 1), 1, 128, {})],
        launch_deadline_ms=now_ms() + MINUTE)
    assert mark_task_running(store, job.id, 0, "main", 0, "container")
    now = launched_early_today(store, job.id) + 30 * MINUTE
    held = [a for allocs in store.all_allocations(["n1"]).values() for a in allocs]
    week = usage.Budget(2, "week")

    spent = usage.read_spends(store.r, {("research", "alice"): week, ("research", "bob"): week,
                                        ("research", ""): week}, held, now)

    assert spent[("research", "alice")].gpu_ms == 90 * MINUTE + 2 * 30 * MINUTE
    assert spent[("research", "alice")].exhausted  # 2.5 of 2
    assert spent[("research", "bob")].gpu_ms == 30 * MINUTE
    assert spent[("research", "")].gpu_ms == (90 + 30) * MINUTE + 2 * 30 * MINUTE
    # the same figure as the usage report of alice in research
    days = usage.days_between(usage.period_first_day("week", now), usage.day_of(now))
    rows = usage.report(usage.read_days(store.r, days), ["user", "vc"],
                        usage.Filter(days[0], days[-1], user="alice", vc="research"))
    assert rows[0]["gpuSeconds"] * 1000 == 90 * MINUTE


def test_the_vcs_default_budget_holds_a_user_without_one_of_their_own(
        store: Store, scheduler: Scheduler) -> None:
    accounts = Accounts(store)
    accounts.put_vc(VirtualCluster("research", 4, budget_period="week",
                                   on_budget_exhausted="wait",
                                   default_user_gpu_hours_budget=5))
    accounts.create_user("bob", "secret-pw", virtual_clusters=["research"])
    accounts.set_user_budget("research", "bob", 100)  # his own, above the default
    used_today(store.r, "alice", "research", 6 * 60)  # 6 of the default 5
    used_today(store.r, "bob", "research", 6 * 60)  # 6 of his 100
    late = submit_job(store, "alice", config("late"))
    other = submit_job(store, "bob", config("other"))

    scheduler.run_pass()

    waiting = store.get_job(late.id) or pytest.fail()
    assert json.loads(waiting.waiting)["reason"] == "UserBudgetExhausted"
    assert waiting.waiting_reason.startswith("user alice has used 6.00 of their 5 GPU-hour")
    assert (store.get_job(other.id) or pytest.fail()).mode == "guaranteed"


# ------------------------------------------------------------------- API

def test_an_admin_gives_a_user_a_budget_and_both_see_it_spent(
        flask_client: FlaskClient, admin: AuthedClient, redis_client: redis.Redis) -> None:
    assert admin.put("/api/v1/virtual-clusters/research",
                     json={"gpuQuota": 4, "budgetPeriod": "week",
                           "onBudgetExhausted": "wait"}).status_code == 201
    alice = new_user(flask_client, admin, "alice")
    bob = new_user(flask_client, admin, "bob")
    resp = admin.put("/api/v1/virtual-clusters/research/budgets/alice",
                     json={"gpuHoursBudget": 10})
    assert resp.status_code == 201, resp.json
    assert admin.put("/api/v1/virtual-clusters/research/budgets/bob",
                     json={"gpuHoursBudget": 20}).status_code == 201
    used_today(redis_client, "alice", "research", 3 * 60)
    mine = {"vc": "research", "user": "alice", "gpuHoursBudget": 10.0, "budgetPeriod": "week",
            "onBudgetExhausted": "wait", "gpuHoursSpent": 3.0, "exhausted": False,
            "default": False}

    view = admin.get("/api/v1/virtual-clusters/research").json
    assert [b["user"] for b in view["userBudgets"]] == ["alice", "bob"]
    assert view["userBudgets"][0] == mine
    assert view["gpuHoursBudget"] is None  # the VC's own budget is apart
    # a user sees their own budget only
    assert alice.get("/api/v1/virtual-clusters/research").json["userBudgets"] == [mine]
    assert alice.get("/api/v1/virtual-clusters").json["research"]["userBudgets"] == [mine]
    assert alice.get("/api/v1/virtual-clusters/research/budgets").json == [mine]
    assert alice.get("/api/v1/virtual-clusters/research/budgets/alice").json == mine
    assert [b["user"] for b in bob.get("/api/v1/virtual-clusters/research").json[
        "userBudgets"]] == ["bob"]
    # and in their usage report
    report = alice.get("/api/v1/usage").json
    assert report["budgets"] == [mine]
    assert [b["user"] for b in admin.get("/api/v1/usage").json["budgets"]] == ["alice", "bob"]
    assert admin.get("/api/v1/usage?vc=default").json["budgets"] == []

    # changed: 200; a PUT of the VC keeps the users' budgets
    resp = admin.put("/api/v1/virtual-clusters/research/budgets/alice",
                     json={"gpuHoursBudget": 2.5})
    assert resp.status_code == 200
    assert (resp.json["gpuHoursBudget"], resp.json["exhausted"]) == (2.5, True)
    admin.put("/api/v1/virtual-clusters/research", json={"gpuQuota": 8})
    assert len(admin.get("/api/v1/virtual-clusters/research").json["userBudgets"]) == 2

    assert admin.delete("/api/v1/virtual-clusters/research/budgets/alice").status_code == 200
    assert error_of(admin.delete("/api/v1/virtual-clusters/research/budgets/alice"),
                    404) == "NoUserBudgetError"
    assert error_of(alice.get("/api/v1/virtual-clusters/research/budgets/alice"),
                    404) == "NoUserBudgetError"


def test_the_default_budget_is_shown_with_the_vc_and_to_each_user(
        flask_client: FlaskClient, admin: AuthedClient, redis_client: redis.Redis) -> None:
    resp = admin.put("/api/v1/virtual-clusters/research",
                     json={"gpuQuota": 4, "defaultUserGpuHoursBudget": 5})
    assert resp.status_code == 201, resp.json
    assert (resp.json["defaultUserGpuHoursBudget"], resp.json["userBudgets"]) == (5.0, [])
    alice = new_user(flask_client, admin, "alice")
    assert admin.put("/api/v1/user/alice/virtualClusters",
                     json={"virtualClusters": ["default", "research"]}).status_code == 200
    used_today(redis_client, "alice", "research", 60)
    hers = {"vc": "research", "user": "alice", "gpuHoursBudget": 5.0, "budgetPeriod": "month",
            "onBudgetExhausted": "oppo", "gpuHoursSpent": 1.0, "exhausted": False,
            "default": True}

    assert alice.get("/api/v1/virtual-clusters/research").json["userBudgets"] == [hers]
    assert admin.get("/api/v1/virtual-clusters/research/budgets/alice").json == hers
    assert alice.get("/api/v1/usage").json["budgets"] == [hers]
    # her own budget replaces the default for her
    admin.put("/api/v1/virtual-clusters/research/budgets/alice", json={"gpuHoursBudget": 50})
    own = alice.get("/api/v1/virtual-clusters/research/budgets/alice").json
    assert (own["gpuHoursBudget"], own["default"]) == (50.0, False)
    # a user who may not use the VC has no budget in it
    bob = new_user(flask_client, admin, "bob")
    assert bob.get("/api/v1/virtual-clusters/research").json["userBudgets"] == []
    assert error_of(admin.get("/api/v1/virtual-clusters/research/budgets/bob"),
                    404) == "NoUserBudgetError"
    for bad in (-1, "five", 1e10):
        resp = admin.put("/api/v1/virtual-clusters/research",
                         json={"gpuQuota": 4, "defaultUserGpuHoursBudget": bad})
        assert error_of(resp, 400) == "BadRequestError"
        assert list(resp.json["fields"]) == ["defaultUserGpuHoursBudget"]


def test_only_an_admin_sets_a_budget_and_a_user_reads_only_their_own(
        flask_client: FlaskClient, admin: AuthedClient) -> None:
    admin.put("/api/v1/virtual-clusters/research", json={"gpuQuota": 4})
    alice = new_user(flask_client, admin, "alice")
    new_user(flask_client, admin, "bob")
    assert admin.put("/api/v1/virtual-clusters/research/budgets/bob",
                     json={"gpuHoursBudget": 1}).status_code == 201

    for resp in (alice.put("/api/v1/virtual-clusters/research/budgets/alice",
                           json={"gpuHoursBudget": 1e9}),
                 alice.delete("/api/v1/virtual-clusters/research/budgets/bob"),
                 alice.get("/api/v1/virtual-clusters/research/budgets/bob"),
                 alice.get("/api/v1/virtual-clusters/research/budgets/BOB")):
        assert error_of(resp, 403) == "ForbiddenUserError"
    assert alice.get("/api/v1/virtual-clusters/research/budgets").json == []
    assert alice.get("/api/v1/virtual-clusters/research").json["userBudgets"] == []
    assert alice.get("/api/v1/usage").json["budgets"] == []
    assert error_of(alice.get("/api/v1/usage?user=bob"), 403) == "ForbiddenUserError"
    budget = admin.get("/api/v1/virtual-clusters/research/budgets/bob").json
    assert budget["gpuHoursBudget"] == 1.0


@pytest.mark.parametrize(("body", "field"), [
    pytest.param({"gpuHoursBudget": -1}, "gpuHoursBudget", id="negative"),
    pytest.param({"gpuHoursBudget": "ten"}, "gpuHoursBudget", id="not a number"),
    pytest.param({"gpuHoursBudget": True}, "gpuHoursBudget", id="a boolean"),
    pytest.param({"gpuHoursBudget": None}, "gpuHoursBudget", id="null"),
    pytest.param({"gpuHoursBudget": 1e10}, "gpuHoursBudget", id="too large"),
    pytest.param({}, "gpuHoursBudget", id="missing"),
    pytest.param({"gpuHoursBudget": 1, "budgetPeriod": "day"}, "budgetPeriod",
                 id="the period is the VC's"),
])
def test_a_bad_user_budget_is_400_naming_the_field(flask_client: FlaskClient,
                                                   admin: AuthedClient, body: dict[str, Any],
                                                   field: str) -> None:
    admin.put("/api/v1/virtual-clusters/research", json={"gpuQuota": 4})
    new_user(flask_client, admin, "alice")
    resp = admin.put("/api/v1/virtual-clusters/research/budgets/alice", json=body)
    assert error_of(resp, 400) == "BadRequestError"
    assert list(resp.json["fields"]) == [field]
    assert admin.get("/api/v1/virtual-clusters/research").json["userBudgets"] == []


@pytest.mark.parametrize("raw", ["NaN", "Infinity"])
def test_a_user_budget_that_is_not_a_finite_number_is_400(flask_client: FlaskClient,
                                                          admin: AuthedClient, raw: str) -> None:
    admin.put("/api/v1/virtual-clusters/research", json={"gpuQuota": 4})
    new_user(flask_client, admin, "alice")
    resp = admin.put("/api/v1/virtual-clusters/research/budgets/alice",
                     data='{"gpuHoursBudget": ' + raw + "}", content_type="application/json")
    assert error_of(resp, 400) == "BadRequestError"


def test_a_budget_for_a_user_or_vc_that_does_not_exist_is_404(
        flask_client: FlaskClient, admin: AuthedClient) -> None:
    admin.put("/api/v1/virtual-clusters/research", json={"gpuQuota": 4})
    new_user(flask_client, admin, "alice")
    assert error_of(admin.put("/api/v1/virtual-clusters/research/budgets/nobody",
                              json={"gpuHoursBudget": 1}), 404) == "NoUserError"
    assert error_of(admin.put("/api/v1/virtual-clusters/nowhere/budgets/alice",
                              json={"gpuHoursBudget": 1}), 404) == "NoVirtualClusterError"
    assert error_of(admin.get("/api/v1/virtual-clusters/nowhere/budgets"),
                    404) == "NoVirtualClusterError"


def test_deleting_the_user_or_the_vc_takes_the_budget_away(store: Store) -> None:
    research_with_budget(store, "wait")
    accounts = Accounts(store)
    accounts.delete_user("alice")
    assert (accounts.get_vc("research") or pytest.fail()).user_gpu_hours_budgets == {}
    # a user created later under the name starts without one
    accounts.create_user("alice", "secret-pw")
    assert (accounts.get_vc("research") or pytest.fail()).user_gpu_hours_budgets == {}

    accounts.set_user_budget("research", "alice", 5)
    accounts.delete_vc("research")
    assert not store.r.exists(keys.vc_user_budgets("research"))
    accounts.put_vc(VirtualCluster("research", 4))
    assert (accounts.get_vc("research") or pytest.fail()).user_gpu_hours_budgets == {}


def test_metrics_show_each_users_budget_and_spend(store: Store,
                                                 flask_client: FlaskClient) -> None:
    research_with_budget(store, "oppo")
    used_today(store.r, "alice", "research", 9 * 60)
    used_today(store.r, "carol", "research", 60)  # no budget of her own: no series

    resp = flask_client.get("/metrics")

    assert resp.status_code == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(resp.get_data(as_text=True))
               for s in family.samples if s.name.startswith("pai_user_gpu_hours")}
    where = (("period", "week"), ("user", "alice"), ("vc", "research"))
    assert samples == {("pai_user_gpu_hours_budget", where): 10.0,
                       ("pai_user_gpu_hours_spent", where): 9.0}


# ------------------------------------------------------------ retention

def record_on(r: redis.Redis, day_ms: int, user: str, retention_days: int) -> None:
    """One GPU-hour of `user` in research on the day of `day_ms`."""
    pipe = r.pipeline()
    usage.record_interval(pipe, usage.Interval(f"{user}~j{day_ms}", 0, "main", 0, user,
                                               "research", day_ms, day_ms + 3600_000,
                                               1, 1, 128), retention_days)
    pipe.execute()


def test_the_write_sets_each_day_keys_expiry(redis_client: redis.Redis) -> None:
    today = usage.day_start_ms(usage.day_of(now_ms()))
    record_on(redis_client, today, "alice", 400)
    record_on(redis_client, today - 450 * DAY, "alice", 400)  # already past retention

    day = usage.day_of(today)
    expected = usage.expires_at_ms(day, 400)
    assert redis_client.pexpiretime(keys.usage_day(day)) == expected
    assert redis_client.pexpiretime(keys.usage_records(day)) == expected
    old = usage.day_of(today - 450 * DAY)
    assert not redis_client.exists(keys.usage_day(old), keys.usage_records(old))


def test_the_sweep_expires_old_days_and_keeps_the_rest(store: Store, redis_server: str) -> None:
    r = store.r
    today = usage.day_start_ms(usage.day_of(now_ms()))
    days = {"old": today - 450 * DAY, "kept": today - 10 * DAY, "today": today}
    for at in days.values():  # written before writes set an expiry
        record_on(r, at, "alice", 0)
    r.set(keys.USAGE_RETENTION + "-unrelated", "1")  # not a day key: left alone
    settings = Settings(redis_url=redis_server, usage_retention_days=400)

    changed = 0
    for _ in range(1000):  # each sweep is one SCAN step
        report = retention.sweep(store, settings)
        changed += report.usage_keys
        if r.hget(keys.USAGE_RETENTION, "enforced") == "400":
            break
    else:
        pytest.fail("the usage walk never finished")

    assert changed == 6  # a day hash and a records hash per day
    old = usage.day_of(days["old"])
    assert not r.exists(keys.usage_day(old), keys.usage_records(old))
    for name in ("kept", "today"):
        day = usage.day_of(days[name])
        assert r.pexpiretime(keys.usage_day(day)) == usage.expires_at_ms(day, 400)
    assert r.pttl(keys.USAGE_RETENTION + "-unrelated") == -1
    # budgets still read what is kept
    spent = usage.read_spends(r, {("research", "alice"): usage.Budget(10, "day")}, [], now_ms())
    assert spent[("research", "alice")].gpu_ms == 3600_000
    # the walk done, the next sweeps leave the keys alone
    assert retention.sweep(store, settings).usage_keys == 0
    # another setting walks again: 0 keeps usage for ever
    forever = Settings(redis_url=redis_server, usage_retention_days=0)
    for _ in range(1000):
        retention.sweep(store, forever)
        if r.hget(keys.USAGE_RETENTION, "enforced") == "0":
            break
    assert r.pttl(keys.usage_day(usage.day_of(today))) == -1


def test_a_report_older_than_retention_says_it_was_trimmed(
        admin: AuthedClient, redis_client: redis.Redis) -> None:
    today = usage.day_start_ms(usage.day_of(now_ms()))
    for at in (today - 450 * DAY, today - 10 * DAY):  # both still in Redis (not swept)
        record_on(redis_client, at, "alice", 0)
    first = usage.day_of(today - 500 * DAY)

    report = admin.get(f"/api/v1/usage?from={first}&groupBy=day").json

    kept = usage.day_of(now_ms() - 400 * DAY)
    assert (report["trimmed"], report["retainedFrom"], report["from"]) == (True, kept, first)
    assert [row["day"] for row in report["rows"]] == [usage.day_of(today - 10 * DAY)]
    recent = admin.get("/api/v1/usage?groupBy=day").json
    assert (recent["trimmed"], recent["retainedFrom"]) == (False, kept)
