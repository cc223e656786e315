"""Usage reports: GPU-, CPU- and memory-seconds per user, VC, day or job,
as JSON or as CSV for chargeback (shared/state/usage.py does the arithmetic)."""

from __future__ import annotations

import csv
import io
from typing import Any

from flask import Blueprint, Response

from services.api.auth import accounts, current_user
from services.api.errors import ApiError
from services.api.platform import platform
from services.api.queries import UsageQuerySchema, load_query, takes_query
from services.api.vcs import budget_view
from shared.domain.models import Allocation, Task, job_id_of
from shared.infra.clock import now_ms
from shared.state import usage

bp = Blueprint("usage", __name__, url_prefix="/api/v1")

# A cell a spreadsheet would run as a formula (CSV injection) gets a quote first.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _scope(query: dict[str, Any]) -> tuple[str | None, str | None]:
    """(user, vc) the report is limited to: anyone but an admin sees only
    their own usage, whatever `user` they ask for."""
    me = current_user()
    user = query.get("user", "").lower() or None
    if not me.admin:
        if user not in (None, me.username):
            raise ApiError("ForbiddenUserError",
                           "only an admin may read another user's usage", 403)
        user = me.username
    vc = query.get("vc", "").lower() or None
    return user, vc


def _allocations(user: str | None) -> list[Allocation]:
    """Every allocation held now (of `user`'s jobs, if given)."""
    store = platform().store
    return [a for allocs in store.all_allocations(list(store.node_heartbeats())).values()
            for a in allocs if user is None or a.job_id.startswith(job_id_of(user, ""))]


def _held_now(user: str | None) -> list[tuple[Allocation, Task | None]]:
    """Every allocation held now (of `user`'s jobs, if given), with its task."""
    store = platform().store
    allocations = _allocations(user)
    if not allocations:
        return []
    return list(zip(allocations, store.allocation_tasks(allocations), strict=True))


def usage_rows(user: str | None, vc: str | None, first: str, last: str,
               by: list[str], now: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """The report's rows, and the instant it is true of: the recorded days
    (only those retention keeps: older ones are gone), plus what running
    tasks have used so far."""
    now = now_ms() if now is None else now
    kept = usage.retained_from(now, platform().settings.usage_retention_days)
    recorded = usage.read_days(platform().store.r,
                               usage.days_between(max(first, kept or first), last))
    running = usage.day_rows(usage.running_intervals(_held_now(user), now))
    rows = usage.report(usage.merge_rows(recorded, running), by,
                        usage.Filter(first, last, user=user, vc=vc))
    return rows, now


def _csv(rows: list[dict[str, Any]], by: list[str], first: str, last: str) -> Response:
    columns = [d for d in usage.DIMENSIONS if d in by] + [name for _, name in usage.RESOURCES]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row[c]) for c in columns])
    return Response(out.getvalue(), mimetype="text/csv", headers={
        "Content-Disposition": f'attachment; filename="pai-usage-{first}-{last}.csv"'})


def _cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


@bp.get("/usage")
@takes_query(UsageQuerySchema())
def get_usage() -> Any:
    """GPU-, CPU- and memory-seconds used, grouped; a user sees their own.
    ---
    get:
      errors: [400, 403]
      responses:
        200:
          content:
            application/json: {schema: UsageReport}
            text/csv: {schema: {type: string}}
    """
    query = load_query()
    user, vc = _scope(query)
    first, last = query["from_"].isoformat(), query["to"].isoformat()
    by = [d for d in usage.DIMENSIONS if d in query["groupBy"]]
    as_of = now_ms()
    rows, as_of = usage_rows(user, vc, first, last, by, as_of)
    if query["format"] == "csv":
        return _csv(rows, by, first, last)
    kept = usage.retained_from(as_of, platform().settings.usage_retention_days)
    return {"from": first, "to": last, "groupBy": by, "asOf": as_of, "rows": rows,
            "retainedFrom": kept, "trimmed": kept is not None and first < kept,
            "budgets": _budgets(user, vc, as_of)}


def _budgets(user: str | None, vc: str | None, now: int) -> list[dict[str, Any]]:
    """The users' budgets the report covers, with their spend this period:
    `user`'s (their own, or a VC's default for them where they may submit),
    or, for an admin's report of all users, every budget given to a user;
    of `vc` only, if given."""
    account = accounts().get_user(user) if user is not None else None
    records = {record.name: record for record in accounts().list_vcs()
               if vc in (None, record.name)}
    budgets = {owner: budget for record in records.values()
               for owner, budget in record.user_budgets(
                   [account.username] if account is not None and account.may_use(record.name)
                   else []).items() if user in (None, owner[1])}
    if not budgets:
        return []
    spends = usage.read_spends(platform().store.r, budgets, _allocations(user), now)
    return [budget_view(spends[owner], records[owner[0]]) for owner in sorted(budgets)]
