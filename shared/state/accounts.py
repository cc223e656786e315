"""Users and virtual clusters in Redis, and the revocation state of tokens.

Passwords are stored only as argon2 hashes. A user's tokens are revoked all
at once by moving the user's token epoch forward (tokens issued before it no
longer count), or one at a time by remembering the token's id until it would
have expired anyway.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from argon2.exceptions import InvalidHashError, VerificationError

from shared.domain.cluster import DEFAULT_VC
from shared.domain.names import canonical_name
from shared.infra.clock import now_ms
from shared.infra.offload import OffLoopHasher
from shared.state import keys
from shared.state.store import Pipe, Store
from shared.state.usage import Budget

_hasher = OffLoopHasher()  # argon2 must not stall the API's gevent workers


class AccountError(ValueError):
    pass


class UserExists(AccountError):
    pass


class NoSuchAccount(AccountError):
    """The user or VC is gone (maybe deleted while the caller was deciding)."""


def _key_name(name: str) -> str:
    """The stored form of a name typed in any case, for look-ups: names are
    unique case-insensitively (`ADMIN` is `admin`). A name that breaks the
    rule simply is not found."""
    return name.lower()


@dataclass
class User:
    username: str
    admin: bool = False
    virtual_clusters: list[str] = field(default_factory=lambda: [DEFAULT_VC])
    created_ms: int = 0
    # Minted at creation and never reused: jobs record it, so a user deleted
    # and created again under the same name does not control the old jobs.
    uid: str = ""

    def may_use(self, vc: str) -> bool:
        return self.admin or vc in self.virtual_clusters

    def view(self) -> dict[str, Any]:
        return {"username": self.username, "admin": self.admin,
                "virtualClusters": self.virtual_clusters, "createdTime": self.created_ms}


@dataclass
class VirtualCluster:
    name: str
    # GPUs guaranteed to its jobs (None: none, but `default` is guaranteed
    # what the other VCs leave); see services/scheduler/policy.py
    gpu_quota: int | None = None
    description: str = ""
    created_ms: int = 0
    # Capabilities its jobs may ask for (shared/domain/capabilities.py); only admins set it.
    allowed_capabilities: list[str] = field(default_factory=list)
    # May its jobs run beyond its guarantee on GPUs no one else's guarantee uses?
    borrowing: bool = True
    # GPU-hours its jobs may use per UTC period (None: no budget), and what
    # they do once it is spent (shared/state/usage.py, docs/accounting.md)
    gpu_hours_budget: float | None = None
    budget_period: str = "month"
    on_budget_exhausted: str = "oppo"

    @property
    def budget(self) -> Budget | None:
        if self.gpu_hours_budget is None:
            return None
        return Budget(self.gpu_hours_budget, self.budget_period, self.on_budget_exhausted)
    # What a job idling on its GPUs gets (shared/state/idle.py): "notify" or "stop".
    idle_gpu_action: str = "notify"
    # Each user's own GPU-hours per budget_period within the VC (Slurm's
    # GrpTRESMins on a user's association), set one at a time
    # (Accounts.set_user_budget), not by put_vc; once spent, their jobs do
    # as on_budget_exhausted says.
    user_gpu_hours_budgets: dict[str, float] = field(default_factory=dict)
    # The budget of every other user within the VC (None: none); put_vc sets it.
    default_user_gpu_hours_budget: float | None = None

    def user_budgets(self, users: Iterable[str] = ()) -> dict[tuple[str, str], Budget]:
        """(VC, user) -> that user's budget here: every user given their own,
        and those of `users` the default covers."""
        hours = dict(self.user_gpu_hours_budgets)
        if self.default_user_gpu_hours_budget is not None:
            for user in users:
                hours.setdefault(user, self.default_user_gpu_hours_budget)
        return {(self.name, user): Budget(h, self.budget_period, self.on_budget_exhausted)
                for user, h in sorted(hours.items())}


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def password_matches(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


_dummy_hash: list[str] = []


def _dummy_password_hash() -> str:
    """A hash no password matches, made once with the same parameters: an
    unknown user costs a login the same argon2 work as a wrong password, so
    the answer's timing does not tell which names exist."""
    if not _dummy_hash:
        _dummy_hash.append(hash_password(secrets.token_hex(16)))
    return _dummy_hash[0]


class Accounts:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.r = store.r

    # ----------------------------------------------------------------- users

    def _user_from(self, fields: dict[str, str]) -> User:
        return User(username=fields["username"], admin=fields.get("admin") == "1",
                    virtual_clusters=json.loads(fields.get("virtual_clusters") or "[]"),
                    created_ms=int(fields.get("created_ms") or 0),
                    uid=fields.get("uid", ""))

    def get_user(self, username: str) -> User | None:
        fields = self.r.hgetall(keys.user(_key_name(username)))
        return self._user_from(fields) if fields else None

    def list_users(self) -> list[User]:
        names = sorted(self.r.smembers(keys.USERS))
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(keys.user(name))
        return [self._user_from(f) for f in pipe.execute() if f]

    def create_user(self, username: str, password: str, *, admin: bool = False,
                    virtual_clusters: list[str] | None = None) -> User:
        try:
            username = canonical_name(username)
        except ValueError as error:
            raise AccountError(f"username: {error}") from None
        user = User(username, admin, list(virtual_clusters or [DEFAULT_VC]), now_ms(),
                    uid=secrets.token_hex(12))
        password_hash = hash_password(password)

        def write(pipe: Pipe) -> User:
            if pipe.exists(keys.user(username)):
                raise UserExists(f"user {username} already exists")
            pipe.multi()
            pipe.hset(keys.user(username), mapping={
                "username": username, "admin": "1" if admin else "0",
                "virtual_clusters": json.dumps(user.virtual_clusters),
                "created_ms": str(user.created_ms), "password_hash": password_hash,
                "uid": user.uid,
            })
            pipe.sadd(keys.USERS, username)
            return user

        return self.store.transact(write, keys.user(username))

    def check_password(self, username: str, password: str) -> bool:
        """Whether the password is the user's; an unknown user is checked
        against a dummy hash, so both answers take the same time."""
        stored = self.r.hget(keys.user(_key_name(username)), "password_hash")
        matched = password_matches(stored or _dummy_password_hash(), password)
        return bool(stored) and matched

    def _update_user(self, username: str, mapping: dict[str, str],
                     *, revoke_tokens: bool = False, granted: Sequence[str] = ()) -> None:
        """Change fields of a user that still exists, compare-and-set: a
        change racing a delete never brings the record back (a bare HSET
        would recreate it without a password hash or a uid). Every VC in
        `granted` must exist when the write lands: a grant racing the VC's
        deletion is refused (AccountError) instead of leaving a grant that a
        VC created later under that name would honour."""
        key = keys.user(_key_name(username))
        vc_keys = [keys.vc(_key_name(vc)) for vc in granted]

        def write(pipe: Pipe) -> None:
            if vc_keys:
                pipe.watch(*vc_keys)
            if not pipe.exists(key):
                raise NoSuchAccount(f"user {username} does not exist")
            missing = [vc for vc, vc_key in zip(granted, vc_keys, strict=True)
                       if not pipe.exists(vc_key)]
            if missing:
                raise AccountError(f"no such virtual cluster: {', '.join(missing)}")
            pipe.multi()
            pipe.hset(key, mapping=mapping)
            if revoke_tokens:
                pipe.set(keys.user_token_epoch(_key_name(username)), now_ms())

        self.store.transact(write, key)

    def set_password(self, username: str, password: str) -> None:
        self._update_user(username, {"password_hash": hash_password(password)},
                          revoke_tokens=True)

    def set_admin(self, username: str, admin: bool) -> None:
        self._update_user(username, {"admin": "1" if admin else "0"})

    def set_virtual_clusters(self, username: str, vcs: list[str]) -> None:
        """The VCs a user may submit to; each must exist (AccountError)."""
        granted = sorted(set(vcs))
        self._update_user(username, {"virtual_clusters": json.dumps(granted)},
                          granted=granted)

    def _take_vc(self, username: str, vc: str) -> None:
        """Take one VC from a user, compare-and-set on the user's record: a
        grant landing meanwhile is re-read, never overwritten."""
        key = keys.user(_key_name(username))

        def write(pipe: Pipe) -> None:
            raw = pipe.hget(key, "virtual_clusters")
            held = json.loads(raw) if raw else []
            if vc not in held:
                return
            pipe.multi()
            pipe.hset(key, "virtual_clusters", json.dumps([v for v in held if v != vc]))

        self.store.transact(write, key)

    def delete_user(self, username: str) -> bool:
        name = _key_name(username)
        pipe = self.r.pipeline()
        pipe.delete(keys.user(name))
        pipe.srem(keys.USERS, name)
        pipe.set(keys.user_token_epoch(name), now_ms())
        deleted = bool(pipe.execute()[0])
        # Their budgets go too: a user created later under the name starts without.
        pipe = self.r.pipeline(transaction=False)
        for vc in self.r.smembers(keys.VCS):
            pipe.hdel(keys.vc_user_budgets(vc), name)
        pipe.execute()
        return deleted

    # ---------------------------------------------------------------- tokens

    def revoke_all_tokens(self, username: str) -> None:
        self.r.set(keys.user_token_epoch(_key_name(username)), now_ms())

    def revoke_token(self, token_id: str, expires_ms: int) -> None:
        ttl_ms = max(1, expires_ms - now_ms())
        self.r.set(keys.revoked_token(token_id), "1", px=ttl_ms)

    def user_for_token(self, username: str, token_id: str, issued_ms: int,
                       uid: str | None = None) -> User | None:
        """The token's user, if it exists, is the same user the token was
        issued to (`uid`: not a later user of that name) and the token is not
        revoked: one round trip on every authenticated request."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(keys.user(username))
        pipe.mget(keys.user_token_epoch(username), keys.revoked_token(token_id))
        fields, (epoch, revoked) = pipe.execute()
        if not fields or revoked or issued_ms <= int(epoch or 0):
            return None
        if uid is not None and fields.get("uid", "") != uid:
            return None
        return self._user_from(fields)

    # ------------------------------------------------------ virtual clusters

    def _vc_from(self, fields: dict[str, str],
                 user_budgets: dict[str, str] | None = None) -> VirtualCluster:
        quota = fields.get("gpu_quota", "")
        budget = fields.get("gpu_hours_budget", "")
        default = fields.get("default_user_gpu_hours_budget", "")
        return VirtualCluster(fields["name"], int(quota) if quota != "" else None,
                              fields.get("description", ""), int(fields.get("created_ms") or 0),
                              json.loads(fields.get("allowed_capabilities") or "[]"),
                              fields.get("borrowing", "1") == "1",
                              gpu_hours_budget=float(budget) if budget != "" else None,
                              budget_period=fields.get("budget_period") or "month",
                              on_budget_exhausted=fields.get("on_budget_exhausted") or "oppo",
                              idle_gpu_action=fields.get("idle_gpu_action") or "notify",
                              user_gpu_hours_budgets={
                                  user: float(hours)
                                  for user, hours in (user_budgets or {}).items()},
                              default_user_gpu_hours_budget=float(default)
                              if default != "" else None)

    def get_vc(self, name: str) -> VirtualCluster | None:
        pipe = self.r.pipeline(transaction=False)
        pipe.hgetall(keys.vc(_key_name(name)))
        pipe.hgetall(keys.vc_user_budgets(_key_name(name)))
        fields, budgets = pipe.execute()
        return self._vc_from(fields, budgets) if fields else None

    def list_vcs(self) -> list[VirtualCluster]:
        names = sorted(self.r.smembers(keys.VCS))
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(keys.vc(name))
            pipe.hgetall(keys.vc_user_budgets(name))
        replies = pipe.execute() if names else []
        return self.vcs_from(list(zip(replies[::2], replies[1::2], strict=True)))

    def vcs_from(self, records: list[tuple[dict[str, str], dict[str, str]]]
                 ) -> list[VirtualCluster]:
        """The virtual clusters of their records and users' budgets as read
        (`list_vcs`, or a scheduling pass's snapshot); a record gone
        meanwhile (its name still listed) is left out."""
        return [self._vc_from(fields, budgets) for fields, budgets in records if fields]

    def set_user_budget(self, vc: str, username: str, gpu_hours: float) -> bool:
        """Give a user their own GPU-hour budget within a VC, compare-and-set
        on both records: the VC and the user must exist when it lands (a
        budget racing either's deletion is refused, NoSuchAccount). True if
        the user had no budget there before."""
        vc_key, user_key = keys.vc(_key_name(vc)), keys.user(_key_name(username))
        budgets = keys.vc_user_budgets(_key_name(vc))

        def write(pipe: Pipe) -> bool:
            if not pipe.exists(vc_key):
                raise NoSuchAccount(f"virtual cluster {vc} does not exist")
            if not pipe.exists(user_key):
                raise NoSuchAccount(f"user {username} does not exist")
            new = not pipe.hexists(budgets, _key_name(username))
            pipe.multi()
            pipe.hset(budgets, _key_name(username), repr(float(gpu_hours)))
            return new

        return self.store.transact(write, vc_key, user_key, budgets)

    def delete_user_budget(self, vc: str, username: str) -> bool:
        """Take a user's own budget within a VC away; False if there was none."""
        return bool(self.r.hdel(keys.vc_user_budgets(_key_name(vc)), _key_name(username)))

    def put_vc(self, vc: VirtualCluster) -> VirtualCluster:
        """Create or change a VC, compare-and-set on its record: two admins
        writing at once each land whole, and the creation time is kept."""
        try:
            vc.name = canonical_name(vc.name)
        except ValueError as error:
            raise AccountError(f"virtual cluster name: {error}") from None
        key = keys.vc(vc.name)

        def write(pipe: Pipe) -> VirtualCluster:
            created = pipe.hget(key, "created_ms")
            vc.created_ms = int(created) if created else now_ms()
            pipe.multi()
            pipe.hset(key, mapping={
                "name": vc.name, "gpu_quota": "" if vc.gpu_quota is None else str(vc.gpu_quota),
                "description": vc.description, "created_ms": str(vc.created_ms),
                "allowed_capabilities": json.dumps(sorted(set(vc.allowed_capabilities))),
                "borrowing": "1" if vc.borrowing else "0",
                "gpu_hours_budget": "" if vc.gpu_hours_budget is None
                else repr(vc.gpu_hours_budget),
                "budget_period": vc.budget_period,
                "on_budget_exhausted": vc.on_budget_exhausted,
                "default_user_gpu_hours_budget": ""
                if vc.default_user_gpu_hours_budget is None
                else repr(vc.default_user_gpu_hours_budget),
                "idle_gpu_action": vc.idle_gpu_action})
            pipe.sadd(keys.VCS, vc.name)
            return vc

        return self.store.transact(write, key)

    def delete_vc(self, name: str) -> None:
        """Delete the VC and take it from every user, so a VC made later under
        the same name does not quietly hand its old users access. The VC goes
        first: a grant racing this finds no VC and is refused, and one that
        landed before is in the users' records the sweep reads after."""
        name = _key_name(name)
        pipe = self.r.pipeline()
        pipe.delete(keys.vc(name), keys.vc_user_budgets(name))
        pipe.srem(keys.VCS, name)
        pipe.execute()
        for user in self.list_users():
            if name in user.virtual_clusters:
                self._take_vc(user.username, name)

    # ------------------------------------------------------------- bootstrap

    def bootstrap(self, admin_user: str, admin_password: str) -> None:
        """The `default` VC and the first admin, on first start only."""
        if not self.r.exists(keys.vc(DEFAULT_VC)):
            self.put_vc(VirtualCluster(DEFAULT_VC, None, "every user's cluster"))
        if admin_user and not self.r.exists(keys.user(_key_name(admin_user))):
            with contextlib.suppress(UserExists):  # another api worker made it first
                self.create_user(admin_user, admin_password, admin=True)
