"""Counters and histograms the services record in Redis, for the API to export.

The scheduler has no HTTP server, the monitor's exits and starts happen on
every node, and the API runs as several gunicorn workers: a per-process
prometheus_client metric would be scraped from one process at a time and
reset on every restart. So what the platform counts lives in Redis, beside
the state it counts: one hash per metric, a field per label set (and, for a
histogram, per bucket), incremented with HINCRBY. Several replicas add to the
same fields, a restart loses nothing (append-only file), and the API turns
the hashes into Prometheus series at scrape time (services/api/metrics.py).

Recording is a few commands queued on a pipeline the caller already has; a
state change records inside its own MULTI, so a metric counts a transition
exactly once however often the message behind it is redelivered.
"""

from __future__ import annotations

import bisect
import json
import math
import socket
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.domain.metricfamily import Kind, MetricFamily
from shared.infra.clock import now_ms
from shared.state import keys

# A scheduler replica that has not beaten for this long is forgotten.
SCHEDULER_FORGET_MS = 24 * 3600 * 1000
MAX_REMEMBERED_FIELDS = 10_000  # label sets a MetricBuffer keeps made fields of
_MISSING = object()  # a label not given (its field is made, and refused, afresh)


class RecordedMetric(MetricFamily):
    """One metric kept in Redis: a counter or a histogram."""

    @property
    def key(self) -> str:
        return keys.recorded_metric(self.name)


LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
                4 * 3600.0, 12 * 3600.0, 24 * 3600.0)

SCHEDULER_PASS = RecordedMetric(
    "pai_scheduler_pass_duration_seconds", Kind.HISTOGRAM,
    "How long one scheduling pass took (snapshot, plan, commits).", buckets=PASS_BUCKETS)
PLACEMENTS = RecordedMetric(
    "pai_scheduler_placements", Kind.COUNTER,
    "Jobs (whole gangs) the scheduler placed, by virtual cluster.", ("vc",))
PREEMPTIONS = RecordedMetric(
    "pai_scheduler_preemptions", Kind.COUNTER,
    "Jobs preempted (warned, then stopped and requeued uncharged) to make room for "
    "guaranteed work, by the victim's virtual cluster.", ("vc",))
SUBMIT_TO_RUNNING = RecordedMetric(
    "pai_job_submit_to_running_seconds", Kind.HISTOGRAM,
    "From a job's submit (for a retry: from its attempt's re-queueing) to its first "
    "running task container, by virtual cluster.", ("vc",), WAIT_BUCKETS)
TASK_EXITS = RecordedMetric(
    "pai_task_exits", Kind.COUNTER,
    "Task exits by final state and by whose doing: the user's program or the platform "
    "(node lost, container vanished).", ("state", "class"))
API_REQUESTS = RecordedMetric(
    "pai_api_request_duration_seconds", Kind.HISTOGRAM,
    "API request latency by endpoint, method and status (for a log follow, until the "
    "stream starts).", ("endpoint", "method", "status"), LATENCY_BUCKETS)
# Usage (shared/state/usage.py): added once per task, when its exit is settled
# (running tasks are not in them yet; GET /api/v1/usage counts those too).
GPU_SECONDS = RecordedMetric(
    "pai_gpu_seconds", Kind.COUNTER,
    "GPU-seconds of ended tasks, from placement to exit, by user and virtual cluster.",
    ("user", "vc"))
CPU_SECONDS = RecordedMetric(
    "pai_cpu_seconds", Kind.COUNTER,
    "CPU-seconds (allocated CPUs times time held) of ended tasks, by user and virtual "
    "cluster.", ("user", "vc"))
MEMORY_MB_SECONDS = RecordedMetric(
    "pai_memory_mb_seconds", Kind.COUNTER,
    "Memory MB-seconds (allocated MB times time held) of ended tasks, by user and virtual "
    "cluster.", ("user", "vc"))

TASK_EXECS = RecordedMetric(
    "pai_task_execs", Kind.COUNTER,
    "Commands run in task containers through the exec API, by the user who ran them.",
    ("user",))

TASK_SSH_KEY_READS = RecordedMetric(
    "pai_task_ssh_key_reads", Kind.COUNTER,
    "Reads of SSH jobs' private keys through the API (GET .../ssh), by the user who read "
    "them.", ("user",))
TASK_EXEC_SESSIONS = RecordedMetric(
    "pai_task_exec_sessions", Kind.COUNTER,
    "Interactive terminal sessions opened in task containers (exec with a TTY), by the user "
    "who opened them.", ("user",))

IDLE_GPU_STOPS = RecordedMetric(
    "pai_idle_gpu_stops", Kind.COUNTER,
    "Jobs the platform stopped because their GPUs stayed idle (shared/state/idle.py), by virtual "
    "cluster.", ("vc",))

RECORDED: tuple[RecordedMetric, ...] = (SCHEDULER_PASS, PLACEMENTS, PREEMPTIONS,
                                        SUBMIT_TO_RUNNING, TASK_EXITS, API_REQUESTS,
                                        TASK_EXECS, GPU_SECONDS, CPU_SECONDS, MEMORY_MB_SECONDS,
                                        IDLE_GPU_STOPS, TASK_SSH_KEY_READS, TASK_EXEC_SESSIONS)

_SUM, _COUNT, _BUCKET = "sum", "count", "le="
_SEP = "|"


def _label_field(metric: RecordedMetric, labels: Mapping[str, str]) -> str:
    """The hash field of a label set: its values as JSON, in the metric's label order."""
    if set(labels) != set(metric.labelnames):
        raise ValueError(f"{metric.name} takes labels {metric.labelnames}, got {sorted(labels)}")
    return json.dumps([str(labels[n]) for n in metric.labelnames], separators=(",", ":"))


def counter_field(metric: RecordedMetric, labels: Mapping[str, str]) -> str:
    """A counter's hash field for one label set (for a caller that increments
    it itself, e.g. inside a Lua script)."""
    return _label_field(metric, labels)


def bucket_bound(metric: RecordedMetric, value: float) -> str:
    """The upper bound of the bucket `value` falls in, as its field suffix."""
    position = bisect.bisect_left(metric.buckets, value)
    return repr(metric.buckets[position]) if position < len(metric.buckets) else "+Inf"


def histogram_fields(metric: RecordedMetric, labels: Mapping[str, str],
                     value: float) -> tuple[str, str, str]:
    """(bucket field, sum field, count field) of one observation."""
    return _histogram_fields_of(_label_field(metric, labels), metric, value)


def _histogram_fields_of(base: str, metric: RecordedMetric,
                         value: float) -> tuple[str, str, str]:
    """`histogram_fields` for the label set whose field is `base`."""
    return (f"{base}{_SEP}{_BUCKET}{bucket_bound(metric, value)}", f"{base}{_SEP}{_SUM}",
            f"{base}{_SEP}{_COUNT}")


def record(pipe: Any, metric: RecordedMetric, labels: Mapping[str, str] | None = None,
           value: float = 1) -> None:
    """Queue one increment (counter) or observation (histogram) on `pipe`."""
    labels = labels or {}
    if metric.kind == Kind.COUNTER:
        pipe.hincrby(metric.key, _label_field(metric, labels), int(value))
        return
    bucket, total, count = histogram_fields(metric, labels, value)
    pipe.hincrby(metric.key, bucket, 1)
    pipe.hincrbyfloat(metric.key, total, float(value))
    pipe.hincrby(metric.key, count, 1)


# ------------------------------------------------------------------ reading


@dataclass
class HistogramValue:
    buckets: dict[float, int] = field(default_factory=dict)  # stored bound -> count in it
    total: float = 0.0
    count: int = 0

    def cumulative(self, bounds: Sequence[float]) -> list[tuple[str, float]]:
        """Prometheus' cumulative buckets over `bounds`, then +Inf (= count).

        Observations stored under a bound that is no longer configured count
        in the first configured bucket above it, so changing the buckets never
        makes a bucket exceed +Inf.
        """
        result = []
        for bound in bounds:
            below = sum(n for stored, n in self.buckets.items() if stored <= bound)
            result.append((_format_bound(bound), float(below)))
        result.append(("+Inf", float(self.count)))
        return result


def _format_bound(bound: float) -> str:
    return repr(float(bound))


@dataclass(frozen=True)
class RecordedValues:
    """What one metric's hash holds: label values -> a count, or a histogram."""

    metric: RecordedMetric
    counters: dict[tuple[str, ...], float]
    histograms: dict[tuple[str, ...], HistogramValue]


def parse_recorded(metric: RecordedMetric, raw: Mapping[str, str]) -> RecordedValues:
    """Decode a metric's hash; fields it cannot read (another version's) are skipped."""
    counters: dict[tuple[str, ...], float] = {}
    histograms: dict[tuple[str, ...], HistogramValue] = defaultdict(HistogramValue)
    width = len(metric.labelnames)
    for name, text in raw.items():
        base, _, suffix = name.rpartition(_SEP) if metric.kind == Kind.HISTOGRAM \
            else (name, "", "")
        try:
            values = tuple(json.loads(base))
            number = float(text)
        except ValueError:
            continue
        if len(values) != width:
            continue
        if metric.kind == Kind.COUNTER:
            counters[values] = number
        elif suffix == _SUM:
            histograms[values].total = number
        elif suffix == _COUNT:
            histograms[values].count = int(number)
        elif suffix.startswith(_BUCKET):
            bound = math.inf if suffix[len(_BUCKET):] == "+Inf" else _float(suffix[len(_BUCKET):])
            if bound is not None:
                histograms[values].buckets[bound] = int(number)
    return RecordedValues(metric, counters, dict(histograms))


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_recorded(r: Any, metrics: Iterable[RecordedMetric] = RECORDED) -> list[RecordedValues]:
    """Every recorded metric, in one round trip."""
    metrics = list(metrics)
    pipe = r.pipeline(transaction=False)
    for metric in metrics:
        pipe.hgetall(metric.key)
    return [parse_recorded(m, raw) for m, raw in zip(metrics, pipe.execute(), strict=True)]


# ------------------------------------------------------- in-process buffer


class MetricBuffer:
    """Observations gathered in memory and added to Redis in one batch.

    For what happens on every API request: a Redis round trip per request
    would cost more than the request's own work, so each worker sums its
    requests here and writes the sums once a second (and before a scrape).
    A failed write keeps the sums for the next one; the buffer holds at most
    one entry per field, so it is bounded by the metric's label sets.
    """

    def __init__(self, flush_seconds: float = 1.0) -> None:
        self.flush_seconds = flush_seconds
        self._lock = threading.Lock()
        self._ints: dict[tuple[str, str], int] = defaultdict(int)
        self._floats: dict[tuple[str, str], float] = defaultdict(float)
        self._last_flush = 0.0
        # A label set's hash field, by metric and label values: made (and its
        # labels checked) once, not at every request. Bounded as the sums are.
        self._fields: dict[tuple[str, int, tuple[object, ...]], str] = {}

    def _field(self, metric: RecordedMetric, labels: Mapping[str, str]) -> str:
        key = (metric.key, len(labels), tuple(labels.get(n, _MISSING) for n in metric.labelnames))
        found = self._fields.get(key)
        if found is None:
            if len(self._fields) >= MAX_REMEMBERED_FIELDS:
                self._fields.clear()
            found = self._fields[key] = _label_field(metric, labels)
        return found

    def observe(self, metric: RecordedMetric, labels: Mapping[str, str], value: float) -> None:
        with self._lock:
            base = self._field(metric, labels)
            if metric.kind == Kind.COUNTER:
                self._ints[(metric.key, base)] += int(value)
                return
            bucket, total, count = _histogram_fields_of(base, metric, value)
            self._ints[(metric.key, bucket)] += 1
            self._ints[(metric.key, count)] += 1
            self._floats[(metric.key, total)] += float(value)

    def flush_if_due(self, r: Any, now: float) -> None:
        if now - self._last_flush >= self.flush_seconds:
            self._last_flush = now
            self.flush(r)

    def flush(self, r: Any) -> None:
        """Write what was gathered; on a Redis error it waits for the next flush."""
        with self._lock:
            ints, self._ints = self._ints, defaultdict(int)
            floats, self._floats = self._floats, defaultdict(float)
        if not ints and not floats:
            return
        pipe = r.pipeline(transaction=False)
        for (key, name), amount in ints.items():
            pipe.hincrby(key, name, amount)
        for (key, name), total in floats.items():
            pipe.hincrbyfloat(key, name, total)
        try:
            pipe.execute()
        except Exception:
            with self._lock:
                for item, amount in ints.items():
                    self._ints[item] += amount
                for item, value in floats.items():
                    self._floats[item] += value
            raise


# ------------------------------------------------------ scheduler heartbeat


def scheduler_name() -> str:
    """One scheduler replica's name in the heartbeat set: its host."""
    return socket.gethostname()


def record_scheduler_heartbeat(r: Any, name: str, at_ms: int | None = None) -> None:
    """The scheduler replica `name` is alive and its repair pass ran."""
    at_ms = now_ms() if at_ms is None else at_ms
    pipe = r.pipeline(transaction=False)
    pipe.zadd(keys.SCHEDULERS, {name: at_ms})
    pipe.zremrangebyscore(keys.SCHEDULERS, 0, at_ms - SCHEDULER_FORGET_MS)
    pipe.execute()


def scheduler_heartbeats(r: Any) -> dict[str, int]:
    return {n: int(s) for n, s in r.zrange(keys.SCHEDULERS, 0, -1, withscores=True)}
