"""`GET /api/v1/jobs` and friends on a real Redis: filters, paging, totals,
newest first; and what removes a job from the list (delete) or never adds it
(a dry run). How fast it is lives in bench/bench_list_jobs.py, not here."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from shared.domain.states import JobState
from shared.infra.clock import now_ms
from shared.state import keys
from tests.support.api import AuthedClient, config, error_of
from tests.support.joblist import Jobs, names
from tests.support.joblist import jobs as jobs  # the fixtures
from tests.support.joblist import mixed as mixed
from tests.support.polling import wait_past

# OpenPAI's list item fields; rows may carry more.
SUMMARY_FIELDS = {"name", "username", "state", "subState", "executionType", "retries",
                  "createdTime", "completedTime", "appExitCode", "virtualCluster"}


# ---------------------------------------------------------------- order


def test_newest_first_by_creation_time_not_by_name(alice: AuthedClient, jobs: Jobs) -> None:
    for name, created in (("b-middle", 2000), ("a-newest", 3000), ("c-oldest", 1000)):
        jobs.add("alice", name, created_ms=created)
    assert names(alice) == ["a-newest", "b-middle", "c-oldest"]


def test_rows_have_the_summary_shape(alice: AuthedClient, mixed: Jobs) -> None:
    rows = alice.get("/api/v1/jobs").json
    assert rows is not None and len(rows) == 8
    assert all(set(row) >= SUMMARY_FIELDS for row in rows)
    newest = rows[0]
    assert {k: newest[k] for k in ("name", "username", "state", "virtualCluster")} == {
        "name": "gpt-1", "username": "bob", "state": "SUCCEEDED", "virtualCluster": "default"}


def test_submitted_jobs_are_listed_newest_first(alice: AuthedClient) -> None:
    for name in ("zeta", "alpha", "mu"):  # an order no sort by name gives
        assert alice.post("/api/v1/user/alice/jobs", json=config(name)).status_code == 202
        wait_past(now_ms())  # distinct creation times: ties have no order to check
    assert names(alice) == ["mu", "alpha", "zeta"]


# -------------------------------------------------------------- filters


@pytest.mark.parametrize(("query", "expected"), [
    ("", ["gpt-1", "bert-2", "mnist-3", "resnet-2", "bert-1", "MNIST-2", "resnet-1",
          "mnist-1"]),
    ("?username=alice", ["bert-2", "resnet-2", "MNIST-2", "mnist-1"]),
    ("?vc=vision", ["mnist-3", "resnet-2", "MNIST-2", "resnet-1"]),
    ("?state=RUNNING", ["bert-2", "MNIST-2"]),
    ("?state=WAITING", ["resnet-2", "bert-1"]),
    ("?keyword=mnist", ["mnist-3", "MNIST-2", "mnist-1"]),
    ("?keyword=NIST-", ["mnist-3", "MNIST-2", "mnist-1"]),
    ("?username=alice&state=WAITING", ["resnet-2"]),
    ("?username=bob&vc=vision", ["mnist-3", "resnet-1"]),
    ("?vc=vision&keyword=resnet", ["resnet-2", "resnet-1"]),
    ("?username=alice&vc=vision&state=RUNNING", ["MNIST-2"]),
    ("?username=alice&vc=default&state=RUNNING&keyword=bert", ["bert-2"]),
    ("?username=carol", []),
    ("?vc=nope", []),
    ("?state=STOPPING", []),
    ("?keyword=no-such-name", []),
    ("?username=&vc=&state=&keyword=", ["gpt-1", "bert-2", "mnist-3", "resnet-2", "bert-1",
                                        "MNIST-2", "resnet-1", "mnist-1"]),
], ids=["all", "username", "vc", "state", "another state", "keyword",
        "keyword ignores case", "username+state", "username+vc", "vc+keyword",
        "username+vc+state", "all four", "unknown user", "unknown vc", "empty state",
        "keyword matching nothing", "empty filters are no filters"])
def test_filters(alice: AuthedClient, mixed: Jobs, query: str, expected: list[str]) -> None:
    assert names(alice, query) == expected


@pytest.mark.parametrize("query", [
    "", "?username=alice", "?vc=vision", "?state=RUNNING", "?keyword=mnist",
    "?username=bob&vc=vision", "?vc=vision&keyword=resnet",
    "?username=alice&vc=default&state=RUNNING&keyword=bert",
], ids=["all", "username", "vc", "state", "keyword", "username+vc", "vc+keyword", "all four"])
def test_oldest_first_is_the_same_jobs_the_other_way(alice: AuthedClient, mixed: Jobs,
                                                     query: str) -> None:
    newest_first = names(alice, query)
    joiner = "&" if query else "?"
    assert names(alice, f"{query}{joiner}order=asc") == newest_first[::-1]
    assert names(alice, f"{query}{joiner}order=desc") == newest_first


def test_oldest_first_pages_from_the_oldest(alice: AuthedClient, mixed: Jobs) -> None:
    assert names(alice, "?order=asc&limit=3") == ["mnist-1", "resnet-1", "MNIST-2"]
    assert names(alice, "?order=asc&offset=3&limit=3") == ["bert-1", "resnet-2", "mnist-3"]
    assert names(alice, "?order=asc&keyword=mnist&limit=2") == ["mnist-1", "MNIST-2"]


@pytest.mark.parametrize("order", ["ascending", "ASC", "up"])
def test_an_unknown_order_is_400(alice: AuthedClient, order: str) -> None:
    resp = alice.get(f"/api/v1/jobs?order={order}")
    assert error_of(resp, 400) == "BadRequestError"


@pytest.mark.parametrize("state", ["waiting", "DONE", "Running", "0"])
def test_an_unknown_state_is_400(alice: AuthedClient, state: str) -> None:
    resp = alice.get(f"/api/v1/jobs?state={state}")
    assert error_of(resp, 400) == "BadRequestError"
    assert resp.json is not None and "WAITING" in resp.json["message"]


def test_a_users_jobs(alice: AuthedClient, mixed: Jobs) -> None:
    resp = alice.get("/api/v1/user/bob/jobs")
    assert resp.status_code == 200 and resp.json is not None
    assert [r["name"] for r in resp.json] == ["gpt-1", "mnist-3", "bert-1", "resnet-1"]
    assert {r["username"] for r in resp.json} == {"bob"}


def test_listing_needs_a_token(flask_client: FlaskClient, mixed: Jobs) -> None:
    for path in ("/api/v1/jobs", "/api/v1/user/alice/jobs"):
        assert error_of(flask_client.get(path), 401) == "UnauthorizedUserError"


# --------------------------------------------------------------- paging


def test_default_page_is_fifty_and_offset_pages_on(alice: AuthedClient, jobs: Jobs) -> None:
    for i in range(60):
        jobs.add("alice", f"job-{i:02d}")
    newest_first = [f"job-{i:02d}" for i in reversed(range(60))]

    assert names(alice) == newest_first[:50]
    assert names(alice, "?offset=50") == newest_first[50:]
    assert names(alice, "?offset=55&limit=3") == newest_first[55:58]
    assert names(alice, "?offset=60") == []
    assert names(alice, "?offset=10000") == []
    assert names(alice, "?username=alice&keyword=job&offset=48&limit=4") \
        == newest_first[48:52]


def test_limit_is_at_most_a_thousand(alice: AuthedClient, jobs: Jobs) -> None:
    for i in range(1001):
        jobs.add("bob", f"job-{i:04d}")
    assert len(names(alice, "?limit=5000")) == 1000
    assert len(names(alice, "?limit=1000")) == 1000
    assert names(alice, "?limit=5000&offset=1000") == ["job-0000"]
    assert len(names(alice, "?username=bob&keyword=job&limit=5000")) == 1000


@pytest.mark.parametrize(("query", "expected"), [
    ("?limit=0", ["gpt-1"]),
    ("?limit=-4", ["gpt-1"]),
    ("?offset=-3&limit=2", ["gpt-1", "bert-2"]),
], ids=["limit 0 is 1", "negative limit is 1", "negative offset is 0"])
def test_out_of_range_paging_is_clamped(alice: AuthedClient, mixed: Jobs, query: str,
                                        expected: list[str]) -> None:
    assert names(alice, query) == expected


@pytest.mark.parametrize("query", [f"?offset={10**30}", f"?offset={2**63}&limit={10**30}",
                                   f"?username=alice&offset={10**30}&withTotalCount=true"],
                         ids=["offset past int64", "offset and limit past int64",
                              "filtered, offset past int64"])
def test_a_huge_offset_is_an_empty_page_not_an_error(alice: AuthedClient, mixed: Jobs,
                                                     query: str) -> None:
    resp = alice.get(f"/api/v1/jobs{query}")
    assert resp.status_code == 200, resp.json
    body = resp.json
    assert (body["data"] if isinstance(body, dict) else body) == []


@pytest.mark.parametrize("query", ["?offset=ten", "?limit=1.5", "?limit=", "?offset=1e3"])
def test_paging_that_is_not_an_integer_is_400(alice: AuthedClient, query: str) -> None:
    assert error_of(alice.get(f"/api/v1/jobs{query}"), 400) == "BadRequestError"


# -------------------------------------------------------------- totals


@pytest.mark.parametrize(("query", "total", "page"), [
    ("", 8, ["gpt-1", "bert-2"]),
    ("&offset=6", 8, ["resnet-1", "mnist-1"]),
    ("&username=alice", 4, ["bert-2", "resnet-2"]),
    ("&username=alice&state=WAITING", 1, ["resnet-2"]),
    ("&vc=vision&keyword=resnet", 2, ["resnet-2", "resnet-1"]),
    ("&keyword=mnist&offset=1", 3, ["MNIST-2", "mnist-1"]),
    ("&username=carol", 0, []),
], ids=["all", "offset", "username", "username+state", "vc+keyword", "keyword+offset",
        "nothing"])
def test_with_total_count(alice: AuthedClient, mixed: Jobs, query: str, total: int,
                          page: list[str]) -> None:
    resp = alice.get(f"/api/v1/jobs?withTotalCount=true&limit=2{query}")

    assert resp.status_code == 200
    body = resp.json
    assert isinstance(body, dict) and set(body) == {"totalCount", "data"}
    assert body["totalCount"] == total
    assert [row["name"] for row in body["data"]] == page


def test_without_total_count_the_list_is_bare(alice: AuthedClient, mixed: Jobs) -> None:
    for flag in ("", "&withTotalCount=false", "&withTotalCount=no"):
        assert isinstance(alice.get(f"/api/v1/jobs?username=alice{flag}").json, list)
    assert isinstance(alice.get("/api/v1/jobs?withTotalCount=1").json, dict)


# ------------------------------------------------- delete and dry run


def _stop(client: AuthedClient, username: str, name: str) -> None:
    resp = client.put(f"/api/v1/user/{username}/jobs/{name}/executionType",
                      json={"value": "STOP"})
    assert resp.status_code == 202


def test_a_live_job_cannot_be_deleted(alice: AuthedClient, admin: AuthedClient,
                                      jobs: Jobs) -> None:
    alice.post("/api/v1/user/alice/jobs", json=config("live"))
    jobs.add("alice", "stopping", state=JobState.STOPPING)
    jobs.add("alice", "running", state=JobState.RUNNING)

    for name in ("live", "stopping", "running"):
        for client in (alice, admin):
            resp = client.delete(f"/api/v1/user/alice/jobs/{name}")
            assert error_of(resp, 409) == "ConflictJobError", name
    assert sorted(names(alice)) == ["live", "running", "stopping"]


def test_deleting_a_finished_job_frees_its_name(alice: AuthedClient,
                                                redis_client: redis.Redis) -> None:
    alice.post("/api/v1/user/alice/jobs", json=config("again"))
    _stop(alice, "alice", "again")

    resp = alice.delete("/api/v1/user/alice/jobs/again")

    assert resp.status_code == 200
    assert names(alice) == []
    assert error_of(alice.get("/api/v1/user/alice/jobs/again"), 404) == "NoJobError"
    assert list(redis_client.scan_iter("pai:job:alice~again*")) == []
    for index in (keys.JOBS, keys.QUEUE, keys.user_jobs("alice"), keys.vc_jobs("default"),
                  keys.state_jobs("STOPPED")):
        assert redis_client.zscore(index, "alice~again") is None, index
    assert alice.post("/api/v1/user/alice/jobs", json=config("again")).status_code == 202
    assert [r["state"] for r in alice.get("/api/v1/jobs").json or []] == ["WAITING"]


def test_only_the_owner_or_an_admin_deletes_a_job(alice: AuthedClient, bob: AuthedClient,
                                                  admin: AuthedClient, jobs: Jobs) -> None:
    jobs.add("alice", "done-1", state=JobState.SUCCEEDED)
    jobs.add("alice", "done-2", state=JobState.FAILED)

    assert error_of(bob.delete("/api/v1/user/alice/jobs/done-1"), 403) == "ForbiddenUserError"
    assert names(alice) == ["done-2", "done-1"]
    assert admin.delete("/api/v1/user/alice/jobs/done-1").status_code == 200
    assert alice.delete("/api/v1/user/alice/jobs/done-2").status_code == 200
    assert names(alice) == []
    assert error_of(alice.delete("/api/v1/user/alice/jobs/done-2"), 404) == "NoJobError"


def test_a_dry_run_stores_nothing(alice: AuthedClient, redis_client: redis.Redis) -> None:
    before = {k: redis_client.type(k) for k in redis_client.scan_iter("*")}

    for path in ("/api/v1/user/alice/jobs?dryRun=true", "/api/v1/jobs?dryRun=1"):
        resp = alice.post(path, json=config("rehearsal", authFile="x"))
        assert resp.status_code == 200, resp.json
        body: dict[str, Any] = resp.json
        assert body["config"]["jobName"] == "rehearsal"
        assert body["ignoredFields"] == ["authFile"]

    assert {k: redis_client.type(k) for k in redis_client.scan_iter("*")} == before
    assert names(alice) == []
    assert alice.post("/api/v1/user/alice/jobs", json=config("rehearsal")).status_code == 202


def test_a_dry_run_still_refuses_what_a_submit_would(alice: AuthedClient,
                                                     redis_client: redis.Redis) -> None:
    resp = alice.post("/api/v1/user/alice/jobs?dryRun=true",
                      json=config(virtualCluster="nope"))
    assert error_of(resp, 400) == "NoVirtualClusterError"
    resp = alice.post("/api/v1/user/alice/jobs?dryRun=true", json=config(retryCount=-3))
    assert error_of(resp, 400) == "InvalidJobConfigError"
    assert redis_client.zcard(keys.JOBS) == 0
