"""Helpers for the WebHDFS tests: pai served over HTTP on a storage root, and
the logins its clients carry."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
from flask import Flask

from services.api.app import create_app
from services.api.auth import issue_token
from shared.infra.config import Settings
from tests.support.api import DAY_S, served


@dataclass(frozen=True)
class Pai:
    """pai over HTTP: its base URL, its one storage root, and the app."""

    url: str
    root: Path
    app: Flask

    def token(self, username: str) -> str:
        with self.app.app_context():
            token, _ = issue_token(username, DAY_S)
        return token

    def session(self, username: str) -> requests.Session:
        """A requests session carrying `username`'s bearer token."""
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.token(username)}"
        return session

    def webhdfs(self, path: str) -> str:
        return f"{self.url}/webhdfs/v1{path}"


@contextmanager
def pai_served(settings: Settings, root: Path, users: tuple[str, ...] = ("alice", "bob"),
               ) -> Iterator[Pai]:
    """The API on `settings` (whose one storage root is `root`) over HTTP,
    with `users` created by the admin."""
    app = create_app(settings)
    client = app.test_client()
    with app.app_context():
        admin_token, _ = issue_token(settings.admin_user, DAY_S)
    for name in users:
        made = client.post("/api/v1/user", json={"username": name, "password": "secret-pw"},
                           headers={"Authorization": f"Bearer {admin_token}"})
        assert made.status_code == 201, made.json
    with served(app) as url:
        yield Pai(url, root, app)


def remote_exception(response: requests.Response, status: int) -> str:
    """The Java exception a WebHDFS refusal names, after checking its shape."""
    assert response.status_code == status, response.text
    body = response.json()["RemoteException"]
    assert body["message"] and body["javaClassName"].endswith(body["exception"])
    exception: str = body["exception"]
    return exception
