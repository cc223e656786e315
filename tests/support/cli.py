"""The `pai` CLI against the API served over HTTP, logged in as a user."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from flask import Flask

from pai_cli.logins import Cluster, Logins, save
from pai_cli.main import cli
from services.api.app import create_app
from services.api.auth import issue_token
from shared.domain.models import Allocation, Gpu, Node
from shared.infra.config import Settings
from shared.state.store import Store
from tests.support.api import new_user, served, signed_in

DAY_S = 24 * 3600


@pytest.fixture
def api(redis_server: str, redis_client: redis.Redis,
        tmp_path: Path) -> Iterator[tuple[str, Flask]]:
    """The API on a free 127.0.0.1 port; node n1 (2 GPUs, one task on it)."""
    app: Flask = create_app(Settings(redis_url=redis_server, storage_roots=(str(tmp_path),),
                                     admin_user="root", admin_password="root-password"))
    store = Store(redis_client)
    store.register_node(Node("n1", "127.0.0.1", cpus=8, memory_mb=8000, gpus=[
        Gpu(i, f"GPU-{i}", "Tesla V100", 16000, group=0) for i in range(2)]))
    pipe = store.r.pipeline()
    store.write_allocation(pipe, Allocation("alice~a", 0, "main", 0, "n1", (0,), 1, 100, ()))
    pipe.execute()
    new_user(app.test_client(), signed_in(app.test_client(), "root"), "alice")
    with served(app) as url:
        yield url, app


def pai_as(api: tuple[str, Flask], tmp_path: Path, username: str) -> Path:
    """A CLI config logged in as `username` (token from the app's own signer)."""
    url, app = api
    with app.app_context():
        token, expires = issue_token(username, DAY_S)
    config = tmp_path / f"{username}.yaml"
    logins = Logins()
    logins.put(Cluster("test", url, username, token, username == "root", expires))
    save(config, logins)
    return config


def run(config: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"PAI_CONFIG": str(config),
                                                     "PAI_CLUSTER": None, "COLUMNS": "200"})
