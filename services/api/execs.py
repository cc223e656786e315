"""Exec: run a command in a task's running container and answer its output.

The view checks who may (the job's owner and admins, as for the job's logs)
and that the task runs now; then, in one atomic step (shared/state/gated.py),
it takes a lease of the caller's cap of concurrent execs
(services/api/follows.py's leases under keys.exec_leases) and writes the
request, its call to the task's node (shared/state/nodecalls.py) and the
audit record (the job's "exec" event and the counter), held to the token
check when this process remembered it (as a submit's write is); and it waits
for the node's answer (shared/state/execs.py). The answer gives the caller's
lease back in its own transaction (the API gives it back only when no answer
came, or one from a launcher that did not). The API never reaches a node's
Docker engine itself.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, current_app

from services.api.auth import current_user, decide_on_remembered, token_expectations
from services.api.bodies import load, read_json, takes
from services.api.errors import ApiError
from services.api.execschemas import ExecRequestSchema
from services.api.follows import Caps, FollowLeases, _ProcessSlots
from services.api.jobs import get_job_or_404
from services.api.platform import extension_of, platform
from shared.domain.models import Job, Task, split_job_id
from shared.domain.states import JobState, TaskState
from shared.infra.clock import now_ms
from shared.state import execs, followleases, gated, keys, nodecalls, telemetry
from shared.state.execs import ExecRequest, Outcome
from shared.state.store import Expect, Store, connect

bp = Blueprint("execs", __name__, url_prefix="/api/v1")
log = logging.getLogger("pai.api")

EXTENSION = "pai.execs"
FIRST_ATTEMPT = 0  # the attempt whose task is read beside the job
RETRY_AFTER_SECONDS = 5


@dataclass
class _Execs:
    """The execs' caps, and this process's waits for answers: each wait holds
    a Redis connection (BLPOP) for up to a command's timeout, so waits have a
    pool of their own, one connection per slot, and never take the
    connections requests need (as log follows, services/api/follows.py)."""

    caps: Caps
    waits: Store
    body: ExecRequestSchema  # made once: a schema costs more to make than to load


def _execs() -> _Execs:
    def create() -> _Execs:
        settings = platform().settings
        # a lease outlives the longest exec it may cover
        leases = FollowLeases(platform().store, settings.exec_per_user, key=keys.exec_leases,
                              lease_seconds=execs.answer_seconds(
                                  settings.exec_max_timeout_seconds,
                                  settings.exec_answer_margin_seconds) + 1)
        slots = max(1, settings.api_worker_connections // 4)
        caps = Caps(leases, _ProcessSlots(slots),
                    busy="this API process waits for as many execs as it may",
                    capped="{user} already holds {cap} execs, the most one user may at once; "
                           "try again when one ends")
        return _Execs(caps, Store(connect(settings.redis_url, pool_size=slots)),
                      ExecRequestSchema(max_timeout=settings.exec_max_timeout_seconds))

    return extension_of(current_app, EXTENSION, create)


@bp.post("/user/<username>/jobs/<name>/tasks/<role>/<int:index>/exec")
@takes(ExecRequestSchema())
def run(username: str, name: str, role: str, index: int) -> dict[str, Any]:
    """Run a command in a task's running container; its exit code and output.
    ---
    post:
      errors: [403, 404, 409, 429, 503, 504]
      responses: {200: ExecResult}
    """
    state = _execs()
    body = load(state.body, read_json())
    wait = execs.answer_seconds(body["timeoutSec"],
                                platform().settings.exec_answer_margin_seconds)
    request, result = _sent(username, name, role, index, body, wait), None
    try:
        result = execs.wait_result(state.waits.r, request.id, wait)
    finally:
        state.caps.close(request.user, request.lease,
                         returned=result is not None and result.lease_returned)
    node = request.node
    if result is None:
        raise ApiError("GatewayTimeoutError", f"node {node} did not answer in time; the "
                       "command may still have run", 504)
    if result.outcome == Outcome.BUSY:
        raise ApiError("ServiceUnavailableError", f"node {node} runs as many commands as "
                       "it may at once; try again shortly", 503,
                       headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if result.outcome == Outcome.NOT_RUNNING:
        raise ApiError("ConflictJobError", f"task {role}[{index}] of job {name} is not running "
                       f"on node {node}: {result.message}", 409)
    return {"exitCode": result.exit_code, "output": result.output,
            "truncated": result.truncated, "timedOut": result.timed_out}


def _sent(username: str, name: str, role: str, index: int, body: dict[str, Any],
          wait: float) -> ExecRequest:
    """The request, written, its slot and lease held: decided on the token
    check this process remembers, with the write holding to it
    (services/api/auth.py `authenticate`), as a submit is. What is not
    written does not hold to anything, so a refusal decided on a remembered
    check is decided again after a fresh one: a revoked token answers 401,
    not what the job holds."""
    def decide(remembered: bool) -> ExecRequest:
        return _send(username, name, role, index, body, wait,
                     token_expectations() if remembered else [])

    # a 429 comes from the write itself, once everything held
    return decide_on_remembered(decide, write_refusal=429)


def _send(username: str, name: str, role: str, index: int, body: dict[str, Any],
          wait: float, expectations: list[Expect]) -> ExecRequest:
    """Write the request, its call to the node and its audit, with the
    caller's lease, in one step held to `expectations`: the request; or
    FollowRefused (the caller's cap, this process's slots)."""
    job, task = job_and_task(username, name, role, index)
    node = running_node(job, task, role, index)
    caller = current_user()
    store = platform().store
    sent: list[ExecRequest] = []

    def take(lease: followleases.Lease) -> bool:
        request = ExecRequest.new(job_id=job.id, attempt=job.attempt, role=role, index=index,
                                  node=node, argv=body["command"],
                                  timeout_seconds=body["timeoutSec"], user=caller.username,
                                  answer_by_ms=now_ms() + int(wait * 1000), lease=lease.lease)
        sent.append(request)
        return gated.write(store, lease, lambda batch: _record(store, batch, request),
                           expectations)

    _execs().caps.open(caller.username, take)
    request = sent[-1]
    log.info("exec by %s in %s attempt %d %s[%d] on %s: %s", request.user, request.job_id,
             request.attempt, request.role, request.index, request.node, request.argv)
    return request


def job_and_task(username: str, name: str, role: str, index: int) -> tuple[Job, Task | None]:
    """The job, answered as `get_job_or_404(owner_only=True)` answers it, and
    its task `role`[`index`] of the attempt it is on: read in one round trip
    for a job on its first attempt (most are), the task of a later attempt
    read after the job says which. A job without a record (gone, or
    compacted: its archive is read) is read the general way."""
    store = platform().store
    first: list[Task | None] = []  # the first attempt's task, read with its job

    def read(job_id: str) -> Job | None:
        found, task = store.read_live_task(job_id, FIRST_ATTEMPT, role, index)
        if found is None:
            return store.get_job(job_id)
        if found.attempt == FIRST_ATTEMPT:
            first.append(task)
        return found

    job = get_job_or_404(username, name, owner_only=True, action="run commands in the tasks",
                         read=read)
    return job, first[0] if first else store.get_task(job.id, job.attempt, role, index)


def running_node(job: Job, task: Task | None, role: str, index: int) -> str:
    """The node of the job's task `role`[`index`] (`task`, of its current
    attempt), if it runs now: else 404 (no such task) or 409 (not running)."""
    name = split_job_id(job.id)[1]
    if task is None:
        raise ApiError("NoTaskError", f"job {name} has no task {role}[{index}]", 404)
    if job.state != JobState.RUNNING or task.state != TaskState.RUNNING or task.node is None:
        raise ApiError("ConflictJobError", f"task {role}[{index}] of job {name} is not running "
                       f"(the task is {task.state.value}, the job {job.state.value})", 409)
    return task.node


def _record(store: Store, pipe: Any, request: ExecRequest) -> None:
    """Queue the request, the call to its node and the audit of it on `pipe`."""
    execs.write_request(pipe, request)
    nodecalls.send(pipe, request.node, nodecalls.Kind.EXEC, request.id,
                   nodecalls.TaskAt(request.job_id, request.attempt, request.role, request.index))
    store.add_event(pipe, request.job_id, "exec", user=request.user, attempt=request.attempt,
                    role=request.role, index=request.index, argv=request.argv)
    telemetry.record(pipe, telemetry.TASK_EXECS, {"user": request.user})
