"""GPU health on the running platform: an XID injected into the virtual GPU
a task runs on makes that GPU unschedulable, and the task is stopped and
retried on another GPU as the platform's failure (not charged a retry)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
import requests

from bench.live_platform import Platform, wait_for
from shared.state import gpufaults

pytestmark = pytest.mark.docker


def task(detail: dict[str, Any]) -> dict[str, Any]:
    status: dict[str, Any] = detail["taskRoles"]["main"]["taskStatuses"][0]
    return status


def gpu_view(pai: Platform, index: int) -> dict[str, Any]:
    node = pai.admin.get(f"{pai.url}/api/v1/nodes/{pai.node}", timeout=30).json()
    found: dict[str, Any] = node["gpus"][index]
    return found


def test_an_injected_xid_retries_the_task_elsewhere_uncharged(
        platform: Platform, unique: Callable[[str], str]) -> None:
    name = unique("xid")
    platform.submit_accepted(platform.config(name, "sleep 600", gpus=1))
    first = task(platform.wait_state(name, "RUNNING"))
    [failed] = first["containerGpus"]
    r = redis.Redis.from_url(platform.env["PAI_REDIS_URL"], decode_responses=True)
    try:
        gpufaults.inject(r, platform.node, failed, xid=79)

        def retried_and_running() -> dict[str, Any] | None:
            detail = platform.detail(name)
            return detail if detail["jobStatus"]["platformRetries"] == 1 \
                and task(detail)["taskState"] == "RUNNING" else None

        detail = wait_for(retried_and_running, 120, "the task to run again after the XID")
        status = detail["jobStatus"]
        assert (status["retries"], status["state"]) == (0, "RUNNING")
        assert failed not in task(detail)["containerGpus"]
        attempt = detail["attempts"][0]
        assert attempt["platformFailure"] is True
        view = gpu_view(platform, failed)
        assert (view["healthy"], view["unhealthyReason"]) == (False, "XID 79 (injected)")
        series = (f'pai_gpu_unhealthy{{index="{failed}",node="{platform.node}",'
                  'reason="XID 79 (injected)"} 1.0')
        exporter = f"http://127.0.0.1:{platform.env['PAI_MONITOR_PORT']}/metrics"
        wait_for(lambda: series in requests.get(exporter, timeout=30).text, 60,
                 "the node exporter to show the unhealthy GPU")
        # the first attempt's container was stopped, not left running on the bad GPU
        wait_for(lambda: all(c.labels.get("pai.attempt") != "0" or c.status != "running"
                             for c in platform.job_containers(name)),
                 60, "the first attempt's container to stop")
    finally:
        platform.stop(name)
        platform.admin.delete(f"{platform.url}/api/v1/nodes/{platform.node}/gpus/{failed}"
                              "/fault", timeout=30)
        r.close()
    assert gpu_view(platform, failed)["healthy"] is True
