"""Cluster views: nodes with their free resources, and health."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, request

from services.api.metrics import api_metrics
from services.api.platform import platform
from shared.cluster import held, node_state
from shared.models import now_ms

bp = Blueprint("cluster", __name__)


@bp.get("/api/v1/nodes")
def nodes() -> list[dict[str, Any]]:
    """Every node that ever reported, with its free and used resources.
    ---
    get:
      responses:
        200:
          content: {application/json: {schema: {type: array, items: Node}}}
    """
    pai = platform()
    now = now_ms()
    nodes = pai.store.get_nodes()
    allocations = pai.store.all_allocations([node.name for node in nodes])
    rows = []
    for node in nodes:
        used = held(allocations[node.name])
        used_gpus = used.used_gpus(node)
        rows.append({
            "name": node.name,
            "ip": node.ip,
            "state": node_state(node.heartbeat_ms, now, pai.settings.node_lost_seconds),
            "lastHeartbeat": node.heartbeat_ms,
            "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model,
                      "memoryMB": g.memory_mb, "used": g.index in used_gpus}
                     for g in node.gpus],
            "gpuTotal": len(node.gpus),
            "gpuUsed": len(used_gpus),
            "gpuFree": len(node.gpus) - len(used_gpus),
            "cpuTotal": node.cpus,
            "cpuUsed": used.cpus,
            "cpuFree": node.cpus - used.cpus,
            "memoryMBTotal": node.memory_mb,
            "memoryMBUsed": used.memory_mb,
            "memoryMBFree": node.memory_mb - used.memory_mb,
            "tasks": used.tasks,
        })
    return rows


@bp.get("/healthz")
def healthz() -> tuple[dict[str, Any], int]:
    """Whether the API can do its job: Redis answers.
    ---
    get:
      tags: [meta]
      responses:
        200: Health
        503: Health
    """
    try:
        platform().store.r.ping()
    except Exception as error:
        return {"status": "unhealthy", "redis": f"unreachable: {error}"}, 503
    return {"status": "ok", "redis": "ok"}, 200


@bp.get("/metrics")
def metrics() -> Response:
    """The platform's Prometheus metrics (text exposition format), computed now.
    ---
    get:
      tags: [meta]
      responses:
        200:
          description: Prometheus text format 0.0.4
          content: {text/plain: {schema: {type: string}}}
    """
    return api_metrics().exposition(request.headers.get("Accept", ""))
