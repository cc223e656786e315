"""A Prometheus metric family as the platform declares one.

The node exporter's gauges and counters (services/monitor/nodemetrics.py)
and the counters and histograms kept in Redis (shared/state/telemetry.py)
are the same thing to Prometheus, told apart only by where their values
come from: one declaration serves both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """Prometheus' types, as far as the platform uses them: the node exporter
    serves gauges and counters; Redis keeps counters and histograms, which
    replicas may add to (a gauge there would be whichever wrote last)."""

    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class MetricFamily:
    """One metric family. `name` is the family name (a counter's samples get
    Prometheus' `_total` suffix, a histogram's `_bucket`, `_sum` and `_count`)."""

    name: str
    kind: Kind
    help: str
    labelnames: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds, ascending; +Inf is implied
