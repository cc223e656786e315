"""Rich renderings of the API's answers: tables for people (scripts use --output json).

Every cell is plain `Text`, so a bracket in a diagnostic is never read as
rich markup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from pai_cli.formatting import (
    NONE,
    ago,
    elapsed,
    format_gpus,
    format_mb,
    format_ports,
    format_time,
)

STATE_STYLES = {
    "WAITING": "yellow", "RUNNING": "cyan", "STOPPING": "magenta", "LAUNCHING": "cyan",
    "SUCCEEDED": "green", "FAILED": "red", "STOPPED": "dim", "READY": "green", "LOST": "red",
    "CORDONED": "yellow", "DRAINING": "magenta", "DRAINED": "dim",
}


def _cell(value: Any) -> Text:
    return Text(NONE if value is None or value == "" else str(value))


def _state(value: Any) -> Text:
    return Text(str(value), style=STATE_STYLES.get(str(value), ""))


def _table(title: str | None, columns: Sequence[str], *, right: Iterable[str] = (),
           wrap: Iterable[str] = ()) -> Table:
    """A borderless table; only the `wrap` columns (free text) wrap when the
    terminal is narrow, so names, times and addresses stay whole."""
    table = Table(title=title, title_justify="left", box=None, header_style="bold",
                  pad_edge=False)
    numeric, wrapping = set(right), set(wrap)
    for column in columns:
        table.add_column(column, justify="right" if column in numeric else "left",
                         no_wrap=column not in wrapping, overflow="fold")
    return table


def jobs_table(rows: Sequence[Mapping[str, Any]], gpus: Mapping[str, int | None],
               now: int, *, waiting: bool = False) -> Table:
    """The job list; `waiting`: why each one waits instead of how long it ran."""
    last = ["WAITING FOR"] if waiting else ["DURATION", "RETRIES"]
    table = _table(None, ["NAME", "USER", "VC", "CLASS", "STATE", "GPUS", "SUBMITTED", *last],
                   right=("GPUS", "RETRIES"), wrap=("NAME", "WAITING FOR"))
    for row in rows:
        state = row.get("state")
        if row.get("mode") == "borrowed":
            state = f"{state} (borrowed)"
        cells = [_cell(row["name"]), _cell(row.get("username")),
                 _cell(row.get("virtualCluster")), _cell(row.get("priorityClass")),
                 _state(state), _cell(gpus.get(row["name"])),
                 _cell(format_time(row.get("createdTime"), seconds=False))]
        if waiting:
            cells.append(_cell(row.get("waitingReason") or "a scheduling pass"))
        else:
            cells += [_cell(elapsed(row.get("createdTime"), row.get("completedTime"), now)),
                      _cell(row.get("retries"))]
        table.add_row(*cells)
    return table


def _field_grid(pairs: Sequence[tuple[str, Any]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in pairs:
        grid.add_row(Text(label), value if isinstance(value, Text) else _cell(value))
    return grid


def job_view(detail: Mapping[str, Any], now: int) -> RenderableType:
    """`pai status`: the job, why it waits, its attempts and its current tasks."""
    status = detail["jobStatus"]
    state = status.get("state")
    pairs: list[tuple[str, Any]] = [
        ("Job", f"{status.get('username')}/{detail['name']}"),
        ("State", _state(state if status.get("subState") in (None, state)
                         else f"{state} ({status['subState']})")),
        ("Virtual cluster", status.get("virtualCluster")),
        ("Attempt", status.get("attemptIndex")),
        ("Retries", status.get("retries")),
        ("Submitted", format_time(status.get("createdTime"))),
        ("Completed", format_time(status.get("completedTime"))),
        ("Duration", elapsed(status.get("createdTime"), status.get("completedTime"), now)),
    ]
    if status.get("executionType") == "STOP" and state != "STOPPED":
        pairs.append(("Stop", "requested"))
    if status.get("priorityClass"):
        pairs.append(("Priority class", status.get("priorityClass")))
    if status.get("mode"):
        pairs.append(("Runs on", "borrowed GPUs (preemptible)" if status["mode"] == "borrowed"
                      else "its virtual cluster's guarantee"))
    if status.get("preemptedBy"):
        pairs.append(("Preempted by", f"{status['preemptedBy']}, stopped at "
                      f"{format_time(status.get('preemptionDeadline'))} at the latest"))
    if state == "WAITING":
        pairs += _waiting_pairs(status)
    if status.get("appExitCode") is not None:
        pairs.append(("Exit code", status.get("appExitCode")))
    if status.get("appExitDiagnostics"):
        pairs.append(("Diagnostics", status.get("appExitDiagnostics")))
    parts: list[RenderableType] = [_field_grid(pairs)]
    attempts = detail.get("attempts") or []
    if attempts:
        parts += [Text(""), attempts_table(attempts)]
    parts += [Text(""), tasks_table(detail.get("taskRoles") or {}, status.get("attemptIndex"))]
    return Group(*parts)


def _waiting_pairs(status: Mapping[str, Any]) -> list[tuple[str, Any]]:
    waiting = status.get("waiting")
    if not waiting:
        return [("Waiting for", status.get("waitingReason") or "a scheduling pass")]
    pairs: list[tuple[str, Any]] = [
        ("Waiting for", f"{waiting.get('message')} [{waiting.get('reason')}]"),
        ("Position", f"{waiting.get('position')} in {status.get('virtualCluster')} "
                     f"({waiting.get('ahead')} ahead)")]
    blockers = waiting.get("blockedBy") or []
    if blockers:
        pairs.append(("Blocked by", ", ".join(f"{b.get('kind')} {b.get('name')}"
                                              for b in blockers)))
    if waiting.get("estimatedStartTime"):
        pairs.append(("Expected start", format_time(waiting["estimatedStartTime"])))
    return pairs


def attempts_table(attempts: Sequence[Mapping[str, Any]]) -> Table:
    table = _table("Attempts", ["#", "STATE", "STARTED", "COMPLETED", "EXIT", "REASON"],
                   right=("#", "EXIT"), wrap=("REASON",))
    for attempt in attempts:
        reason = attempt.get("reason") or ""
        if attempt.get("platformFailure"):
            reason = f"{reason} (platform failure, not counted)".strip()
        elif attempt.get("preemptedBy"):
            reason = f"{reason} (not counted)"
        table.add_row(_cell(attempt.get("attemptIndex")), _state(attempt.get("state")),
                      _cell(format_time(attempt.get("startedTime"))),
                      _cell(format_time(attempt.get("completedTime"))),
                      _cell(attempt.get("exitCode")), _cell(reason))
    return table


def tasks_table(roles: Mapping[str, Any], attempt: Any) -> Table:
    """One row per task: where it runs (node, IP, ports, GPU indices) and how it ended."""
    title = "Tasks" if attempt is None else f"Tasks (attempt {attempt})"
    table = _table(title, ["TASK", "STATE", "NODE", "IP", "PORTS", "GPUS", "EXIT",
                           "DIAGNOSTICS"], right=("EXIT",), wrap=("DIAGNOSTICS",))
    for role, entry in roles.items():
        for task in entry.get("taskStatuses") or []:
            table.add_row(_cell(f"{role}[{task.get('taskIndex')}]"),
                          _state(task.get("taskState")), _cell(task.get("containerNodeName")),
                          _cell(task.get("containerIp")),
                          _cell(format_ports(task.get("containerPorts"))),
                          _cell(format_gpus(task.get("containerGpus"))),
                          _cell(task.get("containerExitCode")),
                          _cell(task.get("containerExitDiagnostics")))
    return table


def gpu_models(node: Mapping[str, Any]) -> str:
    return ", ".join(sorted({g.get("model") or "" for g in node.get("gpus") or []} - {""}))


def nodes_table(nodes: Sequence[Mapping[str, Any]], now: int) -> Table:
    table = _table(None, ["NAME", "STATE", "IP", "GPU MODEL", "GPUS", "FREE", "CPUS",
                          "MEMORY", "TASKS", "HEARTBEAT", "REASON"],
                   right=("GPUS", "FREE", "CPUS", "MEMORY", "TASKS"), wrap=("REASON",))
    for node in nodes:
        table.add_row(
            _cell(node.get("name")), _state(node.get("state")), _cell(node.get("ip")),
            _cell(gpu_models(node)),
            _cell(f"{node.get('gpuUsed', 0)}/{node.get('gpuTotal', 0)}"),
            _cell(node.get("gpuFree")),
            _cell(f"{node.get('cpuUsed', 0)}/{node.get('cpuTotal', 0)}"),
            _cell(f"{format_mb(node.get('memoryMBUsed'))}/"
                  f"{format_mb(node.get('memoryMBTotal'))}"),
            _cell(node.get("tasks")), _cell(ago(node.get("lastHeartbeat"), now)),
            _cell("; ".join([node.get("cordonReason") or "", *gpu_faults(node)]).strip("; ")))
    return table


def gpu_faults(node: Mapping[str, Any]) -> list[str]:
    """'GPU 3 unhealthy: XID 79' for each GPU its monitor saw fail."""
    return [f"GPU {g.get('index')} unhealthy: {g.get('unhealthyReason')}"
            for g in node.get("gpus") or [] if g.get("healthy") is False]


def node_line(node: Mapping[str, Any]) -> str:
    """What an admin's change left: 'node n1 DRAINING (2 tasks left): reboot'."""
    state = str(node.get("state"))
    left = f" ({node.get('tasks')} tasks left)" if state == "DRAINING" else ""
    reason = f": {node['cordonReason']}" if node.get("cordonReason") else ""
    return f"node {node.get('name')} {state}{left}{reason}"


def vcs_table(vcs: Mapping[str, Mapping[str, Any]]) -> Table:
    """Each VC's guarantee, what it uses (and of that, borrows) and its queue."""
    numbers = ("GUARANTEED", "GPUS USED", "BORROWED", "GPUS FREE", "RUNNING", "WAITING")
    table = _table(None, ["NAME", *numbers, "BORROWS", "GPU-HOURS BUDGET", "DESCRIPTION"],
                   right=numbers, wrap=("DESCRIPTION",))
    for name, vc in vcs.items():
        used = (vc.get("resourcesUsed") or {}).get("GPUs")
        table.add_row(_cell(name), _cell(vc.get("gpuGuaranteed", vc.get("gpuQuota"))),
                      _cell(used), _cell(vc.get("gpuBorrowed")),
                      _cell("-" if vc.get("gpuFree") is None else vc["gpuFree"]),
                      _cell(vc.get("runningJobs")), _cell(vc.get("waitingJobs")),
                      _cell(None if vc.get("borrowing") is None
                            else "yes" if vc["borrowing"] else "no"),
                      _cell(budget_cell(vc)), _cell(vc.get("description")))
    return table


def budget_cell(vc: Mapping[str, Any]) -> str | None:
    """'12.50/100 week, then wait': spent of the budget this period (none: None)."""
    budget = vc.get("gpuHoursBudget")
    if budget is None:
        return None
    spent = vc.get("gpuHoursSpent")
    used = "?" if spent is None else f"{float(spent):,.2f}"
    return (f"{used}/{float(budget):,g} {vc.get('budgetPeriod')}, "
            f"then {vc.get('onBudgetExhausted')}")


def _hours(seconds: Any) -> Text:
    return _cell(None if seconds is None else f"{float(seconds) / 3600:,.2f}")


def usage_table(rows: Sequence[Mapping[str, Any]], by: Sequence[str]) -> Table:
    """Usage rows in hours: the grouping columns, then GPU, CPU and memory (GB) hours."""
    numbers = ("GPU HOURS", "CPU HOURS", "MEMORY GB-HOURS")
    table = _table(None, [d.upper() for d in by] + list(numbers), right=numbers)
    for row in rows:
        memory = row.get("memoryMbSeconds")
        table.add_row(*(_cell(row.get(d)) for d in by), _hours(row.get("gpuSeconds")),
                      _hours(row.get("cpuSeconds")),
                      _hours(None if memory is None else float(memory) / 1024))
    return table


def user_budgets_table(budgets: Sequence[Mapping[str, Any]]) -> Table:
    """Users' own budgets within VCs: spent of the budget this period, then what."""
    numbers = ("SPENT", "BUDGET")
    table = _table(None, ["VC", "USER", *numbers, "PERIOD", "ONCE SPENT"], right=numbers)
    for budget in budgets:
        spent = budget.get("gpuHoursSpent")
        table.add_row(_cell(budget.get("vc")), _cell(budget.get("user")),
                      _cell(None if spent is None else f"{float(spent):,.2f}"),
                      _cell(f"{float(budget.get('gpuHoursBudget') or 0):,g}"),
                      _cell(budget.get("budgetPeriod")),
                      _cell(("spent: " if budget.get("exhausted") else "")
                            + str(budget.get("onBudgetExhausted"))))
    return table
