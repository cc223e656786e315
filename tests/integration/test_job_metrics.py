"""`GET /api/v1/user/<u>/jobs/<name>/metrics` against a real Prometheus
(Debian's `prometheus`, scraping every second the monitor's own collector,
served here with a task's series) and a real Redis: points arrive; a hostile
job name makes no PromQL of its own; with Prometheus down or not configured
the answer is the monitor's samples and says so; only the owner or an admin
reads it, as the samples endpoint."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
import yaml
from prometheus_client import start_http_server

from bench import free_port
from bench.live_platform import wait_for
from services.api import jobmetrics
from services.api.app import create_app
from services.monitor.exporter import build_registry
from services.monitor.nodemetrics import (
    GPU_MEMORY_USED,
    TASK_CPU,
    TASK_GPU_UTILIZATION,
    TASK_MEMORY,
    Series,
)
from shared.domain.states import JobState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.state import tasksamples
from shared.state.store import Store
from tests.integration.api_client import AuthedClient, error_of, new_user, portal_login, signed_in
from tests.integration.test_api_list import Jobs

pytestmark = pytest.mark.redis
NODE = "n1"
JOB = "train"
GIB = 1024**3


def task_series(job_name: str = JOB) -> list[Series]:
    """What the monitor shows for alice's job: main[0] on GPUs 0 and 1."""
    task = (NODE, "alice", job_name, "main", "0", "0", "default")
    return [
        Series(TASK_CPU, task, 42.0),
        Series(TASK_MEMORY, task, float(256 * 1024 * 1024)),
        Series(TASK_GPU_UTILIZATION, (*task, "0", "GPU-a"), 30.0),
        Series(TASK_GPU_UTILIZATION, (*task, "1", "GPU-b"), 70.0),
        Series(GPU_MEMORY_USED, (NODE, "0", "GPU-a", "V100"), float(2 * GIB)),
        Series(GPU_MEMORY_USED, (NODE, "1", "GPU-b", "V100"), float(3 * GIB)),
        Series(GPU_MEMORY_USED, (NODE, "2", "GPU-c", "V100"), float(5 * GIB)),  # another's
    ]


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    """The monitor's collector on 127.0.0.1, serving `task_series`."""
    port = free_port()
    server, thread = start_http_server(port, "127.0.0.1", registry=build_registry(task_series))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def prometheus(exporter: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not on PATH: install Debian's prometheus package",
                    pytrace=False)
    work = tmp_path_factory.mktemp("prometheus")
    (work / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "pai-monitor",
                            "static_configs": [{"targets": [exporter]}]}]}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(work / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited:\n{(work / 'prometheus.log').read_text()}")
            with contextlib.suppress(requests.RequestException):
                return requests.get(f"{url}/-/ready", timeout=2).status_code == 200
            return False

        try:
            wait_for(ready, timeout=60, what="prometheus to be ready")
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def _client(settings: Settings, **changes: Any) -> tuple[AuthedClient, AuthedClient]:
    """alice and bob on an app with these settings."""
    flask_client = create_app(dataclasses.replace(settings, **changes)).test_client()
    admin = signed_in(flask_client, "root")
    return new_user(flask_client, admin, "alice"), new_user(flask_client, admin, "bob")


@pytest.fixture
def job(redis_client: redis.Redis) -> Jobs:
    jobs = Jobs(Store(redis_client))
    jobs.add("alice", JOB, state=JobState.RUNNING, created_ms=now_ms() - 60_000)
    return jobs


def _recent(client: AuthedClient, path: str = f"/api/v1/user/alice/jobs/{JOB}/metrics"
            ) -> dict[str, Any]:
    now = now_ms()
    resp = client.get(f"{path}?from={now - 30_000}&to={now}&step=1")
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body: dict[str, Any] = resp.json  # type: ignore[assignment]
    return body


def _whole(sample: dict[str, Any]) -> bool:
    return all(sample[k] is not None for k in ("cpuPercent", "memoryBytes", "gpuMemoryBytes")) \
        and len(sample["gpuPercent"]) == 2


def test_the_metrics_come_from_prometheus(settings: Settings, prometheus: str,
                                          job: Jobs) -> None:
    # a loaded machine's Prometheus may be slow: the bound is not what is tested here
    alice, _ = _client(settings, prometheus_url=prometheus, prometheus_timeout_seconds=30.0)

    def scraped() -> dict[str, Any] | None:
        body = _recent(alice)
        assert body["source"] == "prometheus", body
        tasks = body["tasks"]
        # a few scrapes in: the page's own query (its grid of other instants) finds them too
        if not tasks or sum(_whole(s) for s in tasks[0]["samples"]) < 3:
            return None
        return body

    body = wait_for(scraped, timeout=60, what="Prometheus to have scraped the task")
    assert body["fallbackReason"] is None and body["stepSeconds"] == 1.0
    [task] = body["tasks"]
    assert (task["taskRole"], task["taskIndex"]) == ("main", 0)
    # a point is whole once every query saw its scrape (a scrape may land
    # between two of the queries: the newest point can lack a value)
    last = [s for s in task["samples"] if _whole(s)][-1]
    assert last["cpuPercent"] == 42.0 and last["memoryBytes"] == 256 * 1024 * 1024
    assert last["gpuPercent"] == [30.0, 70.0]  # by GPU index
    assert last["gpuMemoryBytes"] == 5 * GIB  # its two GPUs, not the node's third
    times = [s["time"] for s in task["samples"]]
    assert times == sorted(times) and len(times) == len(set(times))

    # the job's page draws them, GPU memory too, and says where they come from
    browser = alice.client.application.test_client()
    portal_login(browser, "alice")
    page = browser.get(f"/jobs/alice/{JOB}").get_data(as_text=True)
    assert "From Prometheus, a point every" in page
    for key in ("gpu", "cpu", "memory", "gpumemory"):
        assert f'id="chart-{key}"' in page
    assert page.count("<polyline") == 4


@pytest.mark.parametrize("name", ['x"} or vector(1) or {x="', "a\\", "b\n}", '") or up or ("'])
def test_a_hostile_name_is_only_a_label_value_to_prometheus(prometheus: str,
                                                            name: str) -> None:
    """Prometheus parses each query (no 400) and finds nothing: the name did
    not close its literal to add `vector(1)` or `up`."""
    wait_for(lambda: jobmetrics.query_range(
        prometheus, {"up": "up"}, now_ms() - 5000, now_ms(), 1, 10)["up"],
        timeout=60, what="a first scrape")
    found = jobmetrics.query_range(prometheus, jobmetrics.queries("alice", name, 0),
                                   now_ms() - 30_000, now_ms(), 1, 10)
    assert found == {key: [] for key in jobmetrics.queries("alice", name, 0)}


def _sample(redis_client: redis.Redis, at: int) -> None:
    with redis_client.pipeline() as pipe:
        tasksamples.add(pipe, f"alice~{JOB}", 0, "main", 0,
                        tasksamples.Sample(at, cpu_percent=12.5, memory_bytes=1024,
                                           gpu_percent=(40.0,)), maxlen=100)
        pipe.execute()


def test_without_prometheus_the_monitors_samples_are_the_source(
        settings: Settings, job: Jobs, redis_client: redis.Redis) -> None:
    alice, _ = _client(settings)  # PAI_PROMETHEUS_URL unset
    _sample(redis_client, now_ms() - 1000)
    _sample(redis_client, now_ms() - 3_600_000)  # before `from`: left out
    body = _recent(alice)
    assert (body["source"], body["fallbackReason"]) == ("samples", None)
    assert body["stepSeconds"] == settings.task_sample_seconds
    [task] = body["tasks"]
    assert [(s["cpuPercent"], s["gpuPercent"], s["gpuMemoryBytes"])
            for s in task["samples"]] == [(12.5, [40.0], None)]


def test_a_prometheus_that_fails_falls_back_to_the_samples(
        settings: Settings, job: Jobs, redis_client: redis.Redis, tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    alice, _ = _client(settings, prometheus_url=nobody, prometheus_timeout_seconds=2.0)
    _sample(redis_client, now_ms() - 1000)
    body = _recent(alice)
    assert body["source"] == "samples"
    assert body["fallbackReason"].startswith("Prometheus failed: unreachable")
    assert body["tasks"][0]["samples"][0]["cpuPercent"] == 12.5


def test_a_prometheus_error_answer_falls_back_too(settings: Settings, prometheus: str,
                                                 job: Jobs) -> None:
    """Prometheus answering 404 (a wrong path in the URL) is a failure, not data."""
    alice, _ = _client(settings, prometheus_url=f"{prometheus}/not-prometheus")
    body = _recent(alice)
    assert body["source"] == "samples" and "answered 404" in body["fallbackReason"]


def test_only_the_owner_or_an_admin_reads_the_metrics(settings: Settings, job: Jobs) -> None:
    alice, bob = _client(settings)
    resp = bob.get(f"/api/v1/user/alice/jobs/{JOB}/metrics")
    assert error_of(resp, 403) == "ForbiddenUserError"  # bob sees the job, not its use
    assert bob.get(f"/api/v1/user/alice/jobs/{JOB}").status_code == 200
    assert error_of(alice.get("/api/v1/user/alice/jobs/nope/metrics"), 404) == "NoJobError"


@pytest.mark.parametrize("query", ["from=10&to=5", "from=5&to=5", "step=0", "step=100000",
                                   "attempt=-1", "attempt=7", "from=soon", "to=-3"])
def test_a_bad_span_is_400(settings: Settings, job: Jobs, query: str) -> None:
    alice, _ = _client(settings)
    assert error_of(alice.get(f"/api/v1/user/alice/jobs/{JOB}/metrics?{query}"),
                    400) == "BadRequestError"


def test_the_defaults_span_the_jobs_life(settings: Settings, job: Jobs) -> None:
    alice, _ = _client(settings)
    body = alice.get(f"/api/v1/user/alice/jobs/{JOB}/metrics").json
    assert body is not None and body["final"] is False and body["attempt"] == 0
    assert body["to"] - body["from"] >= 60_000  # created a minute ago, still running
