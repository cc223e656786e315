"""The v1 job config (OpenPAI's JSON protocol): validation and normalization.

The API validates every submitted config here, once, and stores the result;
every later reader (scheduler, launcher, monitor) trusts the stored config
and never re-checks it. So this module is strict where a mistake would
otherwise surface late (a typo'd field, a path outside the storage roots, a
`true` where a count belongs) and reports every problem at once, because a
user fixing one error per round trip is a user lost. Every list and string
is capped so that hostile input costs no more than its own size.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marshmallow import (
    RAISE,
    Schema,
    ValidationError,
    fields,
    validate,
    validates,
    validates_schema,
)

from shared.domain import prerequisites, ssh, storage
from shared.domain.capabilities import capability_list_errors
from shared.domain.priority import CLASS_NAMES, DEFAULT_CLASS
from shared.domain.storage import StoragePathError

MAX_TASK_ROLES = 100
MAX_TASKS_PER_ROLE = 1000
MAX_TOTAL_TASKS = 10_000
MAX_CPUS = 1024
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB
MAX_GPUS = 64
MAX_PORT_LABELS = 100
MAX_PORTS_PER_LABEL = 100
MAX_RETRIES = 100
MAX_GRACE_SECONDS = 3600  # a job may ask for up to this; the admin's maximum still applies
MAX_ENVS = 1000
MAX_COMMAND_CHARS = 64 * 1024
MAX_PATH_CHARS = 4096
REDACTED = "******"  # what a secret shows as wherever a config is shown back
DEFAULT_SHM_MB = 64

IGNORED_ENVS = ("isDebug", "paiAzRDMA")

_JOB_NAME = r"^[A-Za-z0-9._~-]+$"
MAX_JOB_NAME = 255
_ROLE_NAME = r"^[A-Za-z0-9._~]+$"
_VC_NAME = r"^[A-Za-z0-9_-]+$"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
_PAI_VAR = re.compile(r"\$(?:\{(PAI_\w+)\}|(PAI_\w+))")


def is_job_name(name: str) -> bool:
    """Whether `name` is one a job may have (the rule `jobName` is held to).
    A name no job can have is no job's: a reader answers "not found" without
    asking Redis, where `mnist:config` would read another key of job `mnist`."""
    return len(name) <= MAX_JOB_NAME and name not in (".", "..") \
        and re.fullmatch(_JOB_NAME, name) is not None


class InvalidJobConfig(ValueError):
    """A rejected config; `fields` names every offending field by dotted path,
    so the API can answer 400 with all of them and the CLI can print them."""

    def __init__(self, message: str, fields: dict[str, list[str]]) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields


@dataclass(frozen=True)
class ValidatedConfig:
    """What a job runs from, plus which of the user's fields it will not act on
    (so the response can say so instead of silently dropping them)."""

    config: dict[str, Any]
    ignored: list[str]
    notes: list[str] = field(default_factory=list)  # what pai does unlike OpenPAI


# ---------------------------------------------------------------- fields


class _WholeRegexp(validate.Regexp):
    """Regexp whose `$` really ends the value: Python's `$` also matches before
    a trailing newline, which would let "name\n" through. The pattern keeps
    its JSON-Schema form (for the OpenAPI document); the match is fullmatch."""

    def __call__(self, value: Any) -> Any:
        pattern: re.Pattern[str] = self.regex  # type: ignore[assignment]
        if isinstance(value, str) and pattern.fullmatch(value) is None:
            raise ValidationError(self._format_error(value))
        return value


def _pattern(regex: str) -> validate.Regexp:
    return _WholeRegexp(regex, error=f"Must match {regex}.")


def _not_blank(value: str) -> None:
    if not value.strip():
        raise ValidationError("Must not be blank.")


def _not_dot_segment(value: str) -> None:
    # The job name becomes a path segment of the default output folder.
    if value in (".", ".."):
        raise ValidationError("Must not be '.' or '..'.")


class _Int(fields.Integer):
    """JSON has one number type, so `2.0` is a whole number; `true` and `"2"`
    are not, although Python and marshmallow would happily coerce them."""

    def _validated(self, value: Any) -> int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.make_error("invalid", input=value)
        return value


class _BoundedList(fields.List[Any]):
    """Checks the length before touching any item (a million-entry list is
    rejected in O(1)) and keeps failed items as placeholders, so indices in
    the loaded data match the user's indices for cross-item checks."""

    def __init__(self, inner: fields.Field[Any], *, min_items: int, max_items: int,
                 **kwargs: Any) -> None:
        super().__init__(inner, **kwargs)
        self.min_items, self.max_items = min_items, max_items  # for the OpenAPI document
        self._length = validate.Length(min=min_items, max=max_items)

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None,
                     **kwargs: Any) -> list[Any]:
        if not isinstance(value, list | tuple):
            raise self.make_error("invalid")
        self._length(value)
        result: list[Any] = []
        errors: dict[int, Any] = {}
        for index, item in enumerate(value):
            try:
                result.append(self.inner.deserialize(item, **kwargs))
            except ValidationError as error:
                result.append(error.valid_data if isinstance(error.valid_data, dict) else None)
                errors[index] = error.messages
        if errors:
            raise ValidationError(errors, valid_data=result)
        return result


def _env_value_ok(value: Any) -> bool:
    if isinstance(value, bool | int | str):
        return True
    return isinstance(value, float) and value == value and abs(value) != float("inf")


class _EnvVars(fields.Field[Any]):
    """Every value lands in a container's environment, so keys must be real
    variable names and values scalars (a nested object has no env form)."""

    default_error_messages = {"invalid": "Must be an object of environment variables."}

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None,
                     **kwargs: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.make_error("invalid")
        if len(value) > MAX_ENVS:
            raise ValidationError(f"At most {MAX_ENVS} variables are allowed.")
        errors: dict[str, list[str]] = {}
        for key, item in value.items():
            problems = []
            if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                problems.append("Not a valid environment variable name.")
            if not _env_value_ok(item):
                problems.append("Must be a string, number or boolean.")
            if problems:
                errors[str(key)] = problems
        if errors:
            raise ValidationError(errors)
        return dict(value)


class _Ssh(fields.Field[Any]):
    """OpenPAI's SSH into the tasks (shared/domain/ssh.py): `true`, or the ssh
    runtime plugin's parameters `{jobssh, userssh: {type, value}}`; loaded
    as the one stored form (`ssh.normalized`), None for no SSH."""

    def _deserialize(self, value: Any, attr: str | None, data: Mapping[str, Any] | None,
                     **kwargs: Any) -> dict[str, Any] | None:
        try:
            return ssh.normalized(value)
        except ssh.InvalidSshRequest as error:
            raise ValidationError(str(error)) from None


def _path_field() -> fields.String:
    return fields.String(validate=validate.Length(max=MAX_PATH_CHARS))


# ---------------------------------------------------------------- schemas


class _StrictSchema(Schema):
    """Unknown fields raise: a typo'd `memoryMb` must not silently become a default."""

    class Meta:
        unknown = RAISE

    error_messages = {"type": "Must be an object."}


class _PortSchema(_StrictSchema):
    label = fields.String(required=True, validate=[
        validate.Length(min=1, max=64), _pattern(_ROLE_NAME),
        validate.NoneOf(["default"], error="'default' is reserved for the task's own port."),
    ])
    beginAt = _Int(load_default=0, validate=validate.Range(min=0, max=65535))
    portNumber = _Int(required=True, validate=validate.Range(min=1, max=MAX_PORTS_PER_LABEL))


class _TaskRoleSchema(_StrictSchema):
    name = fields.String(required=True,
                         validate=[validate.Length(min=1, max=64), _pattern(_ROLE_NAME)])
    taskNumber = _Int(required=True, validate=validate.Range(min=1, max=MAX_TASKS_PER_ROLE))
    cpuNumber = _Int(required=True, validate=validate.Range(min=1, max=MAX_CPUS))
    memoryMB = _Int(required=True, validate=validate.Range(min=100, max=MAX_MEMORY_MB))
    gpuNumber = _Int(load_default=0, validate=validate.Range(min=0, max=MAX_GPUS))
    shmMB = _Int(validate=validate.Range(min=0, max=MAX_MEMORY_MB))
    portList = _BoundedList(fields.Nested(_PortSchema), min_items=0, max_items=MAX_PORT_LABELS,
                            load_default=list)
    command = fields.String(required=True, validate=[
        validate.Length(min=1, max=MAX_COMMAND_CHARS), _not_blank])
    # -1: task failures never fail the attempt (FrameworkController's "never")
    minFailedTaskCount = _Int(allow_none=True, load_default=None,
                              validate=[validate.Range(min=-1, max=MAX_TASKS_PER_ROLE),
                                        validate.NoneOf([0], error="Must be -1 or at least 1.")])
    minSucceededTaskCount = _Int(allow_none=True, load_default=None,
                                 validate=validate.Range(min=1, max=MAX_TASKS_PER_ROLE))
    # OpenPAI v2's per-role retry: a failed task restarts by itself this often
    taskRetryCount = _Int(validate=validate.Range(min=0, max=MAX_RETRIES), metadata={
        "description": "how often a failed task of the role is started again by itself "
                       "(same node and resources) before its failure counts"})
    # Steps around the commands (shared/domain/prerequisites.py): what a
    # protocol v2 role's data, output and script prerequisites become.
    prerequisites = fields.List(fields.Raw(), validate=validate.Length(
        max=prerequisites.MAX_STEPS), metadata={
        "description": "data, output and script prerequisites: {name, type, uris, "
                       "taskStarts, taskSucceeds, failurePolicy} (docs/job-config.md)"})

    @validates_schema(skip_on_field_errors=False)
    def _cross_fields(self, data: dict[str, Any], **kwargs: Any) -> None:
        # Runs even when other fields failed, so every mistake is named at once;
        # a field that failed is simply absent from `data`.
        errors: dict[str, Any] = {}
        memory, shm, tasks = data.get("memoryMB"), data.get("shmMB"), data.get("taskNumber")
        if memory is not None and shm is not None and shm > memory:
            errors["shmMB"] = [f"Must not exceed memoryMB ({memory})."]
        for key in ("minFailedTaskCount", "minSucceededTaskCount"):
            count = data.get(key)
            if count is not None and tasks is not None and count > tasks:  # -1 passes
                errors[key] = [f"Must be between 1 and taskNumber ({tasks})."]
        seen: set[str] = set()
        for index, port in enumerate(data.get("portList") or []):
            label = port.get("label") if port else None
            if label is not None and label in seen:
                errors.setdefault("portList", {})[index] = {
                    "label": [f"Duplicate label {label!r} in this task role."]}
            if label is not None:
                seen.add(label)
        if errors:
            raise ValidationError(errors)


class _ImageAuthSchema(_StrictSchema):
    """A registry login for pulling the job's image (OpenPAI v2's dockerimage
    `auth`): sent to the node's Docker engine with the pull, never shown back."""

    username = fields.String(required=True, validate=validate.Length(min=1, max=1024))
    password = fields.String(required=True, validate=validate.Length(max=4096))
    registryuri = fields.String(validate=validate.Length(max=1024))


class _JobSchema(_StrictSchema):
    jobName = fields.String(required=True, validate=[
        validate.Length(min=1, max=MAX_JOB_NAME), _pattern(_JOB_NAME), _not_dot_segment])
    image = fields.String(required=True,
                          validate=[validate.Length(min=1, max=1024), _not_blank])
    dataDir = _path_field()
    outputDir = _path_field()
    codeDir = _path_field()
    authFile = fields.String(validate=validate.Length(max=MAX_PATH_CHARS))
    imageAuth = fields.Nested(_ImageAuthSchema, metadata={
        "description": "registry login for pulling `image` (its password is never shown back)"})
    virtualCluster = fields.String(load_default="default",
                                   validate=[validate.Length(max=64), _pattern(_VC_NAME)])
    # -1 and -2: retry without limit, with a back-off (OpenPAI's serving jobs)
    retryCount = _Int(load_default=0, validate=validate.Range(min=-2, max=MAX_RETRIES))
    killAllOnCompletedTaskNumber = _Int(load_default=0,
                                        validate=validate.Range(min=0, max=MAX_TOTAL_TASKS))
    jobEnvs = _EnvVars(load_default=dict)
    gpuType = fields.String(allow_none=True, validate=validate.Length(max=255))
    jobPriorityClass = fields.String(validate=validate.OneOf(CLASS_NAMES), metadata={
        "description": f"prod > test > oppo (HiveD's names); default "
                       f"extras.hivedScheduler.jobPriorityClass, else {DEFAULT_CLASS}"})
    preemptionGracePeriodSec = _Int(validate=validate.Range(min=0, max=MAX_GRACE_SECONDS),
                                    metadata={"description": "seconds between SIGTERM and "
                                              "SIGKILL when preempted (held to the admin's "
                                              "maximum)"})
    extras = fields.Dict(load_default=dict)
    ssh = _Ssh(allow_none=True, metadata={
        "description": "SSH into the tasks: true (a key pair made for the job, read at "
                       "GET .../ssh), or {jobssh: bool, userssh: {type: custom, value: "
                       "<your public key>}} as OpenPAI's ssh plugin takes them; every task "
                       "gets a port labelled ssh"})
    taskRoles = _BoundedList(fields.Nested(_TaskRoleSchema), required=True,
                             min_items=1, max_items=MAX_TASK_ROLES)

    @validates("extras")
    def _requested_capabilities(self, extras: dict[str, Any], **kwargs: Any) -> None:
        # The extras pai acts on: capabilities (whether they are granted is
        # the VC's call, at submit), HiveD's priority class, and whether the
        # tasks start all at once (gangAllocation, OpenPAI's default true).
        if "capabilities" in extras:
            errors = capability_list_errors(extras["capabilities"])
            if errors:
                raise ValidationError({"capabilities": errors})
        if "gangAllocation" in extras and not isinstance(extras["gangAllocation"], bool):
            raise ValidationError({"gangAllocation": ["Must be true or false."]})
        hived = extras.get("hivedScheduler")
        if isinstance(hived, dict) and "jobPriorityClass" in hived \
                and hived["jobPriorityClass"] not in CLASS_NAMES:
            raise ValidationError({"hivedScheduler": {"jobPriorityClass": [
                f"Must be one of: {', '.join(CLASS_NAMES)}."]}})

    @validates_schema(skip_on_field_errors=False)
    def _cross_roles(self, data: dict[str, Any], **kwargs: Any) -> None:
        # Failed roles are `None` or partial dicts at their own index (see
        # _BoundedList), so the checks below use only what did validate.
        roles = [r or {} for r in data.get("taskRoles") or []]
        errors: dict[str, Any] = {}
        seen: set[str] = set()
        for index, role in enumerate(roles):
            name = role.get("name")
            if name is not None and name in seen:
                errors.setdefault("taskRoles", {})[index] = {
                    "name": [f"Duplicate task role name {name!r}."]}
            if name is not None:
                seen.add(name)
        counts = [role.get("taskNumber") for role in roles]
        known = sum(c for c in counts if c is not None)
        if known > MAX_TOTAL_TASKS:
            errors.setdefault("taskRoles", {})["_schema"] = [
                f"A job may have at most {MAX_TOTAL_TASKS} tasks in all, not {known}."]
        if data.get("ssh"):  # the platform allocates the `ssh` port of every task
            for index, role in enumerate(roles):
                for at, port in enumerate(role.get("portList") or []):
                    if port and port.get("label") == ssh.PORT_LABEL:
                        errors.setdefault("taskRoles", {}).setdefault(index, {}).setdefault(
                            "portList", {})[at] = {"label": [
                                f"'{ssh.PORT_LABEL}' is the SSH port the platform gives "
                                "every task of an SSH job."]}
        kill_all = data.get("killAllOnCompletedTaskNumber")
        if roles and None not in counts and kill_all is not None and kill_all > known:
            errors["killAllOnCompletedTaskNumber"] = [
                f"Must not exceed the job's total task number ({known})."]
        if errors:
            raise ValidationError(errors)


_SCHEMA = _JobSchema()

# The OpenAPI document describes submitted configs with this very schema.
JobConfigSchema = _JobSchema
BoundedList = _BoundedList
EnvVars = _EnvVars


# ---------------------------------------------------------------- paths


def _resolve_dir(value: str, roots: Sequence[str]) -> tuple[str, str | None]:
    """Returns the host path a dir will be bind-mounted from, or an error.

    Only the form is checked here (shared/domain/storage.py): the API may not see
    the shared storage, and who may name the path is the API's question.
    """
    try:
        where = storage.resolve(value, roots)
    except StoragePathError as error:
        return value, str(error)
    return (where.path if where else value), None


def _path_variables(config: dict[str, Any], username: str,
                    roots: Sequence[str]) -> Callable[[str], str]:
    """What replaces `$PAI_DEFAULT_FS_URI`, `$PAI_USERNAME` / `$PAI_USER_NAME`
    and `$PAI_JOB_NAME` in a path the config names, as OpenPAI's configs use them."""
    variables = {"PAI_DEFAULT_FS_URI": roots[0] if roots else "",
                 "PAI_USERNAME": username, "PAI_USER_NAME": username}
    if "jobName" in config:
        variables["PAI_JOB_NAME"] = config["jobName"]

    def one(match: re.Match[str]) -> str:
        return variables.get(match.group(1) or match.group(2), match.group(0))

    return lambda value: _PAI_VAR.sub(one, value)


def _resolve_dirs(config: dict[str, Any], username: str, roots: Sequence[str],
                  errors: dict[str, list[str]], *, default_output: bool) -> None:
    substitute = _path_variables(config, username, roots)

    if default_output and not config.get("outputDir"):
        config["outputDir"] = (posixpath.join(storage.user_folder(roots[0], username),
                                              config["jobName"], "output")
                               if roots else "")
    for key in ("dataDir", "outputDir", "codeDir"):
        value = config.get(key)
        if not value:
            continue
        value = substitute(value)
        if storage.outside_every_root(value, roots):
            config[key] = value
            config.setdefault(storage.UNMOUNTED_KEY, []).append(key)
            continue
        resolved, error = _resolve_dir(value, roots)
        if error:
            errors.setdefault(key, []).append(error)
        else:
            config[key] = resolved


# ---------------------------------------------------------------- public


def flat_errors(messages: Any) -> dict[str, list[str]]:
    """marshmallow's nested error messages as the API's one error shape: a
    flat map of dotted paths (`taskRoles.0.memoryMB`) to messages."""
    out: dict[str, list[str]] = {}
    _flatten(messages, "", out)
    return out


# JSON's whole numbers for any schema of the API (2.0 yes; true and "2" no).
WholeNumber = _Int


def _flatten(messages: Any, path: str, out: dict[str, list[str]]) -> None:
    """marshmallow nests errors ({"taskRoles": {0: {"memoryMB": [...]}}}); the
    API promises one flat map of dotted paths, which a user can read."""
    if isinstance(messages, dict):
        for key, sub in messages.items():
            if key == "_schema":
                _flatten(sub, path, out)
            else:
                _flatten(sub, f"{path}.{key}" if path else str(key), out)
    elif isinstance(messages, list | tuple):
        for item in messages:
            _flatten(item, path, out)
    else:
        out.setdefault(path or "_schema", []).append(str(messages))


def _rejected(fields_: dict[str, list[str]]) -> InvalidJobConfig:
    count = len(fields_)
    noun = "field" if count == 1 else "fields"
    return InvalidJobConfig(f"job config has {count} invalid {noun}", fields_)


def _check_prerequisites(config: dict[str, Any], username: str, roots: Sequence[str],
                         hdfs_webhdfs_url: str, errors: dict[str, list[str]]) -> None:
    """Each role's prerequisites in their stored form (their URIs' `$PAI_...`
    variables replaced as a dataDir's are), or the errors naming them."""
    substitute = _path_variables(config, username, roots)
    for at, role in enumerate(config.get("taskRoles") or []):
        if not isinstance(role, dict):
            continue  # the schema named what is wrong with it
        raw = role.get("prerequisites")
        if not raw or not isinstance(raw, list):
            role.pop("prerequisites", None)
            continue
        found = []
        for index, item in enumerate(raw):
            if isinstance(item, dict) and isinstance(item.get("uris"), list):
                item = {**item, "uris": [substitute(u) if isinstance(u, str) else u
                                         for u in item["uris"]]}
            try:
                found.append(prerequisites.Prerequisite.from_dict(item))
            except prerequisites.PrerequisiteError as error:
                errors.setdefault(f"taskRoles.{at}.prerequisites.{index}", []).append(
                    str(error))
        try:
            prerequisites.plan(found, roots, hdfs_webhdfs_url)
        except prerequisites.PrerequisiteError as error:
            errors.setdefault(f"taskRoles.{at}.prerequisites", []).append(str(error))
        role["prerequisites"] = [item.to_dict() for item in found]


def validate_job_config(
    raw: Any, *, username: str, storage_roots: Sequence[str], hdfs_webhdfs_url: str = ""
) -> ValidatedConfig:
    """Validate and normalize a submitted config, or raise InvalidJobConfig
    naming every offending field. Never raises anything else, whatever `raw`
    is, because `raw` is whatever a client sent."""
    if not isinstance(raw, dict):
        raise InvalidJobConfig("job config must be a JSON object",
                               {"_schema": ["Job config must be a JSON object."]})
    if raw.get("virtualCluster") == "":
        raw = {**raw, "virtualCluster": "default"}  # OpenPAI's portal sends "" for it.
    roots = [storage.normalize_root(r) for r in storage_roots]
    errors: dict[str, list[str]] = {}
    try:
        config: dict[str, Any] = _SCHEMA.load(raw)
        valid = True
    except ValidationError as error:
        _flatten(error.messages, "", errors)
        config = error.valid_data if isinstance(error.valid_data, dict) else {}
        valid = False
    _resolve_dirs(config, username, roots, errors, default_output=valid)
    _check_prerequisites(config, username, roots, hdfs_webhdfs_url, errors)
    if errors:
        raise _rejected(errors)
    for role in config["taskRoles"]:
        role.setdefault("shmMB", min(DEFAULT_SHM_MB, role["memoryMB"]))
    if config.get("ssh") is None:
        config.pop("ssh", None)  # `false`: no SSH, stored as nothing
    ignored = ["authFile"] if "authFile" in config else []
    ignored += [f"jobEnvs.{name}" for name in IGNORED_ENVS if name in config["jobEnvs"]]
    notes = [f"{key} {config[key]} is outside every storage root: passed to the job in "
             f"{_DIR_VARIABLES[key]} unchanged, not mounted"
             for key in config.get(storage.UNMOUNTED_KEY, [])]
    return ValidatedConfig(config=config, ignored=ignored, notes=notes)


def shown_config(config: dict[str, Any]) -> dict[str, Any]:
    """A config as it may be shown back (GET .../config, a dry run): the
    registry password hidden."""
    auth = config.get("imageAuth")
    if not isinstance(auth, dict) or "password" not in auth:
        return config
    return {**config, "imageAuth": {**auth, "password": REDACTED}}


_DIR_VARIABLES = {"dataDir": "PAI_DATA_DIR", "outputDir": "PAI_OUTPUT_DIR",
                  "codeDir": "PAI_CODE_DIR"}
