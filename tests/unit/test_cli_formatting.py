"""Durations, times and exit codes the CLI shows and returns."""

from __future__ import annotations

from typing import Any

import pytest

from pai_cli.formatting import ago, elapsed, format_duration, format_mb, format_ports, format_time
from pai_cli.views import budget_cell, vcs_table
from pai_cli.waiting import WaitTimeout, exit_code_for, final_line, wait_until_final


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0, "0s"), (0.9, "0s"), (45, "45s"), (60, "1m00s"), (185, "3m05s"),
    (3600, "1h00m"), (7380, "2h03m"), (86400, "1d00h"), (4 * 86400 + 7300, "4d02h"),
    (-5, "0s"),
])
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_elapsed_and_ago() -> None:
    assert elapsed(1_000, 63_000) == "1m02s"
    assert elapsed(1_000, None, now=11_000) == "10s"
    assert elapsed(None, 5_000) == "-"
    assert ago(10_000, now=40_000) == "30s ago"
    assert ago(None) == "-"


def test_small_formats() -> None:
    assert format_time(None) == "-"
    assert len(format_time(1_700_000_000_000)) == len("2023-11-14 22:13:20")
    assert format_mb(512) == "512M" and format_mb(16384) == "16.0G"
    assert format_ports({"default": 21000, "http": "21001,21002"}) == \
        "default=21000 http=21001,21002"
    assert format_ports({}) == "-"


@pytest.mark.parametrize(("status", "code"), [
    pytest.param({"state": "SUCCEEDED", "appExitCode": 0}, 0, id="succeeded"),
    pytest.param({"state": "FAILED", "appExitCode": 3}, 3, id="failed: the app's code"),
    pytest.param({"state": "FAILED", "appExitCode": None}, 1, id="failed without a code"),
    pytest.param({"state": "FAILED", "appExitCode": 0}, 1, id="failed with code 0"),
    pytest.param({"state": "FAILED", "appExitCode": 300}, 1, id="out of a shell's range"),
    pytest.param({"state": "FAILED", "appExitCode": 137}, 137, id="killed"),
    pytest.param({"state": "STOPPED", "appExitCode": None}, 130, id="stopped"),
])
def test_exit_code_for(status: dict[str, Any], code: int) -> None:
    assert exit_code_for(status) == code


def test_final_line() -> None:
    assert final_line("a", {"state": "SUCCEEDED", "appExitDiagnostics": "all done"}) == \
        "job a SUCCEEDED"
    assert final_line("b", {"state": "FAILED", "appExitCode": 3,
                            "appExitDiagnostics": "main[0]: exit code 3"}) == \
        "job b FAILED (exit code 3): main[0]: exit code 3"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def _details(*states: str) -> Any:
    return iter([{"jobStatus": {"state": s}} for s in states])


def test_wait_polls_until_final_and_backs_off() -> None:
    clock, details = FakeClock(), _details("WAITING", "RUNNING", "RUNNING", "RUNNING",
                                           "RUNNING", "RUNNING", "RUNNING", "SUCCEEDED")
    seen: list[str] = []
    last = wait_until_final(lambda: next(details), on_poll=lambda d: seen.append(
        d["jobStatus"]["state"]), sleep=clock.sleep, clock=lambda: clock.now)
    assert last["jobStatus"]["state"] == "SUCCEEDED"
    assert seen[-1] == "SUCCEEDED" and len(seen) == 8
    assert clock.sleeps[0] == 0.25 and max(clock.sleeps) == 2.0
    assert clock.sleeps == sorted(clock.sleeps)


def test_wait_gives_up_at_the_timeout() -> None:
    clock = FakeClock()
    with pytest.raises(WaitTimeout) as caught:
        wait_until_final(lambda: {"jobStatus": {"state": "RUNNING"}}, timeout=5,
                         sleep=clock.sleep, clock=lambda: clock.now)
    assert caught.value.status == {"state": "RUNNING"}
    assert clock.now == 5


@pytest.mark.parametrize(("vc", "cell"), [
    pytest.param({"gpuHoursBudget": None}, None, id="no budget"),
    pytest.param({"gpuHoursBudget": 100.0, "gpuHoursSpent": 1234.5, "budgetPeriod": "week",
                  "onBudgetExhausted": "wait"}, "1,234.50/100 week, then wait",
                 id="spent past its budget"),
    pytest.param({"gpuHoursBudget": 2.5, "gpuHoursSpent": 0, "budgetPeriod": "day",
                  "onBudgetExhausted": "oppo"}, "0.00/2.5 day, then oppo", id="a fraction"),
])
def test_the_vcs_budget_column(vc: dict[str, Any], cell: str | None) -> None:
    assert budget_cell(vc) == cell
    assert "GPU-HOURS BUDGET" in [str(c.header) for c in vcs_table({"v": vc}).columns]
