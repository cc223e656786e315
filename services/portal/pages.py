"""The portal's pure parts: paging, the sort asked for, safe redirects, clones and error
fields, from the API's answers to what a page shows. No IO: table-tested in
tests/integration/test_portal_pages.py (pure, beside the portal's other tests)."""

from __future__ import annotations

import json
import secrets
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import yaml

from shared.domain import jobsort, ssh

PAGE_SIZES = (20, 50, 100)
DEFAULT_PAGE_SIZE = 20
MAX_PAGE = 10**6  # past any real job count: the API's own offset bound stays far away

# The job table sorts every page by any column: the API sorts the whole
# filtered list (`GET /api/v1/jobs?sort=&order=`, shared/domain/jobsort.py).
# Earlier links named some columns otherwise; a bookmark keeps working.
SORT_ALIASES = {"created": jobsort.SUBMIT_TIME, "user": "username", "vc": "virtualCluster"}


@dataclass(frozen=True)
class Paging:
    page: int  # 1-based
    size: int
    total: int = 0

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.size

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.size))

    @property
    def has_previous(self) -> bool:
        return self.page > 1

    @property
    def has_next(self) -> bool:
        return self.page < self.pages


def _whole(text: str | None, default: int, low: int, high: int) -> int:
    try:
        value = int(text) if text is not None else default
    except ValueError:
        return default
    return min(high, max(low, value))


def paging_of(args: Mapping[str, str]) -> Paging:
    """The page asked for by `?page=&size=`: anything out of range is clamped,
    anything not a number is the default (a bookmark never breaks the page)."""
    size = _whole(args.get("size"), DEFAULT_PAGE_SIZE, 1, max(PAGE_SIZES))
    return Paging(_whole(args.get("page"), 1, 1, MAX_PAGE), size)


def sort_of(args: Mapping[str, str]) -> tuple[str, bool]:
    """The column and direction asked for by `?sort=&order=`: an unknown
    column is submit time, anything but `asc` is descending (a bookmark
    never breaks the page)."""
    sort = args.get("sort", "")
    sort = SORT_ALIASES.get(sort, sort)
    if sort not in jobsort.SORTS:
        sort = jobsort.SUBMIT_TIME
    return sort, args.get("order", "desc") != "asc"


def run_time(row: Mapping[str, Any], now_ms: int) -> str:
    """How long a listed job has run (the API's `duration` sort): from its
    start to its end, or to now while it runs; "" before it started."""
    started, completed = row.get("startedTime"), row.get("completedTime")
    if not isinstance(started, int) or started <= 0:
        return ""
    seconds = max(0, ((completed if isinstance(completed, int) else now_ms) - started) // 1000)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


def local_target(target: str | None, default: str = "/") -> str:
    """Where to go after a form: only a path on this site, never another
    host (`//evil`, `https://evil`, `/\\evil`), else `default`."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return default
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or any(c in target for c in "\r\n\t\\"):
        return default
    return target


def clone_text(config: Mapping[str, Any], token: str | None = None) -> str:
    """A job's config as the editor shows it to clone: a new name (the old one
    is taken), v1 as JSON, protocol v2 as YAML."""
    suffix = token or secrets.token_hex(2)
    copied = dict(config)
    if copied.get("protocolVersion") in (2, "2"):
        copied["name"] = f"{copied.get('name', 'job')}-{suffix}"
        return yaml.safe_dump(copied, sort_keys=False)
    copied["jobName"] = f"{copied.get('jobName', 'job')}-{suffix}"
    return json.dumps(copied, indent=2)


def error_fields(body: Any) -> list[tuple[str, list[str]]]:
    """The API's error `fields` ({path: [messages]}) as rows, by path."""
    fields = body.get("fields") if isinstance(body, dict) else None
    if not isinstance(fields, dict):
        return []
    rows = []
    for path, messages in sorted(fields.items()):
        shown = messages if isinstance(messages, list) else [messages]
        rows.append((str(path), [str(m) for m in shown]))
    return rows


def error_message(body: Any, status: int) -> str:
    """The API's error sentence, or what the status means when it gave none."""
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return f"the request failed ({status})"


def job_ref(text: str) -> tuple[str, str] | None:
    """`user/name` (a batch form's checkbox value) as its parts, or None."""
    user, sep, name = text.partition("/")
    if not sep or not user or not name or "/" in name:
        return None
    return user, name


def oldest_offset(total: int, count: int) -> int:
    """The offset of the `count` oldest jobs in a newest-first list of `total`."""
    return max(0, total - count)


def vc_rows(vcs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The API's virtual clusters as the home and VC tables show them, by name."""
    rows = []
    for name in sorted(vcs):
        vc = vcs[name]
        used = int(vc["resourcesUsed"]["GPUs"])
        rows.append({"name": name, "guaranteed": vc["gpuGuaranteed"], "used": used,
                     "borrowed": vc["gpuBorrowed"], "free": vc["gpuFree"],
                     "borrowing": vc["borrowing"], "waiting": vc["waitingJobs"],
                     "running": vc["runningJobs"], "description": vc.get("description") or ""})
    return rows


# ------------------------------------------------------------ usage charts

CHART_WIDTH, CHART_HEIGHT = 600, 160  # the SVG's own units; CSS scales it
CHART_POINTS = 120  # points drawn per line (and rows in the table fallback)
CHART_TASKS = 8  # tasks charted per job, the first by role and index
CHART_REFRESH_SECONDS = 10  # the job page redraws its charts this often while the job runs
MIB = 1024 * 1024


@dataclass(frozen=True)
class ChartLine:
    label: str  # "role[index]"
    points: str  # SVG polyline points; "" when it has no value at all
    values: tuple[float | None, ...]  # one per chart time


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    unit: str
    top: float  # the value at the top edge
    times: tuple[int, ...]  # ms, the table fallback's rows
    lines: tuple[ChartLine, ...]

    @property
    def description(self) -> str:
        if not self.times:
            return f"{self.title}: no samples yet."
        return (f"{self.title} of {len(self.lines)} task(s) from {self.times[0]} to "
                f"{self.times[-1]} ms since the epoch; the top of the chart is "
                f"{self.top:g} {self.unit}.")


def _gpu_mean(sample: Mapping[str, Any]) -> float | None:
    known = [p for p in sample.get("gpuPercent") or () if p is not None]
    return sum(known) / len(known) if known else None


def _memory_mib(sample: Mapping[str, Any]) -> float | None:
    value = sample.get("memoryBytes")
    return None if value is None else value / MIB


def _gpu_memory_mib(sample: Mapping[str, Any]) -> float | None:
    value = sample.get("gpuMemoryBytes")
    return None if value is None else value / MIB


METRICS: tuple[tuple[str, str, str, Callable[[Mapping[str, Any]], float | None]], ...] = (
    ("gpu", "GPU utilisation (mean of the task's GPUs)", "%", _gpu_mean),
    ("cpu", "CPU use (100 = one core)", "%", lambda s: s.get("cpuPercent")),
    ("memory", "Memory use", "MiB", _memory_mib),
)
# Prometheus has the GPUs' memory too (the monitor's samples do not)
GPU_MEMORY = ("gpumemory", "GPU memory use (the task's GPUs)", "MiB", _gpu_memory_mib)


@dataclass(frozen=True)
class Usage:
    """The charts of a job's use and where their figures come from."""

    charts: list[Chart]
    source: str  # one sentence for the page
    final: bool  # no new point will come: the page stops asking


def usage_of(answer: Mapping[str, Any], tasks: int = CHART_TASKS) -> Usage:
    """The API's job metrics (`GET .../metrics`) as charts of the first
    `tasks` tasks, with a sentence naming the source."""
    samples = {f"{t['taskRole']}[{t['taskIndex']}]": t["samples"]
               for t in answer.get("tasks", [])[:tasks] if t["samples"]}
    step = float(answer.get("stepSeconds") or 0)
    if answer.get("source") == "prometheus":
        source = f"From Prometheus, a point every {step:g} s."
        metrics = (*METRICS, GPU_MEMORY)
    else:
        why = answer.get("fallbackReason") or "Prometheus is not configured"
        source = f"From the monitor's samples (one every {step:g} s): {why}."
        metrics = METRICS
    return Usage(usage_charts(samples, metrics=metrics), source, bool(answer.get("final")))


def _buckets(times: list[int], count: int) -> list[tuple[int, int]]:
    """At most `count` equal time spans covering [first, last]: (start, end) ms."""
    first, last = times[0], times[-1]
    if last == first:
        return [(first, last)]
    step = (last - first) / count
    return [(first + int(i * step), first + int((i + 1) * step)) for i in range(count)]


def usage_charts(samples: Mapping[str, Sequence[Mapping[str, Any]]],
                 points: int = CHART_POINTS,
                 metrics: Sequence[tuple[str, str, str, Callable[[Mapping[str, Any]],
                                                                 float | None]]] = METRICS,
                 ) -> list[Chart]:
    """A chart per metric (GPU, CPU, memory) with a line per task, from the
    API's samples (task label -> samples, oldest first). Each line is the
    mean of its samples in up to `points` equal time spans; a span with none
    leaves a gap in the table and is skipped by the line."""
    every = sorted({int(s["time"]) for rows in samples.values() for s in rows})
    charts = []
    for key, title, unit, value_of in metrics:
        if not every:
            charts.append(Chart(key, title, unit, 100.0 if unit == "%" else 1.0, (), ()))
            continue
        spans = _buckets(every, points)
        series: list[tuple[str, list[float | None]]] = []
        for label, rows in samples.items():
            values: list[float | None] = []
            for n, (start, end) in enumerate(spans):
                last = n == len(spans) - 1
                inside = [v for s in rows
                          if start <= int(s["time"]) < end or (last and int(s["time"]) == end)
                          for v in (value_of(s),) if v is not None]
                values.append(sum(inside) / len(inside) if inside else None)
            series.append((label, values))
        peak = max((v for _, vs in series for v in vs if v is not None), default=0.0)
        top = max(100.0, peak) if unit == "%" else max(1.0, peak * 1.1)
        times = tuple(start for start, _ in spans)
        lines = tuple(ChartLine(label, _polyline(values, top), tuple(values))
                      for label, values in series)
        charts.append(Chart(key, title, unit, top, times, lines))
    return charts


def _polyline(values: Sequence[float | None], top: float) -> str:
    count = len(values)
    coords = []
    for n, value in enumerate(values):
        if value is None:
            continue
        x = CHART_WIDTH * n / (count - 1) if count > 1 else CHART_WIDTH / 2
        y = CHART_HEIGHT - CHART_HEIGHT * min(value, top) / top
        coords.append(f"{x:.1f},{y:.1f}")
    return " ".join(coords)


def idle_minutes(since_ms: int, now_ms: int) -> int:
    return max(0, (now_ms - since_ms) // 60_000)


# ------------------------------------------------------------------- debug


@dataclass(frozen=True)
class DebugCommand:
    """How to get a shell in one running task, as the CLI takes it."""

    task: str  # "role[index]"
    exec: str  # pai exec ... -- sh
    ssh: str | None  # pai ssh ..., for a job that asked for SSH


def asks_for_ssh(config: Mapping[str, Any] | None) -> bool:
    """Whether a config as GET .../config shows it asks for SSH: v1's `ssh`,
    or a v2 submission's ssh runtime plugin asking for a key."""
    if not config:
        return False
    if config.get("protocolVersion") in (2, "2"):
        found = ssh.v2_plugin_parameters((config.get("extras") or {}).get(ssh.V2_PLUGINS))
        try:
            return found is not None and ssh.normalized(found[1]) is not None
        except ssh.InvalidSshRequest:
            return False
    return ssh.access_of(dict(config)) is not None


def debug_commands(job: Mapping[str, Any], owner: str, viewer: str,
                   with_ssh: bool) -> list[DebugCommand]:
    """The `pai exec` (and `pai ssh`) command of every running task of a job
    detail; `--user` when the viewer (an admin) is not the owner. Commands
    only: the page never carries the job's key."""
    user = [] if owner == viewer else ["--user", owner]
    found = []
    for role, status in (job.get("taskRoles") or {}).items():
        for task in status.get("taskStatuses") or []:
            if task.get("taskState") != "RUNNING":
                continue
            where = [job["name"], role, str(task["taskIndex"])]
            found.append(DebugCommand(
                task=f"{role}[{task['taskIndex']}]",
                exec=shlex.join(["pai", "exec", *user, *where, "--", "sh"]),
                ssh=shlex.join(["pai", "ssh", *user, *where]) if with_ssh else None))
    return found


def proxy_url(script_root: str, username: str, name: str, role: str, index: int,
              label: str) -> str:
    """Where the API proxies a task's labelled port (services/api/proxy.py):
    the job page links each port of a running task there, for its owner."""
    parts = ["api", "v1", "user", username, "jobs", name, "tasks", role, str(index), "proxy",
             label]
    return script_root + "/" + "/".join(quote(p, safe="") for p in parts) + "/"
