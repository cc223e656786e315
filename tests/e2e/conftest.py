"""The whole platform as real processes (api, scheduler, launcher, monitor),
on the session's throwaway Redis and the real Docker engine, the way
`make up` runs it. Tests talk to it over HTTP only.

The harness is bench/live_platform.py, shared with the benchmarks; these are
its fixtures.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import docker
import pytest
from playwright.sync_api import Browser, Page

from bench.live_platform import USER, USER_PASSWORD, Platform
from tests.e2e.portal_browser import chromium, logged_in
from tests.support.platform import one_node_platform, worker_port_range


@pytest.fixture(scope="session")
def platform(redis_server: str, docker_client: docker.DockerClient, test_image: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with one_node_platform(redis_server, docker_client, test_image,
                           tmp_path_factory.mktemp("platform"), db=1, name="e2e",
                           port_range=worker_port_range(21000, 21999)) as pai:
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
