"""Fixtures for API tests: the app on the session's real Redis (flushed per
test), an admin, and two ordinary users of the default VC."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from services.api.app import create_app
from shared.infra.config import Settings
from tests.support.api import AuthedClient, new_user, signed_in


@pytest.fixture
def settings(redis_server: str, redis_client: redis.Redis, tmp_path: Path) -> Settings:
    return Settings(redis_url=redis_server, storage_roots=(str(tmp_path),),
                    admin_user="root", admin_password="root-password")


@pytest.fixture
def flask_client(settings: Settings) -> FlaskClient:
    return create_app(settings).test_client()


@pytest.fixture
def admin(flask_client: FlaskClient) -> AuthedClient:
    return signed_in(flask_client, "root")


@pytest.fixture
def alice(flask_client: FlaskClient, admin: AuthedClient) -> AuthedClient:
    return new_user(flask_client, admin, "alice")


@pytest.fixture
def bob(flask_client: FlaskClient, admin: AuthedClient) -> AuthedClient:
    return new_user(flask_client, admin, "bob")
