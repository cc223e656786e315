"""`pai jobs --sort` in-process against the real API over HTTP on a real Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask import Flask

from pai_cli.commands.jobs import JOB_SORTS
from shared.domain import jobsort
from shared.domain.states import JobState
from shared.state.store import Store
from tests.support.cli import api, pai_as, run
from tests.support.joblist import Jobs

pytestmark = pytest.mark.redis
__all__ = ["api"]  # the fixture, shared with test_cli_nodes.py


def test_the_cli_knows_every_sort_field_the_api_takes() -> None:
    assert JOB_SORTS == jobsort.SORTS


@pytest.fixture
def listed(api: tuple[str, Flask], redis_client: redis.Redis) -> Iterator[tuple[str, Flask]]:
    jobs = Jobs(Store(redis_client))
    for name, state in (("b", JobState.RUNNING), ("C", JobState.FAILED), ("a", JobState.WAITING)):
        jobs.add("alice", name, state=state)
    yield api


def test_pai_jobs_sort(listed: tuple[str, Flask], tmp_path: Path) -> None:
    alice = pai_as(listed, tmp_path, "alice")

    def names(*args: str) -> list[str]:
        done = run(alice, "jobs", "-o", "json", *args)
        assert done.exit_code == 0, done.stderr
        return [row["name"] for row in json.loads(done.stdout)]

    assert names() == ["a", "C", "b"]  # newest first
    assert names("--sort", "name", "--asc") == ["a", "b", "C"]
    assert names("--sort", "name") == ["C", "b", "a"]
    assert names("--sort", "state", "--asc", "--limit", "2") == ["C", "b"]
    refused = run(alice, "jobs", "--sort", "config")
    assert refused.exit_code == 2 and "config" in refused.stderr
