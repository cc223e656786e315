"""Cluster views: nodes with their free resources and admins' holds on them, and health."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Response, request

from services.api.auth import admin_only, current_user
from services.api.bodies import load_body, takes
from services.api.errors import ApiError
from services.api.metrics import api_metrics
from services.api.platform import platform
from services.api.schemas import NodePutSchema
from shared.domain.cluster import NodeFlags, held, node_view_state
from shared.domain.gpuhealth import GpuFault
from shared.domain.lease import conditions_of
from shared.domain.models import Allocation, Node
from shared.infra.config import Settings
from shared.state import gpufaults, leases, passwake
from shared.state.lifecycle import claim_pass_request
from shared.state.store import NodeNotFound, Store

log = logging.getLogger("pai.api")

bp = Blueprint("cluster", __name__)


def _node_view(node: Node, allocations: list[Allocation], flags: NodeFlags,
               condition: tuple[str, str],
               faults: Mapping[int, GpuFault] | None = None) -> dict[str, Any]:
    used = held(allocations)
    faults = faults or {}
    used_gpus = used.used_gpus(node)
    return {
        "name": node.name,
        "ip": node.ip,
        "state": node_view_state(condition[0], flags, used.tasks),
        "condition": condition[0],
        "conditionReason": condition[1],
        "schedulable": flags.accepts_work,
        "draining": flags.drain,
        "cordonReason": flags.reason,
        "cordonedBy": None if flags.accepts_work else flags.by,
        "cordonedTime": None if flags.accepts_work else flags.at_ms,
        "lastHeartbeat": node.heartbeat_ms,
        "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model,
                  "memoryMB": g.memory_mb, "group": g.group, "used": g.index in used_gpus,
                  **_gpu_health(faults.get(g.index))}
                 for g in node.gpus],
        "gpuUnhealthy": sum(1 for g in node.gpus if g.index in faults),
        "gpuTotal": len(node.gpus),
        "gpuUsed": len(used_gpus),
        "gpuFree": sum(1 for g in node.gpus if g.index not in used_gpus and g.index not in faults),
        "cpuTotal": node.cpus,
        "cpuUsed": used.cpus,
        "cpuFree": node.cpus - used.cpus,
        "memoryMBTotal": node.memory_mb,
        "memoryMBUsed": used.memory_mb,
        "memoryMBFree": node.memory_mb - used.memory_mb,
        "tasks": used.tasks,
    }


def _gpu_health(fault: GpuFault | None) -> dict[str, Any]:
    """A GPU's health as the node view shows it (shared/domain/gpuhealth.py)."""
    if fault is None:
        return {"healthy": True, "unhealthyReason": "", "unhealthySince": None}
    return {"healthy": False, "unhealthyReason": fault.reason,
            "unhealthySince": fault.since_ms}


def _node_views(nodes: list[Node]) -> list[dict[str, Any]]:
    """The nodes as the API shows them: five more round trips, however many."""
    pai = platform()
    allocations = pai.store.all_allocations([node.name for node in nodes])
    flags = pai.store.node_flags()
    faults = gpufaults.read_faults(pai.store.r)
    conditions = node_conditions(pai.store, pai.settings)
    return [_node_view(node, allocations[node.name], flags.get(node.name, NodeFlags()),
                       conditions.get(node.name, ("LOST", "never renewed a lease")),
                       faults.get(node.name))
            for node in nodes]


def node_conditions(store: Store, settings: Settings) -> dict[str, tuple[str, str]]:
    """Every node's condition and its reason, judged now from the leases as
    the scheduler judges them (shared/domain/lease.py)."""
    conditions = conditions_of(leases.read_cluster(store), int(settings.node_lost_seconds * 1000),
                               int(settings.node_settle_seconds * 1000))
    return {name: (condition.value, reason) for name, (condition, reason) in conditions.items()}


def _node_or_404(name: str) -> dict[str, Any]:
    node = platform().store.get_node(name)
    if node is None:
        raise ApiError("NoNodeError", f"node {name} has never reported", 404)
    return _node_views([node])[0]


@bp.get("/api/v1/nodes")
def nodes() -> list[dict[str, Any]]:
    """Every node that ever reported, with its free and used resources and
    whether it takes new work.
    ---
    get:
      responses: {200: [Node]}
    """
    return _node_views(platform().store.get_nodes())


@bp.get("/api/v1/nodes/<name>")
def get_node(name: str) -> dict[str, Any]:
    """One node: its resources, its GPUs' model and topology, and its state.
    ---
    get:
      errors: [404]
      responses: {200: Node}
    """
    return _node_or_404(name)


@bp.put("/api/v1/nodes/<name>")
@admin_only
@takes(NodePutSchema())
def put_node(name: str) -> dict[str, Any]:
    """Cordon, drain or uncordon a node (admin only; docs/nodes.md).

    `{"schedulable": false}`: no new work lands, its tasks run on.
    `{"drain": true}`: that, and the scheduler preempts its jobs and requeues
    them. `{"schedulable": true}`: back in service, any drain ended.
    ---
    put:
      errors: [404]
      responses: {200: Node}
    """
    body = load_body()
    try:
        platform().store.set_node_flags(
            name, schedulable=body.get("schedulable"), drain=body.get("drain"),
            reason=body.get("reason"), by=current_user().username)
    except NodeNotFound:
        raise ApiError("NoNodeError", f"node {name} has never reported", 404) from None
    except ValueError as error:
        raise ApiError("BadRequestError", str(error)) from None
    return _node_or_404(name)


@bp.delete("/api/v1/nodes/<name>/gpus/<int:index>/fault")
@admin_only
def clear_gpu_fault(name: str, index: int) -> dict[str, Any]:
    """Mark a GPU healthy again after looking at it (admin only; docs/monitoring.md).
    ---
    delete:
      errors: [404]
      responses: {200: Node}
    """
    view = _node_or_404(name)
    if index not in {g["index"] for g in view["gpus"]}:
        raise ApiError("NoGpuError", f"node {name} has no GPU {index}", 404)
    cleared = gpufaults.clear_fault(platform().store.r, name, index)
    if cleared is None:
        raise ApiError("NoGpuFaultError", f"GPU {index} of node {name} is healthy", 404)
    log.info("%s cleared GPU %d of node %s (was: %s)", current_user().username, index, name,
             cleared.reason)
    if claim_pass_request(platform().store):  # waiting jobs may fit now
        passwake.ring_now(platform().store.r)
    return _node_or_404(name)


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
        platform().store.ping()
    except Exception as error:
        return {"status": "unhealthy", "redis": f"unreachable: {error}"}, 503
    return {"status": "ok", "redis": "ok"}, 200


@bp.get("/prometheus/targets")
def prometheus_targets() -> list[dict[str, Any]]:
    """Every node's metrics exporter, in Prometheus' HTTP service discovery
    form (`http_sd_configs`), so Prometheus follows the nodes as they join,
    with their condition as a label. Public, as /metrics is.
    ---
    get:
      security: []
      responses: {200: [{type: object}]}
    """
    pai = platform()
    conditions = node_conditions(pai.store, pai.settings)
    return [{"targets": [node.exporter],
             "labels": {"node": node.name,
                        "pai_node_condition": conditions.get(node.name, ("LOST", ""))[0]}}
            for node in pai.store.get_nodes() if node.exporter]


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
