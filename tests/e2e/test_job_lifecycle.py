"""A job's whole life on the running platform: real processes, Redis, Docker."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import requests

from bench.live_platform import Platform, wait_for
from shared.state import starts
from tests.support.platform import gate, launcher_idle, open_gate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENV_DUMP = "env | grep -E '^(PAI_|NVIDIA_|CUDA_)' | sed 's/^/ENV /'; "


def tasks_of(detail: dict[str, Any], role: str) -> list[dict[str, Any]]:
    statuses: list[dict[str, Any]] = detail["taskRoles"][role]["taskStatuses"]
    return statuses


def env_from_log(text: str) -> dict[str, str]:
    pairs = (line[4:].split("=", 1) for line in text.splitlines() if line.startswith("ENV "))
    return {k: v for k, v in pairs}


def test_hello_world_succeeds_and_keeps_its_log(platform: Platform,
                                                unique: Callable[[str], str]) -> None:
    config = json.loads((EXAMPLES / "hello-world.json").read_text())
    config["jobName"] = name = unique("hello")
    assert platform.submit(config).status_code == 202

    detail = platform.wait_state(name)

    assert detail["jobStatus"]["state"] == "SUCCEEDED"
    assert detail["jobStatus"]["appExitCode"] == 0
    task = tasks_of(detail, "main")[0]
    assert task["taskState"] == "SUCCEEDED" and task["containerExitCode"] == 0
    assert task["containerNodeName"] == platform.node
    assert task["containerIp"] == "127.0.0.1"
    log = platform.log(name, "main")
    assert f"Hello from {name}, task main[0] on 127.0.0.1:" \
           f"{task['containerPorts']['default']}" in log
    wait_for(lambda: not platform.job_containers(name), what="the container to be removed")


def test_distributed_example_ends_when_workers_finish(platform: Platform,
                                                      unique: Callable[[str], str]) -> None:
    config = json.loads((EXAMPLES / "distributed.json").read_text())
    config["jobName"] = name = unique("dist")
    for role in config["taskRoles"]:
        role["command"] = ENV_DUMP + role["command"]
    assert platform.submit(config).status_code == 202

    detail = platform.wait_state(name)

    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail["jobStatus"]
    assert [t["taskState"] for t in tasks_of(detail, "worker")] == ["SUCCEEDED"] * 2
    # The attempt ended with the workers; the platform then stops the ps tasks.
    def ps_stopped() -> dict[str, Any] | None:
        found = platform.detail(name)
        states = {t["taskState"] for t in tasks_of(found, "ps_server")}
        return found if states == {"STOPPED"} else None

    detail = wait_for(ps_stopped, what="the ps tasks to be stopped by the platform")
    assert detail["jobStatus"]["state"] == "SUCCEEDED"
    tasks = {(role, t["taskIndex"]): t for role in ("ps_server", "worker")
             for t in tasks_of(detail, role)}
    ports = [t["containerPorts"]["default"] for t in tasks.values()]
    assert len(set(ports)) == 4, "two live tasks on one node share a port"
    ps_hosts = ",".join(f"127.0.0.1:{tasks[('ps_server', i)]['containerPorts']['default']}"
                        for i in range(2))
    worker_hosts = ",".join(f"127.0.0.1:{tasks[('worker', i)]['containerPorts']['default']}"
                            for i in range(2))
    for (role, index), task in tasks.items():
        env = env_from_log(platform.log(name, role, index))
        assert env["PAI_TASK_ROLE_0_HOST_LIST"] == ps_hosts
        assert env["PAI_TASK_ROLE_1_HOST_LIST"] == worker_hosts
        assert env["PAI_TASK_ROLE_INDEX"] == str(index)
        assert env["PAI_TASK_ROLE_NO"] == ("0" if role == "ps_server" else "1")
        assert env["PAI_TASKS_NUM"] == "4" and env["PAI_TASK_ROLES_NUM"] == "2"
        assert env["PAI_KILL_ALL_ON_COMPLETED_TASK_NUM"] == "2"
        assert env["PAI_CURRENT_CONTAINER_PORT"] == str(task["containerPorts"]["default"])
        assert env["NVIDIA_VISIBLE_DEVICES"] == "none"
    worker_log = platform.log(name, "worker", 0)
    assert re.search(r"worker 0 got: hello from ps \d", worker_log)
    wait_for(lambda: not platform.job_containers(name), what="ps containers to be removed")


def test_exit_code_three_retries_then_fails(platform: Platform,
                                            unique: Callable[[str], str]) -> None:
    name = unique("exit3")
    platform.submit(platform.config(name, "echo attempt; exit 3", retryCount=2))

    detail = platform.wait_state(name)

    status = detail["jobStatus"]
    assert (status["state"], status["appExitCode"], status["retries"]) == ("FAILED", 3, 2)
    assert [a["state"] for a in detail["attempts"]] == ["FAILED"] * 3
    assert [a["exitCode"] for a in detail["attempts"]] == [3] * 3
    for attempt in range(3):
        assert "attempt" in platform.log(name, "main", attempt=attempt)


def test_failure_on_first_attempt_only_succeeds_on_the_second(
        platform: Platform, unique: Callable[[str], str]) -> None:
    name = unique("flaky")
    command = ('if [ -f "$PAI_OUTPUT_DIR/mark" ]; then echo second try; exit 0; fi; '
               'touch "$PAI_OUTPUT_DIR/mark"; exit 5')
    platform.submit(platform.config(name, command, retryCount=3))

    detail = platform.wait_state(name)

    assert detail["jobStatus"]["state"] == "SUCCEEDED"
    assert detail["jobStatus"]["retries"] == 1
    assert [a["state"] for a in detail["attempts"]] == ["FAILED", "SUCCEEDED"]
    assert "second try" in platform.log(name, "main")


def test_stop_running_job(platform: Platform, unique: Callable[[str], str]) -> None:
    name = unique("stop")
    platform.submit(platform.config(name, "echo started; sleep 600", tasks=2, gpus=1))
    platform.wait_state(name, "RUNNING")
    wait_for(lambda: "started" in platform.log(name, "main", 1), what="the task to print")

    assert platform.stop(name).status_code == 202
    detail = platform.wait_state(name)

    assert detail["jobStatus"]["state"] == "STOPPED"
    assert detail["jobStatus"]["executionType"] == "STOP"
    assert [t["taskState"] for t in tasks_of(detail, "main")] == ["STOPPED"] * 2
    wait_for(lambda: not platform.job_containers(name), what="containers to be removed")

    def freed() -> bool:
        nodes = platform.admin.get(f"{platform.url}/api/v1/nodes", timeout=5).json()
        mine = next(n for n in nodes if n["name"] == platform.node)
        return bool(mine["gpuUsed"] == 0 and mine["tasks"] == 0)
    wait_for(freed, what="the job's GPUs to be free again")


def test_gang_of_six_gpus_waits_for_the_first(platform: Platform,
                                              unique: Callable[[str], str]) -> None:
    first, second = unique("gang-a"), unique("gang-b")
    platform.submit(platform.config(first, ENV_DUMP + gate(), gpus=6))
    platform.wait_state(first, "RUNNING")
    platform.submit(platform.config(second, ENV_DUMP, gpus=6))

    waiting = wait_for(lambda: platform.detail(second)["jobStatus"]["waitingReason"],
                       what="a waiting reason")
    assert "needs 6 GPUs on one node; the most free on any node is 2" in waiting
    assert platform.detail(second)["jobStatus"]["state"] == "WAITING"
    open_gate(platform, first)

    a = platform.wait_state(first)
    b = platform.wait_state(second)

    assert a["jobStatus"]["state"] == b["jobStatus"]["state"] == "SUCCEEDED"
    task_a, task_b = tasks_of(a, "main")[0], tasks_of(b, "main")[0]
    assert len(task_a["containerGpus"]) == len(task_b["containerGpus"]) == 6
    assert task_b["launchedTime"] >= task_a["completedTime"], "both held GPUs at once"
    for name, task in ((first, task_a), (second, task_b)):
        env = env_from_log(platform.log(name, "main"))
        assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(map(str, task["containerGpus"]))


def test_duplicate_start_runs_the_task_once(platform: Platform,
                                            unique: Callable[[str], str]) -> None:
    name = unique("dup")
    platform.submit(platform.config(name, 'echo ran >> "$PAI_OUTPUT_DIR/runs"; ' + gate()))
    detail = platform.wait_state(name, "RUNNING")
    with redis.Redis.from_url(platform.env["PAI_REDIS_URL"]) as client:
        for _ in range(2):
            starts.send(client, {platform.node: [(f"alice~{name}", 0, "main", 0)]})
    wait_for(lambda: launcher_idle(platform), what="the launcher to handle both starts")
    open_gate(platform, name)

    detail = platform.wait_state(name)

    assert detail["jobStatus"]["state"] == "SUCCEEDED"
    runs = platform.storage / "alice" / name / "output" / "runs"
    assert runs.read_text().splitlines() == ["ran"]


def test_launcher_killed_right_after_starting_a_container(
        platform: Platform, unique: Callable[[str], str]) -> None:
    name = unique("kill-launcher")
    platform.submit(platform.config(name, 'echo ran >> "$PAI_OUTPUT_DIR/runs"; ' + gate(),
                                    tasks=2))
    wait_for(lambda: platform.job_containers(name), interval=0.02,
             what="a container of the job")
    platform.kill("launcher")
    platform.start("launcher")
    platform.wait_state(name, "RUNNING")
    wait_for(lambda: len(platform.job_containers(name)) == 2, what="both tasks' containers")
    open_gate(platform, name)

    detail = platform.wait_state(name)

    assert detail["jobStatus"]["state"] == "SUCCEEDED"
    runs = platform.storage / "alice" / name / "output" / "runs"
    assert runs.read_text().splitlines() == ["ran", "ran"]
    wait_for(lambda: not platform.job_containers(name), what="containers to be removed")


def test_monitor_down_while_a_container_exits(platform: Platform,
                                              unique: Callable[[str], str]) -> None:
    name = unique("monitor-down")
    platform.submit(platform.config(name, "echo before exit; " + gate() + "exit 4"))
    platform.wait_state(name, "RUNNING")
    platform.kill("monitor")
    open_gate(platform, name)
    wait_for(lambda: all(c.status == "exited" for c in platform.job_containers(name)),
             what="the container to exit while the monitor is down")
    assert platform.detail(name)["jobStatus"]["state"] == "RUNNING"
    platform.start("monitor")

    detail = platform.wait_state(name)

    assert detail["jobStatus"]["state"] == "FAILED"
    assert detail["jobStatus"]["appExitCode"] == 4
    assert "before exit" in platform.log(name, "main")
    wait_for(lambda: not platform.job_containers(name), what="the container to be removed")


def test_bad_input_is_refused_with_reasons(platform: Platform,
                                           unique: Callable[[str], str]) -> None:
    bad = platform.config(unique("bad"), "true")
    bad["taskRoles"][0]["memoryMB"] = 10
    bad["jobname"] = "typo"
    resp = platform.submit(bad)
    assert resp.status_code == 400
    body = resp.json()
    assert body["code"] == "InvalidJobConfigError"
    assert set(body["fields"]) >= {"taskRoles.0.memoryMB", "jobname"}

    name = unique("twice")
    assert platform.submit(platform.config(name, "true")).status_code == 202
    again = platform.submit(platform.config(name, "true"))
    assert again.status_code == 409 and again.json()["code"] == "ConflictJobError"

    huge = platform.submit(platform.config(unique("huge"), "true", gpus=16))
    assert huge.status_code == 400
    assert "largest node has 8" in json.dumps(huge.json()["fields"])

    # A folder outside every storage root is passed on unmounted (as OpenPAI
    # did); one that climbs out of its path is refused.
    climbing = platform.submit(platform.config(unique("climbing"), "true",
                                               dataDir="/srv/../etc"))
    assert climbing.status_code == 400
    assert "dataDir" in climbing.json()["fields"]

    not_json = platform.http.post(f"{platform.url}/api/v1/user/alice/jobs", data=b"{oops",
                                  headers={"Content-Type": "application/json"}, timeout=5)
    assert not_json.status_code == 400


def test_scheduler_and_api_killed_with_jobs_queued(platform: Platform,
                                                   unique: Callable[[str], str]) -> None:
    names = [unique("sched-kill") for _ in range(4)]
    platform.kill("scheduler")
    for name in names:
        assert platform.submit(platform.config(name, "echo done", gpus=4)).status_code == 202
    assert {platform.detail(n)["jobStatus"]["state"] for n in names} == {"WAITING"}
    platform.kill("api")
    platform.start("api")
    platform.start("scheduler")

    def api_answers() -> bool:
        try:
            return platform.http.get(f"{platform.url}/healthz", timeout=5).ok
        except requests.RequestException:
            return False

    wait_for(api_answers, what="the api to answer again")

    details = [platform.wait_state(n) for n in names]

    assert [d["jobStatus"]["state"] for d in details] == ["SUCCEEDED"] * 4
    assert all("done" in platform.log(n, "main") for n in names)
