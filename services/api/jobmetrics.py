"""A job's use over time from Prometheus: the PromQL, the query, the answer.

`GET /api/v1/user/<user>/jobs/<name>/metrics` (jobs.py) asks Prometheus
(PAI_PROMETHEUS_URL) for the job attempt's CPU, memory, GPU utilisation and
GPU memory over [from, to] with `query_range`, and answers in the samples
endpoint's shape (a list of samples per task), so the portal draws both the
same way. The series are the monitor's task series (services/monitor/
nodemetrics.py): one per task with the labels user, job_name, role, index,
attempt; GPU memory is per GPU (node, uuid), matched to the task holding the
GPU through the task's GPU series.

The PromQL is built only from the job's own identifiers, each an exact
label match written as a PromQL string literal with every quote, backslash
and control character escaped: a job name cannot end the literal and add
PromQL of its own (tests/unit/test_jobmetrics.py tries). Prometheus gets a
bounded time (PAI_PROMETHEUS_TIMEOUT_SECONDS, for the four queries in all);
any failure is a `PrometheusError`, and the endpoint answers from the
monitor's samples instead, saying so.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import requests

from services.monitor.nodemetrics import (
    GPU_MEMORY_USED,
    TASK_CPU,
    TASK_GPU_UTILIZATION,
    TASK_MEMORY,
)

MAX_POINTS = 1000  # per series: a longer span gets a coarser step (Prometheus' own cap is 11,000)
DEFAULT_POINTS = 240  # a chart's width in points when no step is asked for
MAX_ANSWER_BYTES = 32 * 1024 * 1024  # a Prometheus answer larger than this is refused
SOURCE_PROMETHEUS, SOURCE_SAMPLES = "prometheus", "samples"

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class PrometheusError(Exception):
    """Prometheus did not answer the queries (unreachable, slow, refused, garbled)."""


def string_literal(value: str) -> str:
    """`value` as a double-quoted PromQL string literal that holds exactly it."""
    out = []
    for char in value:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def selector(username: str, job_name: str, attempt: int) -> str:
    """The label matchers of one job attempt's task series."""
    return "{" + ",".join(f"{label}={string_literal(value)}" for label, value in (
        ("user", username), ("job_name", job_name), ("attempt", str(int(attempt))))) + "}"


def queries(username: str, job_name: str, attempt: int) -> dict[str, str]:
    """The PromQL of each chart value, per task (by role and index; GPU
    utilisation per GPU too)."""
    sel = selector(username, job_name, attempt)
    held = f"(0 * {TASK_GPU_UTILIZATION.name}{sel} + 1)"  # 1 per GPU the task holds
    return {
        "cpuPercent": f"max by (role, index) ({TASK_CPU.name}{sel})",
        "memoryBytes": f"max by (role, index) ({TASK_MEMORY.name}{sel})",
        "gpuPercent": f"max by (role, index, gpu) ({TASK_GPU_UTILIZATION.name}{sel})",
        "gpuMemoryBytes": (f"sum by (role, index) ({GPU_MEMORY_USED.name} "
                           f"* on (node, uuid) group_left (role, index) {held})"),
    }


def span(from_ms: int, to_ms: int, step_seconds: float | None) -> float:
    """The step to ask for: as asked (else the span in DEFAULT_POINTS), never
    so fine that a series has more than MAX_POINTS points, at least 1 s."""
    seconds = max(0.0, (to_ms - from_ms) / 1000)
    wanted = step_seconds if step_seconds is not None else seconds / DEFAULT_POINTS
    return float(max(1, math.ceil(max(wanted, seconds / MAX_POINTS))))


def _number(raw: Any) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def task_samples(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """query_range matrices (by the keys of `queries`) as the samples
    endpoint's rows, one entry per task, by role then index, each sample
    {time ms, cpuPercent, memoryBytes, gpuPercent [by GPU index], gpuMemoryBytes}."""
    tasks: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for key, matrix in results.items():
        for series in matrix:
            labels = series.get("metric") or {}
            try:
                task = (str(labels["role"]), int(labels["index"]))
            except (KeyError, ValueError):
                continue
            gpu = labels.get("gpu")
            for stamp, raw in series.get("values") or ():
                at = round(float(stamp) * 1000)
                row = tasks.setdefault(task, {}).setdefault(at, {
                    "time": at, "cpuPercent": None, "memoryBytes": None, "gpuPercent": {},
                    "gpuMemoryBytes": None})
                value = _number(raw)
                if key == "gpuPercent":
                    if gpu is not None and str(gpu).isdigit():
                        row["gpuPercent"][int(gpu)] = value
                elif key in ("memoryBytes", "gpuMemoryBytes"):
                    row[key] = None if value is None else int(value)
                else:
                    row[key] = value
    answer = []
    for (role, index), rows in sorted(tasks.items()):
        samples = []
        for at in sorted(rows):
            row = rows[at]
            row["gpuPercent"] = [row["gpuPercent"][g] for g in sorted(row["gpuPercent"])]
            samples.append(row)
        answer.append({"taskRole": role, "taskIndex": index, "samples": samples})
    return answer


def query_range(base_url: str, promql: Mapping[str, str], from_ms: int, to_ms: int,
                step_seconds: float, timeout_seconds: float) -> dict[str, list[Any]]:
    """Each query's matrix from Prometheus' /api/v1/query_range, within
    `timeout_seconds` for all of them; PrometheusError otherwise."""
    deadline = time.monotonic() + timeout_seconds
    found: dict[str, list[Any]] = {}
    for key, expression in promql.items():
        left = deadline - time.monotonic()
        if left <= 0:
            raise PrometheusError(f"no answer within {timeout_seconds:g} s")
        try:
            resp = requests.get(f"{base_url.rstrip('/')}/api/v1/query_range", params={
                "query": expression, "start": f"{from_ms / 1000:.3f}",
                "end": f"{to_ms / 1000:.3f}", "step": f"{step_seconds:g}"},
                timeout=left, stream=True)
            body = resp.raw.read(MAX_ANSWER_BYTES + 1, decode_content=True)
            resp.close()
        except (requests.RequestException, OSError) as error:
            raise PrometheusError(f"unreachable ({type(error).__name__})") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise PrometheusError("its answer is too large")
        try:
            answer = json.loads(body)
        except ValueError:
            raise PrometheusError(f"answered {resp.status_code}, not JSON") from None
        if resp.status_code != 200 or not isinstance(answer, dict) \
                or answer.get("status") != "success":
            told = answer.get("error") if isinstance(answer, dict) else None
            raise PrometheusError(f"answered {resp.status_code}: {str(told)[:200]}")
        data = answer.get("data") or {}
        if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise PrometheusError("answered something other than a matrix")
        found[key] = data["result"]
    return found
