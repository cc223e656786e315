"""Accounts under attack, on a real Redis (docs/security.md, "Client → API"
and "User → user"): guessing passwords, finding out which names exist, names
that differ only in case or are path tricks, a recreated user taking over an
old user's jobs, and account writes racing a delete."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from services.api.app import create_app
from shared.infra.config import Settings
from shared.state import keys
from shared.state.accounts import AccountError, Accounts, NoSuchAccount, VirtualCluster
from shared.state.store import Store
from tests.support.api import AuthedClient, config, error_of, new_user
from tests.support.interleave import Hook, with_hooks

pytestmark = pytest.mark.redis


def login(client: FlaskClient, username: str, password: str,
          address: str = "10.0.0.1") -> tuple[int, dict[str, str], dict[str, str]]:
    resp = client.post("/api/v1/token", json={"username": username, "password": password},
                       environ_base={"REMOTE_ADDR": address})
    return resp.status_code, dict(resp.json or {}), dict(resp.headers)


# ------------------------------------------------------------ guessing


def test_an_unknown_name_and_a_wrong_password_get_the_same_answer(
        flask_client: FlaskClient, alice: AuthedClient) -> None:
    """Threat (enumeration): a client learns which user names exist from the
    login's answer. Status, code and message are the same for both."""
    unknown = login(flask_client, "nobody", "secret-pw")
    wrong = login(flask_client, "alice", "not-her-pw")
    assert unknown[0] == wrong[0] == 401
    assert unknown[1] == wrong[1] == {"code": "IncorrectPasswordError",
                                      "message": "the user name or the password is incorrect"}


def test_password_guessing_is_throttled_per_user_name(
        redis_server: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    """Threat (guessing): a client tries passwords for one name without end,
    from many addresses. After the limit every try is 429 with Retry-After,
    even with the right password (else only failures would be slowed)."""
    settings = Settings(redis_url=redis_server, storage_roots=(str(tmp_path),),
                        admin_user="root", admin_password="root-password",
                        login_failures_per_user=3, login_failures_per_ip=1000)
    client = create_app(settings).test_client()
    for attempt in range(3):
        assert login(client, "root", f"guess-{attempt}", f"10.0.1.{attempt}")[0] == 401
    status, body, headers = login(client, "root", "root-password", "10.0.2.1")
    assert status == 429 and body["code"] == "TooManyRequestsError", body
    assert 0 < int(headers["Retry-After"]) <= settings.login_window_seconds
    # Another name is not held back by root's window.
    assert login(client, "alice", "whatever", "10.0.2.2")[0] == 401


def test_password_guessing_is_throttled_per_client_address(
        redis_server: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    """Threat (spraying): one client tries one password across many names.
    After the limit for its address it gets 429 for every name; another
    address is not affected; X-Forwarded-For is ignored unless trusted."""
    settings = Settings(redis_url=redis_server, storage_roots=(str(tmp_path),),
                        admin_user="root", admin_password="root-password",
                        login_failures_per_user=1000, login_failures_per_ip=3)
    client = create_app(settings).test_client()
    for name in ("ann", "ben", "cat"):
        assert login(client, name, "spring2026", "10.0.3.1")[0] == 401
    assert login(client, "dan", "spring2026", "10.0.3.1")[0] == 429
    forged = client.post("/api/v1/token", json={"username": "eve", "password": "x"},
                         environ_base={"REMOTE_ADDR": "10.0.3.1"},
                         headers={"X-Forwarded-For": "10.9.9.9"})
    assert forged.status_code == 429, "a client picked its own address"
    assert login(client, "root", "root-password", "10.0.3.2")[0] == 200


# --------------------------------------------------------------- names


def test_names_differing_only_in_case_are_one_user(
        flask_client: FlaskClient, admin: AuthedClient, alice: AuthedClient) -> None:
    """Threat (look-alike accounts): `ADMIN` beside `admin`, `Alice` beside
    `alice`. Names are stored lowercase and unique whatever the case."""
    twin = admin.post("/api/v1/user", json={"username": "ALICE", "password": "secret-pw"})
    assert error_of(twin, 409) == "ConflictUserError"
    assert login(flask_client, "Alice", "secret-pw")[0] == 200
    assert admin.get("/api/v1/user/ALICE").json["username"] == "alice"  # type: ignore[index]


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "-x", "a:b", "a~b", "é"],
                         ids=["dotdot", "dot", "leading-dot", "leading-dash", "colon", "tilde",
                              "non-ascii"])
def test_path_trick_names_are_refused_for_users_and_vcs(admin: AuthedClient, name: str) -> None:
    """Threat: a user or VC name that is a path segment trick (`..`) or breaks
    a key or id (`:`, `~`) reaches storage paths, Redis keys or job ids."""
    created = admin.post("/api/v1/user", json={"username": name, "password": "secret-pw"})
    assert error_of(created, 400) == "BadRequestError"
    vc = admin.put(f"/api/v1/virtual-clusters/{name}", json={"gpuQuota": 1})
    assert vc.status_code in (400, 404), vc.get_data(as_text=True)


# ------------------------------------------------------- recreated user


def test_a_recreated_user_does_not_control_the_old_users_jobs(
        flask_client: FlaskClient, admin: AuthedClient, alice: AuthedClient) -> None:
    """Threat (inheritance): alice leaves, someone else is later created as
    `alice` and stops, reads the config of or deletes the old alice's jobs.
    Jobs belong to the user's immutable id, not to the name."""
    assert alice.post("/api/v1/user/alice/jobs", json=config("old-work")).status_code == 202
    assert admin.delete("/api/v1/user/alice").status_code == 200
    newcomer = new_user(flask_client, admin, "alice")
    assert alice.get("/api/v1/user/alice").status_code == 401  # the old token is dead
    job = "/api/v1/user/alice/jobs/old-work"
    assert error_of(newcomer.get(f"{job}/config"), 403) == "ForbiddenUserError"
    assert error_of(newcomer.put(f"{job}/executionType", json={"value": "STOP"}),
                    403) == "ForbiddenUserError"
    assert error_of(newcomer.delete(job), 403) == "ForbiddenUserError"
    assert admin.get(f"{job}/config").status_code == 200  # admins still can
    assert newcomer.post("/api/v1/user/alice/jobs", json=config("new-work")).status_code == 202
    assert newcomer.get("/api/v1/user/alice/jobs/new-work/config").status_code == 200


# --------------------------------------------------- writes racing a delete


@pytest.mark.parametrize("change", ["password", "admin", "virtual clusters"])
def test_an_account_change_racing_a_delete_does_not_bring_the_user_back(
        redis_server: str, redis_client: redis.Redis, change: str) -> None:
    """Threat (a record brought back): an admin changes a user at the moment
    another deletes it. A plain HSET would recreate a user with no password
    hash and no id (500s at every later login); the change is conditional on
    the record, so the user stays deleted and the caller gets NoSuchAccount."""
    accounts = Accounts(Store(redis_client))
    accounts.put_vc(VirtualCluster("default"))
    accounts.create_user("carol", "secret-pw")
    other = Accounts(Store.from_url(redis_server))
    hook = Hook("before-write", keys.user("carol"), lambda: other.delete_user("carol"))
    racing = Accounts(Store(with_hooks(redis_client, hook)))
    with pytest.raises(NoSuchAccount):
        if change == "password":
            racing.set_password("carol", "new-secret-pw")
        elif change == "admin":
            racing.set_admin("carol", True)
        else:
            racing.set_virtual_clusters("carol", ["default"])
    assert hook.fired
    other.r.close()
    assert not redis_client.exists(keys.user("carol"))


def test_a_grant_racing_the_vcs_deletion_leaves_no_grant_behind(
        redis_server: str, redis_client: redis.Redis) -> None:
    """Threat (a dangling grant): an admin grants a VC at the moment another
    deletes it. The grant would outlive the VC, and a VC created later under
    that name would hand its quota to a user nobody gave it to. The grant is
    conditional on the VC, so it is refused and nothing is left."""
    accounts = Accounts(Store(redis_client))
    for name in ("default", "research"):
        accounts.put_vc(VirtualCluster(name))
    accounts.create_user("carol", "secret-pw")
    other = Accounts(Store.from_url(redis_server))
    hook = Hook("before-write", keys.user("carol"), lambda: other.delete_vc("research"))
    racing = Accounts(Store(with_hooks(redis_client, hook)))
    with pytest.raises(AccountError, match="research"):
        racing.set_virtual_clusters("carol", ["default", "research"])
    assert hook.fired
    other.r.close()
    accounts.put_vc(VirtualCluster("research", 8))  # the name, made again later
    carol = accounts.get_user("carol")
    assert carol is not None and not carol.may_use("research")


def test_taking_a_deleted_vc_from_users_keeps_a_grant_made_meanwhile(
        redis_server: str, redis_client: redis.Redis) -> None:
    """The sweep after a VC's deletion re-reads each user it changes: a grant
    of another VC that lands between its read and its write survives."""
    accounts = Accounts(Store(redis_client))
    for name in ("default", "research", "vision"):
        accounts.put_vc(VirtualCluster(name))
    accounts.create_user("carol", "secret-pw", virtual_clusters=["default", "research"])
    other = Accounts(Store.from_url(redis_server))
    hook = Hook("before-write", keys.user("carol"),
                lambda: other.set_virtual_clusters("carol", ["default", "vision"]))
    Accounts(Store(with_hooks(redis_client, hook))).delete_vc("research")
    assert hook.fired
    other.r.close()
    carol = accounts.get_user("carol")
    assert carol is not None
    assert sorted(carol.virtual_clusters) == ["default", "vision"]


def test_two_admins_writing_one_vc_at_once_keep_its_creation_time(
        redis_server: str, redis_client: redis.Redis) -> None:
    """A VC written by two admins at once lands whole, and an update never
    resets when it was created (the write re-reads under WATCH)."""
    accounts = Accounts(Store(redis_client))
    first = accounts.put_vc(VirtualCluster("vision", 4, "first"))
    other = Accounts(Store.from_url(redis_server))
    hook = Hook("before-write", keys.vc("vision"),
                lambda: other.put_vc(VirtualCluster("vision", 8, "second")))
    Accounts(Store(with_hooks(redis_client, hook))).put_vc(VirtualCluster("Vision", 2, "third"))
    assert hook.fired
    other.r.close()
    stored = accounts.get_vc("vision")
    assert stored is not None
    assert (stored.gpu_quota, stored.description, stored.created_ms) == (2, "third",
                                                                         first.created_ms)
