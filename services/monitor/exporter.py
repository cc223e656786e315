"""The node's Prometheus exporter: the monitor's `/metrics` (PAI_MONITOR_PORT).

It serves the latest sampling round (sampling.py) through a collector in a
registry of its own, so a scrape costs no Docker or NVML call. It listens on
PAI_MONITOR_HOST, by default the node's IP (PAI_NODE_IP): where Prometheus
reaches the node, and loopback on a one-machine trial.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from wsgiref.simple_server import WSGIServer

import docker
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.monitor.nodemetrics import NODE_SERIES, Series
from services.monitor.sampling import IdleStop, NodeSampler, NvmlReader
from shared.domain.metricfamily import Kind, MetricFamily
from shared.infra.config import Settings
from shared.state.store import Store

log = logging.getLogger(__name__)


def _family(spec: MetricFamily) -> GaugeMetricFamily | CounterMetricFamily:
    if spec.kind == Kind.COUNTER:
        return CounterMetricFamily(spec.name, spec.help, labels=list(spec.labelnames))
    return GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labelnames))


class NodeCollector(Collector):
    """Every node family, filled from whatever `source` returns at scrape time."""

    def __init__(self, source: Callable[[], Sequence[Series]],
                 specs: Sequence[MetricFamily] = NODE_SERIES) -> None:
        self.source, self.specs = source, tuple(specs)

    def describe(self) -> Iterable[Metric]:
        return [_family(spec) for spec in self.specs]

    def collect(self) -> Iterator[Metric]:
        families = {spec.name: _family(spec) for spec in self.specs}
        for series in self.source():
            family = families.get(series.spec.name)
            if family is not None:
                family.add_metric(list(series.labels), series.value)
        yield from families.values()


def build_registry(source: Callable[[], Sequence[Series]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(source))
    return registry


class NodeExporter:
    """The sampler, its registry and the HTTP server that serves it."""

    def __init__(self, settings: Settings, store: Store, docker_client: docker.DockerClient,
                 nvml: NvmlReader | None = None, stop_idle: IdleStop | None = None) -> None:
        self.settings = settings
        self.nvml = nvml or NvmlReader()
        self.sampler = NodeSampler(settings, store, docker_client, self.nvml,
                                   stop_idle=stop_idle)
        self.registry = build_registry(self.sampler.latest)
        self._server: WSGIServer | None = None

    def serve(self) -> None:
        """Start NVML and listen (a thread of prometheus_client's)."""
        self.nvml.start()
        self._server, _thread = start_http_server(
            self.settings.monitor_port, self.settings.monitor_host, registry=self.registry)
        log.info("node exporter on http://%s:%d/metrics", self.settings.monitor_host,
                 self.settings.monitor_port)

    def thread(self, stop: threading.Event) -> threading.Thread:
        return threading.Thread(target=self.sampler.run, args=(stop,),
                                name="pai-monitor-sampler", daemon=True)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.sampler.close()
