"""Logins, tokens, and who may touch whose job: the API on a real Redis.

Tokens are signed, expire and can be revoked (logout, an admin, a password
change); a user cannot stop, read the config of, read the logs of or delete
another user's job, and admins can (docs/design.md, "REST API" and "Reliability and security").
"""

from __future__ import annotations

from typing import Any

import jwt
import pytest
import redis
import yaml
from flask.testing import FlaskClient

from services.api.app import MAX_BODY_BYTES, create_app
from shared.infra.clock import now_ms
from shared.infra.config import ConfigError, Settings
from shared.state import keys
from shared.state.store import Store
from tests.support.api import (
    DAY_S,
    AuthedClient,
    config,
    error_of,
    login,
    whoami,
)


def token_of(client: AuthedClient) -> str:
    return client.headers["Authorization"].removeprefix("Bearer ")


def as_token(flask_client: FlaskClient, token: str) -> AuthedClient:
    return AuthedClient(flask_client, token)


def unverified_claims(token: str) -> dict[str, Any]:
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return claims


def forge(settings: Settings, username: str, *, issued_ms: int | None = None,
          lifetime_s: int = 3600, secret: str | None = None, **overrides: Any) -> str:
    """A token with the claims `services.api.auth.issue_token` writes."""
    issued = now_ms() if issued_ms is None else issued_ms
    claims: dict[str, Any] = {"sub": username, "iat": issued // 1000,
                              "exp": (issued + lifetime_s * 1000) // 1000,
                              "iat_ms": issued, "jti": f"forged-{issued}-{username}"}
    claims.update(overrides)
    claims = {k: v for k, v in claims.items() if v is not None}
    return jwt.encode(claims, secret or settings.secret_key, algorithm="HS256")


# ------------------------------------------------------------------ login


def test_login_with_json_gives_a_working_token(flask_client: FlaskClient,
                                               alice: AuthedClient) -> None:
    resp = flask_client.post("/api/v1/token", json={"username": "alice",
                                                    "password": "secret-pw"})

    assert resp.status_code == 200
    body = resp.json
    assert body is not None
    assert (body["user"], body["admin"]) == ("alice", False)
    claims = unverified_claims(body["token"])
    assert claims["sub"] == "alice"
    assert claims["exp"] - claims["iat"] == 7 * DAY_S  # the default lifetime
    assert body["expires"] == claims["iat_ms"] + 7 * DAY_S * 1000
    assert whoami(as_token(flask_client, body["token"]), "alice") == 200


def test_login_with_a_form_gives_a_token(flask_client: FlaskClient,
                                         alice: AuthedClient) -> None:
    resp = flask_client.post("/api/v1/token", data={"username": "alice",
                                                    "password": "secret-pw",
                                                    "expiration": "3600"})

    assert resp.status_code == 200
    body = resp.json
    assert body is not None and body["user"] == "alice"
    claims = unverified_claims(body["token"])
    assert claims["exp"] - claims["iat"] == 3600
    assert whoami(as_token(flask_client, body["token"]), "alice") == 200


def test_an_admin_login_says_so(flask_client: FlaskClient) -> None:
    resp = flask_client.post("/api/v1/token", json={"username": "root",
                                                    "password": "root-password"})
    assert resp.status_code == 200 and resp.json is not None
    assert resp.json["admin"] is True


@pytest.mark.parametrize(("fields", "status", "code"), [
    ({"username": "alice"}, 400, "BadRequestError"),
    ({"password": "secret-pw"}, 400, "BadRequestError"),
    ({"username": "", "password": ""}, 400, "BadRequestError"),
    ({"username": 5, "password": "secret-pw"}, 400, "BadRequestError"),
    ({"username": "alice", "password": "secret-pw", "expiration": "soon"}, 400,
     "BadRequestError"),
    ({"username": "alice", "password": "secret-pw", "expiration": 59}, 400,
     "BadRequestError"),
    ({"username": "alice", "password": "secret-pw", "expiration": 91 * DAY_S}, 400,
     "BadRequestError"),
    ({"username": "nobody", "password": "secret-pw"}, 401, "IncorrectPasswordError"),
    ({"username": "alice", "password": "wrong-pw"}, 401, "IncorrectPasswordError"),
], ids=["no password", "no username", "empty fields", "username not a string",
        "expiration not a number", "expiration under a minute", "expiration over 90 days",
        "unknown user", "wrong password"])
def test_login_errors(flask_client: FlaskClient, alice: AuthedClient, fields: dict[str, Any],
                      status: int, code: str) -> None:
    resp = flask_client.post("/api/v1/token", json=fields)
    assert error_of(resp, status) == code
    assert "token" not in (resp.json or {})


def test_a_form_login_with_a_wrong_password_is_refused(flask_client: FlaskClient,
                                                       alice: AuthedClient) -> None:
    resp = flask_client.post("/api/v1/token", data={"username": "alice", "password": "nope-pw"})
    assert error_of(resp, 401) == "IncorrectPasswordError"


# ------------------------------------------------------------ bad tokens

PROTECTED = [
    ("get", "/api/v1/jobs"),
    ("post", "/api/v1/jobs"),
    ("get", "/api/v1/user/alice/jobs/mnist"),
    ("put", "/api/v1/user/alice/jobs/mnist/executionType"),
    ("get", "/api/v1/user"),
    ("post", "/api/v1/user"),
    ("get", "/api/v1/virtual-clusters"),
    ("put", "/api/v1/virtual-clusters/vision"),
    ("get", "/api/v1/nodes"),
    ("put", "/api/v1/nodes/n1"),
    ("delete", "/api/v1/token"),
    ("get", "/api/v1/no-such-endpoint"),
]


@pytest.mark.parametrize(("method", "path"), PROTECTED,
                         ids=[f"{m.upper()} {p}" for m, p in PROTECTED])
def test_no_token_is_401(flask_client: FlaskClient, alice: AuthedClient, method: str,
                         path: str) -> None:
    resp = getattr(flask_client, method)(path, json={"value": "STOP"})
    assert error_of(resp, 401) == "UnauthorizedUserError"


@pytest.mark.parametrize("header", [
    "Basic YWxpY2U6c2VjcmV0LXB3",
    "Bearer",
    "Bearer    ",
    "Bearer not-a-jwt",
    "Token {alice}",
], ids=["basic auth", "no token", "blank token", "garbage", "wrong scheme"])
def test_malformed_authorization_is_401(flask_client: FlaskClient, alice: AuthedClient,
                                        header: str) -> None:
    resp = flask_client.get("/api/v1/jobs",
                            headers={"Authorization": header.format(alice=token_of(alice))})
    assert error_of(resp, 401) == "UnauthorizedUserError"


@pytest.mark.parametrize("kind", ["other secret", "no jti", "no iat_ms", "unknown user",
                                  "none algorithm"])
def test_tokens_the_api_did_not_issue_are_401(flask_client: FlaskClient, settings: Settings,
                                              alice: AuthedClient, kind: str) -> None:
    if kind == "other secret":
        token = forge(settings, "alice", secret="someone-else-s-secret-of-32-chars!")
    elif kind == "no jti":
        token = forge(settings, "alice", jti=None)
    elif kind == "no iat_ms":
        token = forge(settings, "alice", iat_ms=None)
    elif kind == "unknown user":
        token = forge(settings, "mallory")
    else:
        claims = unverified_claims(forge(settings, "alice"))
        token = jwt.encode(claims, key=None, algorithm="none")
    resp = as_token(flask_client, token).get("/api/v1/user/alice")
    assert error_of(resp, 401) == "UnauthorizedUserError"


def test_a_forged_token_with_the_right_claims_works(flask_client: FlaskClient,
                                                    settings: Settings,
                                                    alice: AuthedClient) -> None:
    """The check for the tests below: forge() writes what issue_token writes."""
    assert whoami(as_token(flask_client, forge(settings, "alice")), "alice") == 200


def test_an_expired_token_is_401(flask_client: FlaskClient, settings: Settings,
                                 alice: AuthedClient) -> None:
    an_hour_ago = now_ms() - 3600 * 1000
    token = forge(settings, "alice", issued_ms=an_hour_ago - 120_000, lifetime_s=120)
    assert unverified_claims(token)["exp"] * 1000 < now_ms()

    resp = as_token(flask_client, token).get("/api/v1/user/alice")

    assert error_of(resp, 401) == "UnauthorizedUserError"
    assert resp.json is not None and "expired" in resp.json["message"]


def test_a_deleted_users_token_is_401(flask_client: FlaskClient, admin: AuthedClient,
                                      alice: AuthedClient) -> None:
    assert admin.delete("/api/v1/user/alice").status_code == 200
    assert error_of(alice.get("/api/v1/jobs"), 401) == "UnauthorizedUserError"


def test_a_recreated_user_does_not_revive_old_tokens(flask_client: FlaskClient,
                                                     admin: AuthedClient,
                                                     alice: AuthedClient) -> None:
    admin.delete("/api/v1/user/alice")
    admin.post("/api/v1/user", json={"username": "alice", "password": "secret-pw"})
    assert whoami(alice, "alice") == 401


# ------------------------------------------------------------ revocation


def test_logout_revokes_only_that_token(flask_client: FlaskClient,
                                        alice: AuthedClient) -> None:
    other = as_token(flask_client, login(flask_client, "alice", "secret-pw"))

    resp = alice.delete("/api/v1/token")

    assert resp.status_code == 200
    resp = alice.get("/api/v1/jobs")
    assert error_of(resp, 401) == "UnauthorizedUserError"
    assert resp.json is not None and "revoked" in resp.json["message"]
    assert error_of(alice.delete("/api/v1/token"), 401) == "UnauthorizedUserError"
    assert whoami(other, "alice") == 200


def test_logout_remembers_the_token_only_until_it_expires(
        flask_client: FlaskClient, alice: AuthedClient, redis_client: redis.Redis) -> None:
    claims = unverified_claims(token_of(alice))
    alice.delete("/api/v1/token")
    ttl_ms = redis_client.pttl(keys.revoked_token(claims["jti"]))
    assert 0 < ttl_ms <= claims["exp"] * 1000 - claims["iat_ms"]


def test_admin_revokes_every_token_of_a_user(flask_client: FlaskClient, admin: AuthedClient,
                                             alice: AuthedClient, bob: AuthedClient) -> None:
    second = as_token(flask_client, login(flask_client, "alice", "secret-pw"))

    resp = admin.delete("/api/v1/user/alice/tokens")

    assert resp.status_code == 200
    assert whoami(alice, "alice") == 401
    assert whoami(second, "alice") == 401
    assert whoami(bob, "bob") == 200
    assert whoami(admin, "root") == 200
    fresh = as_token(flask_client, login(flask_client, "alice", "secret-pw"))
    assert whoami(fresh, "alice") == 200


def test_a_user_may_revoke_their_own_tokens_but_not_anothers(
        flask_client: FlaskClient, admin: AuthedClient, alice: AuthedClient,
        bob: AuthedClient) -> None:
    assert error_of(bob.delete("/api/v1/user/alice/tokens"), 403) == "ForbiddenUserError"
    assert whoami(alice, "alice") == 200

    assert alice.delete("/api/v1/user/alice/tokens").status_code == 200
    assert whoami(alice, "alice") == 401
    assert error_of(admin.delete("/api/v1/user/nobody/tokens"), 404) == "NoUserError"


def test_a_token_issued_in_the_millisecond_of_a_revocation_is_revoked(
        flask_client: FlaskClient, settings: Settings, admin: AuthedClient,
        alice: AuthedClient, redis_client: redis.Redis) -> None:
    admin.delete("/api/v1/user/alice/tokens")
    epoch = int(redis_client.get(keys.user_token_epoch("alice")) or 0)
    same_millisecond = forge(settings, "alice", issued_ms=epoch)
    assert whoami(as_token(flask_client, same_millisecond), "alice") == 401


# -------------------------------------------------------------- passwords


def test_changing_ones_password_needs_the_old_one_and_revokes_tokens(
        flask_client: FlaskClient, alice: AuthedClient) -> None:
    path = "/api/v1/user/alice/password"
    assert error_of(alice.put(path, json={"newPassword": "brand-new-pw"}), 401) \
        == "IncorrectPasswordError"
    assert error_of(alice.put(path, json={"oldPassword": "wrong-pw",
                                          "newPassword": "brand-new-pw"}), 401) \
        == "IncorrectPasswordError"
    assert error_of(alice.put(path, json={"oldPassword": "secret-pw",
                                          "newPassword": "short"}), 400) == "BadRequestError"
    assert error_of(alice.put(path, json=["secret-pw"]), 400) == "BadRequestError"
    assert whoami(alice, "alice") == 200  # nothing changed so far

    resp = alice.put(path, json={"oldPassword": "secret-pw", "newPassword": "brand-new-pw"})

    assert resp.status_code == 200
    assert whoami(alice, "alice") == 401
    old = flask_client.post("/api/v1/token", json={"username": "alice",
                                                   "password": "secret-pw"})
    assert error_of(old, 401) == "IncorrectPasswordError"
    assert whoami(as_token(flask_client, login(flask_client, "alice", "brand-new-pw")),
                  "alice") == 200


def test_an_admin_sets_a_users_password_without_the_old_one(
        flask_client: FlaskClient, admin: AuthedClient, alice: AuthedClient) -> None:

    resp = admin.put("/api/v1/user/alice/password", json={"newPassword": "reset-by-admin"})

    assert resp.status_code == 200
    assert whoami(alice, "alice") == 401
    assert whoami(admin, "root") == 200
    login(flask_client, "alice", "reset-by-admin")


def test_an_admin_changing_their_own_password_needs_the_old_one(admin: AuthedClient) -> None:
    resp = admin.put("/api/v1/user/root/password", json={"newPassword": "new-root-pw"})
    assert error_of(resp, 401) == "IncorrectPasswordError"


def test_nobody_else_changes_a_users_password(admin: AuthedClient, alice: AuthedClient,
                                              bob: AuthedClient) -> None:
    resp = bob.put("/api/v1/user/alice/password",
                   json={"oldPassword": "secret-pw", "newPassword": "taken-over"})
    assert error_of(resp, 403) == "ForbiddenUserError"
    assert whoami(alice, "alice") == 200
    resp = admin.put("/api/v1/user/nobody/password", json={"newPassword": "whatever-pw"})
    assert error_of(resp, 404) == "NoUserError"


# ------------------------------------------------ whose job is it anyway


@pytest.fixture
def bobs_job(bob: AuthedClient, redis_client: redis.Redis) -> str:
    """Bob's job `secret`, WAITING, with a few log lines; its URL."""
    assert bob.post("/api/v1/user/bob/jobs", json=config("secret")).status_code == 202
    Store(redis_client).append_log("bob~secret", 0, "main", 0, ["bob's line"], max_lines=100)
    return "/api/v1/user/bob/jobs/secret"


def _state(client: AuthedClient, url: str) -> str:
    body = client.get(url).json
    assert body is not None
    state: str = body["jobStatus"]["state"]
    return state


@pytest.mark.parametrize(("method", "suffix", "body"), [
    ("put", "/executionType", {"value": "STOP"}),
    ("get", "/config", None),
    ("get", "/tasks/main/0/log", None),
    ("get", "/tasks/main/0/log?follow=1", None),
    ("delete", "", None),
], ids=["stop", "config", "log", "log follow", "delete"])
def test_a_user_cannot_touch_anothers_job(alice: AuthedClient, bobs_job: str, method: str,
                                          suffix: str, body: Any) -> None:
    resp = getattr(alice, method)(bobs_job + suffix, json=body)

    assert error_of(resp, 403) == "ForbiddenUserError"
    assert "bob's line" not in resp.get_data(as_text=True)
    assert _state(alice, bobs_job) == "WAITING"


def test_a_user_cannot_submit_for_another(alice: AuthedClient, bobs_job: str) -> None:
    resp = alice.post("/api/v1/user/bob/jobs", json=config("planted"))
    assert error_of(resp, 403) == "ForbiddenUserError"
    assert alice.get("/api/v1/user/bob/jobs/planted").status_code == 404


@pytest.mark.parametrize("caller", ["bob", "admin"])
def test_the_owner_and_admins_read_stop_and_delete(
        request: pytest.FixtureRequest, bobs_job: str, caller: str) -> None:
    client: AuthedClient = request.getfixturevalue(caller)

    config_resp = client.get(bobs_job + "/config")
    assert config_resp.status_code == 200 and config_resp.json is not None
    assert config_resp.json["jobName"] == "secret"
    log = client.get(bobs_job + "/tasks/main/0/log")
    assert (log.status_code, log.get_data(as_text=True)) == (200, "bob's line\n")
    assert client.put(bobs_job + "/executionType", json={"value": "STOP"}).status_code == 202
    assert _state(client, bobs_job) == "STOPPED"
    assert client.delete(bobs_job).status_code == 200
    assert client.get(bobs_job).status_code == 404


def test_an_admin_submits_for_a_user(admin: AuthedClient, bob: AuthedClient) -> None:
    resp = admin.post("/api/v1/user/bob/jobs", json=config("for-bob"))
    assert resp.status_code == 202 and resp.json is not None
    assert resp.json["username"] == "bob"
    assert bob.get("/api/v1/user/bob/jobs/for-bob/config").status_code == 200


@pytest.mark.parametrize("accept", ["application/yaml", "text/yaml"])
def test_config_as_yaml(bob: AuthedClient, bobs_job: str, accept: str) -> None:
    as_json = bob.get(bobs_job + "/config").json

    resp = bob.get(bobs_job + "/config", headers={"Accept": accept})

    assert resp.status_code == 200
    assert resp.mimetype == accept
    assert yaml.safe_load(resp.get_data(as_text=True)) == as_json


def test_config_is_json_by_default_and_for_browsers(bob: AuthedClient, bobs_job: str) -> None:
    for accept in (None, "*/*", "text/html,application/json;q=0.9"):
        resp = bob.get(bobs_job + "/config", headers={"Accept": accept} if accept else {})
        assert resp.mimetype == "application/json", accept
        assert resp.json is not None and resp.json["jobName"] == "secret"


# --------------------------------------------------- start-up, body size


def test_the_api_refuses_to_start_outside_dev_mode_with_the_default_secret(
        monkeypatch: pytest.MonkeyPatch, redis_server: str, redis_client: redis.Redis) -> None:
    monkeypatch.setenv("PAI_REDIS_URL", redis_server)
    monkeypatch.setenv("PAI_DEV_MODE", "0")
    monkeypatch.delenv("PAI_SECRET_KEY", raising=False)
    with pytest.raises(ConfigError, match="PAI_SECRET_KEY"):
        create_app()
    monkeypatch.setenv("PAI_SECRET_KEY", "too-short")
    with pytest.raises(ConfigError, match="PAI_SECRET_KEY"):
        create_app()


def test_outside_dev_mode_tokens_are_signed_with_the_configured_secret(
        monkeypatch: pytest.MonkeyPatch, redis_server: str, redis_client: redis.Redis) -> None:
    secret = "a-production-secret-that-is-long-enough"
    monkeypatch.setenv("PAI_REDIS_URL", redis_server)
    monkeypatch.setenv("PAI_DEV_MODE", "0")
    monkeypatch.setenv("PAI_SECRET_KEY", secret)
    monkeypatch.setenv("PAI_ADMIN_USER", "root")
    monkeypatch.setenv("PAI_ADMIN_PASSWORD", "root-password")
    client = create_app().test_client()

    token = login(client, "root", "root-password")

    assert jwt.decode(token, secret, algorithms=["HS256"])["sub"] == "root"


@pytest.mark.parametrize(("method", "path", "public"), [
    ("post", "/api/v1/token", True),
    ("post", "/api/v1/user", False),
    ("put", "/api/v1/virtual-clusters/huge", False),
    ("put", "/api/v1/user/root/password", False),
], ids=["login", "create user", "put vc", "password"])
def test_a_body_over_one_mib_is_413(flask_client: FlaskClient, admin: AuthedClient,
                                    method: str, path: str, public: bool) -> None:
    huge = b'{"username": "' + b"x" * MAX_BODY_BYTES + b'"}'
    sender = flask_client if public else admin
    resp = getattr(sender, method)(path, data=huge, content_type="application/json")
    assert error_of(resp, 413) == "RequestEntityTooLargeError"


def test_a_form_over_one_mib_is_413(flask_client: FlaskClient) -> None:
    resp = flask_client.post("/api/v1/token",
                             data={"username": "x" * MAX_BODY_BYTES, "password": "pw"})
    assert error_of(resp, 413) == "RequestEntityTooLargeError"


def test_a_body_of_exactly_one_mib_is_read(flask_client: FlaskClient,
                                           admin: AuthedClient) -> None:
    prefix, suffix = b'{"username": "', b'"}'
    exact = prefix + b"x" * (MAX_BODY_BYTES - len(prefix) - len(suffix)) + suffix
    resp = admin.post("/api/v1/user", data=exact, content_type="application/json")
    assert error_of(resp, 400) == "BadRequestError"  # read, then refused as incomplete


# ------------------------------------------------------------ error shape

ERRORS = [
    ("no token", None, "get", "/api/v1/jobs", None, 401),
    ("unknown route", "alice", "get", "/api/v1/no-such-endpoint", None, 404),
    ("wrong method", "alice", "patch", "/api/v1/jobs", None, 405),
    ("not admin", "alice", "get", "/api/v1/user", None, 403),
    ("not json", "root", "post", "/api/v1/user", "not json", 400),
    ("taken name", "root", "post", "/api/v1/user",
     {"username": "alice", "password": "secret-pw"}, 409),
    ("unknown job", "alice", "get", "/api/v1/user/alice/jobs/nope", None, 404),
    ("bad stop", "alice", "put", "/api/v1/user/alice/jobs/nope/executionType", {}, 400),
    ("bad list", "alice", "get", "/api/v1/jobs?limit=many", None, 400),
]


@pytest.mark.parametrize(("who", "method", "path", "body", "status"),
                         [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_every_error_is_code_and_message_json(
        flask_client: FlaskClient, admin: AuthedClient, alice: AuthedClient, who: str | None,
        method: str, path: str, body: Any, status: int) -> None:
    sender = {None: flask_client, "alice": alice, "root": admin}[who]
    kwargs: dict[str, Any] = {"data": body} if isinstance(body, str) else {"json": body}

    resp = getattr(sender, method)(path, **kwargs)

    error_of(resp, status)
    assert resp.mimetype == "application/json"
    # Schema errors also name each field (the one error shape of the API).
    assert resp.json is not None and {"code", "message"} <= set(resp.json) \
        <= {"code", "message", "fields"}
