"""How a task's container is named and labelled, for launcher and monitor alike.

The name is deterministic in (job, attempt, role, index, task retry), so a
repeated launch finds the container it already made and each task retry
(taskRetryCount) gets a container of its own; the labels let the monitor
map any container back to its task, and to which of its retries, without
asking Redis.
"""

from __future__ import annotations

import hashlib
import queue
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import docker
from docker.transport.unixconn import UnixHTTPAdapter, UnixHTTPConnectionPool

from shared.infra.config import Settings

LABEL_JOB = "pai.job"
LABEL_ATTEMPT = "pai.attempt"
LABEL_ROLE = "pai.role"
LABEL_INDEX = "pai.index"
LABEL_NODE = "pai.node"
LABEL_USER = "pai.user"
LABEL_VC = "pai.vc"
LABEL_TASK_RETRY = "pai.taskRetry"  # absent on a task's first container: 0
# The job's submission (models.Job.submission), unique across resubmissions
# of a name: with the attempt, role, index and retry, the task attempt's id.
LABEL_SUBMISSION = "pai.submission"
# The runner's steps, one a line, by exit code (shared/domain/prerequisites.py):
# set only on containers whose command is the runner.
LABEL_PREREQUISITES = "pai.prerequisites"

_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")


@dataclass(frozen=True)
class TaskRef:
    job_id: str
    attempt: int
    role: str
    index: int
    retry: int = 0  # the task's retries before this container (Task.retries)
    submission: str = ""  # the job's submission (Job.submission); "" for records before it

    @property
    def container_name(self) -> str:
        return container_name(self.job_id, self.attempt, self.role, self.index, self.retry)

    @property
    def attempt_id(self) -> str:
        """The task attempt's id, unique across resubmissions of the job's name."""
        return f"{self.submission}.{self.attempt}.{self.role}.{self.index}.{self.retry}"


def container_name(job_id: str, attempt: int, role: str, index: int, retry: int = 0) -> str:
    """`pai-<job>-<attempt>-<role>-<index>[-r<retry>]-<hash>`: readable, and
    unique even where two job ids differ only in characters Docker names
    cannot hold. A task's first container has no `-r` part. Two submissions
    of one job name share names: `made_for` tells their containers apart."""
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
    if ref.submission:
        labels[LABEL_SUBMISSION] = ref.submission
    return labels


def made_for(labels: Mapping[str, str] | None, ref: TaskRef) -> bool:
    """Was the container with these labels made for `ref`'s submission? Only
    two known submissions that differ say no: a container without the label
    predates it (its platform wrote none), and a ref without one (a record
    from before it) cannot tell."""
    submission = (labels or {}).get(LABEL_SUBMISSION, "")
    return not submission or not ref.submission or submission == ref.submission


def task_ref_from_labels(labels: Mapping[str, str] | None) -> TaskRef | None:
    """The task a container runs, or None for a container that is not ours."""
    if not labels or LABEL_JOB not in labels:
        return None
    try:
        return TaskRef(labels[LABEL_JOB], int(labels[LABEL_ATTEMPT]), labels[LABEL_ROLE],
                       int(labels[LABEL_INDEX]), int(labels.get(LABEL_TASK_RETRY) or 0),
                       labels.get(LABEL_SUBMISSION) or "")
    except (KeyError, ValueError):
        return None


# Idle connections to a local engine kept for reuse; more may be open at
# once (one per log follower), and those are closed when they come back.
ENGINE_CONNECTIONS = 32
# Paths whose connection the SDK hijacks (exec, attach): such a connection
# is never handed out again, so each keeps the SDK's pool of its own.
_HIJACKED_PATHS = ("/exec/", "/attach")


def docker_client(settings: Settings, timeout: int = 60) -> docker.DockerClient:
    if settings.docker_host:
        client = docker.DockerClient(base_url=settings.docker_host, timeout=timeout)
    else:
        client = docker.from_env(timeout=timeout)
    reuse_engine_connections(client)
    return client


class _EnginePool(UnixHTTPConnectionPool):
    """A pool that closes a connection it has no room for without a warning:
    a follower's stream returning when many ran at once is expected."""

    def _put_conn(self, conn: Any) -> None:
        if conn is not None and self.pool is not None and self.pool.full():
            conn.close()
            return
        try:
            super()._put_conn(conn)
        except queue.Full:  # raced another return: nothing is lost
            conn.close()


class EngineAdapter(UnixHTTPAdapter):
    """One keep-alive connection pool for every request to a local engine.

    The SDK's adapter keys its pools by the request's whole URL, and a
    container's URLs name its id: every call about a new container opened a
    new pool and a new connection (connect, and on the engine an accept and a
    goroutine), so a short job paid that on each of its calls.
    """

    def get_connection(self, url: str, proxies: Any = None) -> Any:
        if any(part in url for part in _HIJACKED_PATHS):
            return super().get_connection(url, proxies)
        with self.pools.lock:
            pool = self.pools.get(self.socket_path)
            if pool is None:
                pool = _EnginePool(url, self.socket_path, self.timeout,
                                   maxsize=max(self.max_pool_size, ENGINE_CONNECTIONS))
                self.pools[self.socket_path] = pool
        return pool


def reuse_engine_connections(client: docker.DockerClient) -> None:
    """Make a client of an engine on a unix socket reuse its connections, and
    skip the proxy and .netrc lookups the HTTP library makes on every request
    (nothing to proxy on a local socket). Other engines are left as they are."""
    api = client.api
    adapter = getattr(api, "_custom_adapter", None)
    if adapter is None or type(adapter) is not UnixHTTPAdapter:
        return
    engine = EngineAdapter(f"http+unix://{adapter.socket_path}", timeout=adapter.timeout,
                           max_pool_size=adapter.max_pool_size)
    api._custom_adapter = engine
    api.mount("http+docker://", engine)
    api.trust_env = False
    adapter.close()
