"""Users and virtual clusters in Redis, and the revocation state of tokens.

Passwords are stored only as argon2 hashes. A user's tokens are revoked all
at once by moving the user's token epoch forward (tokens issued before it no
longer count), or one at a time by remembering the token's id until it would
have expired anyway.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from argon2.exceptions import InvalidHashError, VerificationError

from shared import keys
from shared.models import now_ms
from shared.offload import OffLoopHasher
from shared.store import Pipe, Store

USERNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
VC_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
DEFAULT_VC = "default"

_hasher = OffLoopHasher()  # argon2 must not stall the API's gevent workers


class AccountError(ValueError):
    pass


class UserExists(AccountError):
    pass


@dataclass
class User:
    username: str
    admin: bool = False
    virtual_clusters: list[str] = field(default_factory=lambda: [DEFAULT_VC])
    created_ms: int = 0

    def may_use(self, vc: str) -> bool:
        return self.admin or vc in self.virtual_clusters

    def view(self) -> dict[str, Any]:
        return {"username": self.username, "admin": self.admin,
                "virtualClusters": self.virtual_clusters, "createdTime": self.created_ms}


@dataclass
class VirtualCluster:
    name: str
    gpu_quota: int | None = None  # None: no limit
    description: str = ""
    created_ms: int = 0
    # Capabilities its jobs may ask for (shared/capabilities.py); only admins set it.
    allowed_capabilities: list[str] = field(default_factory=list)


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def password_matches(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


class Accounts:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.r = store.r

    # ----------------------------------------------------------------- users

    def _user_from(self, fields: dict[str, str]) -> User:
        return User(username=fields["username"], admin=fields.get("admin") == "1",
                    virtual_clusters=json.loads(fields.get("virtual_clusters") or "[]"),
                    created_ms=int(fields.get("created_ms") or 0))

    def get_user(self, username: str) -> User | None:
        fields = self.r.hgetall(keys.user(username))
        return self._user_from(fields) if fields else None

    def list_users(self) -> list[User]:
        names = sorted(self.r.smembers(keys.USERS))
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(keys.user(name))
        return [self._user_from(f) for f in pipe.execute() if f]

    def create_user(self, username: str, password: str, *, admin: bool = False,
                    virtual_clusters: list[str] | None = None) -> User:
        if not USERNAME.fullmatch(username):
            raise AccountError(
                "username must be 1-64 letters, digits, '_', '.' or '-', starting with a "
                "letter or digit")
        user = User(username, admin, list(virtual_clusters or [DEFAULT_VC]), now_ms())
        password_hash = hash_password(password)

        def write(pipe: Pipe) -> User:
            if pipe.exists(keys.user(username)):
                raise UserExists(f"user {username} already exists")
            pipe.multi()
            pipe.hset(keys.user(username), mapping={
                "username": username, "admin": "1" if admin else "0",
                "virtual_clusters": json.dumps(user.virtual_clusters),
                "created_ms": str(user.created_ms), "password_hash": password_hash,
            })
            pipe.sadd(keys.USERS, username)
            return user

        return self.store.transact(write, keys.user(username))

    def check_password(self, username: str, password: str) -> bool:
        stored = self.r.hget(keys.user(username), "password_hash")
        return bool(stored) and password_matches(stored, password)

    def set_password(self, username: str, password: str) -> None:
        self.r.hset(keys.user(username), "password_hash", hash_password(password))
        self.revoke_all_tokens(username)

    def set_admin(self, username: str, admin: bool) -> None:
        self.r.hset(keys.user(username), "admin", "1" if admin else "0")

    def set_virtual_clusters(self, username: str, vcs: list[str]) -> None:
        self.r.hset(keys.user(username), "virtual_clusters", json.dumps(sorted(set(vcs))))

    def delete_user(self, username: str) -> bool:
        pipe = self.r.pipeline()
        pipe.delete(keys.user(username))
        pipe.srem(keys.USERS, username)
        pipe.set(keys.user_token_epoch(username), now_ms())
        return bool(pipe.execute()[0])

    # ---------------------------------------------------------------- tokens

    def revoke_all_tokens(self, username: str) -> None:
        self.r.set(keys.user_token_epoch(username), now_ms())

    def revoke_token(self, token_id: str, expires_ms: int) -> None:
        ttl_ms = max(1, expires_ms - now_ms())
        self.r.set(keys.revoked_token(token_id), "1", px=ttl_ms)

    def user_for_token(self, username: str, token_id: str, issued_ms: int) -> User | None:
        """The token's user, if it exists and the token is not revoked: one
        round trip on every authenticated request."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(keys.user(username))
        pipe.mget(keys.user_token_epoch(username), keys.revoked_token(token_id))
        fields, (epoch, revoked) = pipe.execute()
        if not fields or revoked or issued_ms <= int(epoch or 0):
            return None
        return self._user_from(fields)

    # ------------------------------------------------------ virtual clusters

    def _vc_from(self, fields: dict[str, str]) -> VirtualCluster:
        quota = fields.get("gpu_quota", "")
        return VirtualCluster(fields["name"], int(quota) if quota != "" else None,
                              fields.get("description", ""), int(fields.get("created_ms") or 0),
                              json.loads(fields.get("allowed_capabilities") or "[]"))

    def get_vc(self, name: str) -> VirtualCluster | None:
        fields = self.r.hgetall(keys.vc(name))
        return self._vc_from(fields) if fields else None

    def list_vcs(self) -> list[VirtualCluster]:
        names = sorted(self.r.smembers(keys.VCS))
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(keys.vc(name))
        return [self._vc_from(f) for f in pipe.execute() if f]

    def put_vc(self, vc: VirtualCluster) -> VirtualCluster:
        if not VC_NAME.fullmatch(vc.name):
            raise AccountError("a virtual cluster name is 1-64 letters, digits, '_' or '-'")
        existing = self.get_vc(vc.name)
        vc.created_ms = existing.created_ms if existing else now_ms()
        pipe = self.r.pipeline()
        pipe.hset(keys.vc(vc.name), mapping={
            "name": vc.name, "gpu_quota": "" if vc.gpu_quota is None else str(vc.gpu_quota),
            "description": vc.description, "created_ms": str(vc.created_ms),
            "allowed_capabilities": json.dumps(sorted(set(vc.allowed_capabilities)))})
        pipe.sadd(keys.VCS, vc.name)
        pipe.execute()
        return vc

    def delete_vc(self, name: str) -> None:
        """Delete the VC and take it from every user, so a VC made later under
        the same name does not quietly hand its old users access."""
        for user in self.list_users():
            if name in user.virtual_clusters:
                self.set_virtual_clusters(
                    user.username, [v for v in user.virtual_clusters if v != name])
        pipe = self.r.pipeline()
        pipe.delete(keys.vc(name))
        pipe.srem(keys.VCS, name)
        pipe.execute()

    def gpu_quotas(self) -> dict[str, int | None]:
        return {vc.name: vc.gpu_quota for vc in self.list_vcs()}

    # ------------------------------------------------------------- bootstrap

    def bootstrap(self, admin_user: str, admin_password: str) -> None:
        """The `default` VC and the first admin, on first start only."""
        if not self.r.exists(keys.vc(DEFAULT_VC)):
            self.put_vc(VirtualCluster(DEFAULT_VC, None, "every user's cluster"))
        if admin_user and not self.r.exists(keys.user(admin_user)):
            with contextlib.suppress(UserExists):  # another api worker made it first
                self.create_user(admin_user, admin_password, admin=True)
