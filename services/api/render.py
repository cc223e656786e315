"""The OpenPAI v1 shapes of a job: pure functions from records to JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from shared.domain.models import Attempt, Job, Task


def job_summary(job: Job) -> dict[str, Any]:
    """A row of the job list (OpenPAI's list item shape, plus a few fields)."""
    return {
        "name": job.name,
        "username": job.username,
        "state": job.state.value,
        "subState": _sub_state(job),
        "executionType": job.execution_type,
        "retries": job.retries,
        "createdTime": job.created_ms,
        "completedTime": job.completed_ms,
        "appExitCode": job.exit_code,
        "virtualCluster": job.virtual_cluster,
        "gpus": job.gpus,
        "startedTime": job.started_ms,
        "priorityClass": job.priority,
        "waitingReason": job.waiting_reason,
        # while placed: on its VC's guarantee ("guaranteed") or borrowed GPUs
        "mode": job.mode or None,
    }


def _sub_state(job: Job) -> str:
    if job.state.value == "WAITING" and job.waiting_reason:
        return "WAITING_FOR_RESOURCES"
    return job.state.value


def task_status(task: Task, log_url: str, idle_since: int | None = None) -> dict[str, Any]:
    ports: dict[str, Any] = {}
    for label, values in task.ports.items():
        ports[label] = values[0] if label == "default" and values else ",".join(
            str(p) for p in values)
    return {
        "taskIndex": task.index,
        "taskState": task.state.value,
        "containerId": task.container_id,
        "containerIp": task.ip,
        "containerPorts": ports,
        "containerGpus": task.gpus,
        "containerNodeName": task.node,
        "containerExitCode": task.exit_code,
        "containerExitDiagnostics": task.diagnostics,
        "containerLog": log_url,
        "launchedTime": task.launched_ms,
        "startedTime": task.started_ms,
        "completedTime": task.completed_ms,
        "retries": task.retries,
        "idleSince": idle_since,
    }


def attempt_view(attempt: Attempt, checkpoint_step: int | None = None) -> dict[str, Any]:
    """One attempt; `checkpoint_step`: the last checkpoint the job reported
    in it (shared/domain/checkpoints.py), None when it reported none."""
    return {
        "attemptIndex": attempt.index,
        "state": attempt.state,
        "createdTime": attempt.created_ms,
        "startedTime": attempt.started_ms,
        "completedTime": attempt.completed_ms,
        "exitCode": attempt.exit_code,
        "reason": attempt.reason,
        "platformFailure": attempt.platform_failure,
        "preemptedBy": attempt.preempted_by or None,
        "checkpointStep": checkpoint_step,
    }


def waiting_view(job: Job, position: int | None) -> dict[str, Any] | None:
    """Why a queued job waits, as the scheduler's last pass explained it, and
    its place in its VC's queue now (1 = next)."""
    if job.state.value != "WAITING" or position is None:
        return None
    explained = json.loads(job.waiting) if job.waiting else {}
    return {
        "reason": explained.get("reason", "Queued"),
        "message": explained.get("message", job.waiting_reason or "not yet considered"),
        "position": position,
        "ahead": position - 1,
        "blockedBy": explained.get("blockedBy", []),
        "estimatedStartTime": explained.get("estimatedStartTime"),
    }


def job_detail(job: Job, role_order: Sequence[str], tasks: Sequence[Task],
               attempts: Sequence[Attempt], base_url: str,
               position: int | None = None,
               idle: Mapping[tuple[str, int], int] | None = None,
               checkpoint_steps: Mapping[int, int] | None = None) -> dict[str, Any]:
    """`GET /user/<u>/jobs/<name>`: status, the current attempt's tasks,
    attempts; `idle`: (role, index) -> idleSince of the tasks flagged idle;
    `checkpoint_steps`: attempt -> its last reported checkpoint step."""
    roles: dict[str, Any] = {}
    for role in role_order:
        statuses = [
            task_status(t, f"{base_url}/tasks/{role}/{t.index}/log?attempt={job.attempt}",
                        (idle or {}).get((t.role, t.index)))
            for t in sorted(tasks, key=lambda t: t.index) if t.role == role
        ]
        roles[role] = {"taskRoleStatus": {"name": role}, "taskStatuses": statuses}
    status = job_summary(job)
    status.update({
        "appExitDiagnostics": job.exit_diagnostics,
        "attemptIndex": job.attempt,
        "platformRetries": job.platform_retries,
        "waiting": waiting_view(job, position),
        "preemptedBy": job.preempted_by or None,
        "preemptionDeadline": job.preempt_deadline_ms,
        "preemptions": job.preemptions,
    })
    status.pop("name")
    return {
        "name": job.name,
        "jobStatus": status,
        "taskRoles": roles,
        "attempts": [attempt_view(a, (checkpoint_steps or {}).get(a.index))
                     for a in attempts],
    }
