"""The API's bodies as marshmallow schemas: what requests are loaded by
(a view declares one with `@takes`, services/api/bodies.py) and what the OpenAPI document shows,
one declaration for both, so the served spec is what the code enforces.
Responses are described here too, and a test holds every response to them.
The job config is not repeated: it is `shared.domain.jobspec.JobConfigSchema`;
exec's and SSH's are in services/api/execschemas.py, query strings' in
services/api/queries.py. This module imports no view (the views import it).
"""

from __future__ import annotations

from marshmallow import (
    Schema,
    ValidationError,
    fields,
    validate,
    validates_schema,
)

from services.api.execschemas import ExecRequestSchema, ExecResultSchema, SshInfoSchema
from services.api.schemabase import MS, RequestSchema, epoch_ms, flag
from shared.domain.capabilities import GRANTABLE
from shared.domain.cluster import BORROWED, GUARANTEED, NODE_STATES
from shared.domain.jobspec import JobConfigSchema, WholeNumber
from shared.domain.jobspec_v2 import JobConfigV2Schema
from shared.domain.names import INPUT_PATTERN
from shared.domain.priority import CLASS_NAMES
from shared.domain.states import JobState, TaskState
from shared.state.usage import ON_EXHAUSTED, PERIODS

MIN_PASSWORD, MAX_PASSWORD = 6, 256
DEFAULT_EXPIRATION_S = 7 * 24 * 3600
MAX_EXPIRATION_S = 90 * 24 * 3600
MAX_TAIL = 100_000  # log lines one plain read returns
MAX_REASON = 512  # characters of an admin's reason for cordoning a node

JOB_STATES = [s.value for s in JobState]


# ---------------------------------------------------------------- common


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


class TokenRequestSchema(RequestSchema):
    username = fields.String(required=True, validate=validate.Length(min=1))
    password = fields.String(required=True, validate=validate.Length(min=1))
    expiration = fields.Integer(load_default=DEFAULT_EXPIRATION_S,
                                validate=validate.Range(min=60, max=MAX_EXPIRATION_S),
                                metadata={"description": "seconds the token lives"})


class TokenSchema(Schema):
    token = fields.String(required=True)
    user = fields.String(required=True)
    admin = fields.Boolean(required=True)
    expires = epoch_ms()


# ---------------------------------------------------------------- users


def _password() -> fields.String:
    return fields.String(required=True,
                         validate=validate.Length(min=MIN_PASSWORD, max=MAX_PASSWORD))


class UserSchema(Schema):
    username = fields.String(required=True)
    admin = fields.Boolean(required=True)
    virtualClusters = fields.List(fields.String(), required=True)
    createdTime = epoch_ms()


class UserCreateSchema(RequestSchema):
    username = fields.String(required=True, validate=validate.Regexp(INPUT_PATTERN))
    password = _password()
    admin = flag(load_default=False)
    virtualClusters = fields.List(fields.String(validate=validate.Length(max=64)),
                                  load_default=lambda: ["default"],
                                  validate=validate.Length(max=1000))


class PasswordChangeSchema(RequestSchema):
    newPassword = _password()
    oldPassword = fields.String(
        metadata={"description": "required unless an admin changes another user's"})


class AdminFlagSchema(RequestSchema):
    value = flag(required=True)


class UserVirtualClustersSchema(RequestSchema):
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
    createdTime = epoch_ms()
    completedTime = epoch_ms(allow_none=True)
    appExitCode = fields.Integer(required=True, allow_none=True)
    virtualCluster = fields.String(required=True)
    gpus = fields.Integer(required=True, metadata={"description": "GPUs the job asks for"})
    startedTime = epoch_ms(allow_none=True)  # when the current attempt started running
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
    estimatedStartTime = epoch_ms(allow_none=True)


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
    preemptionDeadline = epoch_ms(allow_none=True)
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
    launchedTime = epoch_ms(allow_none=True)
    startedTime = epoch_ms(allow_none=True)
    completedTime = epoch_ms(allow_none=True)
    retries = fields.Integer(required=True, metadata={
        "description": "times this task was started again by itself after a failure "
                       "(its role's taskRetryCount), within this attempt"})
    idleSince = fields.Integer(required=True, allow_none=True, metadata={
        **MS, "description": "set while every GPU of the running task has stayed below "
                              "PAI_IDLE_GPU_PERCENT for PAI_IDLE_GPU_SECONDS: since when"})


class TaskSampleSchema(Schema):
    time = epoch_ms()
    cpuPercent = fields.Float(required=True, allow_none=True,
                              metadata={"description": "100 = one core busy"})
    memoryBytes = fields.Integer(required=True, allow_none=True)
    gpuPercent = fields.List(fields.Float(allow_none=True), required=True, metadata={
        "description": "each allocated GPU's utilisation, in the task's GPU order"})


class TaskSamplesSchema(Schema):
    attempt = fields.Integer(required=True)
    intervalSeconds = fields.Float(required=True)
    samples = fields.List(fields.Nested(TaskSampleSchema), required=True)


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
    from_ = fields.Integer(data_key="from", required=True, metadata=MS)
    to = epoch_ms()
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
    idleSince = epoch_ms()


class TaskRoleNameSchema(Schema):
    name = fields.String(required=True)


class TaskRoleStatusSchema(Schema):
    taskRoleStatus = fields.Nested(TaskRoleNameSchema, required=True)
    taskStatuses = fields.List(fields.Nested(TaskStatusSchema), required=True)


class AttemptSchema(Schema):
    attemptIndex = fields.Integer(required=True)
    state = fields.String(required=True)
    createdTime = epoch_ms()
    startedTime = epoch_ms(allow_none=True)
    completedTime = epoch_ms(allow_none=True)
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


class DryRunSchema(Schema):
    config = fields.Nested(JobConfigSchema, required=True,
                           metadata={"description": "the config as it would be stored"})
    ignoredFields = fields.List(fields.String(), required=True)
    notes = fields.List(fields.String())


class StopRequestSchema(RequestSchema):
    value = fields.String(required=True, validate=validate.OneOf(["STOP"]))


class StopAcceptedSchema(Schema):
    message = fields.String(required=True)
    state = fields.String(required=True, validate=validate.OneOf(JOB_STATES))


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


class UserBudgetPutSchema(RequestSchema):
    gpuHoursBudget = fields.Float(
        required=True, allow_nan=False, validate=validate.Range(min=0, max=1e9),
        metadata={"description": "GPU-hours the user's jobs in the VC may use per the VC's "
                                 "budgetPeriod (0: spent from the start)"})


class VirtualClusterPutSchema(RequestSchema):
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
    unhealthySince = epoch_ms(allow_none=True)


class NodeSchema(Schema):
    name = fields.String(required=True)
    ip = fields.String(required=True)
    state = fields.String(required=True, validate=validate.OneOf(NODE_STATES), metadata={
        "description": "READY; CORDONED (no new work); DRAINING (its jobs being moved "
                       "off); DRAINED (drained and empty); or, whatever an admin set, the "
                       "node's condition when it is not READY: LOST, UNREACHABLE, "
                       "NOT_READY, RECONCILING or SETTLING (docs/multi-node.md)"})
    condition = fields.String(required=True, metadata={
        "description": "the node's own condition, admins' holds aside: READY, LOST, "
                       "UNREACHABLE, NOT_READY, RECONCILING or SETTLING"})
    conditionReason = fields.String(required=True, metadata={
        "description": "why the node is not READY (its lease, its engine, launcher or "
                       "storage); empty when READY"})
    schedulable = fields.Boolean(required=True, metadata={
        "description": "whether new tasks may land on it"})
    draining = fields.Boolean(required=True)
    cordonReason = fields.String(required=True, metadata={
        "description": "the admin's reason while cordoned or draining"})
    cordonedBy = fields.String(required=True, allow_none=True)
    cordonedTime = epoch_ms(allow_none=True)
    lastHeartbeat = epoch_ms()
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


class NodePutSchema(RequestSchema):
    schedulable = flag(metadata={
        "description": "false: cordon (no new work; tasks run on); true: uncordon, ending "
                       "any drain"})
    drain = flag(metadata={
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
    asOf = epoch_ms()
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
