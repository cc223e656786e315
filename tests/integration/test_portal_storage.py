"""The portal's storage routes through Flask's test client on a real Redis:
uploads in parts need the session's CSRF token and start where the file
ends; another user's folder is refused as WebHDFS refuses it; nothing is
written or lost by a refused request."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask.testing import FlaskClient

from shared.infra.config import Settings
from tests.support.api import AuthedClient, portal_login

pytestmark = pytest.mark.redis


@pytest.fixture
def browser(settings: Settings, alice: AuthedClient, bob: AuthedClient) -> FlaskClient:
    return alice.client.application.test_client()


def _part(browser: FlaskClient, path: Path, offset: int, body: bytes,
          csrf: str | None) -> tuple[int, dict[str, object]]:
    headers = {"X-CSRF-Token": csrf} if csrf else {}
    answer = browser.post(f"/storage/upload?path={path}&offset={offset}", data=body,
                          headers=headers, content_type="application/octet-stream")
    return answer.status_code, answer.get_json(silent=True) or {}


def test_parts_make_the_file_and_append_where_it_ends(browser: FlaskClient,
                                                      tmp_path: Path) -> None:
    csrf = portal_login(browser, "alice")
    target = tmp_path / "alice" / "up" / "f.bin"
    assert _part(browser, target, 0, b"abc", csrf) == (200, {"length": 3})
    assert _part(browser, target, 3, b"def", csrf) == (200, {"length": 6})
    status, body = _part(browser, target, 2, b"XX", csrf)  # a part sent twice, late
    assert status == 409 and "holds 6 bytes" in str(body["message"])
    assert target.read_bytes() == b"abcdef"
    assert _part(browser, target, 0, b"new", csrf) == (200, {"length": 3})  # anew
    assert target.read_bytes() == b"new"


def test_an_upload_without_the_csrf_token_is_refused(browser: FlaskClient,
                                                     tmp_path: Path) -> None:
    portal_login(browser, "alice")
    status, _ = _part(browser, tmp_path / "alice" / "f.bin", 0, b"forged", None)
    assert status == 400
    status, _ = _part(browser, tmp_path / "alice" / "f.bin", 0, b"forged", "not-the-token")
    assert status == 400
    assert not (tmp_path / "alice").exists()


def test_another_users_folder_is_refused_for_every_route(browser: FlaskClient,
                                                         tmp_path: Path) -> None:
    csrf = portal_login(browser, "alice")
    bobs = tmp_path / "bob"
    bobs.mkdir()
    (bobs / "secret.txt").write_text("bob's")
    status, body = _part(browser, bobs / "planted", 0, b"x", csrf)
    assert status == 403 and "Permission denied" in str(body["message"])
    download = browser.get(f"/storage/download?path={bobs}/secret.txt")
    assert download.status_code == 403 and b"bob's" not in download.data
    listing = browser.get(f"/storage?path={bobs}").get_data(as_text=True)
    assert "Permission denied" in listing and "secret.txt" not in listing
    browser.post("/storage/delete", data={"csrf_token": csrf, "path": f"{bobs}/secret.txt"})
    browser.post("/storage/mkdir", data={"csrf_token": csrf, "path": str(bobs),
                                         "name": "made"})
    assert sorted(p.name for p in bobs.iterdir()) == ["secret.txt"]


def test_a_logged_out_visitor_is_sent_to_the_login(browser: FlaskClient,
                                                   tmp_path: Path) -> None:
    for page in ("/storage", f"/storage/download?path={tmp_path}/alice/x"):
        answer = browser.get(page)
        assert answer.status_code == 302 and "/login" in answer.headers["Location"]
