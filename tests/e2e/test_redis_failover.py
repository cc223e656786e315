"""Redis high availability: kill -9 the primary under a running platform and
Sentinel's promotion of a replica loses no job (docs/high-availability.md).

A group of one primary and two replicas (append-only files on, the
platform's ACL, the write guard of shared/infra/sentinelconf.py) and three
sentinels, all real redis-server processes on free 127.0.0.1 ports in a temp
dir; the platform's services reach it through one `redis+sentinel://`
setting. The API is probed all along: 503 is allowed while the primary
switches, a 500 never.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import docker
import pytest
import requests

from bench.live_platform import Platform, platform_env, wait_for
from tests.support.platform import gate, open_gate, running_platform
from tests.support.redis_group import RedisGroup

pytestmark = [pytest.mark.docker, pytest.mark.redis]

JOBS_BEFORE, JOBS_DURING = 10, 3
# Every job runs until the test opens its gate, after the primary's switch.
JOB_COMMAND = "echo started; " + gate() + "echo finished"


class ApiProbe:
    """Reads the job list over and over from a thread, counting answers by
    status, until stopped: the API's face during the switch."""

    def __init__(self, pai: Platform) -> None:
        self.pai = pai
        self.statuses: dict[int, int] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with requests.Session() as session:
            session.headers.update(self.pai.http.headers)
            while not self.done.wait(0.05):
                try:
                    status = session.get(f"{self.pai.url}/api/v1/jobs", timeout=30).status_code
                except requests.RequestException:
                    status = 0
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def __enter__(self) -> ApiProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=60)


def answered(call: Callable[[], requests.Response], what: str) -> requests.Response:
    """The first answer of `call` that is not a 503 (Retry-After: the switch)."""
    def attempt() -> requests.Response | None:
        resp = call()
        assert resp.status_code != 500, f"{what}: 500 {resp.text}"
        if resp.status_code == 503:
            assert resp.headers.get("Retry-After"), "a 503 says when to come back"
            return None
        return resp

    found: requests.Response = wait_for(attempt, 60, what, interval=0.2)
    return found


def final_state(pai: Platform, name: str) -> dict[str, Any]:
    """The job's detail once it has finished, its gate opened once it runs."""
    def settled() -> dict[str, Any] | None:
        resp = answered(lambda: pai.http.get(f"{pai.url}/api/v1/user/alice/jobs/{name}",
                                             timeout=30), f"the detail of {name}")
        assert resp.status_code == 200, f"job {name} lost: {resp.status_code} {resp.text}"
        detail: dict[str, Any] = resp.json()
        if detail["jobStatus"]["state"] == "RUNNING":
            open_gate(pai, name)
        return detail if detail["jobStatus"]["state"] in {"SUCCEEDED", "FAILED",
                                                          "STOPPED"} else None

    found: dict[str, Any] = wait_for(settled, 120, f"job {name} to finish", interval=0.5)
    return found


@pytest.fixture
def redis_group(tmp_path: Path) -> Iterator[RedisGroup]:
    group = RedisGroup(tmp_path / "redis-ha")
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture
def on_sentinel(redis_group: RedisGroup, docker_client: docker.DockerClient, test_image: str,
                tmp_path: Path) -> Iterator[Platform]:
    run_dir = tmp_path / "platform"
    run_dir.mkdir()
    env = platform_env(redis_group.url, run_dir, node=f"e2e-ha-{uuid.uuid4().hex[:8]}",
                       port_range="24000-24999",
                       extra_env={"PAI_HEARTBEAT_SECONDS": "1",
                                  "PAI_LAUNCH_TIMEOUT_SECONDS": "20"})
    with running_platform(env, run_dir, docker_client, test_image) as pai:
        yield pai


def test_killing_the_primary_loses_no_job(on_sentinel: Platform,
                                          redis_group: RedisGroup) -> None:
    """Threat: the primary dies mid-run (kill -9, no chance to flush). Every
    job submitted before and during the switch reaches SUCCEEDED with its
    whole log in its first attempt, the services follow the new primary without a restart, and
    the API answers 503 at worst, never 500."""
    pai = on_sentinel
    before = [f"before-{n}" for n in range(JOBS_BEFORE)]  # 8 GPUs: two of them queue
    for name in before:
        pai.submit_accepted(pai.config(name, JOB_COMMAND, gpus=1))
    wait_for(lambda: pai.detail(before[0])["jobStatus"]["state"] == "RUNNING", 60,
             "the first job to run")

    with ApiProbe(pai) as probe:
        old_primary = redis_group.kill_primary()
        during = [f"during-{n}" for n in range(JOBS_DURING)]
        for name in during:
            resp = answered(partial(pai.submit, pai.config(name, JOB_COMMAND, gpus=1)),
                            f"submitting {name}")
            # 409: an earlier try that answered 503 had in fact been stored.
            assert resp.status_code in (202, 409), resp.text
        wait_for(lambda: redis_group.primary_port() != old_primary, 60,
                 "Sentinel to promote a replica")
        details = {name: final_state(pai, name) for name in before + during}

    assert probe.statuses.get(500, 0) == 0, probe.statuses
    assert probe.statuses.get(200, 0) > 0, probe.statuses
    states = {name: d["jobStatus"]["state"] for name, d in details.items()}
    assert set(states.values()) == {"SUCCEEDED"}, states
    # a failover is not a node failure: no job ran a second attempt
    attempts = {name: (d["jobStatus"]["attemptIndex"], d["jobStatus"]["platformRetries"])
                for name, d in details.items()}
    assert {a for a in attempts.values() if a != (0, 0)} == set(), attempts
    for name in before + during:
        log = answered(partial(pai.http.get, pai.log_url(name), timeout=30),
                       f"the log of {name}").text
        assert "finished" in log, f"{name}: {log!r}"
