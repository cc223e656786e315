"""How a task's container is named and labelled, for launcher and monitor alike.

The name is deterministic in (job, attempt, role, index, task retry), so a
repeated launch finds the container it already made and each task retry
(taskRetryCount) gets a container of its own; the labels let the monitor
map any container back to its task, and to which of its retries, without
asking Redis.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

import docker

from shared.config import Settings

LABEL_JOB = "pai.job"
LABEL_ATTEMPT = "pai.attempt"
LABEL_ROLE = "pai.role"
LABEL_INDEX = "pai.index"
LABEL_NODE = "pai.node"
LABEL_USER = "pai.user"
LABEL_VC = "pai.vc"
LABEL_TASK_RETRY = "pai.taskRetry"  # absent on a task's first container: 0

_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")


@dataclass(frozen=True)
class TaskRef:
    job_id: str
    attempt: int
    role: str
    index: int
    retry: int = 0  # the task's retries before this container (Task.retries)

    @property
    def container_name(self) -> str:
        return container_name(self.job_id, self.attempt, self.role, self.index, self.retry)


def container_name(job_id: str, attempt: int, role: str, index: int, retry: int = 0) -> str:
    """`pai-<job>-<attempt>-<role>-<index>[-r<retry>]-<hash>`: readable, and
    unique even where two job ids differ only in characters Docker names
    cannot hold. A task's first container has no `-r` part."""
    seed = f"{job_id}\0{attempt}\0{role}\0{index}" + (f"\0{retry}" if retry else "")
    digest = hashlib.sha1(seed.encode()).hexdigest()[:8]
    readable = _UNSAFE.sub("-", f"{job_id}-{attempt}-{role}-{index}")[:200]
    return f"pai-{readable}{f'-r{retry}' if retry else ''}-{digest}"


def task_labels(ref: TaskRef, *, node: str, username: str, vc: str) -> dict[str, str]:
    labels = {
        LABEL_JOB: ref.job_id, LABEL_ATTEMPT: str(ref.attempt), LABEL_ROLE: ref.role,
        LABEL_INDEX: str(ref.index), LABEL_NODE: node, LABEL_USER: username, LABEL_VC: vc,
    }
    if ref.retry:
        labels[LABEL_TASK_RETRY] = str(ref.retry)
    return labels


def task_ref_from_labels(labels: Mapping[str, str] | None) -> TaskRef | None:
    """The task a container runs, or None for a container that is not ours."""
    if not labels or LABEL_JOB not in labels:
        return None
    try:
        return TaskRef(labels[LABEL_JOB], int(labels[LABEL_ATTEMPT]), labels[LABEL_ROLE],
                       int(labels[LABEL_INDEX]), int(labels.get(LABEL_TASK_RETRY) or 0))
    except (KeyError, ValueError):
        return None


def docker_client(settings: Settings, timeout: int = 60) -> docker.DockerClient:
    if settings.docker_host:
        return docker.DockerClient(base_url=settings.docker_host, timeout=timeout)
    return docker.from_env(timeout=timeout)
