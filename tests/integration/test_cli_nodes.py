"""`pai nodes` in-process against the real API, served over HTTP on
127.0.0.1 from a real Redis: an admin cordons, drains and uncordons; a user
sees the state and is refused the change."""

from __future__ import annotations

import json
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
from tests.integration.api_client import new_user, served, signed_in

pytestmark = pytest.mark.redis
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


def test_admin_cordons_drains_and_uncordons(api: tuple[str, Flask], tmp_path: Path) -> None:
    root = pai_as(api, tmp_path, "root")
    done = run(root, "nodes", "cordon", "n1", "--reason", "fan noise")
    assert (done.exit_code, done.stdout) == (0, "node n1 CORDONED: fan noise\n"), done.stderr
    done = run(root, "nodes", "drain", "n1")
    assert done.stdout == "node n1 DRAINING (1 tasks left): fan noise\n", done.stderr
    table = run(root, "nodes").stdout
    assert "DRAINING" in table and "Tesla V100" in table and "fan noise" in table
    [node] = json.loads(run(root, "nodes", "-o", "json").stdout)
    assert (node["state"], node["gpuFree"], node["cordonedBy"]) == ("DRAINING", 1, "root")
    done = run(root, "nodes", "uncordon", "n1", "-o", "json")
    assert json.loads(done.stdout)["state"] == "READY"


def test_a_user_sees_nodes_but_may_not_cordon(api: tuple[str, Flask], tmp_path: Path) -> None:
    alice = pai_as(api, tmp_path, "alice")
    assert "READY" in run(alice, "nodes").stdout
    done = run(alice, "nodes", "cordon", "n1")
    assert done.exit_code == 1
    assert done.stderr.startswith("error: ForbiddenUserError:")


def test_an_unknown_node_is_a_one_line_error(api: tuple[str, Flask], tmp_path: Path) -> None:
    done = run(pai_as(api, tmp_path, "root"), "nodes", "drain", "ghost")
    assert (done.exit_code, done.stderr) == (1, "error: NoNodeError: node ghost has never "
                                                "reported\n")
