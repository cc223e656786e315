"""Usage accounting on the running platform: a real job on virtual GPUs adds
its GPU-seconds to its user, its VC and the Prometheus counters."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from bench.live_platform import Platform

pytestmark = pytest.mark.docker


def gpu_seconds(pai: Platform, session: requests.Session, by: str) -> dict[str, float]:
    resp = session.get(f"{pai.url}/api/v1/usage", params={"groupBy": by}, timeout=30)
    assert resp.status_code == 200, resp.text
    return {row[by]: row["gpuSeconds"] for row in resp.json()["rows"]}


def counted(pai: Platform) -> float:
    text = requests.get(f"{pai.url}/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == "pai_gpu_seconds_total"
               and sample.labels == {"user": "alice", "vc": "default"})


def test_a_two_gpu_job_of_five_seconds_adds_ten_gpu_seconds(
        platform: Platform, unique: Callable[[str], str]) -> None:
    name = unique("usage")
    users, vcs = gpu_seconds(platform, platform.admin, "user"), \
        gpu_seconds(platform, platform.admin, "vc")
    metric = counted(platform)

    platform.submit_accepted(platform.config(name, "sleep 5", gpus=2))
    assert platform.wait_state(name)["jobStatus"]["state"] == "SUCCEEDED"

    mine = gpu_seconds(platform, platform.http, "job")  # alice's own view
    assert mine[f"alice~{name}"] >= 10
    assert gpu_seconds(platform, platform.admin, "user")["alice"] - users.get("alice", 0) >= 10
    assert gpu_seconds(platform, platform.admin, "vc")["default"] - vcs.get("default", 0) >= 10
    assert counted(platform) - metric >= 10
