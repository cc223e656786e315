"""The API while Redis is unreachable: it starts, answers 503 with
Retry-After (never a 500), and bootstraps itself once Redis is back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.api.app import create_app
from shared.infra.config import Settings
from tests.chaos.harness import ChaosRedis

pytestmark = pytest.mark.redis


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[ChaosRedis]:
    server = ChaosRedis(tmp_path / "redis")
    server.datadir.mkdir()
    try:
        yield server
    finally:
        server.stop()


def test_an_api_started_while_redis_is_down_serves_503_then_bootstraps(
        own_redis: ChaosRedis, tmp_path: Path) -> None:
    settings = Settings(redis_url=own_redis.url, storage_roots=(str(tmp_path),),
                        admin_user="root", admin_password="root-password")
    client = create_app(settings).test_client()  # Redis has never run: still starts

    down = client.post("/api/v1/token", json={"username": "root", "password": "root-password"})
    assert down.status_code == 503
    assert down.headers["Retry-After"].isdigit()
    assert down.get_json()["code"] == "ServiceUnavailableError"

    own_redis.start()
    up = client.post("/api/v1/token", json={"username": "root", "password": "root-password"})
    assert up.status_code == 200, up.get_json()

    own_redis.kill()
    token = up.get_json()["token"]
    again = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
    assert again.status_code == 503
    assert again.headers["Retry-After"]
