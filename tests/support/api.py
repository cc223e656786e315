"""Helpers for API tests: a test client that sends a user's token, sign-in
without a login's argon2 check (and through the portal's form), the shape
every error must have, and the app served over HTTP for clients that need
a real socket (the CLI, WebSockets)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from werkzeug.serving import make_server
from werkzeug.test import TestResponse

from services.api.auth import issue_token

DAY_S = 24 * 3600


class AuthedClient:
    """The test client, sending one user's token with every request."""

    def __init__(self, client: FlaskClient, token: str) -> None:
        self.client, self.headers = client, {"Authorization": f"Bearer {token}"}

    def __getattr__(self, method: str) -> Any:
        call = getattr(self.client, method)
        return lambda *args, **kw: call(*args, headers={**self.headers,
                                                        **kw.pop("headers", {})}, **kw)


def login(client: FlaskClient, username: str, password: str) -> str:
    """A token through POST /token itself, as a real client gets one."""
    resp = client.post("/api/v1/token", json={"username": username, "password": password})
    assert resp.status_code == 200, resp.json
    token: str = resp.json["token"]  # type: ignore[index]
    return token


def signed_in(flask_client: FlaskClient, username: str) -> AuthedClient:
    """A client with a token from the app's own `issue_token`, as a login gives.

    Fixtures sign in this way to skip a login's argon2 check (the login tests
    go through POST /token itself).
    """
    with flask_client.application.app_context():
        token, _ = issue_token(username, DAY_S)
    return AuthedClient(flask_client, token)


def new_user(flask_client: FlaskClient, admin: AuthedClient, name: str) -> AuthedClient:
    created = admin.post("/api/v1/user", json={"username": name, "password": "secret-pw"})
    assert created.status_code == 201, created.json
    return signed_in(flask_client, name)


def error_of(resp: TestResponse, status: int) -> str:
    """The response's error code, after checking its status and shape."""
    assert resp.status_code == status, resp.get_data(as_text=True)
    body = resp.json
    assert isinstance(body, dict), resp.get_data(as_text=True)
    assert isinstance(body.get("code"), str) and body["code"].endswith("Error")
    assert isinstance(body.get("message"), str) and body["message"]
    code: str = body["code"]
    return code


def config(name: str = "mnist", **extra: Any) -> dict[str, Any]:
    """A small valid job config: two CPU tasks of one role."""
    return {"jobName": name, "image": "busybox",
            "taskRoles": [{"name": "main", "taskNumber": 2, "cpuNumber": 1, "memoryMB": 128,
                           "command": "echo hi"}], **extra}


@contextmanager
def served(app: Flask) -> Iterator[str]:
    """The app over HTTP on a free 127.0.0.1 port (threaded): its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.shutdown()
        thread.join(timeout=30)


def whoami(client: AuthedClient, username: str) -> int:
    status: int = client.get(f"/api/v1/user/{username}").status_code
    return status


CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, "the page has no CSRF field"
    return found.group(1)


def portal_login(client: FlaskClient, username: str, password: str = "secret-pw") -> str:
    """Log in through the login form, as a browser does; the session's CSRF token."""
    token = csrf_of(client.get("/login").get_data(as_text=True))
    resp = client.post("/login", data={"csrf_token": token, "username": username,
                                       "password": password, "next": "/jobs"})
    assert resp.status_code == 302, resp.get_data(as_text=True)
    assert resp.headers["Location"] == "/jobs"
    return csrf_of(client.get("/jobs").get_data(as_text=True))
