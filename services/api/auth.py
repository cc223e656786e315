"""Logins and tokens: who is calling, and may they?

Tokens are signed JWTs (HS256, PAI_SECRET_KEY) that expire; each request
also checks the user still exists and the token was not revoked, so logout,
a password change or an admin's revocation take effect at once.
"""

from __future__ import annotations

import functools
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import jwt
from flask import Blueprint, current_app, g, request, session

from services.api.bodies import declared_schema, load, load_body, takes
from services.api.errors import ApiError
from services.api.platform import platform
from services.api.schemas import TokenRequestSchema
from shared.infra.clock import now_ms
from shared.state import keys
from shared.state.accounts import Accounts, User
from shared.state.store import Expect, ExpectationFailed
from shared.state.throttle import LoginLimits, record_failure, retry_after

bp = Blueprint("auth", __name__, url_prefix="/api/v1")

ALGORITHM = "HS256"
PUBLIC_ENDPOINTS = {"auth.login", "cluster.healthz", "cluster.metrics",
                    "cluster.prometheus_targets", "openapi.spec", "static"}
# The endpoints whose writes hold to the token check (`token_expectations`),
# so they may use one remembered for VERIFIED_TOKEN_SECONDS.
CONDITIONAL_ENDPOINTS = frozenset({"jobs.submit", "jobs.submit_for_user", "jobs_v2.submit",
                                   "execs.run"})
# The endpoints a browser reaches by navigating, which cannot send a bearer
# token: without one, the portal's session cookie logs the caller in, and
# `g.via_session` tells the view (the task port proxy, services/api/proxy.py).
SESSION_ENDPOINTS = frozenset({"proxy.http_root", "proxy.http"})
VERIFIED_TOKEN_SECONDS = 10.0
VERIFIED_TOKENS_MAX = 10_000
VERIFIED_EXTENSION = "pai.verified_tokens"


def accounts() -> Accounts:
    return Accounts(platform().store)


def issue_token(username: str, expiration_s: int, uid: str = "") -> tuple[str, int]:
    issued = now_ms()
    expires = issued + expiration_s * 1000
    claims = {"sub": username, "iat": issued // 1000, "exp": expires // 1000,
              "iat_ms": issued, "jti": secrets.token_urlsafe(12)}
    if uid:  # the user's immutable id: a later user of the name cannot use it
        claims["uid"] = uid
    return jwt.encode(claims, platform().settings.secret_key, algorithm=ALGORITHM), expires


def _claims(token: str) -> dict[str, Any]:
    try:
        claims: dict[str, Any] = jwt.decode(
            token, platform().settings.secret_key, algorithms=[ALGORITHM],
            options={"require": ["sub", "exp", "jti", "iat_ms"]})
    except jwt.ExpiredSignatureError:
        raise ApiError("UnauthorizedUserError", "the token has expired; log in again",
                       401) from None
    except jwt.InvalidTokenError:
        raise ApiError("UnauthorizedUserError", "the token is not valid", 401) from None
    return claims


def authenticate() -> None:
    """Before every API request: resolve the bearer token to a user in `g`.

    A submit or an exec (CONDITIONAL_ENDPOINTS) may use a check of the same
    token this process made within VERIFIED_TOKEN_SECONDS instead of reading
    Redis again: its write then holds to what that check read
    (`token_expectations`), in the same atomic step, so a token revoked, a
    password changed or a user deleted or changed meanwhile writes nothing
    and the request checks the token afresh (`reverify`), as it does before
    any other answer. Every other request reads Redis.
    """
    if request.endpoint in PUBLIC_ENDPOINTS or not request.path.startswith("/api/"):
        return
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        cookie_token = session.get("token") if request.endpoint in SESSION_ENDPOINTS else None
        if isinstance(cookie_token, str) and cookie_token:
            _check_token(cookie_token, _verified_tokens())
            g.via_session = True
            return
        raise ApiError("UnauthorizedUserError",
                       "log in first: send Authorization: Bearer <token> "
                       "(POST /api/v1/token gives one)", 401)
    token = token.strip()
    verified = _verified_tokens()
    if request.endpoint in CONDITIONAL_ENDPOINTS:
        remembered = verified.get(token, time.time())
        if remembered is not None:
            g.user, g.claims, g.token_remembered = remembered.user, remembered.claims, True
            g.token_expectations = remembered.expectations  # made at its first use
            return
    _check_token(token, verified)


def _check_token(token: str, verified: VerifiedTokens) -> None:
    """The token's user, read from Redis now (revoked, deleted or changed
    users are refused at once); its signature is verified again only when
    this process has not checked it within VERIFIED_TOKEN_SECONDS (a
    remembered check never outlives the token's expiry)."""
    remembered = verified.get(token, time.time())
    claims = remembered.claims if remembered is not None else _claims(token)
    user = accounts().user_for_token(claims["sub"], claims["jti"], int(claims["iat_ms"]),
                                     claims.get("uid"))
    if user is None:
        verified.forget(token)
        raise ApiError("UnauthorizedUserError", "the token was revoked; log in again", 401)
    verified.put(token, user, claims, time.time())
    g.user, g.claims, g.token_remembered = user, claims, False


def reverify() -> None:
    """Check this request's token against Redis now (401 if it no longer
    holds): after a write's expectations failed, or before an answer
    decided on a remembered check that wrote nothing."""
    _, _, token = request.headers.get("Authorization", "").partition(" ")
    _check_token(token.strip(), _verified_tokens())


Decided = TypeVar("Decided")


def decide_on_remembered(decide: Callable[[bool], Decided], *, write_refusal: int,
                         also_remembered: Callable[[], bool] = lambda: False) -> Decided:
    """`decide(True)`: a conditional endpoint's answer decided on the token
    check this process remembers (and on whatever else the view remembers:
    `also_remembered` says whether it did), its write holding to all of it
    (`token_expectations` and the view's own). What is not written holds to
    nothing, so when something decided on changed (ExpectationFailed) or the
    answer is a refusal decided on something remembered (any but
    `write_refusal`, the write's own, given once everything held), it is
    decided again by `decided_fresh`."""
    try:
        return decide(True)
    except ExpectationFailed:
        pass
    except ApiError as error:
        if error.status == write_refusal or not (g.get("token_remembered")
                                                 or also_remembered()):
            raise
    return decided_fresh(decide)


def decided_fresh(decide: Callable[[bool], Decided]) -> Decided:
    """`decide(False)` after checking a remembered token afresh (401 if it
    no longer holds): decided on fresh reads only."""
    if g.get("token_remembered"):
        reverify()
    return decide(False)


def token_expectations() -> list[Expect]:
    """What a submit's or exec's write must find unchanged when this
    request's token check was remembered rather than read: the user's
    identity, admin flag and VCs as read, the token not revoked, no
    revocation of all the user's tokens since it was issued. Empty when the
    check read Redis just now."""
    if not g.get("token_remembered"):
        return []
    expectations: tuple[Expect, ...] = g.token_expectations
    return list(expectations)


@dataclass(frozen=True)
class _Verified:
    user: User
    claims: dict[str, Any]
    until: float  # wall clock seconds: never past the token's own expiry

    @functools.cached_property
    def expectations(self) -> tuple[Expect, ...]:
        """`token_expectations` of this check: made once, by the first
        write that uses it, not again for each one after it."""
        record = keys.user(self.claims["sub"])
        return (
            Expect.field_equals(record, "uid", self.user.uid),
            Expect.field_equals(record, "admin", "1" if self.user.admin else "0"),
            Expect.field_equals(record, "virtual_clusters",
                                json.dumps(self.user.virtual_clusters)),
            Expect.key_absent(keys.revoked_token(self.claims["jti"])),
            Expect.number_below(keys.user_token_epoch(self.claims["sub"]),
                                int(self.claims["iat_ms"])),
        )


class VerifiedTokens:
    """Tokens this process checked against Redis lately, for the writes
    (see `authenticate`). Bounded; a lock because threads may serve requests."""

    def __init__(self, seconds: float = VERIFIED_TOKEN_SECONDS,
                 limit: int = VERIFIED_TOKENS_MAX) -> None:
        self.seconds, self.limit = seconds, limit
        self._tokens: dict[str, _Verified] = {}
        self._lock = threading.Lock()

    def get(self, token: str, now: float) -> _Verified | None:
        with self._lock:
            found = self._tokens.get(token)
            if found is not None and found.until <= now:
                del self._tokens[token]
                return None
            return found

    def put(self, token: str, user: User, claims: dict[str, Any], now: float) -> None:
        until = min(now + self.seconds, float(claims["exp"]))
        with self._lock:
            if len(self._tokens) >= self.limit:
                self._tokens = {t: v for t, v in self._tokens.items() if v.until > now}
                if len(self._tokens) >= self.limit:
                    self._tokens.clear()
            self._tokens[token] = _Verified(user, claims, until)

    def forget(self, token: str) -> None:
        with self._lock:
            self._tokens.pop(token, None)


def _verified_tokens() -> VerifiedTokens:
    found: VerifiedTokens = current_app.extensions.setdefault(VERIFIED_EXTENSION,
                                                              VerifiedTokens())
    return found


def current_user() -> User:
    user: User = g.user
    return user


def require_admin() -> User:
    user = current_user()
    if not user.admin:
        raise ApiError("ForbiddenUserError", "only an admin may do this", 403)
    return user


View = TypeVar("View", bound=Callable[..., Any])
ADMIN_ONLY = "admin_only"  # the attribute `admin_only` sets on a view


def admin_only(view: View) -> View:
    """The view answers admins only (403 for anyone else, before it reads its
    body); the OpenAPI document shows the 403."""

    @functools.wraps(view)
    def checked(*args: Any, **kwargs: Any) -> Any:
        require_admin()
        return view(*args, **kwargs)

    setattr(checked, ADMIN_ONLY, True)
    return checked  # type: ignore[return-value]


def require_self_or_admin(username: str, action: str = "do this") -> User:
    user = current_user()
    if not user.admin and user.username != username:
        raise ApiError("ForbiddenUserError", f"only {username} or an admin may {action}", 403)
    return user


def _login_fields() -> dict[str, Any]:
    """The login, from JSON or from a form (OpenPAI's clients send both),
    loaded by the one schema."""
    if request.mimetype == "application/x-www-form-urlencoded":
        return load(declared_schema(), request.form.to_dict())
    return load_body()


@bp.post("/token")
@takes(TokenRequestSchema())
def login() -> tuple[dict[str, Any], int]:
    """Trade a username and password (JSON or a form) for a bearer token.
    ---
    post:
      errors: [400, 401, 429]
      requestBody:
        required: true
        content:
          application/json: {schema: TokenRequest}
          application/x-www-form-urlencoded: {schema: TokenRequest}
      responses: {200: Token}
    """
    fields = _login_fields()
    password, expiration = fields["password"], fields["expiration"]
    username = fields["username"].lower()  # user names are case-insensitive
    settings, client = platform().settings, client_address()
    limits = LoginLimits(settings.login_failures_per_user, settings.login_failures_per_ip,
                         settings.login_window_seconds)
    store = platform().store
    wait = retry_after(store, limits, username, client)
    if wait:
        raise ApiError("TooManyRequestsError",
                       f"too many failed logins; try again in {wait} seconds", 429,
                       headers={"Retry-After": str(wait)})
    found = accounts()
    # One answer, and the same argon2 work, whether the name exists or not:
    # neither the status, the message nor the time tells which names exist.
    matched = found.check_password(username, password)
    user = found.get_user(username) if matched else None
    if user is None:
        record_failure(store, limits, username, client)
        raise ApiError("IncorrectPasswordError", "the user name or the password is incorrect",
                       401)
    token, expires = issue_token(user.username, expiration, user.uid)
    return {"token": token, "user": user.username, "admin": user.admin,
            "expires": expires}, 200


def client_address() -> str:
    """The caller's address: the socket's peer, or the first X-Forwarded-For
    hop when the operator says a proxy of theirs sets it (else any client
    could pick a fresh address per guess)."""
    if platform().settings.api_trust_forwarded_for:
        forwarded = request.headers.get("X-Forwarded-For", "").split(",")[0].strip()
        if forwarded:
            return forwarded[:64]
    return request.remote_addr or "unknown"


@bp.delete("/token")
def logout() -> dict[str, Any]:
    """Revoke the token this request carries, at once.
    ---
    delete:
      responses: {200: Message}
    """
    claims = g.claims
    accounts().revoke_token(claims["jti"], int(claims["exp"]) * 1000)
    return {"message": "logged out"}
