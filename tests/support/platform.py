"""The whole platform as real processes for end-to-end tests (bench/live_platform.py,
shared with the benchmarks): one started with given settings, or one node
with 8 virtual GPUs and quick heartbeats."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import redis

from bench import BenchError
from bench.live_platform import USER, Platform, platform_env, run_id, running
from shared.infra.messaging import launcher_queue
from shared.state import keys


@contextlib.contextmanager
def running_platform(env: dict[str, str], run_dir: Path, docker_client: docker.DockerClient,
                     image: str) -> Iterator[Platform]:
    """Every service up with `env`, user alice logged in; at the end the
    services stopped and the node's job containers removed.

    A start-up that times out or loses a service fails the test with the
    harness's message (it carries the dead service's log), without a traceback."""
    up = False
    try:
        with running(env, run_dir, docker_client=docker_client, image=image) as pai:
            up = True
            yield pai
    except BenchError as error:
        if up:
            raise
        pytest.fail(f"the platform did not come up: {error}", pytrace=False)


def worker_port_range(low: int, high: int) -> str:
    """This test process's share of the host ports `low`-`high`: `make test`
    runs tests on several processes (pytest-xdist), and tasks on one host
    network must not be handed the same ports by two platforms at once."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or "0")
    size = (high - low + 1) // workers
    first = low + index * size
    return f"{first}-{first + size - 1}"


@contextlib.contextmanager
def one_node_platform(redis_server: str, docker_client: docker.DockerClient, image: str,
                      run_dir: Path, *, db: int, name: str, port_range: str) -> Iterator[Platform]:
    """A platform of one node with 8 virtual GPUs on Redis database `db`, with
    quick heartbeats and launch retries, admin `root` and user alice."""
    env = platform_env(
        redis_server.rsplit("/", 1)[0] + f"/{db}", run_dir, node=f"{name}-{run_id()}",
        port_range=port_range, admin=("root", "root-password"),
        extra_env={"PAI_HEARTBEAT_SECONDS": "1", "PAI_LAUNCH_TIMEOUT_SECONDS": "20"})
    with running_platform(env, run_dir, docker_client, image) as pai:
        yield pai


# A job that must still be running when the test acts waits at a gate the
# test opens, instead of sleeping a guess at how long the test will take.
GATE_FILE = ".pai-test-go"
GATE_SECONDS = 300  # a test that never opens its gate leaves no job running past this


def gate() -> str:
    """Shell that waits, polling every 0.1 s for at most GATE_SECONDS, until
    the test opens the job's gate (`open_gate`): the file GATE_FILE in the
    job's own output folder, which the test reaches on the shared storage."""
    return (f'i=0; while [ ! -e "$PAI_OUTPUT_DIR/{GATE_FILE}" ] && [ $i -lt '
            f'{GATE_SECONDS * 10} ]; do sleep 0.1; i=$((i+1)); done; ')


def open_gate(pai: Platform, name: str, user: str = USER) -> None:
    """Let job `name`'s tasks past their gate (its output folder exists once
    one of its containers has started)."""
    (pai.storage / user / name / "output" / GATE_FILE).touch()


def launcher_idle(pai: Platform) -> bool:
    """Whether nothing waits for the node's launcher or is in its hands: no
    start in its stream (an entry is deleted once its starts ran), no
    message in its queue, none being handled by any worker (kombu's
    `unacked` hash holds those)."""
    with redis.Redis.from_url(pai.env["PAI_REDIS_URL"]) as client:
        return (client.xlen(keys.node_starts(pai.node)) == 0
                and client.llen(launcher_queue(pai.node)) == 0 and client.hlen("unacked") == 0)
