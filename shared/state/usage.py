"""Usage accounting: who held which GPUs, CPUs and memory, for how long.

A task's usage is one interval: from its placement (the allocation's start,
`Task.placed_ms`, which a task retry's relaunch keeps) to its exit
(`Task.completed_ms`), times what its allocation holds. It is recorded
once, when the task's exit is settled (shared/state/taskexits.py
`record_task_exit`, inside that compare-and-set), and
rolled up by UTC day, user, virtual cluster and job. Tasks still holding
their allocation count up to "now" when usage is read.

The arithmetic (splitting at UTC midnights, merging into per-day rows,
grouping for a report) is pure and exact: durations are integer
milliseconds, so a day's share of an interval and the totals of a report
add up to the last millisecond. The Redis side (the guarded recording and
the roll-up reads) is at the end of this module.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.domain.models import Allocation, Task, attempt_task_key, split_job_id, task_key
from shared.infra import config
from shared.state import keys, scripts, telemetry

DAY_MS = 24 * 3600 * 1000
# What a report may be grouped by, in the order its rows' keys are shown.
DIMENSIONS = ("day", "user", "vc", "job")
# The resources counted, as the roll-up hashes name them, and as reports do.
RESOURCES = (("gpu", "gpuSeconds"), ("cpu", "cpuSeconds"), ("memory", "memoryMbSeconds"))


def day_of(ms: int) -> str:
    """The UTC day an instant falls in, as YYYY-MM-DD."""
    return dt.datetime.fromtimestamp(ms // 1000, dt.UTC).strftime("%Y-%m-%d")


def day_start_ms(day: str) -> int:
    """The first millisecond of a UTC day given as YYYY-MM-DD."""
    start = dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    return int(start.timestamp()) * 1000


def days_between(first: str, last: str) -> list[str]:
    """Every day from `first` to `last`, both included (none if last < first)."""
    start, end = day_start_ms(first), day_start_ms(last)
    return [day_of(ms) for ms in range(start, end + 1, DAY_MS)]


def split_by_day(start_ms: int, end_ms: int) -> list[tuple[str, int]]:
    """[start, end) cut at UTC midnights: (day, milliseconds in it), in order.

    An interval that ends before it starts (a clock stepped back between
    placement and exit) is empty: usage is never negative.
    """
    parts = []
    at = start_ms
    while at < end_ms:
        midnight = (at // DAY_MS + 1) * DAY_MS
        upto = min(midnight, end_ms)
        parts.append((day_of(at), upto - at))
        at = upto
    return parts


@dataclass(frozen=True)
class Interval:
    """One task's hold on its allocation: [start_ms, end_ms) of gpus/cpus/memory."""

    job_id: str
    attempt: int
    role: str
    index: int
    user: str
    vc: str
    start_ms: int
    end_ms: int
    gpus: int
    cpus: int
    memory_mb: int

    @property
    def key(self) -> str:
        """The record's identity: the task of the attempt, and when it was
        placed (a job deleted and submitted again under its name reuses
        the rest)."""
        return f"{self.job_id}:{self.attempt}:{self.role}:{self.index}@{self.start_ms}"

    @property
    def duration_ms(self) -> int:
        return max(0, self.end_ms - self.start_ms)

    def to_json(self) -> str:
        return json.dumps({"job": self.job_id, "attempt": self.attempt, "role": self.role,
                           "index": self.index, "user": self.user, "vc": self.vc,
                           "startMs": self.start_ms, "endMs": self.end_ms, "gpus": self.gpus,
                           "cpus": self.cpus, "memoryMB": self.memory_mb},
                          separators=(",", ":"))


@dataclass(frozen=True)
class DayUsage:
    """One job's usage on one UTC day, in resource-milliseconds."""

    day: str
    user: str
    vc: str
    job: str
    gpu_ms: int = 0
    cpu_ms: int = 0
    memory_ms: int = 0  # MB-milliseconds

    def amounts(self) -> tuple[int, int, int]:
        return self.gpu_ms, self.cpu_ms, self.memory_ms


def day_rows(intervals: Iterable[Interval]) -> list[DayUsage]:
    """The intervals' usage per (day, user, vc, job), sorted by those."""
    sums: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for interval in intervals:
        for day, ms in split_by_day(interval.start_ms, interval.end_ms):
            row = sums[(day, interval.user, interval.vc, interval.job_id)]
            row[0] += interval.gpus * ms
            row[1] += interval.cpus * ms
            row[2] += interval.memory_mb * ms
    return [DayUsage(*where, *amounts) for where, amounts in sorted(sums.items())]


def running_intervals(held: Iterable[tuple[Allocation, Task | None]],
                      now_ms: int) -> list[Interval]:
    """The usage so far of tasks still holding their allocations.

    A task whose exit is settled is left out: its interval was recorded
    with the exit (the allocation is released just after), so a report read
    in between counts it once. So is an allocation without its task.
    """
    running = []
    for alloc, task in held:
        if task is None or task.state.is_final or task.launched_ms is None:
            continue
        running.append(task_interval(alloc, task, now_ms))
    return running


def task_interval(alloc: Allocation, task: Task, end_ms: int) -> Interval:
    """What `task` held through `alloc`, from its placement to `end_ms`.
    A task bound before placed_ms existed has only its launch time."""
    placed = task.placed_ms if task.placed_ms is not None else task.launched_ms
    start = placed if placed is not None else end_ms
    return Interval(job_id=alloc.job_id, attempt=alloc.attempt, role=alloc.role,
                    index=alloc.index, user=split_job_id(alloc.job_id)[0], vc=alloc.vc,
                    start_ms=start, end_ms=max(start, end_ms), gpus=len(alloc.gpus),
                    cpus=alloc.cpus, memory_mb=alloc.memory_mb)


def merge_rows(*groups: Iterable[DayUsage]) -> list[DayUsage]:
    """Rows of several sources (recorded, running) added where they meet."""
    sums: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for rows in groups:
        for row in rows:
            total = sums[(row.day, row.user, row.vc, row.job)]
            for i, amount in enumerate(row.amounts()):
                total[i] += amount
    return [DayUsage(*where, *amounts) for where, amounts in sorted(sums.items())]


@dataclass(frozen=True)
class Filter:
    """Which rows a report covers: a day range (both ends included), and
    optionally one user and one VC."""

    first_day: str
    last_day: str
    user: str | None = None
    vc: str | None = None

    def keeps(self, row: DayUsage) -> bool:
        return self.first_day <= row.day <= self.last_day \
            and self.user in (None, row.user) and self.vc in (None, row.vc)


def report(rows: Iterable[DayUsage], by: Sequence[str], keep: Filter) -> list[dict[str, Any]]:
    """The kept rows summed per value of the `by` dimensions (an empty `by`:
    one total), as API rows: the dimensions, then the seconds of each
    resource. Sorted by the dimensions."""
    unknown = [d for d in by if d not in DIMENSIONS]
    if unknown:
        raise ValueError(f"cannot group by {unknown}; choose from {DIMENSIONS}")
    ordered = [d for d in DIMENSIONS if d in by]
    sums: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0, 0, 0])
    for row in rows:
        if not keep.keeps(row):
            continue
        values = {"day": row.day, "user": row.user, "vc": row.vc, "job": row.job}
        total = sums[tuple(values[d] for d in ordered)]
        for i, amount in enumerate(row.amounts()):
            total[i] += amount
    return [{**dict(zip(ordered, where, strict=True)),
             **{name: ms / 1000 for (_, name), ms in zip(RESOURCES, amounts, strict=True)}}
            for where, amounts in sorted(sums.items())]


# ------------------------------------------------------------------ Redis

COUNTERS = (telemetry.GPU_SECONDS, telemetry.CPU_SECONDS, telemetry.MEMORY_MB_SECONDS)


def rollup_field(user: str, vc: str, job: str, resource: str) -> str:
    """A day hash's field: whose usage of which resource (JSON, since job
    ids hold characters no separator is safe from)."""
    return json.dumps([user, vc, job, resource], separators=(",", ":"))


def vc_total_field(vc: str) -> str:
    """A day hash's field of one VC's GPU-milliseconds that day, what a
    budget's spend reads (HMGET, not the whole day). Three elements, so
    reports (parse_day) skip it."""
    return json.dumps(["vc", vc, "gpu"], separators=(",", ":"))


def vc_user_total_field(vc: str, user: str) -> str:
    """A day hash's field of one user's GPU-milliseconds in one VC that day,
    what a user's budget reads. Five elements, so reports skip it."""
    return json.dumps(["vc", vc, "user", user, "gpu"], separators=(",", ":"))


def expires_at_ms(day: str, retention_days: int) -> int | None:
    """When a day's usage keys go: `retention_days` after the day ended
    (None: retention 0, kept for ever)."""
    return day_start_ms(day) + (retention_days + 1) * DAY_MS if retention_days else None


def retained_from(now_ms: int, retention_days: int) -> str | None:
    """The oldest day whose usage is still kept (None: every day is)."""
    return day_of(now_ms - retention_days * DAY_MS) if retention_days else None


def day_of_key(key: str) -> str | None:
    """The day of a usage day or records key (None: not one of those)."""
    day = key.rpartition(":")[2]
    try:
        day_start_ms(day)
    except ValueError:
        return None
    return day if key in (keys.usage_day(day), keys.usage_records(day)) else None


def enforce_retention(r: Any, retention_days: int, count: int) -> int:
    """One bounded step of the walk that gives every usage key the expiry
    `retention_days` asks for (keys written before writes set it, or under
    another setting): one SCAN of `count` and two pipelines. A day already
    past its retention goes at once (PEXPIREAT in the past). Once a whole
    walk has enforced this setting it does nothing until the setting
    changes; the walk's place is in Redis, so a restart carries on. Returns
    how many keys this step changed."""
    state = r.hgetall(keys.USAGE_RETENTION)
    setting = str(retention_days)
    if state.get("enforced") == setting:
        return 0
    cursor = int(state.get("cursor") or 0) if state.get("walking") == setting else 0
    cursor, found = r.scan(cursor, match=keys.USAGE_KEYS, count=count)
    days = {key: day for key in found if (day := day_of_key(key)) is not None}
    pipe = r.pipeline(transaction=False)
    for key in days:
        pipe.pexpiretime(key)
    now = pipe.execute() if days else []
    touched = 0
    for (key, day), expires in zip(days.items(), now, strict=True):
        at = expires_at_ms(day, retention_days)
        if expires == -2 or expires == (at if at is not None else -1):
            continue  # gone meanwhile, or already as the setting says
        if at is None:
            pipe.persist(key)
        else:
            pipe.pexpireat(key, at)
        touched += 1
    walked = {"enforced": setting} if int(cursor) == 0 else {}
    pipe.hset(keys.USAGE_RETENTION, mapping={"cursor": str(cursor), "walking": setting,
                                             **walked})
    pipe.execute()
    return touched


def record_interval(pipe: Any, interval: Interval, retention_days: int | None = None) -> None:
    """Queue the interval's recording on `pipe` (inside the caller's MULTI):
    its record, its per-day roll-ups and the Prometheus counters, all or
    nothing, and only the first time this interval's key is recorded. Each
    day key it writes gets its expiry (`retention_days`, by default
    PAI_USAGE_RETENTION_DAYS) in the same script."""
    if retention_days is None:
        retention_days = config.usage_retention_days()
    first_day = day_of(interval.start_ms)
    record_keys = [keys.usage_records(first_day)]
    args: list[str | int | float] = [interval.key, interval.to_json()]
    expiring = {keys.usage_records(first_day): expires_at_ms(first_day, retention_days)}
    for row in day_rows([interval]):
        for (resource, _), amount in zip(RESOURCES, row.amounts(), strict=True):
            if amount:
                record_keys.append(keys.usage_day(row.day))
                args += [rollup_field(row.user, row.vc, row.job, resource), amount, "i"]
        if row.gpu_ms:
            record_keys += [keys.usage_day(row.day)] * 2
            args += [vc_total_field(row.vc), row.gpu_ms, "i",
                     vc_user_total_field(row.vc, row.user), row.gpu_ms, "i"]
        expiring[keys.usage_day(row.day)] = expires_at_ms(row.day, retention_days)
    for key, at in expiring.items():
        if at is not None:
            record_keys.append(key)
            args += ["", at, "x"]
    labels = {"user": interval.user, "vc": interval.vc}
    per_unit = (interval.gpus, interval.cpus, interval.memory_mb)
    for metric, units in zip(COUNTERS, per_unit, strict=True):
        if units and interval.duration_ms:
            record_keys.append(metric.key)
            args += [telemetry.counter_field(metric, labels),
                     repr(units * interval.duration_ms / 1000), "f"]
    scripts.run(pipe, scripts.RECORD_USAGE_ONCE, record_keys, args)


def held_allocation(reader: Any, job_id: str, attempt: int, task: Task,
                    read: tuple[str, str | None] | None = None) -> Allocation | None:
    """The allocation `task` holds on its node, if it was placed and holds one;
    `read`: (node, raw value) read already with the task (JobView.held),
    used when it is the task's node."""
    if task.node is None or task.launched_ms is None:
        return None
    if read is not None and read[0] == task.node:
        raw = read[1]
    else:
        raw = reader.hget(keys.node_alloc(task.node),
                          attempt_task_key(job_id, attempt, task.role, task.index))
    return Allocation.from_dict(json.loads(raw)) if raw else None


def record_task_usage(pipe: Any, alloc: Allocation | None, task: Task) -> None:
    """Queue the recording of a settled task's usage (see record_interval)."""
    if alloc is not None and task.completed_ms is not None:
        record_interval(pipe, task_interval(alloc, task, task.completed_ms))


def parse_day(day: str, raw: Mapping[str, str]) -> list[DayUsage]:
    """A day hash's fields as rows; fields another version wrote are skipped."""
    sums: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    slots = {resource: i for i, (resource, _) in enumerate(RESOURCES)}
    for name, value in raw.items():
        try:
            user, vc, job, resource = json.loads(name)
            amount = int(value)
        except (ValueError, TypeError):
            continue
        if resource in slots:
            sums[(user, vc, job)][slots[resource]] += amount
    return [DayUsage(day, *where, *amounts) for where, amounts in sorted(sums.items())]


def read_days(r: Any, days: Sequence[str]) -> list[DayUsage]:
    """The recorded roll-ups of these days, in one round trip."""
    pipe = r.pipeline(transaction=False)
    for day in days:
        pipe.hgetall(keys.usage_day(day))
    replies = pipe.execute() if days else []
    return [row for day, raw in zip(days, replies, strict=True) for row in parse_day(day, raw)]


# ---------------------------------------------------------------- budgets

# A VC's GPU-hour budget runs per UTC calendar period: a day, an ISO week
# (Monday to Sunday) or a month.
PERIODS = ("day", "week", "month")
# What a VC's jobs do once it has spent its budget: run only as `oppo`
# (borrowing idle GPUs, preemptible) or wait for the next period.
ON_EXHAUSTED = ("oppo", "wait")
HOUR_MS = 3600 * 1000


def period_first_day(period: str, now_ms: int) -> str:
    """The first UTC day of the period `now_ms` falls in."""
    today = dt.datetime.fromtimestamp(now_ms // 1000, dt.UTC).date()
    if period == "week":
        today -= dt.timedelta(days=today.weekday())
    elif period == "month":
        today = today.replace(day=1)
    elif period != "day":
        raise ValueError(f"unknown budget period {period!r}; choose from {PERIODS}")
    return today.isoformat()


@dataclass(frozen=True)
class Budget:
    """A VC's GPU-hour budget per period, and what its jobs do once spent."""

    gpu_hours: float
    period: str = "month"
    on_exhausted: str = "oppo"


# Whose budget: (vc, user), the user "" for the VC as a whole.
Owner = tuple[str, str]


@dataclass(frozen=True)
class Spend:
    """What a budgeted VC (or one user within it) has used of its GPU-hour
    budget this period."""

    vc: str
    gpu_ms: int
    budget: Budget
    user: str = ""  # "": the VC's budget, for every user's jobs in it

    @property
    def gpu_hours(self) -> float:
        return self.gpu_ms / HOUR_MS

    @property
    def exhausted(self) -> bool:
        return self.gpu_ms >= self.budget.gpu_hours * HOUR_MS

    def describe(self) -> str:
        if self.user:
            return (f"user {self.user} has used {self.gpu_hours:.2f} of their "
                    f"{self.budget.gpu_hours:g} GPU-hour budget in virtual cluster {self.vc} "
                    f"this {self.budget.period}")
        return (f"virtual cluster {self.vc} has used {self.gpu_hours:.2f} of its "
                f"{self.budget.gpu_hours:g} GPU-hour budget this {self.budget.period}")


def _used(rows: Iterable[DayUsage], budgets: Mapping[Owner, Budget],
          now_ms: int) -> dict[Owner, int]:
    """Each owner's GPU-milliseconds within its current period: a row counts
    for its VC's budget and for its user's budget in that VC."""
    first = {owner: period_first_day(b.period, now_ms) for owner, b in budgets.items()}
    used = dict.fromkeys(budgets, 0)
    for row in rows:
        for owner in {(row.vc, ""), (row.vc, row.user)}:
            if owner in first and row.day >= first[owner]:
                used[owner] += row.gpu_ms
    return used


def spend(rows: Iterable[DayUsage], budgets: Mapping[str, Budget],
          now_ms: int) -> dict[str, Spend]:
    """Each budgeted VC's GPU-milliseconds within its current period, from
    day rows (recorded and running alike; see merge_rows)."""
    used = _used(rows, {(vc, ""): b for vc, b in budgets.items()}, now_ms)
    return {vc: Spend(vc, used[(vc, "")], budget) for vc, budget in budgets.items()}


def read_spend(r: Any, budgets: Mapping[str, Budget], held: Sequence[Allocation],
               now_ms: int) -> dict[str, Spend]:
    """Each budgeted VC's spend this period (read_spends)."""
    read = read_spends(r, {(vc, ""): b for vc, b in budgets.items()}, held, now_ms)
    return {vc: s for (vc, _), s in read.items()}


def read_spends(r: Any, budgets: Mapping[Owner, Budget], held: Sequence[Allocation],
                now_ms: int) -> dict[Owner, Spend]:
    """Each budget's spend this period, a VC's (user "") or a user's within a
    VC: its recorded days, plus its tasks holding allocations now up to
    `now_ms`. One round trip: each day's totals (vc_total_field,
    vc_user_total_field: one field per budget and day, at most 31 days)
    from the earliest period start to today, and the tasks of the budgeted
    allocations among `held`."""
    if not budgets:
        return {}
    days = days_between(min(period_first_day(b.period, now_ms) for b in budgets.values()),
                        day_of(now_ms))
    owners = sorted(budgets)
    fields = [vc_user_total_field(vc, user) if user else vc_total_field(vc)
              for vc, user in owners]
    mine = [a for a in held
            if (a.vc, "") in budgets or (a.vc, split_job_id(a.job_id)[0]) in budgets]
    pipe = r.pipeline(transaction=False)
    for day in days:
        pipe.hmget(keys.usage_day(day), fields)
    for a in mine:
        pipe.hget(keys.job_tasks(a.job_id, a.attempt), task_key(a.role, a.index))
    replies = pipe.execute()
    tasks = [Task.from_dict(json.loads(raw)) if raw else None for raw in replies[len(days):]]
    used = _used(day_rows(running_intervals(zip(mine, tasks, strict=True), now_ms)),
                 budgets, now_ms)
    first = [period_first_day(budgets[owner].period, now_ms) for owner in owners]
    for day, totals in zip(days, replies[:len(days)], strict=True):
        for owner, since, total in zip(owners, first, totals, strict=True):
            if total is not None and day >= since:
                used[owner] += int(total)
    return {(vc, user): Spend(vc, used[(vc, user)], budgets[(vc, user)], user)
            for vc, user in owners}
