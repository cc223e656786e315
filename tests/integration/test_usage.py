"""Usage accounting on a real Redis: recorded once at a task's exit, rolled
up by day, and reported by GET /api/v1/usage (JSON and CSV) to whom may see it."""

from __future__ import annotations

import csv
import io
import json
import threading
from typing import Any

import pytest
import redis

from shared.domain.models import Gpu, Node, TaskPlacement
from shared.infra.clock import now_ms
from shared.state import keys, telemetry, usage
from shared.state.lifecycle import mark_task_running, submit_job
from shared.state.placing import commit_placement
from shared.state.store import Store
from shared.state.taskexits import record_task_exit
from tests.support.api import AuthedClient

pytestmark = pytest.mark.redis

DEADLINE_MS = 2**41
# A midnight 30 days ago: inside the default report span, and kept by retention.
MIDNIGHT = usage.day_start_ms(usage.day_of(now_ms())) - 30 * 24 * 3600 * 1000
DAY1, DAY2 = usage.day_of(MIDNIGHT - 1), usage.day_of(MIDNIGHT)
HOUR = 3600 * 1000


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    store = Store(redis_client)
    store.register_node(Node("n1", "10.0.0.1", cpus=64, memory_mb=1 << 20,
                             gpus=[Gpu(i) for i in range(8)]))
    return store


def run_job(store: Store, user: str, name: str, *, gpus: int = 2, cpus: int = 3,
            memory_mb: int = 1000, vc: str = "default") -> str:
    """A one-task job placed on n1 and running; its id."""
    job = submit_job(store, user, {
        "jobName": name, "image": "busybox", "virtualCluster": vc,
        "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": cpus,
                       "memoryMB": memory_mb, "gpuNumber": gpus, "command": "true"}]})
    first = sum(len(a.gpus) for a in store.get_allocations(store.r, "n1").values())
    assert commit_placement(store, job.id, version=job.version, attempt=0, placements=[
        TaskPlacement("main", 0, "n1", "10.0.0.1", tuple(range(first, first + gpus)), cpus,
                      memory_mb, {})], launch_deadline_ms=DEADLINE_MS)
    assert mark_task_running(store, job.id, 0, "main", 0, "container")
    return job.id


def recorded(r: redis.Redis, day: str) -> list[usage.DayUsage]:
    return usage.read_days(r, [day])


def counters(r: redis.Redis) -> dict[str, dict[tuple[str, ...], float]]:
    return {v.metric.name: v.counters for v in telemetry.read_recorded(r, usage.COUNTERS)}


def interval(start: int, end: int, *, user: str = "alice", vc: str = "default",
             job: str = "alice~a", gpus: int = 2, index: int = 0) -> usage.Interval:
    return usage.Interval(job, 0, "main", index, user, vc, start, end, gpus, 4, 1000)


def write(r: redis.Redis, *spans: usage.Interval) -> None:
    pipe = r.pipeline()
    for span in spans:
        usage.record_interval(pipe, span)
    pipe.execute()


# ------------------------------------------------------------- recording


# The reporter's node: none named (the allocation is read after the task),
# the task's own (read with it), or another one (read after it all the same)
@pytest.mark.parametrize("node", [None, "n1", "n2"])
def test_a_task_exit_records_its_hold_from_placement_to_exit_once(store: Store,
                                                                  node: str | None) -> None:
    job_id = run_job(store, "alice", "train", gpus=2, cpus=3, memory_mb=1000)
    assert record_task_exit(store, job_id, 0, "main", 0, exit_code=0, node=node) is not None
    assert record_task_exit(store, job_id, 0, "main", 0, exit_code=0,
                            node=node) is None  # redelivered
    task = store.get_task(job_id, 0, "main", 0)
    assert task is not None and task.launched_ms is not None and task.completed_ms is not None
    held = task.completed_ms - task.launched_ms
    rows = usage.day_rows([usage.Interval(job_id, 0, "main", 0, "alice", "default",
                                          task.launched_ms, task.completed_ms, 2, 3, 1000)])
    assert usage.read_days(store.r, [r.day for r in rows]) == rows
    assert sum(r.gpu_ms for r in rows) == 2 * held
    records = store.r.hgetall(keys.usage_records(usage.day_of(task.launched_ms)))
    assert [json.loads(v)["job"] for v in records.values()] == [job_id]
    # A hold of no whole millisecond adds nothing, so its counter may be absent
    gpu_seconds = counters(store.r)["pai_gpu_seconds"]
    assert gpu_seconds.get(("alice", "default"), 0.0) == 2 * held / 1000
    assert set(gpu_seconds) <= {("alice", "default")}


def test_racing_exit_reports_count_the_task_once(store: Store, redis_server: str) -> None:
    """The monitor's die event and its reconcile pass settle the same exit
    at the same moment, each on its own connection: one of them records."""
    job_id = run_job(store, "alice", "race", gpus=1)
    barrier = threading.Barrier(4)
    results: list[object] = []

    def report() -> None:
        client = redis.Redis.from_url(redis_server, decode_responses=True)
        barrier.wait()
        results.append(record_task_exit(Store(client), job_id, 0, "main", 0, exit_code=0))
        client.close()

    threads = [threading.Thread(target=report) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 4 and sum(r is not None for r in results) == 1
    task = store.get_task(job_id, 0, "main", 0)
    assert task is not None and task.launched_ms is not None and task.completed_ms is not None
    day = usage.day_of(task.launched_ms)
    assert len(store.r.hgetall(keys.usage_records(day))) == 1
    assert sum(r.gpu_ms for r in usage.read_days(store.r, usage.days_between(
        day, usage.day_of(task.completed_ms)))) == task.completed_ms - task.launched_ms


def test_recording_the_same_interval_twice_counts_it_once(redis_client: redis.Redis) -> None:
    span = interval(MIDNIGHT - HOUR, MIDNIGHT + HOUR)
    write(redis_client, span)
    write(redis_client, span, span)
    assert [r.gpu_ms for r in recorded(redis_client, DAY1)] == [2 * HOUR]
    assert [r.gpu_ms for r in recorded(redis_client, DAY2)] == [2 * HOUR]
    assert counters(redis_client)["pai_gpu_seconds"] == {("alice", "default"): 4 * 3600.0}
    # the same task placed again later (a job deleted and submitted again) is new usage
    write(redis_client, interval(MIDNIGHT + 2 * HOUR, MIDNIGHT + 3 * HOUR))
    assert [r.gpu_ms for r in recorded(redis_client, DAY2)] == [4 * HOUR]


# ------------------------------------------------------------------ the API


def rows_of(client: AuthedClient, **query: str) -> list[dict[str, Any]]:
    resp = client.get("/api/v1/usage", query_string=query)
    assert resp.status_code == 200, resp.json
    rows: list[dict[str, Any]] = resp.json["rows"]
    return rows


@pytest.fixture
def history(redis_client: redis.Redis, alice: AuthedClient, bob: AuthedClient) -> None:
    write(redis_client,
          interval(MIDNIGHT - HOUR, MIDNIGHT + HOUR, job="alice~a"),  # 2 GPUs over midnight
          interval(MIDNIGHT, MIDNIGHT + HOUR, user="bob", vc="research", job="bob~b", gpus=1),
          interval(MIDNIGHT + HOUR, MIDNIGHT + 2 * HOUR, vc="research", job="alice~c", gpus=4))


SPAN = {"from": DAY1, "to": DAY2}


@pytest.mark.usefixtures("history")
def test_an_admin_sees_everyone_grouped_as_asked(admin: AuthedClient) -> None:
    assert rows_of(admin, **SPAN) == [
        {"user": "alice", "gpuSeconds": 8 * 3600.0, "cpuSeconds": 12 * 3600.0,
         "memoryMbSeconds": 3000 * 3600.0},
        {"user": "bob", "gpuSeconds": 3600.0, "cpuSeconds": 4 * 3600.0,
         "memoryMbSeconds": 1000 * 3600.0}]
    assert [(r["vc"], r["gpuSeconds"]) for r in rows_of(admin, groupBy="vc", **SPAN)] == [
        ("default", 4 * 3600.0), ("research", 5 * 3600.0)]
    assert [(r["day"], r["user"], r["gpuSeconds"])
            for r in rows_of(admin, groupBy="day,user", **SPAN)] == [
        (DAY1, "alice", 2 * 3600.0), (DAY2, "alice", 6 * 3600.0),
        (DAY2, "bob", 3600.0)]
    assert [r["job"] for r in rows_of(admin, groupBy="job", vc="research", **SPAN)] == [
        "alice~c", "bob~b"]
    assert rows_of(admin, user="Bob", **SPAN)[0]["user"] == "bob"  # names fold to lowercase
    assert rows_of(admin, **{"from": DAY2, "to": DAY2, "groupBy": "day"}) == [
        {"day": DAY2, "gpuSeconds": 7 * 3600.0, "cpuSeconds": 12 * 3600.0,
         "memoryMbSeconds": 3000 * 3600.0}]


@pytest.mark.usefixtures("history")
def test_a_user_sees_only_their_own_usage(alice: AuthedClient, bob: AuthedClient) -> None:
    assert [r["user"] for r in rows_of(alice, **SPAN)] == ["alice"]
    assert [r["job"] for r in rows_of(bob, groupBy="job", **SPAN)] == ["bob~b"]
    assert [r["job"] for r in rows_of(alice, groupBy="job", vc="research", **SPAN)] == [
        "alice~c"]
    refused = bob.get("/api/v1/usage", query_string={"user": "alice", **SPAN})
    assert refused.status_code == 403 and refused.json["code"] == "ForbiddenUserError"


@pytest.mark.usefixtures("history")
def test_csv_for_chargeback(admin: AuthedClient) -> None:
    resp = admin.get("/api/v1/usage", query_string={"format": "csv", "groupBy": "user,vc",
                                                    **SPAN})
    assert resp.status_code == 200 and resp.mimetype == "text/csv"
    assert "attachment" in resp.headers["Content-Disposition"]
    table = list(csv.reader(io.StringIO(resp.get_data(as_text=True))))
    assert table == [["user", "vc", "gpuSeconds", "cpuSeconds", "memoryMbSeconds"],
                     ["alice", "default", "14400.0", "28800.0", "7200000.0"],
                     ["alice", "research", "14400.0", "14400.0", "3600000.0"],
                     ["bob", "research", "3600.0", "14400.0", "3600000.0"]]


def test_a_running_task_counts_up_to_now(store: Store, admin: AuthedClient) -> None:
    job_id = run_job(store, "alice", "long", gpus=2)
    task = store.get_task(job_id, 0, "main", 0)
    assert task is not None and task.launched_ms is not None
    before = sum(r["gpuSeconds"] for r in rows_of(admin, groupBy="day"))
    resp = admin.get("/api/v1/usage", query_string={"groupBy": "job"})
    assert resp.json["rows"][0]["job"] == job_id
    assert resp.json["rows"][0]["gpuSeconds"] == pytest.approx(
        2 * (resp.json["asOf"] - task.launched_ms) / 1000)
    assert resp.json["rows"][0]["gpuSeconds"] >= before  # it only grows
    # once it ended, the recorded interval replaces the running one (never both)
    record_task_exit(store, job_id, 0, "main", 0, exit_code=0)
    done = store.get_task(job_id, 0, "main", 0)
    assert done is not None and done.completed_ms is not None
    assert rows_of(admin, groupBy="job")[0]["gpuSeconds"] == pytest.approx(
        2 * (done.completed_ms - task.launched_ms) / 1000)


@pytest.mark.parametrize("query", [
    pytest.param({"groupBy": "node"}, id="unknown dimension"),
    pytest.param({"groupBy": ","}, id="no dimension"),
    pytest.param({"from": DAY2, "to": DAY1}, id="from after to"),
    pytest.param({"from": "2020-01-01", "to": DAY1}, id="span too long"),
    pytest.param({"from": "yesterday"}, id="not a date"),
    pytest.param({"format": "xlsx"}, id="unknown format"),
    pytest.param({"user": "../etc"}, id="not a user name"),
    pytest.param({"usr": "alice"}, id="a typo'd parameter"),
])
def test_bad_queries_are_400s(admin: AuthedClient, query: dict[str, str]) -> None:
    resp = admin.get("/api/v1/usage", query_string=query)
    assert resp.status_code == 400, resp.json
    assert resp.json["code"] == "BadRequestError"


def test_a_csv_cell_is_never_a_formula() -> None:
    from services.api.usage import _cell
    assert _cell("=HYPERLINK(\"x\")") == "'=HYPERLINK(\"x\")" and _cell("alice") == "alice"
    assert _cell(1.5) == 1.5


def test_a_user_never_sees_anothers_running_jobs(store: Store, alice: AuthedClient,
                                                 admin: AuthedClient) -> None:
    """Attack: alice asks for everything, for bob, or for a name that is a
    prefix of another's ("al" of "alice"): she gets her own rows only, or a 403."""
    run_job(store, "bob", "secret-project", gpus=1)
    run_job(store, "alice", "mine", gpus=1)
    assert [r["job"] for r in rows_of(alice, groupBy="job")] == ["alice~mine"]
    assert [r["job"] for r in rows_of(alice, groupBy="job,vc", vc="default")] == ["alice~mine"]
    assert alice.get("/api/v1/usage", query_string={"user": "bob"}).status_code == 403
    assert alice.get("/api/v1/usage", query_string={"user": "al"}).status_code == 403
    assert rows_of(admin, user="al", groupBy="job") == []
    assert [r["job"] for r in rows_of(admin, groupBy="job")] == ["alice~mine",
                                                                 "bob~secret-project"]
