"""Jobs: submit (v1 JSON or YAML, and protocol v2 at /api/v2/jobs), list, read, stop,
delete, and a job's samples and metrics (its tasks' logs: services/api/tasklogs.py)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import yaml
from flask import Blueprint, Response, current_app, g, request
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from services.api import jobmetrics
from services.api.auth import (
    current_user,
    decide_on_remembered,
    decided_fresh,
    require_self_or_admin,
    token_expectations,
)
from services.api.bodies import View, load_body, read_document, read_yaml, takes
from services.api.errors import ApiError
from services.api.platform import extension_of, platform
from services.api.queries import (
    JobListQuerySchema,
    JobMetricsQuerySchema,
    SubmitQuerySchema,
    TaskSamplesQuerySchema,
    load_query,
    takes_query,
)
from services.api.render import job_detail, job_summary
from services.api.schemas import StopRequestSchema
from services.api.storage import check_job_storage
from shared.domain.archive import diagnostics_of
from shared.domain.capabilities import refused_capabilities
from shared.domain.configshape import ShapeCache
from shared.domain.feasibility import infeasible_reasons
from shared.domain.jobspec import (
    InvalidJobConfig,
    ValidatedConfig,
    is_job_name,
    shown_config,
)
from shared.domain.jobspec_v2 import ConvertedConfig, convert_v2, is_v2, redact
from shared.domain.models import Job, JobSpec, Node, job_id_of
from shared.domain.priority import PriorityClass
from shared.domain.states import TaskState
from shared.infra.clock import now_ms
from shared.state import checkpoints, idle, keys, passwake, sshkeys, tasksamples
from shared.state.accounts import DEFAULT_VC, Accounts, User, VirtualCluster
from shared.state.lifecycle import delete_job, queue_new_job, request_stop
from shared.state.retention import remove_logs
from shared.state.store import Expect, JobConflict

bp = Blueprint("jobs", __name__, url_prefix="/api/v1")
bp_v2 = Blueprint("jobs_v2", __name__, url_prefix="/api/v2")

MAX_METRIC_TASKS = 64  # tasks a job's metrics answer holds at most, by role and index
MAX_METRIC_SAMPLES = 20_000  # samples read per task when the monitor's are shown
MAX_IDLE_SHOWN = 200  # idle tasks listed at most, longest idle first
# Feasibility at submit is judged against nodes read at most this long ago.
NODES_FRESH_SECONDS = 1.0
NODES_EXTENSION = "pai.known_nodes"
# A submit decides on a VC record read at most this long ago by this
# process; its write holds to it (`_vc_for_submit`).
VC_FRESH_SECONDS = 10.0
VCS_EXTENSION = "pai.known_vcs"
# Validated configs by shape, per process (shared/domain/configshape.py).
SHAPES_EXTENSION = "pai.config_shapes"
# The stored config's key for a v2 job's submission as it may be shown back.
V2_SUBMISSION = "protocolV2"


def _config_body(read: Callable[[], Any] = read_document) -> Any:
    """The job config as JSON, or YAML under a YAML content type (the limits
    of services/api/bodies.py), its errors under the code job configs answer with."""
    try:
        return read()
    except ApiError as error:
        if error.status != 400:
            raise
        raise ApiError("InvalidJobConfigError", error.message, 400) from None


def get_job_or_404(username: str, name: str, *, owner_only: bool = False,
                   action: str = "do this",
                   read: Callable[[str], Job | None] | None = None) -> Job:
    """The job, or 404; with owner_only, 403 unless the caller owns it or is
    admin. Owning is being the user the job was submitted by (its immutable
    id), not merely a later user of the same name. `read`: how the job's
    record is read, given its id (the store's `get_job` unless a view reads
    more with it)."""
    username = username.lower()  # user names are case-insensitive
    caller = require_self_or_admin(username, f"{action} for this job") if owner_only else None
    reader = read or platform().store.get_job
    job = reader(job_id_of(username, name)) if is_job_name(name) else None
    if job is None:
        raise ApiError("NoJobError", f"job {name} of user {username} not found", 404)
    if caller is not None and not caller.admin and job.user_id and job.user_id != caller.uid:
        raise ApiError("ForbiddenUserError",
                       f"job {name} belongs to an earlier user named {username}", 403)
    return job


# Both submit views answer alike: 202, or with dryRun 200 and the config as it
# would be stored; only the bodies they take differ (`_submit_operation`).
_SUBMIT_OPERATION = """
    ---
    post:
      errors: [400, 403, 404, 409]
      requestBody:
        required: true
        content:
{content}
      responses:
        202: Submitted
        200:
          description: dryRun; the config as it would be stored
          content: {{application/json: {{schema: DryRun}}}}
"""


def _submit_operation(*content: str) -> Callable[[View], View]:
    """A submit view's OpenAPI operation, after its own summary: `content`,
    one line a media type it takes, is all that is particular to it."""
    lines = "\n".join(f"          {media}" for media in content)

    def document(view: View) -> View:
        view.__doc__ = (view.__doc__ or "") + _SUBMIT_OPERATION.format(content=lines)
        return view

    return document


@bp.post("/jobs", endpoint="submit")
@bp.post("/user/<username>/jobs", endpoint="submit_for_user")
@takes_query(SubmitQuerySchema())
@_submit_operation("application/json: {schema: JobConfig}",
                   'text/yaml: {schema: {type: string, description: "a v1 or protocol v2 config"}}')
def submit(username: str | None = None) -> tuple[dict[str, Any], int]:
    """Submit a job: as the caller, or for a user (themselves, or anyone for an admin)."""
    dry_run = load_query()["dryRun"]
    return _submit(username or current_user().username, _config_body(), dry_run)


@bp_v2.post("/jobs", endpoint="submit")
@takes_query(SubmitQuerySchema())
@_submit_operation(*(f"{media}: {{schema: JobConfigV2}}"
                     for media in ("text/yaml", "application/yaml", "application/json")))
def submit_v2() -> tuple[dict[str, Any], int]:
    """Submit an OpenPAI protocol v2 job (YAML; JSON is YAML) as the caller."""
    dry_run = load_query()["dryRun"]
    body = _config_body(read_yaml)
    if not is_v2(body):
        raise ApiError("InvalidJobConfigError", "this endpoint takes protocol v2 configs",
                       400, fields={"protocolVersion": ["Must be 2."]})
    return _submit(current_user().username, body, dry_run)


def _check_vc(username: str, vc_name: str, vc: VirtualCluster | None, gpus: int,
              priority: str) -> User:
    """The VC exists, the user may use it, and it can ever run the job (a VC
    that does not borrow runs only what its guarantee holds); the job's owner."""
    accounts = Accounts(platform().store)
    if vc is None:
        raise ApiError("NoVirtualClusterError", f"virtual cluster {vc_name} does not exist",
                       400, fields={"virtualCluster": [f"no virtual cluster {vc_name}"]})
    caller = current_user()  # read by this request's token check: no need to ask again
    owner = caller if caller.username == username else accounts.get_user(username)
    if owner is None:
        raise ApiError("NoUserError", f"user {username} does not exist", 404)
    if not owner.may_use(vc_name):
        raise ApiError("ForbiddenUserError",
                       f"user {username} may not use virtual cluster {vc_name}", 403)
    if not vc.borrowing and priority == PriorityClass.OPPO.label:
        raise ApiError("InvalidJobConfigError", "the job can never run in its virtual "
                       "cluster", 400, fields={"jobPriorityClass": [
                           f"oppo jobs run only on borrowed GPUs; virtual cluster "
                           f"{vc_name} does not borrow"]})
    # `default`'s guarantee is what the others leave: it moves with the nodes
    if not vc.borrowing and vc_name != DEFAULT_VC and gpus > (vc.gpu_quota or 0):
        raise ApiError("InvalidJobConfigError", "the job can never run in its virtual "
                       "cluster", 400, fields={"virtualCluster": [
                           f"the job needs {gpus} GPUs at once; {vc_name} is guaranteed "
                           f"{vc.gpu_quota or 0} and does not borrow"]})
    return owner


def _check_capabilities(spec: JobSpec, vc: VirtualCluster | None) -> None:
    """A job gets a capability beyond the default set only where an admin allowed it."""
    refused = refused_capabilities(spec.capabilities, vc.allowed_capabilities if vc else [])
    if refused:
        raise ApiError("ForbiddenCapabilityError",
                       f"virtual cluster {spec.virtual_cluster} does not allow "
                       f"{', '.join(refused)}", 403,
                       fields={"extras.capabilities": [
                           f"not allowed in virtual cluster {spec.virtual_cluster}: {c}"
                           for c in refused]})


def _vc_for_submit(name: str, remembered: bool,
                   capabilities: bool) -> tuple[VirtualCluster | None, list[Expect]]:
    """The VC a submit decides on, and what its write must find unchanged.

    With `remembered`, a VC read by this process within VC_FRESH_SECONDS
    serves, and the write holds to the fields the checks use (so a VC
    deleted, recreated or changed meanwhile writes nothing: the submit
    decides again on fresh reads). A VC not found is always read again.
    """
    cache = current_app.extensions.setdefault(VCS_EXTENSION, {})
    now = time.monotonic()
    found = cache.get(name) if remembered else None
    g.vc_remembered = found is not None and found[1] > now
    if found is None or not g.vc_remembered:
        vc = Accounts(platform().store).get_vc(name)
        if vc is not None:
            cache[name] = (vc, now + VC_FRESH_SECONDS)
        return vc, []
    vc = found[0]
    record = keys.vc(vc.name)
    expected = [
        Expect.field_equals(record, "created_ms", str(vc.created_ms)),
        Expect.field_equals(record, "borrowing", "1" if vc.borrowing else "0"),
        Expect.field_equals(record, "gpu_quota",
                            "" if vc.gpu_quota is None else str(vc.gpu_quota)),
    ]
    if capabilities:
        expected.append(Expect.field_equals(record, "allowed_capabilities",
                                            json.dumps(sorted(set(vc.allowed_capabilities)))))
    return vc, expected


def _known_nodes() -> list[Node]:
    """Every node that ever reported, as read at most NODES_FRESH_SECONDS ago.

    Reading and parsing every node's inventory on each submit made a submit
    cost O(nodes) (31 ms of CPU with 1,000 nodes, docs/performance-log.md); the
    inventories change only when a node registers again.
    """
    cache = current_app.extensions.setdefault(NODES_EXTENSION, {})
    now = time.monotonic()
    if cache.get("until", 0.0) <= now:
        cache["nodes"] = platform().store.get_nodes()
        cache["until"] = now + NODES_FRESH_SECONDS
    nodes: list[Node] = cache["nodes"]
    return nodes


def _submit(username: str, body: Any, dry_run: bool) -> tuple[dict[str, Any], int]:
    """Decide on what this process remembers (the token check, the VC) with
    the write holding to it (services/api/auth.py `authenticate`). What is
    not written does not hold to anything, so a refusal decided on
    remembered records, and a dry run, are decided again on fresh reads: a
    VC granted a moment ago is usable, a revoked token answers 401."""
    def decide(remembered: bool) -> tuple[dict[str, Any], int]:
        return _submit_decided(username, body, remembered=remembered, dry_run=dry_run)

    if dry_run:
        return decided_fresh(decide)
    # a 409 comes from the write itself, once everything held
    return decide_on_remembered(decide, write_refusal=409,
                                also_remembered=lambda: bool(g.get("vc_remembered")))


def _submit_decided(username: str, body: Any, remembered: bool,
                    dry_run: bool) -> tuple[dict[str, Any], int]:
    username = username.lower()  # user names are case-insensitive
    caller = require_self_or_admin(username, "submit jobs")
    pai = platform()
    validated: ValidatedConfig | ConvertedConfig
    try:
        if is_v2(body):
            validated = convert_v2(body, username=username,
                                   storage_roots=pai.settings.storage_roots,
                                   hdfs_webhdfs_url=pai.settings.hdfs_webhdfs_url)
        else:  # most submits repeat a config but for its name: once per shape
            shapes = extension_of(current_app, SHAPES_EXTENSION, ShapeCache)
            validated = shapes.validate(body, username=username,
                                        storage_roots=pai.settings.storage_roots,
                                        hdfs_webhdfs_url=pai.settings.hdfs_webhdfs_url)
    except InvalidJobConfig as error:
        raise ApiError("InvalidJobConfigError", error.message, 400, fields=error.fields) \
            from None
    check_job_storage(validated.config, caller)
    spec = JobSpec.from_config(validated.config)
    vc, expected = _vc_for_submit(spec.virtual_cluster, remembered, bool(spec.capabilities))
    owner = _check_vc(username, spec.virtual_cluster, vc,
                      sum(r.gpu_number * r.task_number for r in spec.task_roles),
                      spec.priority_class)
    if spec.capabilities:
        _check_capabilities(spec, vc)
    reasons = infeasible_reasons(spec, _known_nodes())
    if reasons:
        raise ApiError("InvalidJobConfigError", "the job can never run on this cluster", 400,
                       fields=reasons)
    notes = validated.notes
    stored, shown = validated.config, shown_config(validated.config)
    if isinstance(validated, ConvertedConfig):
        # What GET .../config shows back: the submission, its secrets out.
        stored = {**validated.config, V2_SUBMISSION: validated.shown}
        shown = shown_config(redact(validated.config, validated.secrets))
    extra = {"notes": notes} if notes else {}
    if dry_run:
        return {"config": shown, "ignoredFields": validated.ignored, **extra}, 200
    try:
        # One round trip: the job, its indexes, its queue place, its event and
        # the scheduler's pass flag (shared/state/store/jobs.py `insert_job`).
        with sshkeys.key_kept(pai.store.r, job_id_of(username, spec.name), spec.ssh):
            queued = queue_new_job(pai.store, username, stored, spec=spec, user_id=owner.uid,
                                   expectations=[*token_expectations(), *expected]
                                   if remembered else [])
    except JobConflict as error:
        raise ApiError("ConflictJobError", str(error), 409) from None
    job = queued.job
    try:
        if queued.pass_claimed:
            passwake.ring_now(pai.store.r, new_work=True)
    except (RedisError, OperationalError) as error:
        # The job is stored and queued: the scheduler's periodic pass places
        # it. A 503 now would send the client back to submit it again, and
        # get a 409 for its own job (a primary switch, docs/high-availability.md).
        logging.getLogger("pai.api").warning(
            "job %s stored; the scheduler was not told now (%s)", job.id, error)
    return {
        "name": job.name,
        "username": username,
        "state": job.state.value,
        "url": f"/api/v1/user/{username}/jobs/{job.name}",
        "ignoredFields": validated.ignored,
        **extra,
    }, 202


@bp.get("/jobs")
@takes_query(JobListQuerySchema())
def list_jobs() -> dict[str, Any] | list[dict[str, Any]]:
    """Jobs newest first (or oldest first, or by another field), filtered; a page
    with the total on request.
    ---
    get:
      errors: [400]
      responses:
        200:
          content:
            application/json:
              schema:
                oneOf:
                - {type: array, items: JobSummary}
                - JobPage
    """
    query = load_query()
    jobs, total = platform().store.list_jobs(
        username=query.get("username"), vc=query.get("vc"), state=query.get("state"),
        keyword=query.get("keyword"), offset=query["offset"], limit=query["limit"],
        oldest_first=query["order"] == "asc",
        sort=query["sort"])
    rows = [job_summary(j) for j in jobs]
    if query["withTotalCount"]:
        return {"totalCount": total, "data": rows}
    return rows


@bp.get("/user/<username>/jobs")
def list_user_jobs(username: str) -> list[dict[str, Any]]:
    """A user's jobs, newest first (at most 1000).
    ---
    get:
      responses: {200: [JobSummary]}
    """
    jobs, _ = platform().store.list_jobs(username=username, limit=1000)
    return [job_summary(j) for j in jobs]


@bp.delete("/user/<username>/jobs/<name>")
def remove(username: str, name: str) -> dict[str, Any]:
    """Delete a finished job, so that its name may be used again.
    ---
    delete:
      errors: [403, 404, 409]
      responses: {200: Message}
    """
    job = get_job_or_404(username, name, owner_only=True, action="delete")
    if not job.state.is_final:
        raise ApiError("ConflictJobError",
                       f"job {name} is {job.state.value}; stop it before deleting it", 409)
    remove_logs(platform().settings.task_log_dir, job.id)
    delete_job(platform().store, job.id)
    return {"message": f"job {name} deleted; its name may be used again"}


@bp.get("/user/<username>/jobs/<name>")
def detail(username: str, name: str) -> dict[str, Any]:
    """A job's status, its current attempt's tasks and every attempt.
    ---
    get:
      errors: [404]
      responses: {200: JobDetail}
    """
    store = platform().store
    job, tasks = store.job_with_tasks(get_job_or_404(username, name))
    config = store.get_config(job.id) or {"taskRoles": []}
    roles = [r["name"] for r in config["taskRoles"]]
    position = store.queue_position(job)
    attempts = store.get_attempts(job.id)
    # a compacted record leaves out what its last attempt tells (shared/domain/archive.py)
    job.exit_diagnostics = diagnostics_of(job.state.value, job.exit_diagnostics, attempts)
    flagged = idle.flagged_tasks(store.r, job.id, job.attempt, tasks, now_ms(),
                                 int(platform().settings.idle_gpu_seconds * 1000))
    return job_detail(job, roles, tasks, attempts, f"/api/v1/user/{username}/jobs/{name}",
                      position, flagged,
                      checkpoints.read_steps(store.r, job.id))


@bp.get("/user/<username>/jobs/<name>/config")
def config(username: str, name: str) -> Response | dict[str, Any]:
    """The config a job runs from, normalized (a v2 job's: as submitted, its
    secrets hidden); YAML when Accept asks for it.
    ---
    get:
      errors: [403, 404]
      responses:
        200:
          content:
            application/json: {schema: {oneOf: [JobConfig, JobConfigV2]}}
            application/yaml: {schema: {type: string}}
            text/yaml: {schema: {type: string}}
    """
    job = get_job_or_404(username, name, owner_only=True, action="read the config")
    found = platform().store.get_config(job.id)
    if found is None:
        raise ApiError("NoJobError", f"job {name} has no stored config", 404)
    # A v2 job shows its submission (secrets out), not the v1 config it runs from.
    shown = found.get(V2_SUBMISSION) or shown_config(found)
    best = request.accept_mimetypes.best_match(
        ["application/json", "application/yaml", "text/yaml"], default="application/json")
    if best in ("application/yaml", "text/yaml"):
        return Response(yaml.safe_dump(shown, sort_keys=False), mimetype=best)
    return dict(shown)


@bp.put("/user/<username>/jobs/<name>/executionType")
@takes(StopRequestSchema())
def execution_type(username: str, name: str) -> tuple[dict[str, Any], int]:
    """Stop a job; a finished job is left as it is.
    ---
    put:
      errors: [403, 404]
      responses: {202: StopAccepted}
    """
    load_body()  # {"value": "STOP"}, nothing else
    pai = platform()
    job = request_stop(pai.store, get_job_or_404(username, name, owner_only=True,
                                                 action="stop").id)
    pai.messenger.stop_job(job.id)
    return {"message": f"stop requested for job {name}", "state": job.state.value}, 202


def task_asked(username: str, name: str, role: str, index: int, *,
               action: str) -> tuple[Job, dict[str, Any], int]:
    """The job, if the caller owns it or is an admin (else 403/404), the
    view's query, and the attempt it names, which has task `role`[`index`]
    (else 404)."""
    job, query, attempt = _job_asked(username, name, action=action)
    if not platform().store.task_exists(job.id, attempt, role, index):
        raise ApiError("NoTaskError", f"job {name} has no task {role}[{index}]", 404)
    return job, query, attempt


def _job_asked(username: str, name: str, *, action: str) -> tuple[Job, dict[str, Any], int]:
    job = get_job_or_404(username, name, owner_only=True, action=action)
    query = load_query()
    return job, query, _attempt_asked(job, query)


def _attempt_asked(job: Job, query: dict[str, Any]) -> int:
    """The attempt a query names (`attempt`), else the job's current one; 400
    for one the job has not reached."""
    attempt: int = query.get("attempt", job.attempt)
    if attempt > job.attempt:
        raise ApiError("BadRequestError", f"job {job.name} has attempts 0..{job.attempt}")
    return attempt


@bp.get("/user/<username>/jobs/<name>/tasks/<role>/<int:index>/samples")
@takes_query(TaskSamplesQuerySchema())
def task_samples(username: str, name: str, role: str, index: int) -> dict[str, Any]:
    """A task attempt's CPU, memory and GPU use over time, as its node's monitor
    sampled it (kept until the finished job is compacted); who may read its log.
    ---
    get:
      errors: [400, 403, 404]
      responses: {200: TaskSamples}
    """
    job, query, attempt = task_asked(username, name, role, index, action="read the samples")
    store = platform().store
    found = tasksamples.read(store.r, job.id, attempt, role, index, limit=query["limit"])
    return {"attempt": attempt, "intervalSeconds": platform().settings.task_sample_seconds,
            "samples": [sample.to_dict() for sample in found]}


@bp.get("/user/<username>/jobs/<name>/metrics")
@takes_query(JobMetricsQuerySchema())
def job_metrics(username: str, name: str) -> dict[str, Any]:
    """A job attempt's CPU, memory, GPU and GPU memory use over time, per task:
    from Prometheus when PAI_PROMETHEUS_URL is set, else (or when it fails)
    from the monitor's samples, as `source` says (all it kept unless `from`
    or `to` is given); who may read its log.
    ---
    get:
      errors: [400, 403, 404]
      responses: {200: JobMetrics}
    """
    job, query, attempt = _job_asked(username, name, action="read the metrics")
    settings = platform().settings
    to_ms = query.get("to", job.completed_ms if job.state.is_final and job.completed_ms
                      else now_ms())
    from_ms = query.get("from_", min(job.created_ms, to_ms - 1))
    if from_ms >= to_ms:
        raise ApiError("BadRequestError", "`from` must be before `to`")
    answer: dict[str, Any] = {"attempt": attempt, "final": job.state.is_final,
                              "from": from_ms, "to": to_ms, "fallbackReason": None}
    if settings.prometheus_url:
        step = jobmetrics.span(from_ms, to_ms, query.get("step"))
        try:
            found = jobmetrics.query_range(
                settings.prometheus_url, jobmetrics.queries(username, name, attempt),
                from_ms, to_ms, step, settings.prometheus_timeout_seconds)
            return {**answer, "source": jobmetrics.SOURCE_PROMETHEUS, "stepSeconds": step,
                    "tasks": jobmetrics.task_samples(found)[:MAX_METRIC_TASKS]}
        except jobmetrics.PrometheusError as error:
            logging.getLogger("pai.api").warning(
                "job %s/%s metrics: Prometheus failed: %s", username, name, error)
            answer["fallbackReason"] = f"Prometheus failed: {error}"
    store = platform().store
    tasks = []
    for task in store.get_tasks(job.id, attempt)[:MAX_METRIC_TASKS]:
        kept = tasksamples.read(store.r, job.id, attempt, task.role, task.index,
                                limit=MAX_METRIC_SAMPLES)
        tasks.append({"taskRole": task.role, "taskIndex": task.index, "samples": [
            {**sample.to_dict(), "gpuMemoryBytes": None} for sample in kept
            if query.get("from_", 0) <= sample.time_ms <= query.get("to", sample.time_ms)]})
    return {**answer, "source": jobmetrics.SOURCE_SAMPLES,
            "stepSeconds": settings.task_sample_seconds, "tasks": tasks}


@bp.get("/idle-gpu-tasks")
def idle_gpu_tasks() -> list[dict[str, Any]]:
    """Running tasks holding GPUs they have not used for PAI_IDLE_GPU_SECONDS
    (every GPU below PAI_IDLE_GPU_PERCENT), longest idle first; anyone signed
    in sees them, as anyone sees the job list.
    ---
    get:
      responses: {200: [IdleGpuTask]}
    """
    store, settings = platform().store, platform().settings
    nodes = list(store.node_heartbeats())
    found = idle.flagged_on(store.r, nodes, now_ms(), int(settings.idle_gpu_seconds * 1000))
    rows = []
    for task in found[:MAX_IDLE_SHOWN]:
        user, name = task.job_id.split("~", 1)
        held = next((t for t in store.get_tasks(task.job_id, task.attempt)
                     if t.role == task.role and t.index == task.index), None)
        if held is None or held.state != TaskState.RUNNING or held.node != task.node:
            continue  # ended since its node's monitor last wrote (or that monitor is gone)
        rows.append({"username": user, "jobName": name, "attempt": task.attempt,
                     "taskRole": task.role, "taskIndex": task.index, "node": task.node,
                     "gpus": list(held.gpus), "idleSince": task.since_ms})
    return rows
