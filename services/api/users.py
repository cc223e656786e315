"""Users: admins create and manage them; everyone may change their password."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from services.api.auth import accounts, admin_only, current_user, require_self_or_admin
from services.api.bodies import load_body, takes
from services.api.errors import ApiError
from services.api.schemas import (
    AdminFlagSchema,
    PasswordChangeSchema,
    UserCreateSchema,
    UserVirtualClustersSchema,
)
from shared.state.accounts import AccountError, UserExists

bp = Blueprint("users", __name__, url_prefix="/api/v1")


def _vcs(value: list[str]) -> list[str]:
    """The VC names (any case), each one that exists, in stored form."""
    value = [name.lower() for name in value]
    known = {vc.name for vc in accounts().list_vcs()}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ApiError("NoVirtualClusterError",
                       f"no such virtual cluster: {', '.join(unknown)}", 400)
    return list(value)


def _user_or_404(username: str) -> dict[str, Any]:
    user = accounts().get_user(username)
    if user is None:
        raise ApiError("NoUserError", f"user {username} does not exist", 404)
    return user.view()


@bp.post("/user")
@admin_only
@takes(UserCreateSchema())
def create_user() -> tuple[dict[str, Any], int]:
    """Create a user (admin only); it may use `default` unless told otherwise.
    ---
    post:
      errors: [409]
      responses: {201: User}
    """
    body = load_body()
    vcs = _vcs(body["virtualClusters"])
    try:
        user = accounts().create_user(body["username"], body["password"], admin=body["admin"],
                                      virtual_clusters=vcs)
    except UserExists as error:
        raise ApiError("ConflictUserError", str(error), 409) from None
    except AccountError as error:
        raise ApiError("BadRequestError", str(error)) from None
    return user.view(), 201


@bp.get("/user")
@admin_only
def list_users() -> list[dict[str, Any]]:
    """Every user (admin only).
    ---
    get:
      responses: {200: [User]}
    """
    return [u.view() for u in accounts().list_users()]


@bp.get("/user/<username>")
def get_user(username: str) -> dict[str, Any]:
    """One user, to themselves or an admin.
    ---
    get:
      errors: [403, 404]
      responses: {200: User}
    """
    require_self_or_admin(username, "see this user")
    return _user_or_404(username)


@bp.delete("/user/<username>")
@admin_only
def delete_user(username: str) -> dict[str, Any]:
    """Delete a user (admin only; never oneself).
    ---
    delete:
      errors: [400, 404]
      responses: {200: Message}
    """
    admin = current_user()
    if username == admin.username:
        raise ApiError("BadRequestError", "an admin cannot delete their own account")
    _user_or_404(username)
    accounts().delete_user(username)
    return {"message": f"user {username} deleted"}


@bp.put("/user/<username>/password")
@takes(PasswordChangeSchema())
def set_password(username: str) -> dict[str, Any]:
    """Change a password; every token of the user is revoked with the old one.
    ---
    put:
      errors: [401, 403, 404]
      responses: {200: Message}
    """
    caller = require_self_or_admin(username, "change this password")
    body = load_body()
    _user_or_404(username)
    new = body["newPassword"]
    found = accounts()
    if not caller.admin or caller.username == username:
        old = body.get("oldPassword")
        if old is None or not found.check_password(username, old):
            raise ApiError("IncorrectPasswordError", "oldPassword is incorrect", 401)
    found.set_password(username, new)
    return {"message": "password changed; every token of this user is revoked"}


@bp.put("/user/<username>/admin")
@admin_only
@takes(AdminFlagSchema())
def set_admin(username: str) -> dict[str, Any]:
    """Grant or take the admin right (admin only; never one's own).
    ---
    put:
      errors: [404]
      responses: {200: User}
    """
    value = load_body()["value"]
    if username == current_user().username and not value:
        raise ApiError("BadRequestError", "an admin cannot take their own admin right")
    _user_or_404(username)
    accounts().set_admin(username, value)
    return _user_or_404(username)


@bp.put("/user/<username>/virtualClusters")
@admin_only
@takes(UserVirtualClustersSchema())
def set_virtual_clusters(username: str) -> dict[str, Any]:
    """Set the virtual clusters a user may submit to (admin only).
    ---
    put:
      errors: [404]
      responses: {200: User}
    """
    vcs = _vcs(load_body()["virtualClusters"])
    _user_or_404(username)
    try:
        accounts().set_virtual_clusters(username, vcs)
    except AccountError as error:  # a VC deleted since _vcs looked: as if before
        raise ApiError("NoVirtualClusterError", str(error), 400) from None
    return _user_or_404(username)


@bp.delete("/user/<username>/tokens")
def revoke_tokens(username: str) -> dict[str, Any]:
    """Revoke every token of a user, e.g. after a laptop went missing.
    ---
    delete:
      errors: [403, 404]
      responses: {200: Message}
    """
    require_self_or_admin(username, "revoke these tokens")
    _user_or_404(username)
    accounts().revoke_all_tokens(username)
    return {"message": f"every token of {username} is revoked"}
