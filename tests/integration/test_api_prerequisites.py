"""Prerequisites at submit, on a real Redis: a path in the storage that a
prerequisite names follows a job mount's rule (data: own folder or a share;
output: own folder only), refused with 403 naming the field before anything
is stored; hdfs:// needs the operator's WebHDFS endpoint."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import yaml
from flask.testing import FlaskClient

from services.api.app import create_app
from shared.infra.config import Settings
from shared.state import keys
from tests.support.api import AuthedClient, error_of, new_user, signed_in

pytestmark = pytest.mark.redis


def v2(name: str, prerequisites: list[dict[str, Any]], **role: Any) -> str:
    return yaml.safe_dump({
        "protocolVersion": 2, "name": name, "type": "job",
        "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "busybox"},
                          *prerequisites],
        "taskRoles": {"main": {"dockerImage": "img", "commands": ["true"],
                               "resourcePerInstance": {"cpu": 1, "memoryMB": 128},
                               **role}}})


def submit(client: AuthedClient, body: str) -> Any:
    return client.post("/api/v2/jobs", data=body, content_type="text/yaml")


def test_data_from_another_users_folder_is_refused(alice: AuthedClient, settings: Settings,
                                                   redis_client: redis.Redis) -> None:
    bobs = f"{settings.storage_roots[0]}/bob/private"
    answer = submit(alice, v2("steal", [{"name": "d", "type": "data", "uri": [bobs]}],
                              data="d"))
    assert error_of(answer, 403) == "ForbiddenStorageError"
    assert "taskRoles.0.prerequisites.0.uris" in answer.json["fields"]
    assert not redis_client.exists(keys.job("alice~steal"))


def test_an_output_into_a_share_or_another_folder_is_refused(
        alice: AuthedClient, admin: AuthedClient, settings: Settings) -> None:
    root = settings.storage_roots[0]
    made = admin.put("/api/v1/storage/shares/ds", json={"path": f"{root}/datasets",
                                                         "users": ["alice"]})
    assert made.status_code == 201, made.json
    for target in (f"{root}/datasets/out", f"{root}/bob/out", root):
        answer = submit(alice, v2("out", [{"name": "o", "type": "output", "uri": target}],
                                  output="o"))
        assert error_of(answer, 403) == "ForbiddenStorageError", target


def test_data_from_a_share_and_output_into_the_own_folder_are_accepted(
        alice: AuthedClient, admin: AuthedClient, settings: Settings) -> None:
    root = settings.storage_roots[0]
    assert admin.put("/api/v1/storage/shares/ds", json={
        "path": f"{root}/datasets", "users": ["alice"]}).status_code == 201
    answer = submit(alice, v2("ok", [
        {"name": "d", "type": "data", "uri": [f"{root}/datasets/mnist"]},
        {"name": "o", "type": "output", "uri": f"{root}/alice/results"}],
        data="d", output="o"))
    assert answer.status_code == 202, answer.json


def test_a_script_uri_is_never_reached_so_it_is_not_checked(alice: AuthedClient,
                                                            settings: Settings) -> None:
    """A script's uri is text for its commands (`git clone <% $script.uri %>`)."""
    answer = submit(alice, v2("script", [
        {"name": "s", "type": "script", "uri": f"{settings.storage_roots[0]}/bob/s"}],
        script="s", commands=["echo <% $script.uri %>"]))
    assert answer.status_code == 202, answer.json


def test_hdfs_needs_the_operators_webhdfs_endpoint(alice: AuthedClient, settings: Settings,
                                                   redis_server: str) -> None:
    body = v2("hdfs", [{"name": "d", "type": "data", "uri": ["hdfs://nn:9000/data/x"]}],
              data="d")
    refused = submit(alice, body)
    assert error_of(refused, 400) == "InvalidJobConfigError"
    assert "PAI_HDFS_WEBHDFS_URL" in str(refused.json["fields"])
    app = create_app(Settings(**{**settings.__dict__,
                                 "hdfs_webhdfs_url": "http://namenode:9870"}))
    client: FlaskClient = app.test_client()
    new_user(client, signed_in(client, "root"), "carol")
    accepted = submit(signed_in(client, "carol"), body)
    assert accepted.status_code == 202, accepted.json
