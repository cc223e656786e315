"""The whole platform as real processes (api, scheduler, launcher, monitor),
on the session's throwaway Redis and the real Docker engine, the way
`make up` runs it. Tests talk to it over HTTP only.

The harness is bench/live_platform.py, shared with the benchmarks; these are
its fixtures.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest
from playwright.sync_api import Browser, Page

from bench import BenchError
from bench.live_platform import USER, USER_PASSWORD, Platform, platform_env, run_id, running
from tests.e2e.portal_browser import chromium, logged_in


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


@pytest.fixture(scope="session")
def platform(redis_server: str, docker_client: docker.DockerClient, test_image: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with one_node_platform(redis_server, docker_client, test_image,
                           tmp_path_factory.mktemp("platform"), db=1, name="e2e",
                           port_range="21000-21999") as pai:
        yield pai


@pytest.fixture
def unique() -> Callable[[str], str]:
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium under Playwright, for a module of portal tests."""
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser, platform: Platform) -> Iterator[Page]:
    """A fresh browser context logged in as the platform's user."""
    with logged_in(browser, platform, USER, USER_PASSWORD) as opened:
        yield opened
