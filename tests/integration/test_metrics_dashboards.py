"""Every metric a dashboard or alert rule queries is one the exporters really emit.

The names come from the expressions (tests/unit/test_metrics_promql.py reads
them); the emitted names from the registries themselves: the API's, built by
`create_app` on a real Redis, and the node exporter's, fed one sampling round.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from flask import Flask

from services.api.app import create_app
from services.api.metrics import metric_names as registry_names
from services.monitor.exporter import build_registry
from services.monitor.nodemetrics import GpuSample, TaskSample, node_series
from shared.infra.config import Settings
from tests.support.promql import metric_names, variable_metric_names

pytestmark = pytest.mark.redis

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
RULES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
# Series Prometheus makes itself: a target's health, and the alerts' state.
PROMETHEUS_BUILTINS = {"up", "ALERTS", "ALERTS_FOR_STATE"}


@pytest.fixture
def api_app(redis_server: str, redis_client: redis.Redis) -> Flask:
    return create_app(Settings(redis_url=redis_server, admin_user="root",
                               admin_password="root-password"))


@pytest.fixture
def emitted(api_app: Flask) -> set[str]:
    round_ = node_series(
        "n1", [GpuSample(0, "GPU-0", "Tesla", 50.0, 1, 2, 60.0, 100.0, 0, 0, (1,))],
        [TaskSample("alice", "mnist", "main", 0, 0, "default", 10.0, 1024, (1,), (0,))])
    node = registry_names(build_registry(lambda: round_))
    return registry_names(api_app.extensions["pai.metrics"].registry) | node | \
        PROMETHEUS_BUILTINS


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])


def dashboard_queries(path: Path) -> list[tuple[str, set[str]]]:
    """(where, metric names) of every panel target and template variable."""
    board = json.loads(path.read_text())
    found = [(f"{path.name}: panel {panel.get('title')!r}", metric_names(target["expr"]))
             for panel in _panels(board.get("panels") or [])
             for target in panel.get("targets") or () if target.get("expr")]
    for variable in (board.get("templating") or {}).get("list") or ():
        query = variable.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        if variable.get("type") == "query" and query:
            found.append((f"{path.name}: variable ${variable['name']}",
                          variable_metric_names(query)))
    return found


def rule_queries(path: Path) -> list[tuple[str, set[str]]]:
    return [(f"{path.name}: {rule.get('alert') or rule.get('record')}",
             metric_names(rule["expr"]))
            for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def test_there_are_three_dashboards_and_each_queries_something() -> None:
    assert {p.stem for p in DASHBOARDS} == {"cluster-overview", "job", "node"}
    for path in DASHBOARDS:
        assert any(names for _where, names in dashboard_queries(path)), path.name


@pytest.mark.parametrize("path", DASHBOARDS + RULES, ids=lambda p: p.name)
def test_every_queried_metric_is_emitted(path: Path, emitted: set[str]) -> None:
    queries = dashboard_queries(path) if path.suffix == ".json" else rule_queries(path)
    unknown = {where: sorted(names - emitted) for where, names in queries if names - emitted}

    assert not unknown, f"queries of metrics no exporter emits: {unknown}"


def test_the_dashboards_use_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in _panels(board["panels"]):
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
