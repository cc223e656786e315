"""Counters and histograms kept in Redis hashes: how a value is filed and read back."""

from __future__ import annotations

import math

import pytest

from shared.state import telemetry
from shared.state.telemetry import Kind, RecordedMetric

HIST = RecordedMetric("pai_test_seconds", Kind.HISTOGRAM, "test", ("vc",), (0.1, 1.0, 10.0))
COUNT = RecordedMetric("pai_test", Kind.COUNTER, "test", ("state", "class"))


@pytest.mark.parametrize(("value", "bound"), [
    pytest.param(0.0, "0.1", id="zero goes in the first bucket"),
    pytest.param(0.1, "0.1", id="a bound is inclusive (le)"),
    pytest.param(0.5, "1.0", id="between bounds: the next one up"),
    pytest.param(10.0, "10.0", id="the last bound"),
    pytest.param(11.0, "+Inf", id="past every bound: +Inf"),
])
def test_an_observation_is_filed_under_the_bound_above_it(value: float, bound: str) -> None:
    assert telemetry.bucket_bound(HIST, value) == bound


def test_histogram_fields_carry_the_label_values_then_the_part() -> None:
    assert telemetry.histogram_fields(HIST, {"vc": "vision"}, 0.5) == (
        '["vision"]|le=1.0', '["vision"]|sum', '["vision"]|count')


def test_labels_must_be_exactly_the_metrics() -> None:
    with pytest.raises(ValueError, match="takes labels"):
        telemetry.histogram_fields(HIST, {"vc": "a", "extra": "b"}, 1.0)


class _Writes:
    """What a pipeline is asked to add: (key, field) -> amount (no Redis)."""

    def __init__(self) -> None:
        self.added: dict[tuple[str, str], float] = {}

    def pipeline(self, transaction: bool = True) -> _Writes:
        return self

    def hincrby(self, key: str, field: str, amount: int) -> None:
        self.added[(key, field)] = self.added.get((key, field), 0) + amount

    hincrbyfloat = hincrby

    def execute(self) -> None:
        pass


OBSERVED = [(HIST, {"vc": "a"}, 0.05), (HIST, {"vc": "b"}, 3.0), (HIST, {"vc": "a"}, 0.5),
            (COUNT, {"state": "x", "class": "y"}, 2), (HIST, {"vc": "a"}, 0.05),
            (COUNT, {"class": "y", "state": "x"}, 1)]


def test_a_buffer_adds_what_recording_each_observation_adds() -> None:
    buffer, direct = telemetry.MetricBuffer(), _Writes()
    for metric, labels, value in OBSERVED:
        buffer.observe(metric, labels, value)
        telemetry.record(direct, metric, labels, value)
    flushed = _Writes()
    buffer.flush(flushed)
    assert flushed.added == pytest.approx(direct.added)


@pytest.mark.parametrize("labels", [{"vc": "a", "extra": "b"}, {}, {"other": "a"}],
                         ids=["one too many", "none", "another name"])
def test_a_buffer_refuses_wrong_labels_after_right_ones_too(labels: dict[str, str]) -> None:
    buffer = telemetry.MetricBuffer()
    buffer.observe(HIST, {"vc": "a"}, 1.0)
    for _ in range(2):
        with pytest.raises(ValueError, match="takes labels"):
            buffer.observe(HIST, labels, 1.0)


def test_a_stored_histogram_reads_back_cumulative_with_inf_as_the_count() -> None:
    raw = {'["a|b"]|le=0.1': "2", '["a|b"]|le=10.0': "1", '["a|b"]|le=+Inf': "1",
           '["a|b"]|sum': "13.5", '["a|b"]|count': "4"}

    values = telemetry.parse_recorded(HIST, raw)

    histogram = values.histograms[("a|b",)]  # a "|" inside a label value is fine
    assert histogram.total == 13.5 and histogram.count == 4
    assert histogram.cumulative(HIST.buckets) == [
        ("0.1", 2.0), ("1.0", 2.0), ("10.0", 3.0), ("+Inf", 4.0)]


def test_observations_under_a_bound_no_longer_configured_count_in_the_next_one_up() -> None:
    raw = {'["x"]|le=0.5': "3", '["x"]|count': "3", '["x"]|sum': "1.2"}

    histogram = telemetry.parse_recorded(HIST, raw).histograms[("x",)]

    assert histogram.cumulative(HIST.buckets) == [
        ("0.1", 0.0), ("1.0", 3.0), ("10.0", 3.0), ("+Inf", 3.0)]


def test_counters_read_back_by_label_values_and_junk_fields_are_skipped() -> None:
    raw = {'["FAILED","platform"]': "3", '["SUCCEEDED","user"]': "10", "not json": "1",
           '["too","many","labels"]': "5"}

    assert telemetry.parse_recorded(COUNT, raw).counters == {
        ("FAILED", "platform"): 3.0, ("SUCCEEDED", "user"): 10.0}


def test_every_recorded_metric_has_a_pai_name_and_ascending_buckets() -> None:
    for metric in telemetry.RECORDED:
        assert metric.name.startswith("pai_")
        assert not metric.name.endswith("_total")  # Prometheus adds it to a counter
        assert list(metric.buckets) == sorted(set(metric.buckets))
        assert all(math.isfinite(b) for b in metric.buckets)
        assert (metric.kind == Kind.HISTOGRAM) == bool(metric.buckets)
