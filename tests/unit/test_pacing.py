"""When a ring for new work gets its pass (services/scheduler/pacing.py)."""

from __future__ import annotations

import pytest

from services.scheduler.pacing import LastPass, new_work_delay

INTERVAL = 0.1


@pytest.mark.parametrize(("last", "now", "delay"), [
    pytest.param(None, 5.0, 0.0, id="no-pass-yet"),
    pytest.param(LastPass(began=5.0, left_waiting=False), 5.01, 0.0, id="nothing-left-waiting"),
    pytest.param(LastPass(began=5.0, left_waiting=True), 5.03, 0.07, id="saturated-waits-rest"),
    pytest.param(LastPass(began=5.0, left_waiting=True), 5.0, 0.1, id="right-after-the-pass"),
    pytest.param(LastPass(began=5.0, left_waiting=True), 5.1, 0.0, id="interval-over"),
    pytest.param(LastPass(began=5.0, left_waiting=True), 9.0, 0.0, id="long-ago"),
])
def test_new_work_delay(last: LastPass | None, now: float, delay: float) -> None:
    assert new_work_delay(last, now, INTERVAL) == pytest.approx(delay)


def test_no_interval_never_waits() -> None:
    assert new_work_delay(LastPass(began=5.0, left_waiting=True), 5.0, 0.0) == 0.0
