"""The API's bodies as marshmallow schemas: what requests are loaded by
(a view declares one with `@takes`, services/api/bodies.py) and what the OpenAPI document shows,
one declaration for both, so the served spec is what the code enforces.
Responses are described here too, and a test holds every response to them.
The job config is not repeated: it is `shared.domain.jobspec.JobConfigSchema`.
This module imports no view (the views import it).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from marshmallow import (
    EXCLUDE,
    RAISE,
    Schema,
    ValidationError,
    fields,
    post_load,
    validate,
    validates_schema,
)

from shared.domain import jobsort
from shared.domain.capabilities import GRANTABLE
from shared.domain.cluster import BORROWED, GUARANTEED, NODE_STATES
from shared.domain.jobspec import JobConfigSchema, WholeNumber
from shared.domain.jobspec_v2 import JobConfigV2Schema
from shared.domain.names import INPUT_PATTERN
from shared.domain.priority import CLASS_NAMES
from shared.domain.states import JobState, TaskState
from shared.state import execs, execsessions
from shared.state.usage import ON_EXHAUSTED, PERIODS

MIN_PASSWORD, MAX_PASSWORD = 6, 256
DEFAULT_EXPIRATION_S = 7 * 24 * 3600
MAX_EXPIRATION_S = 90 * 24 * 3600
MAX_TAIL = 100_000  # log lines one plain read returns
MAX_REASON = 512  # characters of an admin's reason for cordoning a node

JOB_STATES = [s.value for s in JobState]
_MS = {"description": "epoch milliseconds"}


def _ms(*, allow_none: bool = False) -> fields.Integer:
    return fields.Integer(required=True, allow_none=allow_none, metadata=_MS)


# ---------------------------------------------------------------- common


class _Request(Schema):
    """A request body: a field the schema does not know is a 400 naming it
    (a typo must not be silently ignored)."""

    class Meta:
        unknown = RAISE


class _JsonBoolean(fields.Boolean):
    """Only JSON's true and false: a set of {True} alone would still let 1 in
    (1 == True in Python)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if type(value) is not bool:
            raise self.make_error("invalid", input=value)
        return value


def _flag(**kwargs: object) -> fields.Boolean:
    """JSON's true and false only (not "yes", 1 or "on")."""
    return _JsonBoolean(**kwargs)  # type: ignore[arg-type]


class ErrorSchema(Schema):
    code = fields.String(required=True, metadata={"example": "NoJobError"})
    message = fields.String(required=True)
    field_errors = fields.Dict(keys=fields.String(), values=fields.List(fields.String()),
                               data_key="fields",
                               metadata={"description": "every offending field by dotted path"})


class MessageSchema(Schema):
    message = fields.String(required=True)


class HealthSchema(Schema):
    status = fields.String(required=True, validate=validate.OneOf(["ok", "unhealthy"]))
    redis = fields.String(required=True)


# ---------------------------------------------------------------- tokens


class TokenRequestSchema(_Request):
    username = fields.String(required=True, validate=validate.Length(min=1))
    password = fields.String(required=True, validate=validate.Length(min=1))
    expiration = fields.Integer(load_default=DEFAULT_EXPIRATION_S,
                                validate=validate.Range(min=60, max=MAX_EXPIRATION_S),
                                metadata={"description": "seconds the token lives"})


class TokenSchema(Schema):
    token = fields.String(required=True)
    user = fields.String(required=True)
    admin = fields.Boolean(required=True)
    expires = _ms()


# ---------------------------------------------------------------- users


def _password() -> fields.String:
    return fields.String(required=True,
                         validate=validate.Length(min=MIN_PASSWORD, max=MAX_PASSWORD))


class UserSchema(Schema):
    username = fields.String(required=True)
    admin = fields.Boolean(required=True)
    virtualClusters = fields.List(fields.String(), required=True)
    createdTime = _ms()


class UserCreateSchema(_Request):
    username = fields.String(required=True, validate=validate.Regexp(INPUT_PATTERN))
    password = _password()
    admin = _flag(load_default=False)
    virtualClusters = fields.List(fields.String(validate=validate.Length(max=64)),
                                  load_default=lambda: ["default"],
                                  validate=validate.Length(max=1000))


class PasswordChangeSchema(_Request):
    newPassword = _password()
    oldPassword = fields.String(
        metadata={"description": "required unless an admin changes another user's"})


class AdminFlagSchema(_Request):
    value = _flag(required=True)


class UserVirtualClustersSchema(_Request):
    virtualClusters = fields.List(fields.String(validate=validate.Length(max=64)),
                                  required=True, validate=validate.Length(max=1000))


# ---------------------------------------------------------------- jobs


class JobSummarySchema(Schema):
    name = fields.String(required=True)
    username = fields.String(required=True)
    state = fields.String(required=True, validate=validate.OneOf(JOB_STATES))
    subState = fields.String(required=True,
                             validate=validate.OneOf([*JOB_STATES, "WAITING_FOR_RESOURCES"]))
    executionType = fields.String(required=True, validate=validate.OneOf(["START", "STOP"]))
    retries = fields.Integer(required=True)
    createdTime = _ms()
    completedTime = _ms(allow_none=True)
    appExitCode = fields.Integer(required=True, allow_none=True)
    virtualCluster = fields.String(required=True)
    gpus = fields.Integer(required=True, metadata={"description": "GPUs the job asks for"})
    startedTime = _ms(allow_none=True)  # when the current attempt started running
    priorityClass = fields.String(required=True, validate=validate.OneOf(CLASS_NAMES))
    waitingReason = fields.String(required=True, metadata={
        "description": "why it waits, in a sentence (\"\" when not waiting)"})
    mode = fields.String(required=True, allow_none=True,
                         validate=validate.OneOf([GUARANTEED, BORROWED]), metadata={
                             "description": "while placed: on its virtual cluster's guarantee, "
                                            "or on borrowed GPUs (preemptible)"})


class BlockerSchema(Schema):
    kind = fields.String(required=True, metadata={
        "description": "quota, budget, userBudget, reservation, job, resources, nodes or gpuType"})
    name = fields.String(required=True)


class WaitingSchema(Schema):
    reason = fields.String(required=True, metadata={"description": "a reason code"})
    message = fields.String(required=True)
    position = fields.Integer(required=True, metadata={
        "description": "place in its virtual cluster's queue, 1 = next"})
    ahead = fields.Integer(required=True)
    blockedBy = fields.List(fields.Nested(BlockerSchema), required=True)
    estimatedStartTime = _ms(allow_none=True)


class JobPageSchema(Schema):
    totalCount = fields.Integer(required=True)
    data = fields.List(fields.Nested(JobSummarySchema), required=True)


class JobStatusSchema(JobSummarySchema):
    class Meta:
        exclude = ("name",)

    appExitDiagnostics = fields.String(required=True)
    attemptIndex = fields.Integer(required=True)
    platformRetries = fields.Integer(required=True)
    waiting = fields.Nested(WaitingSchema, required=True, allow_none=True)
    preemptedBy = fields.String(required=True, allow_none=True, metadata={
        "description": "being preempted to make room for this job"})
    preemptionDeadline = _ms(allow_none=True)
    preemptions = fields.Integer(required=True, metadata={
        "description": "attempts ended by preemption (never counted in retries)"})


class TaskStatusSchema(Schema):
    taskIndex = fields.Integer(required=True)
    taskState = fields.String(required=True,
                              validate=validate.OneOf([s.value for s in TaskState]))
    containerId = fields.String(required=True, allow_none=True)
    containerIp = fields.String(required=True, allow_none=True)
    containerPorts = fields.Dict(
        keys=fields.String(), required=True,
        values=fields.Raw(metadata={"oneOf": [{"type": "integer"}, {"type": "string"}]}),
        metadata={"description": 'label -> port: {"default": 15000, "<label>": "p1,p2"}'})
    containerGpus = fields.List(fields.Integer(), required=True)
    containerNodeName = fields.String(required=True, allow_none=True)
    containerExitCode = fields.Integer(required=True, allow_none=True)
    containerExitDiagnostics = fields.String(required=True)
    containerLog = fields.String(required=True)
    launchedTime = _ms(allow_none=True)
    startedTime = _ms(allow_none=True)
    completedTime = _ms(allow_none=True)
    retries = fields.Integer(required=True, metadata={
        "description": "times this task was started again by itself after a failure "
                       "(its role's taskRetryCount), within this attempt"})
    idleSince = fields.Integer(required=True, allow_none=True, metadata={
        **_MS, "description": "set while every GPU of the running task has stayed below "
                              "PAI_IDLE_GPU_PERCENT for PAI_IDLE_GPU_SECONDS: since when"})


class TaskSamplesQuerySchema(Schema):
    attempt = fields.Integer(validate=validate.Range(min=0),
                             metadata={"description": "default: the job's current attempt"})
    limit = fields.Integer(load_default=2000, validate=validate.Range(min=1, max=20_000),
                           metadata={"description": "the last samples to send"})


class TaskSampleSchema(Schema):
    time = _ms()
    cpuPercent = fields.Float(required=True, allow_none=True,
                              metadata={"description": "100 = one core busy"})
    memoryBytes = fields.Integer(required=True, allow_none=True)
    gpuPercent = fields.List(fields.Float(allow_none=True), required=True, metadata={
        "description": "each allocated GPU's utilisation, in the task's GPU order"})


class TaskSamplesSchema(Schema):
    attempt = fields.Integer(required=True)
    intervalSeconds = fields.Float(required=True)
    samples = fields.List(fields.Nested(TaskSampleSchema), required=True)


MAX_METRICS_STEP_SECONDS = 86_400


class JobMetricsQuerySchema(Schema):
    attempt = fields.Integer(validate=validate.Range(min=0),
                             metadata={"description": "default: the job's current attempt"})
    from_ = fields.Integer(data_key="from", validate=validate.Range(min=0), metadata={
        **_MS, "description": "default: when the job was submitted"})
    to = fields.Integer(validate=validate.Range(min=0), metadata={
        **_MS, "description": "default: when the job finished, else now"})
    step = fields.Float(validate=validate.Range(min=1, max=MAX_METRICS_STEP_SECONDS), metadata={
        "description": "seconds between points; at least the span in 1,000 points"})

    @validates_schema
    def check_span(self, data: dict[str, Any], **_: object) -> None:
        if "from_" in data and "to" in data and data["from_"] >= data["to"]:
            raise ValidationError(["must be before `to`"], "from")


class JobMetricsSampleSchema(TaskSampleSchema):
    gpuMemoryBytes = fields.Integer(required=True, allow_none=True, metadata={
        "description": "memory in use on the task's GPUs (Prometheus only)"})


class JobMetricsTaskSchema(Schema):
    taskRole = fields.String(required=True)
    taskIndex = fields.Integer(required=True)
    samples = fields.List(fields.Nested(JobMetricsSampleSchema), required=True)


class JobMetricsSchema(Schema):
    source = fields.String(required=True, validate=validate.OneOf(["prometheus", "samples"]),
                           metadata={"description": "Prometheus, or the monitor's samples"})
    fallbackReason = fields.String(required=True, allow_none=True, metadata={
        "description": "why the samples are shown though Prometheus is configured"})
    attempt = fields.Integer(required=True)
    final = fields.Boolean(required=True, metadata={"description": "the job has ended"})
    from_ = fields.Integer(data_key="from", required=True, metadata=_MS)
    to = _ms()
    stepSeconds = fields.Float(required=True, metadata={
        "description": "Prometheus' step, or the monitor's sampling interval"})
    tasks = fields.List(fields.Nested(JobMetricsTaskSchema), required=True)


class IdleGpuTaskSchema(Schema):
    username = fields.String(required=True)
    jobName = fields.String(required=True)
    attempt = fields.Integer(required=True)
    taskRole = fields.String(required=True)
    taskIndex = fields.Integer(required=True)
    node = fields.String(required=True)
    gpus = fields.List(fields.Integer(), required=True)
    idleSince = _ms()


class TaskRoleNameSchema(Schema):
    name = fields.String(required=True)


class TaskRoleStatusSchema(Schema):
    taskRoleStatus = fields.Nested(TaskRoleNameSchema, required=True)
    taskStatuses = fields.List(fields.Nested(TaskStatusSchema), required=True)


class AttemptSchema(Schema):
    attemptIndex = fields.Integer(required=True)
    state = fields.String(required=True)
    createdTime = _ms()
    startedTime = _ms(allow_none=True)
    completedTime = _ms(allow_none=True)
    exitCode = fields.Integer(required=True, allow_none=True)
    reason = fields.String(required=True)
    platformFailure = fields.Boolean(required=True)
    preemptedBy = fields.String(required=True, allow_none=True)
    checkpointStep = fields.Integer(required=True, allow_none=True, metadata={
        "description": "the highest step of the `PAI_CHECKPOINT_STEP=<step>` lines the job "
                       "printed in this attempt (docs/job-config.md); null if none"})


class JobDetailSchema(Schema):
    name = fields.String(required=True)
    jobStatus = fields.Nested(JobStatusSchema, required=True)
    taskRoles = fields.Dict(keys=fields.String(), values=fields.Nested(TaskRoleStatusSchema),
                            required=True)
    attempts = fields.List(fields.Nested(AttemptSchema), required=True)


class SubmittedSchema(Schema):
    name = fields.String(required=True)
    username = fields.String(required=True)
    state = fields.String(required=True, validate=validate.OneOf(JOB_STATES))
    url = fields.String(required=True)
    ignoredFields = fields.List(fields.String(), required=True)
    notes = fields.List(fields.String(), metadata={
        "description": "what pai does differently from OpenPAI with this job"})


class SubmitQuerySchema(Schema):
    dryRun = fields.Boolean(load_default=False,
                            metadata={"description": "validate and answer 200; store nothing"})


LIST_ORDERS = ("desc", "asc")  # by the sort field (submit time unless named): down, or up


class JobListQuerySchema(Schema):
    offset = fields.Integer(load_default=0, validate=validate.Range(min=0),
                            metadata={"description": "past the last job: an empty page"})
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=1000))
    state = fields.String(validate=validate.OneOf(JOB_STATES))
    username = fields.String()
    vc = fields.String(metadata={"description": "virtual cluster"})
    keyword = fields.String(metadata={"description": "part of the job name"})
    order = fields.String(load_default="desc", validate=validate.OneOf(LIST_ORDERS), metadata={
        "description": "desc (largest, newest first) or asc, by `sort`"})
    sort = fields.String(load_default=jobsort.SUBMIT_TIME, validate=validate.OneOf(jobsort.SORTS),
                         metadata={"description": "the field the whole filtered list is "
                                   "sorted by; equal values in submit-time order, then id"})
    withTotalCount = fields.Boolean(
        load_default=False, metadata={"description": "answer {totalCount, data}, not a list"})


class TaskLogQuerySchema(Schema):
    attempt = fields.Integer(validate=validate.Range(min=0),
                             metadata={"description": "default: the job's current attempt"})
    tail = fields.Integer(load_default=1000, validate=validate.Range(min=0, max=MAX_TAIL),
                          metadata={"description": "the last lines to send"})
    follow = fields.Boolean(load_default=False, metadata={
        "description": "server-sent events: the tail, then new lines until the task ends"})


class DryRunSchema(Schema):
    config = fields.Nested(JobConfigSchema, required=True,
                           metadata={"description": "the config as it would be stored"})
    ignoredFields = fields.List(fields.String(), required=True)
    notes = fields.List(fields.String())


class StopRequestSchema(_Request):
    value = fields.String(required=True, validate=validate.OneOf(["STOP"]))


class StopAcceptedSchema(Schema):
    message = fields.String(required=True)
    state = fields.String(required=True, validate=validate.OneOf(JOB_STATES))


def _check_argv(argv: list[str]) -> None:
    """A command line an exec may run (shared/state/execs.py), else its problems as
    the `command` field's errors."""
    problems = execs.argv_problems(argv)
    if problems:
        raise ValidationError(problems, "command")


class ExecRequestSchema(_Request):
    """A command to run in a task's running container. The largest timeout is
    the platform's setting (PAI_EXEC_MAX_TIMEOUT_SECONDS): the view loads the
    body with `ExecRequestSchema(max_timeout=...)`."""

    command = fields.List(
        fields.String(), required=True,
        validate=validate.Length(min=1, max=execs.MAX_ARGS),
        metadata={"description": "the program and its arguments (no shell unless you "
                                 "run one)", "example": ["nvidia-smi"]})
    timeoutSec = fields.Integer(
        load_default=execs.DEFAULT_TIMEOUT_SECONDS, strict=True,
        validate=validate.Range(min=1, max=execs.MAX_TIMEOUT_SECONDS),
        metadata={"description": "the command is killed after this long"})

    def __init__(self, *args: Any, max_timeout: int = execs.MAX_TIMEOUT_SECONDS,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_timeout = max_timeout

    @validates_schema
    def check_command(self, data: dict[str, Any], **_: object) -> None:
        _check_argv(data.get("command") or [])
        if data.get("timeoutSec", 0) > self.max_timeout:
            raise ValidationError([f"at most {self.max_timeout} seconds on this platform"],
                                  "timeoutSec")


class ExecTtyQuerySchema(Schema):
    """The query of the interactive exec's WebSocket (services/api/exectty.py)."""

    tty = fields.Boolean(required=True, validate=validate.Equal(True), metadata={
        "description": "1: a terminal session over a WebSocket (run a command without one "
                       "with POST)"})
    command = fields.List(fields.String(), validate=validate.Length(min=1, max=execs.MAX_ARGS),
                          metadata={"description": "the program and its arguments, one "
                                                   "`command=` each (default: a start message, "
                                                   "or /bin/sh)"})
    cols = fields.Integer(load_default=execsessions.DEFAULT_COLS,
                          validate=validate.Range(min=1, max=execsessions.MAX_WINDOW))
    rows = fields.Integer(load_default=execsessions.DEFAULT_ROWS,
                          validate=validate.Range(min=1, max=execsessions.MAX_WINDOW))

    @validates_schema
    def check_command(self, data: dict[str, Any], **_: object) -> None:
        if "command" in data:
            _check_argv(data["command"])


def _window_side(name: str) -> fields.Integer:
    """One side of a control message's window: a JSON whole number (not 80.5,
    "80" or true) within the largest window."""
    return fields.Integer(
        strict=True,
        validate=validate.Range(min=1, max=execsessions.MAX_WINDOW,
                                error=f"{name} must be between {{min}} and {{max}}"),
        error_messages={"invalid": f"{name} must be a whole number",
                        "null": f"{name} must be a whole number"})


class ControlMessageSchema(Schema):
    """A text frame of the interactive exec (services/api/exectty.py): {"type":
    "resize", "cols", "rows"} or {"type": "start", "command"?, "cols"?, "rows"?}.
    Other keys are left alone, as a newer client may send them."""

    class Meta:
        unknown = EXCLUDE

    error_messages = {"type": "a text frame must be a JSON object"}

    type = fields.String(
        required=True,
        validate=validate.OneOf(("resize", "start"),
                                error="unknown message type {input!r}: resize or start"),
        error_messages={"required": "unknown message type None: resize or start",
                        "invalid": "unknown message type: resize or start"})
    cols = _window_side("cols")
    rows = _window_side("rows")
    command = fields.List(
        fields.String(error_messages={"invalid": "command must be a list of strings"}),
        error_messages={"invalid": "command must be a list of strings"})

    @validates_schema
    def check_message(self, data: dict[str, Any], **_: object) -> None:
        if data["type"] == "resize" or "cols" in data or "rows" in data:
            for side in ("cols", "rows"):
                if side not in data:
                    raise ValidationError(f"{side} must be a whole number", side)
        if data["type"] == "start" and data.get("command") is not None:
            _check_argv(data["command"])


class ExecResultSchema(Schema):
    exitCode = fields.Integer(required=True, allow_none=True, metadata={
        "description": "the command's exit status; null when it could not be read"})
    output = fields.String(required=True, metadata={
        "description": "stdout and stderr as they came, at most 1 MiB"})
    truncated = fields.Boolean(required=True, metadata={
        "description": "the command printed more than the output holds"})
    timedOut = fields.Boolean(required=True, metadata={
        "description": "the command outlived timeoutSec and was killed"})


# ---------------------------------------------------------------- ssh


class SshContainerSchema(Schema):
    id = fields.String(required=True, metadata={"description": "<role>-<index>"})
    sshIp = fields.String(required=True, metadata={"description": "the node's IP"})
    sshPort = fields.String(required=True, metadata={
        "description": "the task's ssh port (a string, as OpenPAI answers it)"})


class SshKeyPairSchema(Schema):
    folderPath = fields.String(required=True, metadata={
        "description": "where the key files are served (OpenPAI: an HDFS folder)"})
    publicKeyFileName = fields.String(required=True)
    privateKeyFileName = fields.String(required=True)
    privateKeyDirectDownloadLink = fields.String(required=True, metadata={
        "description": "GET it with your token: the private key as text"})
    publicKey = fields.String(required=True)
    privateKey = fields.String(required=True, metadata={
        "description": "the job's private key, OpenSSH format (`ssh -i` takes it)"})


class SshInfoSchema(Schema):
    """OpenPAI's answer at GET .../ssh: the running tasks' sshd addresses and
    the job's key pair (null when the job authorizes only the user's key)."""

    containers = fields.List(fields.Nested(SshContainerSchema), required=True)
    keyPair = fields.Nested(SshKeyPairSchema, required=True, allow_none=True)


# ---------------------------------------------------------------- cluster


class ResourcesUsedSchema(Schema):
    GPUs = fields.Integer(required=True)
    CPUs = fields.Integer(required=True)
    memoryMB = fields.Integer(required=True)
    tasks = fields.Integer(required=True)


class UserBudgetSchema(Schema):
    vc = fields.String(required=True)
    user = fields.String(required=True)
    gpuHoursBudget = fields.Float(required=True, metadata={
        "description": "GPU-hours the user's jobs in the VC may use per budgetPeriod"})
    budgetPeriod = fields.String(required=True, metadata={"description": "the VC's"})
    onBudgetExhausted = fields.String(required=True, metadata={"description": "the VC's"})
    gpuHoursSpent = fields.Float(required=True, metadata={
        "description": "GPU-hours the user's jobs in the VC used this period, running "
                       "tasks up to now"})
    exhausted = fields.Boolean(required=True)
    default = fields.Boolean(required=True, metadata={
        "description": "the VC's defaultUserGpuHoursBudget, not one of the user's own"})


class VirtualClusterSchema(Schema):
    name = fields.String(required=True)
    description = fields.String(required=True)
    gpuQuota = fields.Integer(required=True, allow_none=True, metadata={
        "description": "GPUs guaranteed (null: none set; `default` then gets what the "
                       "others leave)"})
    gpuGuaranteed = fields.Integer(required=True, metadata={
        "description": "the guarantee in force now"})
    borrowing = fields.Boolean(required=True, metadata={
        "description": "may its jobs run beyond the guarantee on idle GPUs"})
    idleGpuAction = fields.String(required=True, metadata={
        "description": "what a job idling on its GPUs gets: notify (flagged) or stop"})
    resourcesUsed = fields.Nested(ResourcesUsedSchema, required=True)
    gpuBorrowed = fields.Integer(required=True, metadata={
        "description": "GPUs its jobs hold beyond the guarantee (preemptible)"})
    gpuFree = fields.Integer(required=True, allow_none=True, metadata={
        "description": "guaranteed GPUs it does not use now"})
    waitingJobs = fields.Integer(required=True)
    runningJobs = fields.Integer(required=True)
    allowedCapabilities = fields.List(fields.String(), required=True)
    gpuHoursBudget = fields.Float(required=True, allow_none=True, metadata={
        "description": "GPU-hours its jobs may use per budgetPeriod (null: no budget)"})
    budgetPeriod = fields.String(required=True, metadata={
        "description": "day, week (ISO, from Monday) or month, UTC calendar periods"})
    onBudgetExhausted = fields.String(required=True, metadata={
        "description": "once spent, its jobs run only as oppo (`oppo`) or wait (`wait`)"})
    gpuHoursSpent = fields.Float(required=True, allow_none=True, metadata={
        "description": "GPU-hours used this period, running tasks up to now (null: no "
                       "budget)"})
    defaultUserGpuHoursBudget = fields.Float(required=True, allow_none=True, metadata={
        "description": "GPU-hours per budgetPeriod of each user in it without a budget of "
                       "their own (null: none)"})
    userBudgets = fields.List(fields.Nested(UserBudgetSchema), required=True,
                              metadata={"description": "users' own GPU-hour budgets in it "
                                                       "(an admin sees all, a user their own)"})
    queue = fields.List(fields.String(), metadata={
        "description": "one VC's view only: its waiting jobs in order (first 1000), "
                       "as user~name"})


class UserBudgetPutSchema(_Request):
    gpuHoursBudget = fields.Float(
        required=True, allow_nan=False, validate=validate.Range(min=0, max=1e9),
        metadata={"description": "GPU-hours the user's jobs in the VC may use per the VC's "
                                 "budgetPeriod (0: spent from the start)"})


class VirtualClusterPutSchema(_Request):
    gpuQuota = WholeNumber(allow_none=True, load_default=None,
                           validate=validate.Range(min=0, max=1_000_000),
                           metadata={"description": "GPUs guaranteed, or null for none"})
    borrowing = fields.Boolean(load_default=True, metadata={
        "description": "may its jobs borrow GPUs beyond the guarantee"})
    idleGpuAction = fields.String(load_default="notify", validate=validate.OneOf(
        ["notify", "stop"]), metadata={
        "description": "a job whose GPUs stay idle: notify (flag it) or stop it after "
                       "PAI_IDLE_GPU_GRACE_SECONDS more"})
    description = fields.String(load_default="", validate=validate.Length(max=1024))
    allowedCapabilities = fields.List(
        fields.String(validate=validate.OneOf(sorted(GRANTABLE))), load_default=list,
        validate=validate.Length(max=len(GRANTABLE)),
        metadata={"description": "capabilities its jobs may ask for in extras.capabilities"})
    gpuHoursBudget = fields.Float(
        allow_none=True, load_default=None, allow_nan=False,
        validate=validate.Range(min=0, max=1e9),
        metadata={"description": "GPU-hours its jobs may use per budgetPeriod, or null "
                                 "for no budget"})
    budgetPeriod = fields.String(load_default="month", validate=validate.OneOf(PERIODS),
                                 metadata={"description": "UTC calendar period of the "
                                                          "budget"})
    onBudgetExhausted = fields.String(
        load_default="oppo", validate=validate.OneOf(ON_EXHAUSTED),
        metadata={"description": "once spent: its jobs run only as oppo, or wait"})
    defaultUserGpuHoursBudget = fields.Float(
        allow_none=True, load_default=None, allow_nan=False,
        validate=validate.Range(min=0, max=1e9),
        metadata={"description": "GPU-hours per budgetPeriod of each user in it without a "
                                 "budget of their own (PUT .../budgets/<user>), or null"})


class NodeGpuSchema(Schema):
    index = fields.Integer(required=True)
    uuid = fields.String(required=True)
    model = fields.String(required=True)
    memoryMB = fields.Integer(required=True)
    group = fields.Integer(required=True, allow_none=True, metadata={
        "description": "GPUs of one group share NVLink or a PCIe switch; null: unknown"})
    used = fields.Boolean(required=True)
    healthy = fields.Boolean(required=True, metadata={
        "description": "false: its monitor saw it fail; nothing is placed on it until an "
                       "admin clears it"})
    unhealthyReason = fields.String(required=True, metadata={
        "description": "what failed (XID, ECC, pages, thermal); empty while healthy"})
    unhealthySince = _ms(allow_none=True)


class NodeSchema(Schema):
    name = fields.String(required=True)
    ip = fields.String(required=True)
    state = fields.String(required=True, validate=validate.OneOf(NODE_STATES), metadata={
        "description": "READY; CORDONED (no new work); DRAINING (its jobs being moved "
                       "off); DRAINED (drained and empty); LOST (no heartbeat, whatever "
                       "an admin set)"})
    schedulable = fields.Boolean(required=True, metadata={
        "description": "whether new tasks may land on it"})
    draining = fields.Boolean(required=True)
    cordonReason = fields.String(required=True, metadata={
        "description": "the admin's reason while cordoned or draining"})
    cordonedBy = fields.String(required=True, allow_none=True)
    cordonedTime = _ms(allow_none=True)
    lastHeartbeat = _ms()
    gpus = fields.List(fields.Nested(NodeGpuSchema), required=True)
    gpuTotal = fields.Integer(required=True)
    gpuUnhealthy = fields.Integer(required=True, metadata={
        "description": "GPUs marked unhealthy: the scheduler places nothing on them, and "
                       "gpuFree does not count them"})
    gpuUsed = fields.Integer(required=True)
    gpuFree = fields.Integer(required=True)
    cpuTotal = fields.Integer(required=True)
    cpuUsed = fields.Integer(required=True)
    cpuFree = fields.Integer(required=True)
    memoryMBTotal = fields.Integer(required=True)
    memoryMBUsed = fields.Integer(required=True)
    memoryMBFree = fields.Integer(required=True)
    tasks = fields.Integer(required=True)


class NodePutSchema(_Request):
    schedulable = _flag(metadata={
        "description": "false: cordon (no new work; tasks run on); true: uncordon, ending "
                       "any drain"})
    drain = _flag(metadata={
        "description": "true: cordon, and preempt and requeue the jobs on it; false: end "
                       "the drain, the node stays cordoned"})
    reason = fields.String(validate=validate.Length(max=MAX_REASON), metadata={
        "description": "why, shown with the node (kept while it stays cordoned)"})

    @validates_schema
    def check_meaning(self, data: dict[str, object], **_: object) -> None:
        if "schedulable" not in data and "drain" not in data:
            raise ValidationError("give schedulable or drain (or both)", "_schema")
        if data.get("schedulable") is True and data.get("drain") is True:
            raise ValidationError("a draining node cannot be schedulable: drain cordons it",
                                  "drain")


# ---------------------------------------------------------------- usage

USAGE_DIMENSIONS = ("day", "user", "vc", "job")  # shared.state.usage.DIMENSIONS
MAX_USAGE_DAYS = 732  # one report's span: two years of daily roll-ups
USAGE_DEFAULT_DAYS = 30


class _CommaList(fields.String):
    """A list sent as one comma-separated query value (`day,user`)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        text = super()._deserialize(value, attr, data, **kwargs)
        return [part.strip() for part in text.split(",") if part.strip()]


class UsageQuerySchema(Schema):
    user = fields.String(validate=validate.Regexp(INPUT_PATTERN), metadata={
        "description": "one user's usage (anyone but an admin sees only their own)"})
    vc = fields.String(validate=validate.Regexp(INPUT_PATTERN),
                       metadata={"description": "one virtual cluster's usage"})
    from_ = fields.Date(data_key="from", metadata={
        "description": "first UTC day, YYYY-MM-DD (default: 29 days before `to`)"})
    to = fields.Date(metadata={"description": "last UTC day, included (default: today)"})
    groupBy = _CommaList(load_default=lambda: ["user"], validate=[
        validate.Length(min=1, max=len(USAGE_DIMENSIONS)),
        validate.ContainsOnly(USAGE_DIMENSIONS)], metadata={
        "description": "one or more of day, user, vc, job, comma-separated (default user)"})
    format = fields.String(load_default="json", validate=validate.OneOf(["json", "csv"]),
                           metadata={"description": "csv: the rows as a CSV file"})

    @validates_schema
    def check_span(self, data: dict[str, Any], **_: object) -> None:
        first, last = _usage_span(data)
        if first > last:
            raise ValidationError("must not be after `to` (default: today)", "from")
        if (last - first).days >= MAX_USAGE_DAYS:
            raise ValidationError(f"a report spans at most {MAX_USAGE_DAYS} days", "from")

    @post_load
    def fill_span(self, data: dict[str, Any], **_: object) -> dict[str, Any]:
        data["from_"], data["to"] = _usage_span(data)
        return data


def _usage_span(data: dict[str, Any]) -> tuple[dt.date, dt.date]:
    """The report's first and last day, defaults filled in (UTC)."""
    last = data.get("to") or dt.datetime.now(dt.UTC).date()
    return data.get("from_") or last - dt.timedelta(days=USAGE_DEFAULT_DAYS - 1), last


class UsageRowSchema(Schema):
    day = fields.String(metadata={"description": "UTC day, YYYY-MM-DD (when grouped by day)"})
    user = fields.String()
    vc = fields.String()
    job = fields.String(metadata={"description": "user~name"})
    gpuSeconds = fields.Float(required=True)
    cpuSeconds = fields.Float(required=True)
    memoryMbSeconds = fields.Float(required=True)


class UsageReportSchema(Schema):
    from_ = fields.String(required=True, data_key="from")
    to = fields.String(required=True)
    groupBy = fields.List(fields.String(), required=True)
    asOf = _ms()
    rows = fields.List(fields.Nested(UsageRowSchema), required=True)
    retainedFrom = fields.String(required=True, allow_none=True, metadata={
        "description": "the oldest day still kept (PAI_USAGE_RETENTION_DAYS; null: all)"})
    trimmed = fields.Boolean(required=True, metadata={
        "description": "the span asked for starts before retainedFrom: the rows cover "
                       "only the days still kept"})
    budgets = fields.List(fields.Nested(UserBudgetSchema), required=True, metadata={
        "description": "the reported user's own budgets and what they spent this period "
                       "(every user's, for an admin's report without `user`)"})


# Component name -> schema; views' docstrings refer to these names.
COMPONENTS: dict[str, type[Schema]] = {
    "Error": ErrorSchema,
    "Message": MessageSchema,
    "Health": HealthSchema,
    "TokenRequest": TokenRequestSchema,
    "Token": TokenSchema,
    "User": UserSchema,
    "UserCreate": UserCreateSchema,
    "PasswordChange": PasswordChangeSchema,
    "AdminFlag": AdminFlagSchema,
    "UserVirtualClusters": UserVirtualClustersSchema,
    "JobConfig": JobConfigSchema,
    "JobConfigV2": JobConfigV2Schema,
    "JobSummary": JobSummarySchema,
    "JobPage": JobPageSchema,
    "JobDetail": JobDetailSchema,
    "Submitted": SubmittedSchema,
    "DryRun": DryRunSchema,
    "StopRequest": StopRequestSchema,
    "StopAccepted": StopAcceptedSchema,
    "ExecRequest": ExecRequestSchema,
    "ExecResult": ExecResultSchema,
    "UserBudget": UserBudgetSchema,  # before the schemas that nest it
    "SshInfo": SshInfoSchema,
    "VirtualCluster": VirtualClusterSchema,
    "VirtualClusterPut": VirtualClusterPutSchema,
    "UserBudgetPut": UserBudgetPutSchema,
    "Node": NodeSchema,
    "NodePut": NodePutSchema,
    "UsageReport": UsageReportSchema,
    "TaskSamples": TaskSamplesSchema,
    "JobMetrics": JobMetricsSchema,
    "IdleGpuTask": IdleGpuTaskSchema,
}
