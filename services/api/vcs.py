"""Virtual clusters: GPU quotas, what each uses now and who waits in it."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from services.api.auth import accounts, admin_only, current_user
from services.api.bodies import load_body, takes
from services.api.errors import ApiError
from services.api.platform import platform
from services.api.schemas import UserBudgetPutSchema, VirtualClusterPutSchema
from shared.domain.capabilities import capability_list_errors
from shared.domain.cluster import BORROWED, Held, VcPolicy, held_by_vc, takes_work, vc_policies
from shared.domain.lease import unready_of
from shared.domain.states import JobState
from shared.infra.clock import now_ms
from shared.state import leases
from shared.state.accounts import DEFAULT_VC, AccountError, NoSuchAccount, VirtualCluster
from shared.state.usage import Budget, Owner, Spend, read_spends

bp = Blueprint("vcs", __name__, url_prefix="/api/v1")

QUEUE_SHOWN = 1000


def _usage() -> tuple[dict[str, Held], dict[str, int]]:
    """What each VC's allocations hold, over every node that ever reported,
    and how many of those GPUs its borrowing jobs hold."""
    store = platform().store
    allocations = [a for allocs in store.all_allocations(list(store.node_heartbeats())).values()
                   for a in allocs]
    ids = sorted({a.job_id for a in allocations})
    borrowing = {job_id for job_id, (mode,) in zip(ids, store.job_fields(ids, ["mode"]),
                                                    strict=True) if mode == BORROWED}
    borrowed: dict[str, int] = {}
    for a in allocations:
        if a.job_id in borrowing:
            borrowed[a.vc] = borrowed.get(a.vc, 0) + len(a.gpus)
    return held_by_vc(allocations), borrowed


def _guarantees(vcs: list[VirtualCluster]) -> dict[str, VcPolicy]:
    """Every VC's guarantee in force (`default`'s depends on the live GPUs)."""
    settings, store = platform().settings, platform().store
    now, flags = now_ms(), store.node_flags()
    unready = unready_of(leases.read_cluster(store), int(settings.node_lost_seconds * 1000),
                         int(settings.node_settle_seconds * 1000))
    gpus = sum(len(n.gpus) for n in store.get_nodes()
               if takes_work(n, flags.get(n.name), now, settings.node_lost_seconds, unready))
    return vc_policies({vc.name: vc.gpu_quota for vc in vcs},
                       {vc.name: vc.borrowing for vc in vcs}, gpus)


def _spent(vcs: list[VirtualCluster]) -> dict[Owner, Spend]:
    """What each budget of `vcs` (a VC's, user "", and its users' own that
    the caller may see) has used this period, up to now: one read."""
    budgets: dict[Owner, Budget] = {(vc.name, ""): vc.budget for vc in vcs
                                    if vc.budget is not None}
    for vc in vcs:
        budgets.update(_visible(vc))
    if not budgets:
        return {}
    store = platform().store
    held = [a for allocs in store.all_allocations(list(store.node_heartbeats())).values()
            for a in allocs]
    return read_spends(store.r, budgets, held, now_ms())


def _visible(vc: VirtualCluster) -> dict[Owner, Budget]:
    """The users' budgets of `vc` the caller may see: an admin every budget
    given to a user, anyone else their own (or the VC's default for them, if
    they may use the VC)."""
    me = current_user()
    if me.admin:
        return vc.user_budgets()
    mine = vc.user_budgets([me.username] if me.may_use(vc.name) else [])
    return {owner: b for owner, b in mine.items() if owner[1] == me.username}


def budget_view(spend: Spend, vc: VirtualCluster) -> dict[str, Any]:
    """A user's budget within a VC as the API shows it (UserBudget)."""
    return {"vc": spend.vc, "user": spend.user, "gpuHoursBudget": spend.budget.gpu_hours,
            "budgetPeriod": spend.budget.period, "onBudgetExhausted": spend.budget.on_exhausted,
            "gpuHoursSpent": spend.gpu_hours, "exhausted": spend.exhausted,
            "default": spend.user not in vc.user_gpu_hours_budgets}


def _views(vcs: list[VirtualCluster],
           every: list[VirtualCluster] | None = None) -> dict[str, dict[str, Any]]:
    """The views of `vcs`; `every` VC (read here unless given) sets the
    guarantee `default` gets."""
    usage, borrowed = _usage()
    guarantees = _guarantees(accounts().list_vcs() if every is None else every)
    counts = platform().store.count_vc_jobs([vc.name for vc in vcs],
                                            (JobState.WAITING, JobState.RUNNING))
    spent = _spent(vcs)
    views = {}
    for vc in vcs:
        used = usage.get(vc.name, Held())
        guarantee = guarantees.get(vc.name, VcPolicy(0)).guarantee
        lent = borrowed.get(vc.name, 0)
        views[vc.name] = {
            "name": vc.name,
            "description": vc.description,
            "gpuQuota": vc.gpu_quota,
            "gpuGuaranteed": guarantee,
            "borrowing": vc.borrowing,
            "idleGpuAction": vc.idle_gpu_action,
            "resourcesUsed": {"GPUs": len(used.gpus), "CPUs": used.cpus,
                              "memoryMB": used.memory_mb, "tasks": used.tasks},
            "gpuBorrowed": lent,
            "gpuFree": max(0, guarantee - (len(used.gpus) - lent)),
            "waitingJobs": counts[vc.name, JobState.WAITING],
            "runningJobs": counts[vc.name, JobState.RUNNING],
            "allowedCapabilities": vc.allowed_capabilities,
            "gpuHoursBudget": vc.gpu_hours_budget,
            "budgetPeriod": vc.budget_period,
            "onBudgetExhausted": vc.on_budget_exhausted,
            "gpuHoursSpent": spent[(vc.name, "")].gpu_hours
            if (vc.name, "") in spent else None,
            "defaultUserGpuHoursBudget": vc.default_user_gpu_hours_budget,
            "userBudgets": [budget_view(spent[owner], vc) for owner in _visible(vc)],
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
    vcs = accounts().list_vcs()
    return _views(vcs, vcs)


@bp.get("/virtual-clusters/<name>")
def get_vc(name: str) -> dict[str, Any]:
    """One virtual cluster: guarantee, what it uses now and its queue in order.
    ---
    get:
      errors: [404]
      responses: {200: VirtualCluster}
    """
    view = _views([_vc_or_404(name)])[name]
    view["queue"] = platform().store.vc_queue_ids(name, QUEUE_SHOWN)
    return view


@bp.put("/virtual-clusters/<name>")
@admin_only
@takes(VirtualClusterPutSchema())
def put_vc(name: str) -> tuple[dict[str, Any], int]:
    """Create or change a virtual cluster (admin only).
    ---
    put:
      upserts: VirtualCluster
    """
    body = load_body()
    problems = capability_list_errors(body["allowedCapabilities"])
    if problems:  # beyond the schema's check: repeats, and what no VC may allow
        raise ApiError("BadRequestError", "the request body is not valid",
                       fields={"allowedCapabilities": problems})
    existed = accounts().get_vc(name) is not None
    try:
        accounts().put_vc(VirtualCluster(name, body["gpuQuota"], body["description"],
                                         allowed_capabilities=body["allowedCapabilities"],
                                         borrowing=body["borrowing"],
                                         gpu_hours_budget=body["gpuHoursBudget"],
                                         budget_period=body["budgetPeriod"],
                                         on_budget_exhausted=body["onBudgetExhausted"],
                                         default_user_gpu_hours_budget=body[
                                             "defaultUserGpuHoursBudget"],
                                         idle_gpu_action=body["idleGpuAction"]))
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


def _user_budget_view(name: str, user: str) -> dict[str, Any]:
    """`user`'s budget in the VC, their own or the VC's default (if they exist
    and may use the VC), with its spend."""
    vc = _vc_or_404(name)
    account = accounts().get_user(user)
    covered = [user] if account is not None and account.may_use(vc.name) else []
    budget = vc.user_budgets(covered).get((vc.name, user))
    if budget is None:
        raise ApiError("NoUserBudgetError",
                       f"user {user} has no budget in virtual cluster {vc.name}", 404)
    store = platform().store
    held = [a for allocs in store.all_allocations(list(store.node_heartbeats())).values()
            for a in allocs]
    spent = read_spends(store.r, {(vc.name, user): budget}, held, now_ms())
    return budget_view(spent[(vc.name, user)], vc)


@bp.get("/virtual-clusters/<name>/budgets")
def list_user_budgets(name: str) -> list[dict[str, Any]]:
    """Users' own GPU-hour budgets in a VC, with what each spent this period
    (an admin sees every user's, a user their own).
    ---
    get:
      errors: [404]
      responses: {200: [UserBudget]}
    """
    budgets: list[dict[str, Any]] = _views([_vc_or_404(name)])[name]["userBudgets"]
    return budgets


@bp.get("/virtual-clusters/<name>/budgets/<user>")
def get_user_budget(name: str, user: str) -> dict[str, Any]:
    """One user's own GPU-hour budget in a VC and its spend (an admin, or that user).
    ---
    get:
      errors: [403, 404]
      responses: {200: UserBudget}
    """
    me = current_user()
    if not me.admin and user.lower() != me.username:
        raise ApiError("ForbiddenUserError", "only an admin may read another user's budget",
                       403)
    return _user_budget_view(name, user.lower())


@bp.put("/virtual-clusters/<name>/budgets/<user>")
@admin_only
@takes(UserBudgetPutSchema())
def put_user_budget(name: str, user: str) -> tuple[dict[str, Any], int]:
    """Give a user their own GPU-hour budget within a VC (admin only): per the
    VC's budgetPeriod; once spent, their jobs there do as its
    onBudgetExhausted says.
    ---
    put:
      errors: [404]
      upserts: UserBudget
    """
    body = load_body()
    try:
        new = accounts().set_user_budget(name, user, body["gpuHoursBudget"])
    except NoSuchAccount as error:
        code = "NoVirtualClusterError" if str(error).startswith("virtual") else "NoUserError"
        raise ApiError(code, str(error), 404) from None
    return _user_budget_view(name.lower(), user.lower()), 201 if new else 200


@bp.delete("/virtual-clusters/<name>/budgets/<user>")
@admin_only
def delete_user_budget(name: str, user: str) -> dict[str, Any]:
    """Take a user's own budget within a VC away (admin only); the VC's own stays.
    ---
    delete:
      errors: [404]
      responses: {200: Message}
    """
    _vc_or_404(name)
    if not accounts().delete_user_budget(name, user):
        raise ApiError("NoUserBudgetError",
                       f"user {user} has no budget of their own in virtual cluster {name}", 404)
    return {"message": f"the budget of user {user} in virtual cluster {name} is deleted"}
