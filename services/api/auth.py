"""Logins and tokens: who is calling, and may they?

Tokens are signed JWTs (HS256, PAI_SECRET_KEY) that expire; each request
also checks the user still exists and the token was not revoked, so logout,
a password change or an admin's revocation take effect at once.
"""

from __future__ import annotations

import secrets
from typing import Any

import jwt
from flask import Blueprint, g, request

from services.api.errors import ApiError
from services.api.platform import platform
from shared.accounts import Accounts, User
from shared.models import now_ms

bp = Blueprint("auth", __name__, url_prefix="/api/v1")

DEFAULT_EXPIRATION_S = 7 * 24 * 3600
MAX_EXPIRATION_S = 90 * 24 * 3600
ALGORITHM = "HS256"
PUBLIC_ENDPOINTS = {"auth.login", "cluster.healthz", "cluster.metrics", "openapi.spec", "static"}


def accounts() -> Accounts:
    return Accounts(platform().store)


def issue_token(username: str, expiration_s: int) -> tuple[str, int]:
    issued = now_ms()
    expires = issued + expiration_s * 1000
    claims = {"sub": username, "iat": issued // 1000, "exp": expires // 1000,
              "iat_ms": issued, "jti": secrets.token_urlsafe(12)}
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
    user = accounts().user_for_token(claims["sub"], claims["jti"], int(claims["iat_ms"]))
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


def require_self_or_admin(username: str, action: str = "do this") -> User:
    user = current_user()
    if not user.admin and user.username != username:
        raise ApiError("ForbiddenUserError", f"only {username} or an admin may {action}", 403)
    return user


def _login_fields() -> dict[str, Any]:
    body = request.get_json(silent=True) if request.is_json else None
    if isinstance(body, dict):
        return body
    return request.form.to_dict()


@bp.post("/token")
def login() -> tuple[dict[str, Any], int]:
    """Trade a username and password (JSON or a form) for a bearer token.
    ---
    post:
      requestBody:
        required: true
        content:
          application/json: {schema: TokenRequest}
          application/x-www-form-urlencoded: {schema: TokenRequest}
      responses:
        200: {content: {application/json: {schema: Token}}}
        400: BadRequest
        401: Unauthorized
        404: NotFound
    """
    fields = _login_fields()
    username, password = fields.get("username"), fields.get("password")
    if not isinstance(username, str) or not isinstance(password, str) \
            or not username or not password:
        raise ApiError("BadRequestError", "send username and password")
    try:
        expiration = int(fields.get("expiration") or DEFAULT_EXPIRATION_S)
    except (TypeError, ValueError):
        raise ApiError("BadRequestError", "expiration is a number of seconds") from None
    if not 60 <= expiration <= MAX_EXPIRATION_S:
        raise ApiError("BadRequestError",
                       f"expiration must be between 60 and {MAX_EXPIRATION_S} seconds")
    found = accounts()
    user = found.get_user(username)
    if user is None:
        raise ApiError("NoUserError", f"user {username} does not exist", 404)
    if not found.check_password(username, password):
        raise ApiError("IncorrectPasswordError", "the password is incorrect", 401)
    token, expires = issue_token(username, expiration)
    return {"token": token, "user": username, "admin": user.admin, "expires": expires}, 200


@bp.delete("/token")
def logout() -> dict[str, Any]:
    """Revoke the token this request carries, at once.
    ---
    delete:
      responses:
        200: {content: {application/json: {schema: Message}}}
    """
    claims = g.claims
    accounts().revoke_token(claims["jti"], int(claims["exp"]) * 1000)
    return {"message": "logged out"}
