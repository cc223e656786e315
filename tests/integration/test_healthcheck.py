"""deploy/image/pai-healthcheck, the containers' health checks, run as the
image runs it (a process reading the services' settings) against a real
Redis: alone, and behind a real Sentinel as the k8s `ha` component and the
Compose `ha` profile set PAI_REDIS_URL. A check that fails there restarts
the scheduler for ever (its liveness probe is `pai-healthcheck redis`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import free_port
from tests.support.redis_group import MASTER, RedisGroup

pytestmark = pytest.mark.redis

HEALTHCHECK = Path(__file__).resolve().parents[2] / "deploy" / "image" / "pai-healthcheck"


def healthcheck(redis_url: str, *checks: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PAI_")}
    env["PAI_REDIS_URL"] = redis_url
    return subprocess.run([sys.executable, str(HEALTHCHECK), *checks], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def sentinel_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisGroup]:
    """A primary and one sentinel: all a check of the URL needs."""
    group = RedisGroup(tmp_path_factory.mktemp("sentinel"), replicas=0, sentinels=1)
    try:
        group.start()
        yield group
    finally:
        group.stop()


def test_redis_behind_sentinel_is_healthy(sentinel_group: RedisGroup) -> None:
    done = healthcheck(sentinel_group.url, "redis")
    assert (done.returncode, done.stderr) == (0, "")


def test_a_single_redis_is_healthy(redis_server: str) -> None:
    done = healthcheck(redis_server, "redis")
    assert (done.returncode, done.stderr) == (0, "")


def test_a_primary_the_sentinels_do_not_know_is_unhealthy(sentinel_group: RedisGroup) -> None:
    url = sentinel_group.url.replace(f"/{MASTER}/0", "/no-such-primary/0")
    done = healthcheck(url, "redis")
    assert done.returncode == 1
    assert "no-such-primary" in done.stderr


def test_no_sentinel_answering_is_unhealthy(sentinel_group: RedisGroup) -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()}/{MASTER}/0"
    done = healthcheck(url, "redis")
    assert done.returncode == 1
    assert done.stderr.startswith("pai-healthcheck: redis: ")


def test_a_wrong_password_is_unhealthy(sentinel_group: RedisGroup) -> None:
    password = sentinel_group.credentials.password
    done = healthcheck(sentinel_group.url.replace(password, "not-the-password"), "redis")
    assert done.returncode == 1
    assert "not-the-password" not in done.stderr  # the URL's password is never printed
