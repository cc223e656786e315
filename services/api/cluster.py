"""Cluster views: nodes with their free resources, and health."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, request

from services.api.metrics import api_metrics
from services.api.platform import platform
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
    store = pai.store
    lost_after = int(pai.settings.node_lost_seconds * 1000)
    now = now_ms()
    rows = []
    for node in store.get_nodes():
        allocs = store.get_allocations(store.r, node.name).values()
        used_gpus = sorted({g for a in allocs for g in a.gpus})
        used_cpus = sum(a.cpus for a in allocs)
        used_memory = sum(a.memory_mb for a in allocs)
        rows.append({
            "name": node.name,
            "ip": node.ip,
            "state": "READY" if now - node.heartbeat_ms < lost_after else "LOST",
            "lastHeartbeat": node.heartbeat_ms,
            "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model,
                      "memoryMB": g.memory_mb, "used": g.index in used_gpus}
                     for g in node.gpus],
            "gpuTotal": len(node.gpus),
            "gpuUsed": len(used_gpus),
            "gpuFree": len(node.gpus) - len(used_gpus),
            "cpuTotal": node.cpus,
            "cpuUsed": used_cpus,
            "cpuFree": node.cpus - used_cpus,
            "memoryMBTotal": node.memory_mb,
            "memoryMBUsed": used_memory,
            "memoryMBFree": node.memory_mb - used_memory,
            "tasks": len(allocs),
        })
    return rows


@bp.get("/healthz")
def healthz() -> tuple[dict[str, Any], int]:
    """Whether the API can do its job: Redis answers.
    ---
    get:
      tags: [meta]
      responses:
        200: {content: {application/json: {schema: Health}}}
        503: {content: {application/json: {schema: Health}}}
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
