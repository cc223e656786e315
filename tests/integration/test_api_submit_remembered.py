"""A submit decides on a token check and a VC record this process remembers,
and its write holds to them (services/api/auth.py `authenticate`,
services/api/jobs.py `_vc_for_submit`): whatever changed between two submits
with the same token must take effect on the second, exactly as if it had
read everything afresh, and leave nothing written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from shared.state import keys
from tests.support.api import AuthedClient, config, error_of, new_user
from tests.support.redis_server import operator_url

pytestmark = pytest.mark.redis

Change = Callable[[AuthedClient, AuthedClient], Any]


@pytest.fixture
def alice(flask_client: FlaskClient, admin: AuthedClient) -> AuthedClient:
    """An ordinary user of `default` and `vision` (borrowing, no guarantee)."""
    assert admin.put("/api/v1/virtual-clusters/vision",
                     json={"description": "computer vision"}).status_code == 201
    client = new_user(flask_client, admin, "alice")
    assert admin.put("/api/v1/user/alice/virtualClusters",
                     json={"virtualClusters": ["default", "vision"]}).status_code == 200
    return client


def job(name: str, **extra: Any) -> dict[str, Any]:
    return config(name, virtualCluster="vision", jobPriorityClass="oppo", **extra)


def delete_vision(alice: AuthedClient, admin: AuthedClient) -> Any:
    """A VC with a waiting job stays: the first job is stopped first."""
    assert alice.put("/api/v1/user/alice/jobs/first/executionType",
                     json={"value": "STOP"}).status_code == 202
    return admin.delete("/api/v1/virtual-clusters/vision")


def recreate_alice(admin: AuthedClient) -> Any:
    assert admin.delete("/api/v1/user/alice").status_code == 200
    assert admin.post("/api/v1/user", json={"username": "alice",
                                            "password": "other-pw"}).status_code == 201
    return admin.put("/api/v1/user/alice/virtualClusters",
                     json={"virtualClusters": ["default", "vision"]})


CHANGES: list[Any] = [
    pytest.param(lambda alice, admin: alice.delete("/api/v1/token"),
                 401, "UnauthorizedUserError", id="the token logged out"),
    pytest.param(lambda alice, admin: admin.delete("/api/v1/user/alice/tokens"),
                 401, "UnauthorizedUserError", id="every token of the user revoked"),
    pytest.param(lambda alice, admin: admin.delete("/api/v1/user/alice"),
                 401, "UnauthorizedUserError", id="the user deleted"),
    pytest.param(lambda alice, admin: recreate_alice(admin),
                 401, "UnauthorizedUserError", id="the user deleted and made again"),
    pytest.param(lambda alice, admin: admin.put("/api/v1/user/alice/virtualClusters",
                                                json={"virtualClusters": ["default"]}),
                 403, "ForbiddenUserError", id="the VC taken from the user"),
    pytest.param(delete_vision, 400, "NoVirtualClusterError", id="the VC deleted"),
    pytest.param(lambda alice, admin: admin.put("/api/v1/virtual-clusters/vision",
                                                json={"borrowing": False, "gpuQuota": 0}),
                 400, "InvalidJobConfigError", id="the VC stops lending to oppo jobs"),
]


@pytest.mark.parametrize(("change", "status", "code"), CHANGES)
def test_what_changed_since_the_last_submit_takes_effect_at_once(
        alice: AuthedClient, admin: AuthedClient, redis_client: redis.Redis,
        change: Change, status: int, code: str) -> None:
    assert alice.post("/api/v1/user/alice/jobs", json=job("first")).status_code == 202
    changed = change(alice, admin)
    assert changed.status_code < 300, changed.get_data(as_text=True)
    resp = alice.post("/api/v1/user/alice/jobs", json=job("second"))
    assert error_of(resp, status) == code
    assert not redis_client.exists(keys.job("alice~second"))
    assert redis_client.zscore(keys.JOBS, "alice~second") is None


def test_a_change_that_leaves_the_decision_standing_still_submits(
        alice: AuthedClient, admin: AuthedClient, redis_client: redis.Redis) -> None:
    """The VC's record changed (so the remembered one does not hold), but the
    job may still run there: decided again on fresh reads, it is accepted."""
    assert alice.post("/api/v1/user/alice/jobs", json=job("first")).status_code == 202
    assert admin.put("/api/v1/virtual-clusters/vision",
                     json={"description": "renamed team"}).status_code == 200
    assert admin.put("/api/v1/user/alice/admin", json={"value": False}).status_code == 200
    assert alice.post("/api/v1/user/alice/jobs", json=job("second")).status_code == 202
    assert redis_client.exists(keys.job("alice~second"))


def test_a_replayed_name_is_still_a_conflict_on_the_remembered_path(
        alice: AuthedClient) -> None:
    assert alice.post("/api/v1/user/alice/jobs", json=job("same")).status_code == 202
    resp = alice.post("/api/v1/user/alice/jobs", json=job("same"))
    assert error_of(resp, 409) == "ConflictJobError"


def _calls(operator: redis.Redis) -> dict[str, int]:
    """Commands run so far, by name (a script's own commands count too)."""
    stats = operator.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
            for name in ("hgetall", "mget", "evalsha")}


def test_a_submit_with_nothing_changed_reads_no_user_token_or_vc_record(
        alice: AuthedClient, redis_server: str) -> None:
    """The point of remembering: the second submit's only Redis work is its
    write (the token check reads the user's record and MGETs the revocation
    keys; a VC check reads the VC's record: neither happens)."""
    assert alice.post("/api/v1/user/alice/jobs", json=job("first")).status_code == 202
    with redis.Redis.from_url(operator_url(redis_server), decode_responses=True) as operator:
        before = _calls(operator)
        assert alice.post("/api/v1/user/alice/jobs", json=job("second")).status_code == 202
        after = _calls(operator)
    assert after == {**before, "evalsha": before["evalsha"] + 1}


def test_a_refusal_decided_on_remembered_records_is_decided_again(
        alice: AuthedClient, admin: AuthedClient) -> None:
    """A refusal writes nothing, so it holds to nothing: a VC granted since
    the token check was remembered is usable at once."""
    assert alice.post("/api/v1/user/alice/jobs", json=job("first")).status_code == 202
    assert admin.put("/api/v1/virtual-clusters/audio", json={}).status_code == 201
    other = config("second", virtualCluster="audio")
    assert error_of(alice.post("/api/v1/user/alice/jobs", json=other), 403) \
        == "ForbiddenUserError"
    assert admin.put("/api/v1/user/alice/virtualClusters",
                     json={"virtualClusters": ["default", "vision", "audio"]}).status_code == 200
    assert alice.post("/api/v1/user/alice/jobs", json=other).status_code == 202


def test_a_dry_run_after_logout_is_refused(alice: AuthedClient) -> None:
    """A dry run writes nothing to hold to the token check: it reads afresh."""
    assert alice.post("/api/v1/user/alice/jobs", json=job("first")).status_code == 202
    assert alice.delete("/api/v1/token").status_code == 200
    resp = alice.post("/api/v1/user/alice/jobs?dryRun=true", json=job("second"))
    assert error_of(resp, 401) == "UnauthorizedUserError"
