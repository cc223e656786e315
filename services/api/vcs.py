"""Virtual clusters: GPU quotas, what each uses now and who waits in it."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from services.api.auth import accounts, admin_only
from services.api.bodies import load_body, takes
from services.api.errors import ApiError
from services.api.platform import platform
from services.api.schemas import VirtualClusterPutSchema
from shared import keys
from shared.accounts import DEFAULT_VC, AccountError, VirtualCluster
from shared.capabilities import capability_list_errors
from shared.cluster import Held, held_by_vc
from shared.states import JobState

bp = Blueprint("vcs", __name__, url_prefix="/api/v1")


def _usage() -> dict[str, Held]:
    """What each VC's allocations hold, over every node that ever reported."""
    store = platform().store
    allocations = store.all_allocations(list(store.node_heartbeats()))
    return held_by_vc(a for allocs in allocations.values() for a in allocs)


def _views(vcs: list[VirtualCluster]) -> dict[str, dict[str, Any]]:
    usage = _usage()
    r = platform().store.r
    pipe = r.pipeline(transaction=False)
    for vc in vcs:
        for state in (JobState.WAITING, JobState.RUNNING):
            pipe.zintercard(2, [keys.vc_jobs(vc.name), keys.state_jobs(state)])
    counts = pipe.execute() if vcs else []
    views = {}
    for i, vc in enumerate(vcs):
        used = usage.get(vc.name, Held())
        views[vc.name] = {
            "name": vc.name,
            "description": vc.description,
            "gpuQuota": vc.gpu_quota,
            "resourcesUsed": {"GPUs": len(used.gpus), "CPUs": used.cpus,
                              "memoryMB": used.memory_mb, "tasks": used.tasks},
            "gpuFree": None if vc.gpu_quota is None else max(0, vc.gpu_quota - len(used.gpus)),
            "waitingJobs": counts[2 * i],
            "runningJobs": counts[2 * i + 1],
            "allowedCapabilities": vc.allowed_capabilities,
        }
    return views


def _vc_or_404(name: str) -> VirtualCluster:
    vc = accounts().get_vc(name)
    if vc is None:
        raise ApiError("NoVirtualClusterError", f"virtual cluster {name} does not exist", 404)
    return vc


@bp.get("/virtual-clusters")
def list_vcs() -> dict[str, dict[str, Any]]:
    """Every virtual cluster by name, with its quota, usage and queue.
    ---
    get:
      responses:
        200:
          content:
            application/json:
              schema:
                type: object
                additionalProperties: {$ref: '#/components/schemas/VirtualCluster'}
    """
    return _views(accounts().list_vcs())


@bp.get("/virtual-clusters/<name>")
def get_vc(name: str) -> dict[str, Any]:
    """One virtual cluster: quota, what it uses now and who waits in it.
    ---
    get:
      errors: [404]
      responses: {200: VirtualCluster}
    """
    return _views([_vc_or_404(name)])[name]


@bp.put("/virtual-clusters/<name>")
@admin_only
@takes(VirtualClusterPutSchema())
def put_vc(name: str) -> tuple[dict[str, Any], int]:
    """Create or change a virtual cluster (admin only).
    ---
    put:
      responses:
        200:
          description: changed
          content: {application/json: {schema: VirtualCluster}}
        201:
          description: created
          content: {application/json: {schema: VirtualCluster}}
    """
    body = load_body()
    problems = capability_list_errors(body["allowedCapabilities"])
    if problems:  # beyond the schema's check: repeats, and what no VC may allow
        raise ApiError("BadRequestError", "the request body is not valid",
                       fields={"allowedCapabilities": problems})
    existed = accounts().get_vc(name) is not None
    try:
        accounts().put_vc(VirtualCluster(name, body["gpuQuota"], body["description"],
                                         allowed_capabilities=body["allowedCapabilities"]))
    except AccountError as error:
        raise ApiError("BadRequestError", str(error)) from None
    return _views([_vc_or_404(name)])[name], 200 if existed else 201


@bp.delete("/virtual-clusters/<name>")
@admin_only
def delete_vc(name: str) -> dict[str, Any]:
    """Delete an idle virtual cluster (admin only; `default` stays).
    ---
    delete:
      errors: [404, 409]
      responses: {200: Message}
    """
    if name == DEFAULT_VC:
        raise ApiError("ForbiddenVirtualClusterError", "the default virtual cluster stays", 403)
    view = _views([_vc_or_404(name)])[name]
    if view["waitingJobs"] or view["runningJobs"]:
        raise ApiError("ConflictVirtualClusterError",
                       f"virtual cluster {name} still has waiting or running jobs", 409)
    accounts().delete_vc(name)
    return {"message": f"virtual cluster {name} deleted"}
