"""`pai usage` in-process against the real API over HTTP on 127.0.0.1, from a
real Redis holding recorded usage: tables in hours, JSON, CSV, and a user
refused another's usage."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import redis
from flask import Flask

from shared.infra.clock import now_ms
from shared.state import usage
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.store import Store
from tests.support.cli import api, pai_as, run  # noqa: F401 (api: a fixture)

pytestmark = pytest.mark.redis

# A midnight 30 days ago: inside the default report span, and kept by retention.
MIDNIGHT = usage.day_start_ms(usage.day_of(now_ms())) - 30 * 24 * 3600 * 1000
DAY1, DAY2 = usage.day_of(MIDNIGHT - 1), usage.day_of(MIDNIGHT)
HOUR = 3600 * 1000
SPAN = ("--from", DAY1, "--to", DAY2)


@pytest.fixture
def recorded(redis_client: redis.Redis) -> None:
    pipe = redis_client.pipeline()
    for span in (
            usage.Interval("alice~a", 0, "main", 0, "alice", "default", MIDNIGHT - HOUR,
                           MIDNIGHT + HOUR, 2, 4, 2048),
            usage.Interval("root~b", 0, "main", 0, "root", "default", MIDNIGHT,
                           MIDNIGHT + HOUR, 1, 1, 1024)):
        usage.record_interval(pipe, span)
    pipe.execute()


@pytest.mark.usefixtures("recorded")
def test_usage_table_json_and_csv(api: tuple[str, Flask], tmp_path: Path) -> None:  # noqa: F811
    root = pai_as(api, tmp_path, "root")
    done = run(root, "usage", *SPAN)
    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["USER", "GPU", "HOURS", "CPU", "HOURS", "MEMORY", "GB-HOURS"]
    assert lines[1].split() == ["alice", "4.00", "8.00", "4.00"]
    assert lines[2].split() == ["root", "1.00", "1.00", "1.00"]
    answer = json.loads(run(root, "usage", "-b", "day", "-b", "user", "-o", "json",
                            *SPAN).stdout)
    assert answer["groupBy"] == ["day", "user"]
    assert [(r["day"], r["user"], r["gpuSeconds"]) for r in answer["rows"]] == [
        (DAY1, "alice", 7200.0), (DAY2, "alice", 7200.0),
        (DAY2, "root", 3600.0)]
    table = list(csv.reader(io.StringIO(run(root, "usage", "-b", "vc", "-o", "csv",
                                            *SPAN).stdout)))
    assert table == [["vc", "gpuSeconds", "cpuSeconds", "memoryMbSeconds"],
                     ["default", "18000.0", "32400.0", "18432000.0"]]


@pytest.mark.usefixtures("recorded")
def test_a_user_sees_their_own_and_is_refused_anothers(
        api: tuple[str, Flask], tmp_path: Path) -> None:  # noqa: F811
    alice = pai_as(api, tmp_path, "alice")
    answer = json.loads(run(alice, "usage", "-o", "json", *SPAN).stdout)
    assert [r["user"] for r in answer["rows"]] == ["alice"]
    done = run(alice, "usage", "--user", "root", *SPAN)
    assert done.exit_code == 1 and done.stderr.startswith("error: ForbiddenUserError:")
    empty = run(alice, "usage", "--from", "2020-01-01", "--to", "2020-01-02")
    assert empty.stdout.splitlines()[0] == "no usage from 2020-01-01 to 2020-01-02"


def test_a_user_sees_their_budgets(api: tuple[str, Flask], tmp_path: Path,  # noqa: F811
                                   redis_client: redis.Redis) -> None:
    accounts = Accounts(Store(redis_client))
    accounts.put_vc(VirtualCluster("research", 4, budget_period="week",
                                   on_budget_exhausted="wait"))
    accounts.set_user_budget("research", "alice", 2)
    today = usage.day_start_ms(usage.day_of(now_ms()))
    pipe = redis_client.pipeline()
    usage.record_interval(pipe, usage.Interval("alice~r", 0, "main", 0, "alice", "research",
                                               today, today + HOUR, 3, 1, 128))
    pipe.execute()
    alice = pai_as(api, tmp_path, "alice")

    done = run(alice, "usage", "--budget")

    assert done.exit_code == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["VC", "USER", "SPENT", "BUDGET", "PERIOD", "ONCE", "SPENT"]
    assert lines[1].split() == ["research", "alice", "3.00", "2", "week", "spent:", "wait"]
    answer = json.loads(run(alice, "usage", "--budget", "-o", "json").stdout)
    assert [(b["vc"], b["exhausted"]) for b in answer] == [("research", True)]
    root = pai_as(api, tmp_path, "root")  # an admin sees every user's
    assert run(root, "usage", "--budget").stdout.splitlines()[1:] == lines[1:]
    assert run(root, "usage", "--budget", "--vc", "default").stdout == \
        "no per-user GPU-hour budget\n"
    assert run(alice, "usage", "--budget", "-o", "csv").exit_code == 2


def test_a_trimmed_report_says_so(api: tuple[str, Flask], tmp_path: Path) -> None:  # noqa: F811
    alice = pai_as(api, tmp_path, "alice")
    done = run(alice, "usage", "--from", "2024-01-01", "--to", "2024-01-02")
    kept = usage.day_of(now_ms() - 400 * 24 * HOUR)
    assert done.stdout.splitlines() == ["no usage from 2024-01-01 to 2024-01-02",
                                        f"(usage before {kept} is no longer kept)"]
