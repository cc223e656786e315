"""Users through the API on a real Redis: admins create, list, delete, promote
and assign virtual clusters; everyone else may only look at themselves."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from shared.state import keys
from tests.support.api import (
    AuthedClient,
    config,
    error_of,
    login,
    whoami,
)


@pytest.fixture
def vision(admin: AuthedClient) -> str:
    """A second virtual cluster, `vision`."""
    assert admin.put("/api/v1/virtual-clusters/vision", json={"gpuQuota": 8}).status_code == 201
    return "vision"


# ----------------------------------------------------------------- create


def test_an_admin_creates_a_user_with_defaults(flask_client: FlaskClient,
                                               admin: AuthedClient) -> None:
    resp = admin.post("/api/v1/user", json={"username": "carol", "password": "carol-pw"})

    assert resp.status_code == 201
    body = resp.json
    assert body is not None
    assert {k: body[k] for k in ("username", "admin", "virtualClusters")} == {
        "username": "carol", "admin": False, "virtualClusters": ["default"]}
    assert isinstance(body["createdTime"], int) and body["createdTime"] > 0
    assert "password" not in str(body).lower()
    assert login(flask_client, "carol", "carol-pw")


def test_an_admin_creates_an_admin_in_chosen_vcs(flask_client: FlaskClient, admin: AuthedClient,
                                                 vision: str) -> None:
    resp = admin.post("/api/v1/user", json={"username": "dave", "password": "dave-pw-1",
                                            "admin": True, "virtualClusters": [vision]})

    assert resp.status_code == 201 and resp.json is not None
    assert (resp.json["admin"], resp.json["virtualClusters"]) == (True, [vision])
    dave = AuthedClient(flask_client, login(flask_client, "dave", "dave-pw-1"))
    assert dave.get("/api/v1/user").status_code == 200


def test_only_admins_create_users(alice: AuthedClient, redis_client: redis.Redis) -> None:
    resp = alice.post("/api/v1/user", json={"username": "eve", "password": "eve-pw-1",
                                            "admin": True})
    assert error_of(resp, 403) == "ForbiddenUserError"
    assert not redis_client.exists(keys.user("eve"))


def test_a_taken_username_is_409(admin: AuthedClient, alice: AuthedClient) -> None:
    resp = admin.post("/api/v1/user", json={"username": "alice", "password": "other-pw",
                                            "admin": True})
    assert error_of(resp, 409) == "ConflictUserError"
    assert admin.get("/api/v1/user/alice").json["admin"] is False


@pytest.mark.parametrize(("body", "code"), [
    ({"password": "secret-pw"}, "BadRequestError"),
    ({"username": 7, "password": "secret-pw"}, "BadRequestError"),
    ({"username": "bad name!", "password": "secret-pw"}, "BadRequestError"),
    ({"username": "-dash", "password": "secret-pw"}, "BadRequestError"),
    ({"username": "x" * 65, "password": "secret-pw"}, "BadRequestError"),
    ({"username": "carol"}, "BadRequestError"),
    ({"username": "carol", "password": "short"}, "BadRequestError"),
    ({"username": "carol", "password": 123456}, "BadRequestError"),
    ({"username": "carol", "password": "p" * 257}, "BadRequestError"),
    ({"username": "carol", "password": "secret-pw", "admin": "yes"}, "BadRequestError"),
    ({"username": "carol", "password": "secret-pw", "virtualClusters": "default"},
     "BadRequestError"),
    ({"username": "carol", "password": "secret-pw", "virtualClusters": [1]},
     "BadRequestError"),
    ({"username": "carol", "password": "secret-pw", "virtualClusters": ["nope"]},
     "NoVirtualClusterError"),
    (["carol", "secret-pw"], "BadRequestError"),
], ids=["no username", "username not a string", "username with spaces",
        "username starting with a dash", "username too long", "no password",
        "password too short", "password not a string", "password too long",
        "admin not a boolean", "vcs not a list", "vcs not names", "unknown vc",
        "not an object"])
def test_create_user_rejects_bad_input(admin: AuthedClient, redis_client: redis.Redis,
                                       body: Any, code: str) -> None:
    resp = admin.post("/api/v1/user", json=body)
    assert error_of(resp, 400) == code
    assert redis_client.smembers(keys.USERS) == {"root"}


def test_create_user_rejects_a_body_that_is_not_json(admin: AuthedClient) -> None:
    resp = admin.post("/api/v1/user", data="username=carol&password=secret-pw",
                      content_type="application/x-www-form-urlencoded")
    assert error_of(resp, 400) == "BadRequestError"


# ------------------------------------------------------------ list, read


def test_an_admin_lists_every_user_sorted(admin: AuthedClient, alice: AuthedClient,
                                          bob: AuthedClient) -> None:
    resp = admin.get("/api/v1/user")

    assert resp.status_code == 200
    rows = resp.json
    assert rows is not None
    assert [u["username"] for u in rows] == ["alice", "bob", "root"]
    assert [u["admin"] for u in rows] == [False, False, True]
    assert all(set(u) >= {"username", "admin", "virtualClusters", "createdTime"}
               for u in rows)
    assert "password" not in str(rows).lower()  # nor its hash


def test_only_admins_list_users(alice: AuthedClient) -> None:
    assert error_of(alice.get("/api/v1/user"), 403) == "ForbiddenUserError"


def test_a_user_reads_themselves_but_not_others(admin: AuthedClient, alice: AuthedClient,
                                                bob: AuthedClient) -> None:
    own = alice.get("/api/v1/user/alice")
    assert own.status_code == 200 and own.json is not None
    assert own.json["username"] == "alice"
    assert error_of(alice.get("/api/v1/user/bob"), 403) == "ForbiddenUserError"
    assert admin.get("/api/v1/user/bob").status_code == 200
    assert error_of(admin.get("/api/v1/user/nobody"), 404) == "NoUserError"


# ----------------------------------------------------------------- delete


def test_an_admin_deletes_a_user(flask_client: FlaskClient, admin: AuthedClient,
                                 alice: AuthedClient, redis_client: redis.Redis) -> None:
    resp = admin.delete("/api/v1/user/alice")

    assert resp.status_code == 200
    assert error_of(admin.get("/api/v1/user/alice"), 404) == "NoUserError"
    assert [u["username"] for u in admin.get("/api/v1/user").json or []] == ["root"]
    assert whoami(alice, "alice") == 401
    relogin = flask_client.post("/api/v1/token", json={"username": "alice",
                                                       "password": "secret-pw"})
    assert error_of(relogin, 401) == "IncorrectPasswordError"  # as for any unknown name
    assert not redis_client.exists(keys.user("alice"))


def test_deleting_a_user_keeps_their_jobs(admin: AuthedClient, alice: AuthedClient) -> None:
    alice.post("/api/v1/user/alice/jobs", json=config("kept"))
    admin.delete("/api/v1/user/alice")
    assert admin.get("/api/v1/user/alice/jobs/kept").status_code == 200


def test_user_deletion_errors(admin: AuthedClient, alice: AuthedClient,
                              bob: AuthedClient) -> None:
    assert error_of(alice.delete("/api/v1/user/bob"), 403) == "ForbiddenUserError"
    assert error_of(alice.delete("/api/v1/user/alice"), 403) == "ForbiddenUserError"
    assert error_of(admin.delete("/api/v1/user/root"), 400) == "BadRequestError"
    assert error_of(admin.delete("/api/v1/user/nobody"), 404) == "NoUserError"
    assert whoami(bob, "bob") == 200
    assert whoami(admin, "root") == 200


# ------------------------------------------------------------------ admin


def test_an_admin_promotes_and_demotes_a_user_at_once(admin: AuthedClient,
                                                      alice: AuthedClient) -> None:
    resp = admin.put("/api/v1/user/alice/admin", json={"value": True})

    assert resp.status_code == 200 and resp.json is not None
    assert resp.json["admin"] is True
    assert alice.get("/api/v1/user").status_code == 200  # the same token, now an admin's

    assert admin.put("/api/v1/user/alice/admin", json={"value": False}).status_code == 200
    assert error_of(alice.get("/api/v1/user"), 403) == "ForbiddenUserError"


@pytest.mark.parametrize(("caller", "path", "body", "status", "code"), [
    ("alice", "/api/v1/user/alice/admin", {"value": True}, 403, "ForbiddenUserError"),
    ("root", "/api/v1/user/alice/admin", {"value": "true"}, 400, "BadRequestError"),
    ("root", "/api/v1/user/alice/admin", {}, 400, "BadRequestError"),
    ("root", "/api/v1/user/alice/admin", [True], 400, "BadRequestError"),
    ("root", "/api/v1/user/root/admin", {"value": False}, 400, "BadRequestError"),
    ("root", "/api/v1/user/nobody/admin", {"value": True}, 404, "NoUserError"),
], ids=["not an admin", "value a string", "no value", "not an object", "demote oneself",
        "unknown user"])
def test_set_admin_errors(admin: AuthedClient, alice: AuthedClient, caller: str, path: str,
                          body: Any, status: int, code: str) -> None:
    client = admin if caller == "root" else alice
    assert error_of(client.put(path, json=body), status) == code
    assert admin.get("/api/v1/user/alice").json["admin"] is False
    assert admin.get("/api/v1/user/root").json["admin"] is True


# ------------------------------------------------------- virtual clusters


def test_an_admin_sets_a_users_vcs(admin: AuthedClient, alice: AuthedClient,
                                   vision: str) -> None:
    job = config("cnn", virtualCluster=vision)
    assert error_of(alice.post("/api/v1/user/alice/jobs", json=job), 403) \
        == "ForbiddenUserError"

    resp = admin.put("/api/v1/user/alice/virtualClusters",
                     json={"virtualClusters": [vision, "default", vision]})

    assert resp.status_code == 200 and resp.json is not None
    assert resp.json["virtualClusters"] == ["default", "vision"]
    assert alice.post("/api/v1/user/alice/jobs", json=job).status_code == 202


def test_taking_a_vc_away_stops_new_submissions_to_it(admin: AuthedClient,
                                                      alice: AuthedClient) -> None:
    assert admin.put("/api/v1/user/alice/virtualClusters",
                     json={"virtualClusters": []}).status_code == 200
    resp = alice.post("/api/v1/user/alice/jobs", json=config())
    assert error_of(resp, 403) == "ForbiddenUserError"


@pytest.mark.parametrize(("caller", "user", "body", "status", "code"), [
    ("root", "alice", {"virtualClusters": ["default", "nope"]}, 400, "NoVirtualClusterError"),
    ("root", "alice", {"virtualClusters": "default"}, 400, "BadRequestError"),
    ("root", "alice", {}, 400, "BadRequestError"),
    ("root", "nobody", {"virtualClusters": ["default"]}, 404, "NoUserError"),
    ("alice", "alice", {"virtualClusters": ["default", "vision"]}, 403, "ForbiddenUserError"),
], ids=["unknown vc", "not a list", "missing", "unknown user", "not an admin"])
def test_set_vcs_errors(admin: AuthedClient, alice: AuthedClient, vision: str, caller: str,
                        user: str, body: Any, status: int, code: str) -> None:
    client = admin if caller == "root" else alice
    resp = client.put(f"/api/v1/user/{user}/virtualClusters", json=body)
    assert error_of(resp, status) == code
    assert admin.get("/api/v1/user/alice").json["virtualClusters"] == ["default"]
