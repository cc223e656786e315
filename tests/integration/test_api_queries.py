"""Query strings are loaded by their schemas (services/api/queries.py) like
bodies: a bad value is a 400 whose `fields` name the parameter, for the job
list, a task's log, a submit's dryRun, a task's samples, a job's metrics and
the usage report. What clients rely on stays: an empty filter is no filter,
paging past the ends is clamped, and the list and log ignore parameters
they do not know (OpenPAI's clients send their own)."""

from __future__ import annotations

import pytest

from tests.support.api import AuthedClient, config, error_of

JOB = "/api/v1/user/alice/jobs/mnist"


@pytest.fixture
def submitted(alice: AuthedClient) -> AuthedClient:
    assert alice.post("/api/v1/user/alice/jobs", json=config()).status_code == 202
    return alice


@pytest.mark.parametrize(("path", "query", "field"), [
    ("/api/v1/jobs", "limit=ten", "limit"),
    ("/api/v1/jobs", "offset=1.5", "offset"),
    ("/api/v1/jobs", "state=DONE", "state"),
    ("/api/v1/jobs", "withTotalCount=maybe", "withTotalCount"),
    ("/api/v1/jobs", "sort=colour", "sort"),
    ("/api/v1/jobs", "order=up", "order"),
    (f"{JOB}/tasks/main/0/log", "tail=all", "tail"),
    (f"{JOB}/tasks/main/0/log", "attempt=-1", "attempt"),
    (f"{JOB}/tasks/main/0/log", "attempt=first", "attempt"),
    (f"{JOB}/tasks/main/0/log", "follow=perhaps", "follow"),
    (f"{JOB}/tasks/main/0/samples", "limit=0", "limit"),
    (f"{JOB}/metrics", "from=yesterday", "from"),
    ("/api/v1/usage", "groupBy=colour", "groupBy"),
], ids=lambda value: value if "/" not in value else value.rsplit("/", 1)[-1])
def test_a_bad_query_value_is_400_naming_its_parameter(submitted: AuthedClient, path: str,
                                                       query: str, field: str) -> None:
    resp = submitted.get(f"{path}?{query}")
    assert error_of(resp, 400) == "BadRequestError"
    assert resp.json is not None and list(resp.json["fields"]) == [field]
    assert field in resp.json["message"]


@pytest.mark.parametrize("version", ["v1/user/alice", "v2"])
def test_a_bad_dry_run_flag_is_400_naming_it(alice: AuthedClient, version: str) -> None:
    resp = alice.post(f"/api/{version}/jobs?dryRun=perhaps", json=config())
    assert error_of(resp, 400) == "BadRequestError"
    assert resp.json is not None and list(resp.json["fields"]) == ["dryRun"]
    assert alice.get("/api/v1/jobs").json == []  # nothing was stored


@pytest.mark.parametrize("flag", ["true", "1", "True", "yes"])
def test_a_dry_run_stores_nothing(alice: AuthedClient, flag: str) -> None:
    resp = alice.post(f"/api/v1/user/alice/jobs?dryRun={flag}", json=config())
    assert resp.status_code == 200 and resp.json is not None
    assert resp.json["config"]["jobName"] == "mnist"
    assert alice.get("/api/v1/jobs").json == []


def test_empty_filters_are_no_filters_and_unknown_parameters_are_ignored(
        submitted: AuthedClient) -> None:
    resp = submitted.get("/api/v1/jobs?state=&username=&vc=&keyword=&sort=&order="
                         "&withTotalCount=&pageToken=abc")
    assert resp.status_code == 200, resp.json
    assert [row["name"] for row in resp.json] == ["mnist"]
    log = submitted.get(f"{JOB}/tasks/main/0/log?follow=&tail=5&cacheBuster=1")
    assert log.status_code == 200 and log.mimetype == "text/plain"


def test_an_attempt_the_job_has_not_reached_is_400(submitted: AuthedClient) -> None:
    resp = submitted.get(f"{JOB}/tasks/main/0/log?attempt=1")
    assert error_of(resp, 400) == "BadRequestError"
    assert resp.json is not None and "attempts 0..0" in resp.json["message"]
