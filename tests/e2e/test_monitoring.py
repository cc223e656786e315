"""A real Prometheus (Debian's `prometheus`) scrapes the running platform.

Prometheus gets a config generated here (the compose one names compose
hosts) that scrapes this session's api and monitor on 127.0.0.1 every second
and loads deploy/prometheus/rules; its data lives in a temp dir and it is
stopped by its PID.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from bench.live_platform import Platform, free_port, wait_for

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules"
# The job runs until the test stops it; it keeps one core a little busy.
BUSY = "while true; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; sleep 0.2; done"


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        resp.raise_for_status()
        body = resp.json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def targets(self) -> dict[str, str]:
        resp = requests.get(f"{self.url}/api/v1/targets", timeout=10)
        resp.raise_for_status()
        return {t["labels"]["job"]: t["health"] for t in resp.json()["data"]["activeTargets"]}


@pytest.fixture(scope="module")
def prometheus(platform: Platform, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not on PATH: run `make test` (it installs Debian's "
                    "prometheus package when root), or install it yourself", pytrace=False)
    work = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES / "*.yml")],
        "scrape_configs": [
            {"job_name": "pai-api", "static_configs": [
                {"targets": [f"127.0.0.1:{platform.env['PAI_API_PORT']}"]}]},
            {"job_name": "pai-monitor", "static_configs": [
                {"targets": [f"127.0.0.1:{platform.env['PAI_MONITOR_PORT']}"]}]},
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(work / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [binary, f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--storage.tsdb.retention.time=1h"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited:\n{(work / 'prometheus.log').read_text()[-3000:]}")
        with contextlib.suppress(requests.RequestException):
            return requests.get(f"{url}/-/ready", timeout=2).status_code == 200
        return False

    try:
        wait_for(ready, timeout=60, what="prometheus to be ready")
        yield Prometheus(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def test_prometheus_scrapes_the_api_and_the_monitor(prometheus: Prometheus) -> None:
    targets = wait_for(lambda: (t := prometheus.targets()) and
                       all(h == "up" for h in t.values()) and t,
                       timeout=60, what="both targets to be up")
    assert set(targets) == {"pai-api", "pai-monitor"}


def test_a_running_jobs_series_reach_prometheus(platform: Platform, prometheus: Prometheus,
                                                unique: Callable[[str], str]) -> None:
    name = unique("watched")
    assert platform.submit(platform.config(name, BUSY)).status_code == 202
    try:
        platform.wait_state(name, "RUNNING")

        jobs = wait_for(lambda: prometheus.query('pai_jobs{state="RUNNING", vc="default"} > 0'),
                        timeout=60, what="pai_jobs to show a running job")
        cpu = wait_for(lambda: prometheus.query(
            f'pai_task_cpu_percent{{user="alice", job_name="{name}"}}'),
            timeout=60, what="the task's CPU series")
        memory = wait_for(lambda: prometheus.query(
            f'pai_task_memory_bytes{{user="alice", job_name="{name}"}}'),
            timeout=30, what="the task's memory series")
    finally:
        platform.stop(name)
    assert float(jobs[0]["value"][1]) >= 1
    series = cpu[0]["metric"]
    assert {k: series[k] for k in ("node", "role", "index", "attempt", "vc")} == {
        "node": platform.node, "role": "main", "index": "0", "attempt": "0", "vc": "default"}
    assert series["job"] == "pai-monitor"  # the scrape job: why the label is job_name
    assert float(cpu[0]["value"][1]) >= 0
    assert float(memory[0]["value"][1]) > 0


def test_without_nvml_there_are_no_gpu_series(platform: Platform,
                                              prometheus: Prometheus) -> None:
    nvml = wait_for(lambda: prometheus.query(f'pai_monitor_nvml_up{{node="{platform.node}"}}'),
                    timeout=60, what="the monitor's NVML gauge")

    assert float(nvml[0]["value"][1]) == 0  # no NVML here; the node's 8 GPUs are virtual
    assert prometheus.query("pai_gpu_utilization_percent") == []
    assert prometheus.query("pai_task_gpu_utilization_percent") == []
    gpus = prometheus.query(f'pai_gpus_total{{node="{platform.node}"}}')
    assert float(gpus[0]["value"][1]) == 8  # what the scheduler places: the API's view


def test_the_alert_rules_load_and_nothing_fires_on_a_healthy_platform(
        platform: Platform, prometheus: Prometheus) -> None:
    beat = wait_for(lambda: prometheus.query("pai_scheduler_last_heartbeat_timestamp_seconds"),
                    timeout=60, what="the scheduler's heartbeat")
    assert beat

    def rules() -> dict[str, dict[str, Any]]:
        resp = requests.get(f"{prometheus.url}/api/v1/rules", timeout=10)
        return {r["name"]: r for g in resp.json()["data"]["groups"] for r in g["rules"]}

    loaded = rules()
    assert {"PaiNodeDown", "PaiSchedulerDown", "PaiRedisDown"} <= set(loaded)
    assert all(r["health"] != "err" for r in loaded.values()), loaded
    # Evaluated every second: a rule that saw the first scrape without the
    # first heartbeat may be pending for a moment, never firing.
    healthy = ("PaiNodeDown", "PaiSchedulerDown", "PaiRedisDown", "PaiApiDown")
    assert all(loaded[alert]["state"] != "firing" for alert in healthy), loaded
    wait_for(lambda: all(rules()[alert]["state"] == "inactive" for alert in healthy),
             timeout=30, what="the health alerts to be inactive")
