"""No input gets a 5xx (docs/security.md, "Client → API"): every route that
takes a body is sent every kind of broken body, and answers 4xx JSON."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from services.api.app import BLUEPRINTS
from tests.support.api import AuthedClient, config, error_of

pytestmark = pytest.mark.redis

BAD_BODIES: dict[str, bytes] = {
    "nested 100k deep": b"[" * 100_000 + b"]" * 100_000,
    "nested 40 objects": b'{"a":' * 40 + b"1" + b"}" * 40,
    "number too large": b'{"gpuQuota": 1e400, "value": 1e400}',
    "ten thousand digits": b'{"gpuQuota": ' + b"9" * 10_000 + b"}",
    "NaN": b'{"gpuQuota": NaN}',
    "Infinity": b'{"gpuQuota": -Infinity}',
    "not utf-8": b'{"name": "\xff\xfe"}',
    "truncated": b'{"a": ',
    "a list": b"[1, 2]",
    "a string": b'"STOP"',
    "null": b"null",
    "empty": b"",
    "unknown fields": b'{"surprise": true}',
    "wrong types": b'{"value": 7, "username": [], "password": {}, "gpuQuota": "8"}',
}


def body_routes(app: Flask) -> list[tuple[str, str]]:
    """(method, path) of every API route that reads a body, with its
    variables filled in with names that exist."""
    fill = {"username": "alice", "user": "alice", "name": "default", "role": "main", "index": "0",
            "label": "default", "path": "x"}
    routes = []
    for rule in app.url_map.iter_rules():
        for method in sorted((rule.methods or set()) & {"POST", "PUT", "PATCH"}):
            path = rule.rule
            for variable in rule.arguments:
                value = fill[variable]
                for spelling in (f"<int:{variable}>", f"<path:{variable}>", f"<{variable}>"):
                    path = path.replace(spelling, value)
            routes.append((method, path))
    return sorted(routes)


def _routes_only() -> Flask:
    """The API's routes without its Redis (the list is needed at collection)."""
    app = Flask(__name__)
    for blueprint in BLUEPRINTS:
        app.register_blueprint(blueprint)
    return app


ROUTES = body_routes(_routes_only())


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
@pytest.mark.parametrize("kind", sorted(BAD_BODIES))
def test_no_broken_body_gets_a_5xx(admin: AuthedClient, alice: AuthedClient, method: str,
                                   path: str, kind: str) -> None:
    resp = getattr(admin, method.lower())(path, data=BAD_BODIES[kind],
                                          content_type="application/json")
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.get_data(as_text=True))
    assert resp.is_json, resp.get_data(as_text=True)
    if path.startswith("/webhdfs/"):  # WebHDFS's own error shape (docs/storage.md)
        assert resp.json["RemoteException"]["exception"].endswith("Exception")
    else:
        assert resp.json["code"].endswith("Error"), resp.get_data(as_text=True)


@pytest.mark.parametrize("name", ["a:b", "a/b", "..", "a" * 300, "x\ny", "a b"],
                         ids=["colon", "slash", "dotdot", "too long", "newline", "space"])
def test_odd_job_names_get_400_naming_the_field(alice: AuthedClient, name: str) -> None:
    resp = alice.post("/api/v1/jobs", json=config(name))
    assert error_of(resp, 400) == "InvalidJobConfigError"
    assert "jobName" in resp.json["fields"]  # type: ignore[index]


def test_deep_yaml_or_json_in_extras_is_400_not_a_crash(alice: AuthedClient) -> None:
    deep: Any = "leaf"
    for _ in range(200):
        deep = {"d": deep}
    resp = alice.post("/api/v1/jobs", json=config("deep-extras") | {"extras": deep})
    assert error_of(resp, 400) == "InvalidJobConfigError"


def test_a_malformed_last_event_id_is_400(alice: AuthedClient) -> None:
    assert alice.post("/api/v1/jobs", json=config("followed")).status_code == 202
    resp = alice.get("/api/v1/user/alice/jobs/followed/tasks/main/0/log?follow=1",
                     headers={"Last-Event-ID": "9" * 10_000})
    assert resp.status_code == 400, resp.get_data(as_text=True)


def test_the_form_login_is_loaded_by_the_same_schema(flask_client: FlaskClient,
                                                     alice: AuthedClient) -> None:
    resp = flask_client.post("/api/v1/token", data={"username": "alice", "password": "secret-pw",
                                                    "expiration": "soon"})
    assert error_of(resp, 400) == "BadRequestError"
    assert "expiration" in resp.json["fields"]  # type: ignore[index]
