"""Idle-GPU decisions and the sample format, without IO."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.state.idle import IdleAction, IdlePolicy, Verdict, decide, idle_run, is_idle, verdict
from shared.state.tasksamples import Sample, max_samples, task_gpu_percent

POLICY = IdlePolicy(percent=5.0, window_ms=1000, grace_ms=500)
STOPPING = IdlePolicy(percent=5.0, window_ms=1000, grace_ms=500, action=IdleAction.STOP)


def s(time_ms: int, *gpus: float | None) -> Sample:
    return Sample(time_ms=time_ms, cpu_percent=1.0, memory_bytes=1, gpu_percent=tuple(gpus))


@pytest.mark.parametrize(("since", "samples", "now", "policy", "expected"), [
    pytest.param(None, [], 5000, POLICY, Verdict(None, False, False), id="nothing-yet"),
    pytest.param(None, [s(0, 0.0)], 999, POLICY, Verdict(0, False, False),
                 id="idle-but-not-for-the-window"),
    pytest.param(None, [s(0, 0.0)], 1000, POLICY, Verdict(0, True, False),
                 id="idle-for-the-window-is-flagged"),
    pytest.param(None, [s(0, 4.9, 0.0), s(600, 1.0, 2.0)], 1200, POLICY,
                 Verdict(0, True, False), id="every-gpu-below-the-threshold"),
    pytest.param(None, [s(0, 0.0, 5.0)], 5000, POLICY, Verdict(None, False, False),
                 id="one-gpu-at-the-threshold-is-busy"),
    pytest.param(None, [s(0, 0.0), s(500, 90.0), s(600, 0.0)], 1500, POLICY,
                 Verdict(600, False, False), id="a-busy-sample-restarts-the-run"),
    pytest.param(None, [s(0, 0.0), s(500, None), s(600, 0.0)], 1599, POLICY,
                 Verdict(600, False, False), id="an-unknown-gpu-is-not-idle"),
    pytest.param(None, [s(0)], 5000, POLICY, Verdict(None, False, False),
                 id="a-task-without-gpus-is-never-idle"),
    pytest.param(100, [s(700, 0.0)], 1100, POLICY, Verdict(100, True, False),
                 id="a-run-carried-over-keeps-its-start"),
    pytest.param(100, [s(700, 50.0)], 5000, POLICY, Verdict(None, False, False),
                 id="a-carried-run-ends-on-use"),
    pytest.param(None, [s(0, 0.0)], 1499, STOPPING, Verdict(0, True, False),
                 id="stop-waits-for-the-grace"),
    pytest.param(None, [s(0, 0.0)], 1500, STOPPING, Verdict(0, True, True),
                 id="stop-after-window-and-grace"),
    pytest.param(None, [s(0, 0.0)], 10**9, POLICY, Verdict(0, True, False),
                 id="notify-never-stops"),
])
def test_decide(since: int | None, samples: list[Sample], now: int, policy: IdlePolicy,
                expected: Verdict) -> None:
    assert decide(since, samples, now, policy) == expected


percent = st.one_of(st.none(), st.floats(min_value=0, max_value=100))
samples_st = st.lists(
    st.tuples(st.integers(0, 10_000), st.lists(percent, max_size=4)), max_size=30,
).map(lambda rows: [s(t, *g) for t, g in sorted(rows, key=lambda r: r[0])])


@given(samples_st, st.integers(0, 30))
def test_folding_in_rounds_equals_folding_at_once(samples: list[Sample], cut: int) -> None:
    """The monitor folds one round at a time; the answer is the whole history's."""
    first, rest = samples[:cut], samples[cut:]
    assert idle_run(idle_run(None, first, 5.0), rest, 5.0) == idle_run(None, samples, 5.0)


@given(samples_st)
def test_the_run_starts_at_the_first_of_the_trailing_idle_samples(samples: list[Sample]) -> None:
    trailing = 0
    while trailing < len(samples) and is_idle(samples[-1 - trailing], 5.0):
        trailing += 1
    expected = samples[-trailing].time_ms if trailing else None
    assert idle_run(None, samples, 5.0) == expected


@given(st.one_of(st.none(), st.integers(0, 10**6)), st.integers(0, 10**7),
       st.sampled_from([POLICY, STOPPING]))
def test_a_stop_is_always_flagged_and_only_where_the_vc_says_stop(
        since: int | None, now: int, policy: IdlePolicy) -> None:
    result = verdict(since, now, policy)
    assert not result.stop or (result.flagged and policy.action == IdleAction.STOP)
    assert not result.flagged or (since is not None and now - since >= policy.window_ms)


@given(st.integers(0, 2**40), st.one_of(st.none(), st.floats(0, 10_000).map(lambda f: round(f, 2))),
       st.one_of(st.none(), st.integers(0, 2**50)), st.lists(percent.map(
           lambda p: None if p is None else round(p, 2)), max_size=8))
def test_a_sample_reads_back_as_written(time_ms: int, cpu: float | None, memory: int | None,
                                        gpus: list[float | None]) -> None:
    sample = Sample(time_ms, cpu, memory, tuple(gpus))
    assert Sample.from_fields(sample.fields()) == sample


@pytest.mark.parametrize(("every", "keep", "expected"), [
    (15.0, 2 * 86400.0, 11520), (15.0, 1.0, 1), (0.001, 10**9, 100_000), (10.0, 25.0, 3)])
def test_max_samples(every: float, keep: float, expected: int) -> None:
    assert max_samples(every, keep) == expected


def test_a_tasks_gpus_read_in_its_allocations_order() -> None:
    assert task_gpu_percent((3, 1), {1: 10.0, 3: 0.0}) == (0.0, 10.0)
    assert task_gpu_percent((2,), {1: 10.0}) == (None,)
