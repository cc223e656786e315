"""Logins and tokens: who is calling, and may they?

Tokens are signed JWTs (HS256, PAI_SECRET_KEY) that expire; each request
also checks the user still exists and the token was not revoked, so logout,
a password change or an admin's revocation take effect at once.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

import jwt
from flask import Blueprint, g, request

from services.api.bodies import declared_schema, load, load_body, takes
from services.api.errors import ApiError
from services.api.platform import platform
from services.api.schemas import TokenRequestSchema
from shared.accounts import Accounts, User
from shared.models import now_ms
from shared.throttle import LoginLimits, record_failure, retry_after

bp = Blueprint("auth", __name__, url_prefix="/api/v1")

ALGORITHM = "HS256"
PUBLIC_ENDPOINTS = {"auth.login", "cluster.healthz", "cluster.metrics", "openapi.spec", "static"}


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
    """Before every API request: resolve the bearer token to a user in `g`."""
    if request.endpoint in PUBLIC_ENDPOINTS or not request.path.startswith("/api/"):
        return
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError("UnauthorizedUserError",
                       "log in first: send Authorization: Bearer <token> "
                       "(POST /api/v1/token gives one)", 401)
    claims = _claims(token.strip())
    user = accounts().user_for_token(claims["sub"], claims["jti"], int(claims["iat_ms"]),
                                     claims.get("uid"))
    if user is None:
        raise ApiError("UnauthorizedUserError", "the token was revoked; log in again", 401)
    g.user, g.claims = user, claims


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
