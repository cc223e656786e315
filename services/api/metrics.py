"""The platform's Prometheus metrics, served by the API at `/metrics`.

Two collectors in a registry made per app (no module globals):

- `ClusterCollector` reads the cluster's state from Redis at scrape time
  (shared/state/queuecounts.py for the jobs and queues):
  jobs by state and virtual cluster, the queue, GPUs/CPUs/memory per node,
  node and scheduler heartbeats. Nothing is cached, so any API worker
  answers the same.
- `RecordedCollector` exports what the services counted into Redis
  (shared/state/telemetry.py): scheduling passes, placements, submit-to-running
  times, task exits, API request latency.

A scrape while Redis is down still answers: `pai_redis_up 0` and the
families without samples, so "Redis down" is an alert, not a failed scrape.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flask import Flask, Response, current_app, g, request
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from redis.exceptions import RedisError

from shared.domain.cluster import held, held_by_vc
from shared.domain.lease import conditions_of
from shared.domain.models import Allocation, split_job_id
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.state import leases, telemetry, usage
from shared.state.accounts import DEFAULT_VC, Accounts, VirtualCluster
from shared.state.queuecounts import jobs_by_state_and_vc, queue_view
from shared.state.store import Store

log = logging.getLogger("pai.api")

EXTENSION = "pai.metrics"
# The methods a request's latency is labelled with; any other (gunicorn
# takes any upper-case token) is "other", so a client cannot add label sets.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
MIB = 1024 * 1024
# -------------------------------------------------------------- collectors


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class ClusterCollector(Collector):
    """Gauges of the cluster's state, computed from Redis at every scrape."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store, self.settings = store, settings

    def describe(self) -> Iterable[Metric]:
        return self._families().values()

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        families = [
            _gauge("pai_redis_up", "1 when the API reached Redis for this scrape."),
            _gauge("pai_redis_memory_used_bytes",
                   "Memory Redis holds (INFO's used_memory, read with MEMORY STATS)."),
            _gauge("pai_redis_memory_max_bytes",
                   "Redis's maxmemory as configured (PAI_REDIS_MAXMEMORY); past it Redis "
                   "refuses writes (noeviction), so the platform stops taking work."),
            _gauge("pai_jobs", "Jobs by state and virtual cluster.", ("state", "vc")),
            _gauge("pai_queue_length", "Jobs queued for placement, by virtual cluster.",
                   ("vc",)),
            _gauge("pai_queue_oldest_waiting_seconds",
                   "How long the longest-queued job of a virtual cluster has waited "
                   "(since submit, or since a retry re-queued it).", ("vc",)),
            _gauge("pai_gpus_total", "GPUs a node offers.", ("node",)),
            _gauge("pai_gpus_allocated", "GPUs allocated to tasks, by node and virtual cluster.",
                   ("node", "vc")),
            _gauge("pai_gpus_free", "GPUs of a node no task holds.", ("node",)),
            _gauge("pai_vc_gpu_quota",
                   "A virtual cluster's GPU quota, its guarantee (absent: none set).", ("vc",)),
            _gauge("pai_vc_gpu_hours_budget",
                   "A virtual cluster's GPU-hour budget per period (absent: none set).",
                   ("vc", "period")),
            _gauge("pai_vc_gpu_hours_spent",
                   "GPU-hours a budgeted virtual cluster used this period, running tasks "
                   "up to now.", ("vc", "period")),
            _gauge("pai_user_gpu_hours_budget",
                   "A user's own GPU-hour budget per period within a virtual cluster (only "
                   "users given one).", ("vc", "user", "period")),
            _gauge("pai_user_gpu_hours_spent",
                   "GPU-hours a user with their own budget used in the virtual cluster this "
                   "period, running tasks up to now.", ("vc", "user", "period")),
            _gauge("pai_node_cpus_total", "CPUs a node offers.", ("node",)),
            _gauge("pai_node_cpus_allocated", "CPUs allocated to tasks on a node.", ("node",)),
            _gauge("pai_node_memory_bytes_total", "Memory a node offers.", ("node",)),
            _gauge("pai_node_memory_bytes_allocated", "Memory allocated to tasks on a node.",
                   ("node",)),
            _gauge("pai_node_up", "1 until the node is lost (its lease not renewed for its "
                   "lease, grace and a margin), 0 once it is.", ("node",)),
            _gauge("pai_node_ready", "1 while the node takes new work (its condition is "
                   "READY: renewing, healthy, reconciled, settled).", ("node",)),
            _gauge("pai_node_last_heartbeat_timestamp_seconds",
                   "When the node last renewed its lease (the control plane's clock).",
                   ("node",)),
            _gauge("pai_control_plane_outage", "1 while most nodes stopped renewing at once: "
                   "the control plane's own outage, during which no node is declared lost.",
                   ()),
            _gauge("pai_scheduler_last_heartbeat_timestamp_seconds",
                   "When a scheduler replica last finished its repair pass.", ("scheduler",)),
        ]
        return {f.name: f for f in families}

    def collect(self) -> Iterator[Metric]:
        families = self._families()
        try:
            self._fill(families)
        except RedisError as error:
            log.warning("metrics: Redis unreachable: %s", error)
            families = self._families()
            families["pai_redis_up"].add_metric([], 0)
        yield from families.values()

    def _fill(self, families: dict[str, GaugeMetricFamily]) -> None:
        r = self.store.r  # the state layer's readers take the client
        vc_records = Accounts(self.store).list_vcs()
        vcs = sorted({vc.name for vc in vc_records} | {DEFAULT_VC})
        for (state, vc), count in jobs_by_state_and_vc(r, vcs).items():
            families["pai_jobs"].add_metric([state, vc], count)
        now = now_ms()
        queue = queue_view(r, vcs)
        for vc in vcs:
            families["pai_queue_length"].add_metric([vc], queue.length.get(vc, 0))
            oldest = queue.oldest_ms.get(vc)
            families["pai_queue_oldest_waiting_seconds"].add_metric(
                [vc], max(0, now - oldest) / 1000 if oldest else 0)
        for vc_record in vc_records:
            if vc_record.gpu_quota is not None:
                families["pai_vc_gpu_quota"].add_metric([vc_record.name], vc_record.gpu_quota)
        allocations = self._fill_nodes(families, now)
        self._fill_budgets(families, vc_records, allocations, now)
        for name, beat in telemetry.scheduler_heartbeats(r).items():
            families["pai_scheduler_last_heartbeat_timestamp_seconds"].add_metric(
                [name], beat / 1000)
        families["pai_redis_memory_used_bytes"].add_metric(
            [], self.store.memory_used_bytes())
        if self.settings.redis_maxmemory_bytes:
            families["pai_redis_memory_max_bytes"].add_metric(
                [], self.settings.redis_maxmemory_bytes)
        families["pai_redis_up"].add_metric([], 1)

    def _fill_budgets(self, families: dict[str, GaugeMetricFamily],
                      vc_records: Sequence[VirtualCluster],
                      allocations: Mapping[str, Sequence[Allocation]], now: int) -> None:
        budgets: dict[usage.Owner, usage.Budget] = {
            (vc.name, ""): vc.budget for vc in vc_records if vc.budget is not None}
        held = [a for allocs in allocations.values() for a in allocs]
        for record in vc_records:  # bounded label sets: users given their own budget,
            # and the VC's default for those holding GPUs in it now
            budgets.update(record.user_budgets(
                {split_job_id(a.job_id)[0] for a in held if a.vc == record.name}))
        for (vc, user), spend in sorted(usage.read_spends(self.store.r, budgets, held,
                                                          now).items()):
            kind = "user" if user else "vc"
            labels: list[str] = [vc, user, spend.budget.period] if user \
                else [vc, spend.budget.period]
            families[f"pai_{kind}_gpu_hours_budget"].add_metric(labels, spend.budget.gpu_hours)
            families[f"pai_{kind}_gpu_hours_spent"].add_metric(labels, spend.gpu_hours)

    def _fill_nodes(self, families: dict[str, GaugeMetricFamily],
                    now: int) -> dict[str, list[Allocation]]:
        nodes = self.store.get_nodes()
        allocations = self.store.all_allocations([n.name for n in nodes])
        view = leases.read_cluster(self.store)
        conditions = {name: condition for name, (condition, _) in conditions_of(
            view, int(self.settings.node_lost_seconds * 1000),
            int(self.settings.node_settle_seconds * 1000)).items()}
        families["pai_control_plane_outage"].add_metric([], 1 if view.outage.in_progress else 0)
        for node in nodes:
            used = held(allocations[node.name])
            families["pai_gpus_total"].add_metric([node.name], len(node.gpus))
            for vc, vc_held in sorted(held_by_vc(allocations[node.name]).items()):
                families["pai_gpus_allocated"].add_metric([node.name, vc],
                                                          len(vc_held.used_gpus(node)))
            families["pai_gpus_free"].add_metric([node.name], len(used.free_gpus(node)))
            families["pai_node_cpus_total"].add_metric([node.name], node.cpus)
            families["pai_node_cpus_allocated"].add_metric([node.name], used.cpus)
            families["pai_node_memory_bytes_total"].add_metric([node.name], node.memory_mb * MIB)
            families["pai_node_memory_bytes_allocated"].add_metric(
                [node.name], used.memory_mb * MIB)
            condition = conditions.get(node.name, "LOST")
            families["pai_node_up"].add_metric([node.name], 0 if condition == "LOST" else 1)
            families["pai_node_ready"].add_metric([node.name], 1 if condition == "READY" else 0)
            families["pai_node_last_heartbeat_timestamp_seconds"].add_metric(
                [node.name], node.heartbeat_ms / 1000)
        return allocations


class RecordedCollector(Collector):
    """The counters and histograms services record in Redis (shared/state/telemetry.py)."""

    def __init__(self, r: Any,
                 metrics: Sequence[telemetry.RecordedMetric] = telemetry.RECORDED) -> None:
        self.r, self.metrics = r, tuple(metrics)

    def describe(self) -> Iterable[Metric]:
        return [_recorded_family(m) for m in self.metrics]

    def collect(self) -> Iterator[Metric]:
        try:
            values = telemetry.read_recorded(self.r, self.metrics)
        except RedisError:
            yield from self.describe()  # the cluster collector reports Redis down
            return
        for recorded in values:
            yield _recorded_family(recorded.metric, recorded)


def _recorded_family(metric: telemetry.RecordedMetric,
                     values: telemetry.RecordedValues | None = None) -> Metric:
    labels = list(metric.labelnames)
    if metric.kind == telemetry.Kind.COUNTER:
        counter = CounterMetricFamily(metric.name, metric.help, labels=labels)
        for label_values, count in sorted((values.counters if values else {}).items()):
            counter.add_metric(list(label_values), count)
        return counter
    histogram = HistogramMetricFamily(metric.name, metric.help, labels=labels)
    for label_values, value in sorted((values.histograms if values else {}).items()):
        histogram.add_metric(list(label_values), value.cumulative(metric.buckets),
                             sum_value=value.total)
    return histogram


# ------------------------------------------------------------ the app side


@dataclass
class ApiMetrics:
    registry: CollectorRegistry
    buffer: telemetry.MetricBuffer
    store: Store

    def exposition(self, accept: str) -> Response:
        """This worker's buffered requests written, then every family rendered in
        the format the scraper accepts (Prometheus text or OpenMetrics)."""
        self.flush()
        encode, content_type = choose_encoder(accept)
        return Response(encode(self.registry), content_type=content_type)

    def flush(self) -> None:
        try:
            self.buffer.flush(self.store.r)
        except RedisError as error:
            log.warning("metrics: cannot record request latencies: %s", error)


def build_registry(store: Store, settings: Settings) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(store, settings))
    registry.register(RecordedCollector(store.r))
    return registry


def init_app(app: Flask, store: Store, settings: Settings) -> ApiMetrics:
    """Bind the metrics to the app and time every request.

    Call before any other before_request hook, so a request refused by one
    (a 401) is timed too.
    """
    metrics = ApiMetrics(build_registry(store, settings), telemetry.MetricBuffer(), store)
    app.extensions[EXTENSION] = metrics
    app.before_request(_start_timer)
    app.after_request(_observe_request)
    return metrics


def api_metrics() -> ApiMetrics:
    found: ApiMetrics = current_app.extensions[EXTENSION]
    return found


def _start_timer() -> None:
    g.pai_request_started = time.perf_counter()


def _observe_request(response: Response) -> Response:
    started = g.get("pai_request_started")
    if started is None:
        return response
    metrics = api_metrics()
    method = request.method if request.method in METHODS else "other"
    metrics.buffer.observe(telemetry.API_REQUESTS, {
        "endpoint": request.endpoint or "unmatched", "method": method,
        "status": str(response.status_code)}, time.perf_counter() - started)
    try:
        metrics.buffer.flush_if_due(metrics.store.r, time.monotonic())
    except RedisError as error:
        log.warning("metrics: cannot record request latencies: %s", error)
    return response


def metric_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name the registry can expose (a histogram's `_bucket`,
    `_sum`, `_count`; a counter's `_total`), for checking dashboards and rules."""
    suffixes: dict[str, tuple[str, ...]] = defaultdict(lambda: ("",))
    suffixes.update({"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")})
    return {family.name + suffix for family in registry.collect()
            for suffix in suffixes[family.type]}
