"""What a Sentinel client may repeat across a primary switch, and how long it
waits (shared/infra/failover.py): pure rules, no Redis."""

from __future__ import annotations

import pytest

from shared.infra.failover import (
    FIRST_PAUSE_SECONDS,
    LONGEST_PAUSE_SECONDS,
    FailoverRedis,
    FailoverWait,
    failover_seconds,
    repeatable,
)


@pytest.mark.parametrize(("args", "expected"), [
    pytest.param(("HGETALL", "pai:job:a"), True, id="a read"),
    pytest.param(("xread", "BLOCK", 1000, "STREAMS", "k", "0"), True, id="a blocking read"),
    pytest.param(("HSET", "pai:job:a", "state", "RUNNING"), True, id="HSET sets"),
    pytest.param(("ZADD", "pai:nodes", 5, "n1"), True, id="ZADD of a score"),
    pytest.param(("SET", "k", "v", "PX", 100), True, id="plain SET"),
    pytest.param(("DEL", "k"), True, id="DEL"),
    pytest.param(("SET", "pai:lock", "1", "NX", "PX", 100), False,
                 id="SET NX answers differently the second time"),
    pytest.param(("ZADD", "k", "INCR", 1, "m"), False, id="ZADD INCR adds twice"),
    pytest.param(("INCR", "pai:queue:seq"), False, id="INCR counts twice"),
    pytest.param(("HINCRBY", "k", "f", 1), False, id="HINCRBY counts twice"),
    pytest.param(("XADD", "pai:log", "*", "l", "x"), False, id="XADD appends a line twice"),
    pytest.param(("RPUSH", "q", "m"), False, id="a queue push delivers twice"),
    pytest.param(("EVALSHA", "abc", 0), False, id="a script may do anything"),
    pytest.param(("EXEC",), False, id="an unwatched EXEC"),
    pytest.param((), False, id="nothing"),
])
def test_only_commands_whose_repeat_is_harmless_are_repeated(
        args: tuple[object, ...], expected: bool) -> None:
    assert repeatable(args) is expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_wait_doubles_up_to_its_longest_pause_and_stops_at_the_budget() -> None:
    clock = FakeClock()
    wait = FailoverWait(5.0, clock=clock, sleep=clock.sleep)
    pauses = 0
    while wait.pause():
        pauses += 1
        assert pauses < 100, "the wait is bounded"
    assert clock.slept[0] == FIRST_PAUSE_SECONDS
    assert clock.slept[1] == 2 * FIRST_PAUSE_SECONDS
    assert max(clock.slept) == LONGEST_PAUSE_SECONDS
    assert clock.now == pytest.approx(105.0)  # never sleeps past the budget


def test_a_zero_budget_never_waits() -> None:
    clock = FakeClock()
    assert FailoverWait(0.0, clock=clock, sleep=clock.sleep).pause() is False
    assert clock.slept == []


def test_only_a_sentinel_client_waits_out_a_switch() -> None:
    assert failover_seconds(object()) == 0.0
    assert failover_seconds(FailoverRedis.__new__(FailoverRedis)) > 0
