"""The whole platform as real processes for end-to-end tests (bench/live_platform.py,
shared with the benchmarks): one started with given settings, or one node
with 8 virtual GPUs and quick heartbeats."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from bench import BenchError
from bench.live_platform import Platform, platform_env, run_id, running


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

