"""The API's /metrics on a real Redis: gauges read at scrape time, counters recorded
by the services, request latency, and a scrape that survives Redis going away."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from services.api.app import create_app
from services.api.metrics import ClusterCollector, RecordedCollector, metric_names
from services.scheduler.service import Scheduler
from shared.domain.models import Gpu, Node
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state import keys, telemetry
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.lifecycle import mark_task_running, submit_job
from shared.state.store import Store
from shared.state.taskexits import record_task_exit

pytestmark = pytest.mark.redis

ADMIN, PASSWORD = "root", "root-password"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def settings(redis_server: str) -> Settings:
    return Settings(redis_url=redis_server, admin_user=ADMIN, admin_password=PASSWORD,
                    node_lost_seconds=30)


@pytest.fixture
def app(settings: Settings, redis_client: redis.Redis) -> Flask:
    return create_app(settings)


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    return Store(redis_client)


@pytest.fixture
def scheduler(settings: Settings, store: Store) -> Iterator[Scheduler]:
    celery = make_celery(settings)
    yield Scheduler(settings, store, Messenger(celery))
    celery.close()


def scrape(client: FlaskClient) -> Samples:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.content_type.startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(resp.get_data(as_text=True))
            for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def add_node(store: Store, name: str, gpus: int, heartbeat_ms: int | None = None) -> None:
    store.register_node(Node(name, "127.0.0.1", cpus=8, memory_mb=8192,
                             gpus=[Gpu(i, f"GPU-{name}-{i}", "Tesla") for i in range(gpus)],
                             port_range=(20000, 20100)))
    if heartbeat_ms is not None:
        store.r.zadd(keys.NODES, {name: heartbeat_ms})


def config(name: str, gpus: int = 1, vc: str = "default", retry: int = 0) -> dict[str, Any]:
    return {"jobName": name, "image": "busybox", "virtualCluster": vc, "retryCount": retry,
            "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
                           "gpuNumber": gpus, "command": "true"}]}


def test_metrics_need_no_token_and_speak_the_prometheus_format(app: Flask) -> None:
    samples = scrape(app.test_client())

    assert value(samples, "pai_redis_up") == 1.0
    assert value(samples, "pai_jobs", state="WAITING", vc="default") == 0.0


def test_jobs_queue_gpus_and_nodes_are_read_from_redis_at_scrape_time(
        app: Flask, store: Store, scheduler: Scheduler) -> None:
    Accounts(store).put_vc(VirtualCluster("vision", gpu_quota=4))
    add_node(store, "n1", gpus=4)
    add_node(store, "n2", gpus=2, heartbeat_ms=now_ms() - 3_600_000)  # lost an hour ago
    submit_job(store, "alice", config("a", gpus=2))
    submit_job(store, "alice", config("b", gpus=1, vc="vision"))
    submit_job(store, "alice", config("c", gpus=4))  # 1 GPU is left: it waits
    scheduler.run_pass()
    mark_task_running(store, "alice~a", 0, "main", 0, "container-a")

    samples = scrape(app.test_client())

    assert value(samples, "pai_jobs", state="RUNNING", vc="default") == 1.0
    assert value(samples, "pai_jobs", state="WAITING", vc="default") == 1.0
    assert value(samples, "pai_jobs", state="WAITING", vc="vision") == 1.0  # placed, starting
    assert value(samples, "pai_queue_length", vc="default") == 1.0
    assert value(samples, "pai_queue_length", vc="vision") == 0.0
    waited = value(samples, "pai_queue_oldest_waiting_seconds", vc="default")
    assert waited is not None and 0 <= waited < 60
    assert value(samples, "pai_gpus_total", node="n1") == 4.0
    assert value(samples, "pai_gpus_allocated", node="n1", vc="default") == 2.0
    assert value(samples, "pai_gpus_allocated", node="n1", vc="vision") == 1.0
    assert value(samples, "pai_gpus_free", node="n1") == 1.0
    assert value(samples, "pai_gpus_free", node="n2") == 2.0
    assert value(samples, "pai_vc_gpu_quota", vc="vision") == 4.0
    assert value(samples, "pai_vc_gpu_quota", vc="default") is None  # no limit
    assert value(samples, "pai_node_cpus_allocated", node="n1") == 2.0
    assert value(samples, "pai_node_memory_bytes_total", node="n1") == 8192 * 1024 * 1024
    assert value(samples, "pai_node_up", node="n1") == 1.0
    assert value(samples, "pai_node_up", node="n2") == 0.0
    beat = value(samples, "pai_node_last_heartbeat_timestamp_seconds", node="n2")
    assert beat is not None and abs(beat - (now_ms() / 1000 - 3600)) < 60


def test_the_longest_wait_counts_a_retry_from_its_requeueing(
        app: Flask, store: Store, scheduler: Scheduler, redis_client: redis.Redis) -> None:
    add_node(store, "n1", gpus=1)
    submit_job(store, "alice", config("retried", retry=1))
    scheduler.run_pass()
    mark_task_running(store, "alice~retried", 0, "main", 0, "container")
    report = record_task_exit(store, "alice~retried", 0, "main", 0, exit_code=1)
    assert report is not None and report.retried  # back in the queue, at its old place
    submit_job(store, "alice", config("fresh"))
    # White box: as if the first was submitted 2 hours ago and the second 10 minutes ago.
    redis_client.hset(keys.job("alice~retried"), "created_ms", now_ms() - 7_200_000)
    redis_client.hset(keys.job("alice~fresh"), "created_ms", now_ms() - 600_000)

    waited = value(scrape(app.test_client()), "pai_queue_oldest_waiting_seconds", vc="default")

    assert waited is not None and 595 <= waited < 660


def test_what_services_record_is_exported_as_counters_and_histograms(
        app: Flask, store: Store, scheduler: Scheduler) -> None:
    add_node(store, "n1", gpus=8)
    for name in ("ok", "bad", "lost"):
        submit_job(store, "alice", config(name))
    scheduler.run_pass()
    for name in ("ok", "bad", "lost"):
        mark_task_running(store, f"alice~{name}", 0, "main", 0, f"container-{name}")
    record_task_exit(store, "alice~ok", 0, "main", 0, exit_code=0)
    record_task_exit(store, "alice~bad", 0, "main", 0, exit_code=3)
    record_task_exit(store, "alice~bad", 0, "main", 0, exit_code=3)  # a redelivery: once
    record_task_exit(store, "alice~lost", 0, "main", 0, exit_code=-1, platform_failure=True)
    scheduler.heartbeat("scheduler-a")

    samples = scrape(app.test_client())

    assert value(samples, "pai_task_exits_total", state="SUCCEEDED", **{"class": "user"}) == 1
    assert value(samples, "pai_task_exits_total", state="FAILED", **{"class": "user"}) == 1
    assert value(samples, "pai_task_exits_total", state="FAILED", **{"class": "platform"}) == 1
    assert value(samples, "pai_scheduler_placements_total", vc="default") == 3
    assert (value(samples, "pai_scheduler_pass_duration_seconds_count") or 0) >= 1
    assert value(samples, "pai_scheduler_pass_duration_seconds_bucket", le="+Inf") == \
        value(samples, "pai_scheduler_pass_duration_seconds_count")
    assert value(samples, "pai_job_submit_to_running_seconds_count", vc="default") == 3
    assert value(samples, "pai_job_submit_to_running_seconds_bucket", vc="default",
                 le="60.0") == 3
    beat = value(samples, "pai_scheduler_last_heartbeat_timestamp_seconds",
                 scheduler="scheduler-a")
    assert beat is not None and abs(beat - now_ms() / 1000) < 60


def test_request_latency_is_counted_by_endpoint_method_and_status(app: Flask) -> None:
    client = app.test_client()
    for _ in range(3):
        assert client.get("/healthz").status_code == 200
    assert client.get("/api/v1/jobs").status_code == 401
    assert client.get("/no/such/page").status_code == 404

    samples = scrape(client)

    count = "pai_api_request_duration_seconds_count"
    assert value(samples, count, endpoint="cluster.healthz", method="GET", status="200") == 3
    assert value(samples, count, endpoint="jobs.list_jobs", method="GET", status="401") == 1
    assert value(samples, count, endpoint="unmatched", method="GET", status="404") == 1


def test_made_up_methods_share_one_label_set(app: Flask, redis_client: redis.Redis) -> None:
    """Any upper-case token is a method to gunicorn: a client sending a new
    one each time must not add a label set (up to 14 Redis fields and as many
    exposed series) per request."""
    client = app.test_client()
    for n in range(40):
        client.open("/api/v1/jobs", method=f"X{n:03d}")
    client.open("/healthz", method="PATCH")

    samples = scrape(client)

    count = "pai_api_request_duration_seconds_count"
    methods = {dict(labels)["method"] for name, labels in samples if name == count}
    assert methods == {"PATCH", "other"}
    assert value(samples, count, endpoint="unmatched", method="other", status="401") == 40
    assert value(samples, count, endpoint="unmatched", method="PATCH", status="405") == 1


def test_several_api_workers_add_to_the_same_counts(settings: Settings,
                                                    redis_client: redis.Redis) -> None:
    workers = [create_app(settings).test_client() for _ in range(2)]
    for worker in workers:
        worker.get("/healthz")
    workers[0].get("/metrics")  # each worker writes its own requests before it answers

    samples = scrape(workers[1])

    assert value(samples, "pai_api_request_duration_seconds_count", endpoint="cluster.healthz",
                 method="GET", status="200") == 2


def test_a_scrape_while_redis_is_down_says_so_instead_of_failing() -> None:
    store = Store.from_url("redis://127.0.0.1:1/0")  # nothing listens there
    cluster = list(ClusterCollector(store, Settings()).collect())
    recorded = list(RecordedCollector(store.r).collect())

    redis_up = next(f for f in cluster if f.name == "pai_redis_up")
    assert [s.value for s in redis_up.samples] == [0]
    assert all(not f.samples for f in cluster if f.name != "pai_redis_up")
    assert {f.name for f in recorded} == {m.name for m in telemetry.RECORDED}


def test_every_family_is_named_pai_and_described(app: Flask) -> None:
    names = metric_names(app.extensions["pai.metrics"].registry)

    assert all(name.startswith("pai_") for name in names)
    assert {"pai_jobs", "pai_gpus_total", "pai_gpus_allocated", "pai_gpus_free",
            "pai_task_exits_total", "pai_scheduler_pass_duration_seconds_bucket",
            "pai_api_request_duration_seconds_sum"} <= names
