"""WebHDFS refusals: every way a caller might reach what is not theirs.

Users and job code are untrusted (docs/security.md): a user tries another's
folder, a share's write, the platform's log tree, `..`, a forged or revoked
login, a WebHDFS identity parameter that names someone else; a job plants
links, FIFOs and hard links in its outputDir for the API to follow. Each
attack is a raw HTTP request, so what is checked is pai's answer, not a
client's behaviour; and each checks that nothing was read, written or lost.
"""

from __future__ import annotations

import fcntl
import http.client
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from shared.infra.config import Settings
from tests.support.webhdfs import Pai, pai_served, remote_exception

pytestmark = pytest.mark.redis


@pytest.fixture
def pai(settings: Settings, tmp_path: Path) -> Iterator[Pai]:
    with pai_served(settings, tmp_path) as served:
        yield served


@pytest.fixture
def alice(pai: Pai) -> requests.Session:
    return pai.session("alice")


@pytest.fixture
def bobs(pai: Pai) -> Path:
    """bob's folder, holding a secret file."""
    folder = pai.root / "bob"
    folder.mkdir()
    (folder / "secret.txt").write_bytes(b"bob's secret")
    return folder


def _call(session: requests.Session, pai: Pai, method: str, path: str | Path, op: str,
          body: bytes | None = None, **params: str) -> requests.Response:
    return session.request(method, pai.webhdfs(str(path)), params={"op": op, **params},
                           data=body, allow_redirects=False)


# ---------------------------------------------------------------- logins


def test_no_login_is_401(pai: Pai, bobs: Path) -> None:
    answer = requests.get(pai.webhdfs(f"{bobs}/secret.txt"), params={"op": "OPEN"})
    assert remote_exception(answer, 401) == "SecurityException"


def test_user_name_alone_is_no_login(pai: Pai, bobs: Path) -> None:
    """Hadoop's "simple" auth trusts `user.name`; pai trusts only a token."""
    answer = requests.get(pai.webhdfs(f"{bobs}/secret.txt"),
                          params={"op": "OPEN", "user.name": "bob"})
    assert remote_exception(answer, 401) == "SecurityException"
    assert "user.name alone" in answer.json()["RemoteException"]["message"]


@pytest.mark.parametrize("name", ["user.name", "doas"])
def test_a_token_cannot_speak_for_another_user(pai: Pai, alice: requests.Session,
                                               bobs: Path, name: str) -> None:
    answer = _call(alice, pai, "GET", f"{bobs}/secret.txt", "OPEN", **{name: "bob"})
    assert remote_exception(answer, 403) == "AccessControlException"
    assert "bob's secret" not in answer.text


def test_a_forged_token_is_401(pai: Pai, bobs: Path) -> None:
    token = pai.token("alice")
    header, claims, _ = token.split(".")
    forged = f"{header}.{claims}.{'A' * 43}"
    answer = requests.get(pai.webhdfs(f"{bobs}/secret.txt"),
                          params={"op": "OPEN", "delegation": forged})
    assert remote_exception(answer, 401) == "SecurityException"


def test_a_revoked_token_is_401_at_once(pai: Pai) -> None:
    session = pai.session("alice")
    assert session.delete(f"{pai.url}/api/v1/token").status_code == 200
    answer = _call(session, pai, "GET", pai.root / "alice", "LISTSTATUS")
    assert remote_exception(answer, 401) == "SecurityException"


def test_the_data_step_checks_the_login_again(pai: Pai, alice: requests.Session) -> None:
    """The 307's Location is no ticket: without a login it is refused."""
    first = _call(alice, pai, "PUT", pai.root / "alice" / "f", "CREATE")
    assert first.status_code == 307
    location = first.headers["Location"]
    answer = requests.put(location, data=b"anonymous bytes")
    assert remote_exception(answer, 401) == "SecurityException"
    assert not (pai.root / "alice" / "f").exists()


# ---------------------------------------------------------------- other users' folders


@pytest.mark.parametrize(("method", "op", "path", "params"), [
    ("GET", "OPEN", "secret.txt", {}),
    ("GET", "LISTSTATUS", "", {}),
    ("GET", "GETFILESTATUS", "secret.txt", {}),
    ("GET", "GETCONTENTSUMMARY", "", {}),
    ("PUT", "CREATE", "planted.txt", {}),
    ("PUT", "CREATE", "secret.txt", {"overwrite": "true", "data": "true"}),
    ("POST", "APPEND", "secret.txt", {}),
    ("POST", "APPEND", "secret.txt", {"data": "true"}),
    ("PUT", "MKDIRS", "new", {}),
    ("DELETE", "DELETE", "secret.txt", {}),
    ("DELETE", "DELETE", "", {"recursive": "true"}),
    ("PUT", "RENAME", "secret.txt", {"destination": "/ALICE/stolen.txt"}),
])
def test_another_users_folder_is_out_of_reach(pai: Pai, alice: requests.Session, bobs: Path,
                                              method: str, op: str, path: str,
                                              params: dict[str, str]) -> None:
    params = {k: v.replace("/ALICE", str(pai.root / "alice")) for k, v in params.items()}
    answer = _call(alice, pai, method, bobs / path if path else bobs, op,
                   body=b"evil" if method != "GET" else None, **params)
    assert remote_exception(answer, 403) == "AccessControlException"
    assert "bob's secret" not in answer.text
    assert sorted(p.name for p in bobs.iterdir()) == ["secret.txt"]
    assert (bobs / "secret.txt").read_bytes() == b"bob's secret"


def test_renaming_into_another_users_folder_is_refused(pai: Pai, alice: requests.Session,
                                                       bobs: Path) -> None:
    mine = pai.root / "alice"
    mine.mkdir()
    (mine / "gift.txt").write_text("x")
    answer = _call(alice, pai, "PUT", mine / "gift.txt", "RENAME",
                   destination=str(bobs / "gift.txt"))
    assert remote_exception(answer, 403) == "AccessControlException"
    assert (mine / "gift.txt").exists() and not (bobs / "gift.txt").exists()


def test_a_folder_named_like_mine_is_not_mine(pai: Pai, alice: requests.Session) -> None:
    other = pai.root / "alice2"
    other.mkdir()
    answer = _call(alice, pai, "PUT", other / "x", "MKDIRS")
    assert remote_exception(answer, 403) == "AccessControlException"
    assert not (other / "x").exists()


def test_a_bare_root_is_no_users(pai: Pai, alice: requests.Session, bobs: Path) -> None:
    answer = _call(alice, pai, "GET", pai.root, "LISTSTATUS")
    assert remote_exception(answer, 403) == "AccessControlException"
    assert "bob" not in answer.text


def test_a_share_is_read_only(pai: Pai) -> None:
    shared = pai.root / "datasets"
    shared.mkdir()
    (shared / "a.csv").write_bytes(b"data")
    made = pai.session("root").put(f"{pai.url}/api/v1/storage/shares/ds",
                                   json={"path": str(shared), "users": ["alice"]})
    assert made.status_code == 201, made.text
    alice = pai.session("alice")
    assert _call(alice, pai, "GET", shared / "a.csv", "OPEN").content == b"data"
    for method, op, params in [("PUT", "CREATE", {"overwrite": "true"}),
                               ("POST", "APPEND", {}), ("DELETE", "DELETE", {}),
                               ("PUT", "MKDIRS", {}),
                               ("PUT", "RENAME", {"destination": str(shared / "b.csv")})]:
        answer = _call(alice, pai, method, shared / "a.csv", op, body=b"x", **params)
        assert remote_exception(answer, 403) == "AccessControlException", op
        assert "read-only" in answer.json()["RemoteException"]["message"]
    assert sorted(p.name for p in shared.iterdir()) == ["a.csv"]
    assert (shared / "a.csv").read_bytes() == b"data"


# ---------------------------------------------------------------- paths


def test_dot_dot_is_refused_before_any_lookup(pai: Pai, bobs: Path) -> None:
    """A raw request line, as no client would normalise it: `..` is a 400."""
    where = urlsplit(pai.url)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
    path = f"/webhdfs/v1{pai.root}/alice/../bob/secret.txt"
    connection.request("GET", f"{path}?op=OPEN&delegation={pai.token('alice')}")
    answer = connection.getresponse()
    body = answer.read()
    assert answer.status == 400
    assert b"IllegalArgumentException" in body and b"secret" not in body.split(b'"message"')[0]
    assert b"bob's secret" not in body


@pytest.mark.parametrize("path", ["/etc/passwd", "/proc/self/environ", "/"])
def test_paths_outside_every_root_are_not_served(pai: Pai, path: str) -> None:
    answer = _call(pai.session("root"), pai, "GET", path, "OPEN")
    assert remote_exception(answer, 404) == "FileNotFoundException"
    assert "root:" not in answer.text


def test_the_log_tree_is_no_ones_not_even_an_admins(pai: Pai) -> None:
    logs = pai.root / ".pai-logs" / "alice~job" / "0"
    logs.mkdir(parents=True)
    (logs / "main-0.log").write_text("a task's log")
    admin = pai.session("root")
    for method, op, target, params in [
            ("GET", "OPEN", logs / "main-0.log", {}),
            ("GET", "LISTSTATUS", pai.root / ".pai-logs", {}),
            ("DELETE", "DELETE", pai.root / ".pai-logs", {"recursive": "true"}),
            ("DELETE", "DELETE", pai.root, {"recursive": "true"}),
            ("PUT", "RENAME", pai.root / ".pai-logs", {"destination": str(pai.root / "x")}),
            ("PUT", "CREATE", logs / "forged.log", {})]:
        answer = _call(admin, pai, method, target, op, body=b"x", **params)
        assert remote_exception(answer, 403) == "AccessControlException", (op, target)
    assert (logs / "main-0.log").read_text() == "a task's log"
    assert not (logs / "forged.log").exists()


# ---------------------------------------------------------------- what a job plants


@pytest.fixture
def planted(pai: Pai, bobs: Path) -> Path:
    """alice's folder as a job of hers left it: links to bob's folder, to a
    host file and to a file of bob's; a FIFO; a file hard-linked twice."""
    mine = pai.root / "alice"
    mine.mkdir()
    (mine / "to-bob").symlink_to(bobs)
    (mine / "to-host").symlink_to("/etc/hostname")
    (mine / "to-secret").symlink_to(bobs / "secret.txt")
    os.mkfifo(mine / "fifo")
    (mine / "twice").write_text("mine")
    os.link(mine / "twice", mine / "twice-again")
    return mine


@pytest.mark.parametrize(("method", "op", "path", "params"), [
    ("GET", "OPEN", "to-secret", {}),
    ("GET", "OPEN", "to-host", {}),
    ("GET", "OPEN", "to-bob/secret.txt", {}),
    ("GET", "LISTSTATUS", "to-bob", {}),
    ("GET", "GETFILESTATUS", "to-bob/secret.txt", {}),
    ("GET", "GETCONTENTSUMMARY", "to-bob", {}),
    ("PUT", "CREATE", "to-bob/planted.txt", {"data": "true"}),
    ("PUT", "MKDIRS", "to-bob/made", {}),
    ("POST", "APPEND", "to-secret", {"data": "true"}),
    ("DELETE", "DELETE", "to-bob/secret.txt", {}),
    ("PUT", "RENAME", "to-bob/secret.txt", {"destination": "/ALICE/got.txt"}),
])
def test_no_operation_follows_a_planted_link(pai: Pai, alice: requests.Session,
                                             planted: Path, bobs: Path, method: str,
                                             op: str, path: str,
                                             params: dict[str, str]) -> None:
    params = {k: v.replace("/ALICE", str(planted)) for k, v in params.items()}
    answer = _call(alice, pai, method, planted / path, op,
                   body=b"evil" if method != "GET" else None, **params)
    assert remote_exception(answer, 403) == "AccessControlException", answer.text
    assert "symbolic link" in answer.json()["RemoteException"]["message"]
    assert "bob's secret" not in answer.text
    assert sorted(p.name for p in bobs.iterdir()) == ["secret.txt"]
    assert (bobs / "secret.txt").read_bytes() == b"bob's secret"


def test_a_listing_shows_links_as_links(pai: Pai, alice: requests.Session,
                                        planted: Path) -> None:
    answer = _call(alice, pai, "GET", planted, "LISTSTATUS")
    kinds = {s["pathSuffix"]: s["type"] for s in answer.json()["FileStatuses"]["FileStatus"]}
    assert kinds == {"to-bob": "SYMLINK", "to-host": "SYMLINK", "to-secret": "SYMLINK",
                     "twice": "FILE", "twice-again": "FILE"}  # the FIFO is not listed


def test_deleting_or_moving_a_link_touches_the_link_only(pai: Pai, alice: requests.Session,
                                                         planted: Path, bobs: Path) -> None:
    moved = _call(alice, pai, "PUT", planted / "to-secret", "RENAME",
                  destination=str(planted / "moved-link"))
    assert moved.json() == {"boolean": True}
    assert (planted / "moved-link").is_symlink()
    deleted = _call(alice, pai, "DELETE", planted / "to-bob", "DELETE", recursive="true")
    assert deleted.json() == {"boolean": True}
    assert not (planted / "to-bob").exists()
    assert (bobs / "secret.txt").read_bytes() == b"bob's secret"


def test_a_recursive_delete_does_not_descend_into_a_link(pai: Pai, alice: requests.Session,
                                                         planted: Path, bobs: Path) -> None:
    answer = _call(alice, pai, "DELETE", planted, "DELETE", recursive="true")
    assert answer.json() == {"boolean": True}
    assert not planted.exists()
    assert (bobs / "secret.txt").read_bytes() == b"bob's secret"


def test_a_fifo_is_refused_without_hanging(pai: Pai, alice: requests.Session,
                                           planted: Path) -> None:
    for method, op, params in [("GET", "OPEN", {}), ("POST", "APPEND", {"data": "true"})]:
        answer = _call(alice, pai, method, planted / "fifo", op, body=b"x", **params)
        assert remote_exception(answer, 403) == "AccessControlException", op


def test_appending_to_a_hard_linked_file_is_refused(pai: Pai, alice: requests.Session,
                                                    planted: Path) -> None:
    answer = _call(alice, pai, "POST", planted / "twice", "APPEND", body=b"more",
                   **{"data": "true"})
    assert remote_exception(answer, 403) == "AccessControlException"
    assert (planted / "twice-again").read_text() == "mine"


def test_overwriting_a_hard_linked_file_leaves_the_other_link_alone(
        pai: Pai, alice: requests.Session, planted: Path) -> None:
    answer = _call(alice, pai, "PUT", planted / "twice", "CREATE", body=b"new",
                   overwrite="true", **{"data": "true"})
    assert answer.status_code == 201, answer.text
    assert (planted / "twice").read_bytes() == b"new"
    assert (planted / "twice-again").read_text() == "mine"


def test_overwrite_replaces_a_planted_link_instead_of_writing_through_it(
        pai: Pai, alice: requests.Session, planted: Path, bobs: Path) -> None:
    answer = _call(alice, pai, "PUT", planted / "to-secret", "CREATE", body=b"mine now",
                   overwrite="true", **{"data": "true"})
    assert answer.status_code == 201, answer.text
    assert not (planted / "to-secret").is_symlink()
    assert (planted / "to-secret").read_bytes() == b"mine now"
    assert (bobs / "secret.txt").read_bytes() == b"bob's secret"


def test_a_second_writer_is_refused_while_an_upload_holds_the_file(
        pai: Pai, alice: requests.Session) -> None:
    mine = pai.root / "alice"
    mine.mkdir()
    (mine / "busy").write_bytes(b"start")
    with open(mine / "busy", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        answer = _call(alice, pai, "POST", mine / "busy", "APPEND", body=b"interleaved",
                       **{"data": "true"})
    assert remote_exception(answer, 403) == "AlreadyBeingCreatedException"
    assert (mine / "busy").read_bytes() == b"start"


# ---------------------------------------------------------------- bad requests


@pytest.mark.parametrize(("method", "params", "exception"), [
    ("PUT", {"op": "SETOWNER", "owner": "bob"}, "UnsupportedOperationException"),
    ("GET", {"op": "NOSUCHOP"}, "IllegalArgumentException"),
    ("GET", {}, "IllegalArgumentException"),
    ("GET", {"op": "CREATE"}, "IllegalArgumentException"),
    ("DELETE", {"op": "DELETE", "recursive": "yes"}, "IllegalArgumentException"),
    ("PUT", {"op": "MKDIRS", "permission": "1777"}, "IllegalArgumentException"),
    ("PUT", {"op": "MKDIRS", "permission": "999"}, "IllegalArgumentException"),
    ("GET", {"op": "OPEN", "offset": "-1"}, "IllegalArgumentException"),
    ("GET", {"op": "OPEN", "length": "1e9"}, "IllegalArgumentException"),
    ("PUT", {"op": "RENAME", "destination": "relative/path"}, "IllegalArgumentException"),
])
def test_bad_requests_are_400_and_change_nothing(pai: Pai, alice: requests.Session,
                                                 method: str, params: dict[str, str],
                                                 exception: str) -> None:
    mine = pai.root / "alice"
    mine.mkdir()
    (mine / "f").write_bytes(b"kept")
    answer = alice.request(method, pai.webhdfs(str(mine / "f")), params=params,
                           allow_redirects=False)
    assert remote_exception(answer, 400) == exception
    assert sorted(p.name for p in mine.iterdir()) == ["f"]
    assert (mine / "f").read_bytes() == b"kept"


def test_reading_past_the_end_is_refused(pai: Pai, alice: requests.Session) -> None:
    mine = pai.root / "alice"
    mine.mkdir()
    (mine / "short").write_bytes(b"abc")
    answer = _call(alice, pai, "GET", mine / "short", "OPEN", offset="4")
    assert remote_exception(answer, 403) == "IOException"


def test_a_folder_cannot_be_moved_into_itself(pai: Pai, alice: requests.Session) -> None:
    mine = pai.root / "alice"
    (mine / "a").mkdir(parents=True)
    answer = _call(alice, pai, "PUT", mine / "a", "RENAME", destination=str(mine / "a" / "b"))
    assert remote_exception(answer, 400) == "IllegalArgumentException"
    assert (mine / "a").is_dir()
