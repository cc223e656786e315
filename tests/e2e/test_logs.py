"""Task logs end to end: bounded in Redis, whole in the platform's log tree
(`<first storage root>/.pai-logs` by default), served after the
container and the monitor that shipped it are gone.

A platform of its own (its own node, Redis database and ports) whose log
bound is 20,000 lines, so that a 100,000-line job overflows it.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Iterator

import docker
import pytest

from bench.live_platform import Platform, free_port, wait_for
from shared.state import logstream
from tests.support.platform import running_platform

BOUND = 20_000
LINES = 100_000
# The bound drops whole entries, each a shipped batch of up to ENTRY_LINES lines.
SLACK = logstream.ENTRY_LINES - 1


@pytest.fixture(scope="module")
def bounded(platform: Platform, docker_client: docker.DockerClient,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    run_dir = tmp_path_factory.mktemp("bounded")
    storage = run_dir / "storage"
    storage.mkdir()
    storage.chmod(0o777)
    node = f"e2e-logs-{uuid.uuid4().hex[:8]}"
    env = {**platform.env,
           "PAI_REDIS_URL": platform.env["PAI_REDIS_URL"].rsplit("/", 1)[0] + "/2",
           "PAI_API_PORT": str(free_port()), "PAI_MONITOR_PORT": str(free_port()),
           "PAI_NODE_NAME": node, "PAI_STORAGE_ROOTS": str(storage),
           "PAI_PORT_RANGE": "22000-22999", "PAI_LOG_MAX_LINES": str(BOUND)}
    with running_platform(env, run_dir, docker_client, platform.image) as pai:
        yield pai


def follow(pai: Platform, name: str, **params: int) -> list[str]:
    """Every data line of the event stream, until its end event."""
    data: list[str] = []
    with pai.http.get(pai.log_url(name), params={"follow": 1, **params}, stream=True,
                      timeout=60) as resp:
        resp.raise_for_status()
        event = ""
        for raw in resp.iter_lines(decode_unicode=True):
            if raw.startswith("event: "):
                event = raw[len("event: "):]
            elif raw.startswith("data: ") and event != "end":
                data.append(raw[len("data: "):])
            elif raw == "" and event == "end":
                break
    return data


def test_a_100000_line_job_keeps_its_last_lines_and_all_of_them_in_output_dir(
        bounded: Platform, unique: Callable[[str], str]) -> None:
    name = unique("loud")
    assert bounded.submit(bounded.config(name, f"seq 1 {LINES}")).status_code == 202
    assert bounded.wait_state(name, timeout=300)["jobStatus"]["state"] == "SUCCEEDED"

    assert bounded.log(name, "main", tail=1000).splitlines() == \
        [str(n) for n in range(LINES - 999, LINES + 1)]

    everything = bounded.log(name, "main", tail=LINES).splitlines()
    marker, kept = everything[0], everything[1:]
    assert BOUND <= len(kept) <= BOUND + SLACK  # the stream stays within its bound
    assert kept == [str(n) for n in range(LINES - len(kept) + 1, LINES + 1)]
    assert marker == (f"[pai: {LINES - len(kept)} earlier lines dropped; "
                      f"the log keeps the last {BOUND} lines]")

    full = bounded.storage.joinpath(".pai-logs", f"alice~{name}", "0", "main-0.log")
    assert full.read_text().splitlines() == [str(n) for n in range(1, LINES + 1)]


def test_the_log_is_served_after_its_container_and_monitor_are_gone(
        bounded: Platform, unique: Callable[[str], str]) -> None:
    name = unique("gone")
    assert bounded.submit(bounded.config(name, "seq 1 50; echo last")).status_code == 202
    bounded.wait_state(name, "SUCCEEDED")
    wait_for(lambda: not bounded.job_containers(name), timeout=60,
             what="the monitor to remove the container")

    bounded.kill("monitor", signal.SIGKILL)
    bounded.start("monitor")

    assert bounded.log(name, "main", tail=3).splitlines() == ["49", "50", "last"]
    assert follow(bounded, name, tail=2) == ["50", "last"]


def test_follow_delivers_lines_while_the_task_runs(
        bounded: Platform, unique: Callable[[str], str]) -> None:
    name = unique("follow")
    script = "for i in 1 2 3 4 5 6 7 8; do echo tick $i; sleep 0.3; done"
    assert bounded.submit(bounded.config(name, script)).status_code == 202
    bounded.wait_state(name, {"RUNNING", "SUCCEEDED"})

    received = follow(bounded, name, tail=100)

    assert received == [f"tick {i}" for i in range(1, 9)]
