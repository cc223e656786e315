"""OpenPAI's protocol v2 (YAML) job config: validation and conversion to v1.

pai has one internal job model, the v1 config (shared/domain/jobspec.py). A v2
config is checked here by its own schema, so errors name v2 paths
(`taskRoles.worker.resourcePerInstance.gpu`), then turned into a v1 config
and validated once more by the v1 rules, so nothing a v1 submit may not do
slips in through v2. Every v2 field pai does not act on is kept (the stored
submission holds it) and named in `ignored`, so a user learns it was not
acted on instead of finding out when the job misbehaves. `data`, `output`
and `script` prerequisites run around the commands
(shared/domain/prerequisites.py); one pai could not run (a plugin other
than OpenPAI's cmd plugin, a URI it cannot reach) is refused: a job that
silently skipped its data download would fail later and further from its
cause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from marshmallow import INCLUDE, RAISE, Schema, ValidationError, fields, validate

from shared.domain import prerequisites, ssh
from shared.domain.jobspec import (
    MAX_COMMAND_CHARS,
    MAX_CPUS,
    MAX_GPUS,
    MAX_MEMORY_MB,
    MAX_PORTS_PER_LABEL,
    MAX_RETRIES,
    MAX_TASK_ROLES,
    MAX_TASKS_PER_ROLE,
    REDACTED,
    InvalidJobConfig,
    WholeNumber,
    flat_errors,
    validate_job_config,
)

MAX_PARAMETERS = 1000
MAX_COMMANDS = 1000
MAX_PREREQUISITES = 100
MAX_DEPLOYMENTS = 100
MAX_SECRETS = 100
UNLIMITED_RETRIES = (-1, -2)  # OpenPAI: retry without limit (serving jobs)

_NAME = r"^[A-Za-z0-9._~-]+$"
_REFERENCE = re.compile(r"<%\s*\$(parameters|secrets)\.([A-Za-z0-9_.-]+)\s*%>")
# `<% $data.uri[0] %>`, `<% $script.name %>`: a field of the role's data,
# output or script prerequisite, as OpenPAI's REST server renders them.
_PREREQUISITE_REFERENCE = re.compile(
    r"<%\s*\$(data|output|script)\.([A-Za-z0-9_-]+)(?:\[(\d+)\])?\s*%>")


def is_v2(raw: Any) -> bool:
    """Whether a submitted document speaks protocol v2 (OpenPAI allows 2 or "2")."""
    return isinstance(raw, dict) and "protocolVersion" in raw


def _check_secrets(value: Any) -> None:
    """Secrets nest (OpenPAI allows it) down to scalar values, and are few:
    every string shown back is searched for each of them."""
    if not isinstance(value, dict):
        raise ValidationError("Must be an object.")
    leaves = _secret_leaves(value)
    if len(leaves) > MAX_SECRETS:
        raise ValidationError(f"At most {MAX_SECRETS} secrets are allowed.")


def _scalar(value: Any) -> None:
    if isinstance(value, dict | list) or value is None:
        raise ValidationError("Must be a string, number or boolean.")


class _Strict(Schema):
    class Meta:
        unknown = RAISE

    error_messages = {"type": "Must be an object."}


class _Open(Schema):
    """OpenPAI lets these carry more than pai reads; the rest is kept and listed."""

    class Meta:
        unknown = INCLUDE

    error_messages = {"type": "Must be an object."}


class _V2AuthSchema(_Open):
    username = fields.String()
    password = fields.String()
    registryuri = fields.String()


class _V2PrerequisiteSchema(_Open):
    protocolVersion = fields.Raw()
    name = fields.String(required=True, validate=validate.Length(min=1, max=255))
    type = fields.String(required=True, validate=validate.OneOf(
        ["dockerimage", "script", "data", "output"]))
    uri = fields.Raw()
    auth = fields.Nested(_V2AuthSchema)
    plugin = fields.String()
    callbacks = fields.Raw()
    failurePolicy = fields.Raw()
    require = fields.Raw()  # OpenPAI: "parsed by backend automatically"; order is the role's


class _V2ResourceSchema(_Strict):
    instances = WholeNumber()  # a legacy spelling some OpenPAI files carry; stored only
    cpu = WholeNumber(required=True, validate=validate.Range(min=1, max=MAX_CPUS))
    memoryMB = WholeNumber(required=True, validate=validate.Range(min=100, max=MAX_MEMORY_MB))
    gpu = WholeNumber(load_default=0, validate=validate.Range(min=0, max=MAX_GPUS))
    ports = fields.Dict(keys=fields.String(), values=WholeNumber(
        validate=validate.Range(min=1, max=MAX_PORTS_PER_LABEL)))


class _V2CompletionSchema(_Strict):
    minFailedInstances = WholeNumber(allow_none=True, validate=validate.Range(
        min=-1, max=MAX_TASKS_PER_ROLE))
    minSucceededInstances = WholeNumber(allow_none=True, validate=validate.Range(
        min=-1, max=MAX_TASKS_PER_ROLE))


def _commands() -> fields.List[Any]:
    return fields.List(fields.String(validate=validate.Length(max=MAX_COMMAND_CHARS)),
                       validate=validate.Length(max=MAX_COMMANDS))


class _V2TaskRoleSchema(_Open):
    protocolVersion = fields.Raw()
    instances = WholeNumber(load_default=1, validate=validate.Range(
        min=1, max=MAX_TASKS_PER_ROLE))
    dockerImage = fields.String(required=True)
    data = fields.String()
    output = fields.String()
    script = fields.String()
    prerequisites = fields.List(fields.String(), validate=validate.Length(max=MAX_PREREQUISITES))
    resourcePerInstance = fields.Nested(_V2ResourceSchema, required=True)
    commands = _commands()
    completion = fields.Nested(_V2CompletionSchema)
    taskRetryCount = WholeNumber(validate=validate.Range(min=0, max=MAX_RETRIES))
    extraContainerOptions = fields.Dict()


class _V2RoleCommandsSchema(_Strict):
    preCommands = _commands()
    postCommands = _commands()


class _V2DeploymentSchema(_Strict):
    name = fields.String(required=True)
    taskRoles = fields.Dict(keys=fields.String(), values=fields.Nested(_V2RoleCommandsSchema),
                            required=True)


class _V2DefaultsSchema(_Open):
    virtualCluster = fields.String()
    deployment = fields.String()


class _V2JobSchema(_Open):
    protocolVersion = fields.Raw(required=True, validate=validate.OneOf(
        [2, "2"], error="Must be 2."))
    name = fields.String(required=True, validate=[validate.Length(min=1, max=255)])
    type = fields.String(required=True, validate=validate.OneOf(
        ["job"], error="Must be 'job'."))
    version = fields.Raw()
    contributor = fields.Raw()
    description = fields.Raw()
    prerequisites = fields.List(fields.Nested(_V2PrerequisiteSchema),
                                validate=validate.Length(max=MAX_PREREQUISITES))
    parameters = fields.Dict(keys=fields.String(), values=fields.Raw(validate=_scalar),
                             validate=validate.Length(max=MAX_PARAMETERS))
    secrets = fields.Raw(validate=_check_secrets)
    jobRetryCount = WholeNumber(validate=validate.Range(min=-2, max=MAX_RETRIES))
    taskRoles = fields.Dict(keys=fields.String(), values=fields.Nested(_V2TaskRoleSchema),
                            required=True, validate=validate.Length(min=1, max=MAX_TASK_ROLES))
    deployments = fields.List(fields.Nested(_V2DeploymentSchema),
                              validate=validate.Length(max=MAX_DEPLOYMENTS))
    defaults = fields.Nested(_V2DefaultsSchema)
    extras = fields.Dict()


_SCHEMA = _V2JobSchema()
JobConfigV2Schema = _V2JobSchema  # for the OpenAPI document


@dataclass(frozen=True)
class ConvertedConfig:
    """The v1 config a v2 job runs from, what it does not act on, notes for
    the submitter, and the submission as it may be shown back (secrets out)."""

    config: dict[str, Any]
    ignored: list[str]
    notes: list[str]
    shown: dict[str, Any]
    secrets: tuple[str, ...] = ()  # the values to keep out of anything shown back


def _secret_leaves(secrets: Any, prefix: str = "") -> dict[str, str]:
    """`secrets` flattened to dotted names (OpenPAI nests them)."""
    out: dict[str, str] = {}
    if isinstance(secrets, dict):
        for key, value in secrets.items():
            out.update(_secret_leaves(value, f"{prefix}{key}."))
    elif prefix:
        out[prefix[:-1]] = "" if secrets is None else str(secrets)
    return out


def redact(value: Any, secrets: Sequence[str]) -> Any:
    """`value` with every secret's text replaced, in every string it holds."""
    hidden = sorted({s for s in secrets if s}, key=len, reverse=True)
    if not hidden:
        return value
    pattern = re.compile("|".join(re.escape(s) for s in hidden))  # longest first
    return _redacted(value, pattern)


def _redacted(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        return pattern.sub(REDACTED, value)
    if isinstance(value, dict):
        return {k: _redacted(v, pattern) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v, pattern) for v in value]
    return value


def shown_submission(raw: dict[str, Any]) -> dict[str, Any]:
    """The submission as it may be stored and shown back: every secret value
    replaced, wherever it was written (in `secrets`, or pasted in clear)."""
    leaves = _secret_leaves(raw.get("secrets"))
    shown: dict[str, Any] = redact(raw, list(leaves.values()))
    if "secrets" in shown:
        shown["secrets"] = redact_tree(shown["secrets"])
    if isinstance(shown.get("prerequisites"), list):  # a registry password, even in clear
        shown = {**shown, "prerequisites": [_without_password(p)
                                            for p in shown["prerequisites"]]}
    return shown


def _without_password(prerequisite: Any) -> Any:
    auth = prerequisite.get("auth") if isinstance(prerequisite, dict) else None
    if not isinstance(auth, dict) or "password" not in auth:
        return prerequisite
    return {**prerequisite, "auth": {**auth, "password": REDACTED}}


def redact_tree(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    return REDACTED


def _substitute(text: str, parameters: dict[str, Any], secrets: dict[str, str],
                path: str, errors: dict[str, list[str]]) -> str:
    def one(match: re.Match[str]) -> str:
        kind, name = match.group(1), match.group(2)
        table: dict[str, Any] = parameters if kind == "parameters" else secrets
        if name not in table:
            errors.setdefault(path, []).append(f"No {kind[:-1]} named {name!r}.")
            return match.group(0)
        value = table[name]
        return str(value).lower() if isinstance(value, bool) else str(value)

    return _REFERENCE.sub(one, text)


def _render_prerequisites(text: str, used: dict[str, dict[str, Any]]) -> str:
    """`<% $data.uri[0] %>` and the like, from the role's prerequisites by
    kind; a reference to nothing is left as it is (OpenPAI does the same)."""
    def one(match: re.Match[str]) -> str:
        item = used.get(match.group(1)) or {}
        value = item.get(match.group(2))
        if match.group(3) is not None:
            index = int(match.group(3))
            value = value[index] if isinstance(value, list) and index < len(value) else None
        if value is None or isinstance(value, dict):
            return match.group(0)
        if isinstance(value, list):
            return ",".join(str(v) for v in value)
        return str(value).lower() if isinstance(value, bool) else str(value)

    return _PREREQUISITE_REFERENCE.sub(one, text)


def _role_prerequisites(role: dict[str, Any], where: str, others: dict[str, Any],
                        errors: dict[str, list[str]]) -> tuple[list[dict[str, Any]],
                                                               dict[str, dict[str, Any]]]:
    """The stored form of the prerequisites a role names (legacy `data`,
    `output`, `script`, then its `prerequisites` list, each once), and the
    raw v2 items its legacy fields name, for rendering its commands."""
    names: list[str] = []
    used: dict[str, dict[str, Any]] = {}
    for key in prerequisites.KINDS:
        if key not in role:
            continue
        found = others.get(role[key])
        if found is None or found[0].get("type") != key:
            errors.setdefault(f"{where}.{key}", []).append(
                f"No {key} prerequisite named {role[key]!r}.")
            continue
        used[key] = found[0]
        names.append(role[key])
    for index, name in enumerate(role.get("prerequisites") or []):
        if name not in others:
            errors.setdefault(f"{where}.prerequisites.{index}", []).append(
                f"No data, output or script prerequisite named {name!r}.")
        elif name not in names:
            names.append(name)
    stored = [others[n][1].to_dict() for n in names if others[n][1] is not None]
    return stored, used


def _known(data: dict[str, Any], schema: Schema, path: str) -> list[str]:
    """The fields of `data` its schema does not declare: kept, not acted on."""
    declared = set(schema.fields)
    return [f"{path}{key}" for key in data if key not in declared]


@dataclass
class _Conversion:
    """What converting one v2 config gathers as it goes: the parameters and
    secrets its text may name, and every error and ignored field, by v2 path."""

    parameters: dict[str, Any]
    secrets: dict[str, str]
    errors: dict[str, list[str]]
    ignored: list[str]
    # data, output and script prerequisites by name: the raw item, and its stored form
    others: dict[str, tuple[dict[str, Any], prerequisites.Prerequisite | None]] = \
        field(default_factory=dict)

    def refuse(self, path: str, message: str) -> None:
        self.errors.setdefault(path, []).append(message)

    def substitute(self, text: str, path: str) -> str:
        return _substitute(text, self.parameters, self.secrets, path, self.errors)


def convert_v2(raw: Any, *, username: str, storage_roots: Sequence[str],
               hdfs_webhdfs_url: str = "") -> ConvertedConfig:
    """A v2 config as the v1 config it runs from, or InvalidJobConfig naming
    every offending field by its v2 path."""
    job = _loaded(raw)
    ignored = _known(job, _SCHEMA, "")
    ignored += [f"{key}" for key in ("version", "contributor", "description") if key in job]
    conversion = _Conversion(dict(job.get("parameters") or {}),
                             _secret_leaves(job.get("secrets")), {}, ignored)
    images, auths = _images(job, conversion)
    deployment = _deployment(job, conversion.errors)
    roles: list[dict[str, Any]] = []
    role_images: set[str] = set()
    for name, role in job["taskRoles"].items():
        v1, image = _role_as_v1(name, role, images, deployment.get(name, {}), conversion)
        roles.append(v1)
        role_images.update([image] if image is not None else [])
    if len(role_images) > 1:
        conversion.refuse("taskRoles",
                          "pai runs one image per job; these task roles name different images.")
    config: dict[str, Any] = {"jobName": job["name"], "image": next(iter(role_images), ""),
                              "taskRoles": roles}
    if config["image"] in auths:
        config["imageAuth"] = auths[config["image"]]
    if "jobRetryCount" in job:
        config["retryCount"] = job["jobRetryCount"]
    defaults = job.get("defaults") or {}
    if defaults.get("virtualCluster"):
        config["virtualCluster"] = defaults["virtualCluster"]
    ignored += _known(defaults, _V2DefaultsSchema(), "defaults.")
    _take_extras(job, config, ignored)
    if conversion.errors:
        raise InvalidJobConfig(f"job config has {len(conversion.errors)} invalid field(s)",
                               conversion.errors)
    try:
        validated = validate_job_config(config, username=username, storage_roots=storage_roots,
                                        hdfs_webhdfs_url=hdfs_webhdfs_url)
    except InvalidJobConfig as error:
        raise InvalidJobConfig(error.message, {_v2_path(k, roles): v
                                               for k, v in error.fields.items()}) from None
    return ConvertedConfig(config=validated.config, ignored=ignored + validated.ignored,
                           notes=validated.notes, shown=shown_submission(raw),
                           secrets=tuple(v for v in conversion.secrets.values() if v))


def _loaded(raw: Any) -> dict[str, Any]:
    """`raw` loaded by the v2 schema, or InvalidJobConfig by v2 path."""
    if not isinstance(raw, dict):
        raise InvalidJobConfig("job config must be an object",
                               {"_schema": ["Job config must be an object."]})
    if raw.get("protocolVersion") not in (2, "2"):  # most often a v1 config that names it
        raise InvalidJobConfig("job config has 1 invalid field(s)", {"protocolVersion": [
            "Must be 2. A v1 config has no protocolVersion: remove it to submit as v1."]})
    try:
        job: dict[str, Any] = _SCHEMA.load(raw)
    except ValidationError as error:
        found = {_dict_path(path): messages
                 for path, messages in flat_errors(error.messages).items()}
        raise InvalidJobConfig(f"job config has {len(found)} invalid field(s)", found) \
            from None
    return job


def _images(job: dict[str, Any],
            conversion: _Conversion) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The dockerimage prerequisites by name, and the registry login each
    image's pull uses; the data, output and script ones go to
    `conversion.others`, for the roles that name them."""
    images: dict[str, str] = {}
    auths: dict[str, dict[str, str]] = {}  # image -> the registry login its pull uses
    for index, pre in enumerate(job.get("prerequisites") or []):
        where = f"prerequisites.{index}"
        if pre["type"] != "dockerimage":
            conversion.others[pre["name"]] = (pre, _loaded_prerequisite(pre, where,
                                                                        conversion.errors))
            conversion.ignored += _known(pre, _V2PrerequisiteSchema(), f"{where}.")
            continue
        if not isinstance(pre["uri"], str) or not pre["uri"].strip():
            conversion.refuse(f"{where}.uri", "Must be an image name.")
            continue
        images[pre["name"]] = conversion.substitute(pre["uri"], f"{where}.uri")
        if "auth" in pre:
            auth = {key: conversion.substitute(str(value), f"{where}.auth.{key}")
                    for key, value in pre["auth"].items()
                    if key in ("username", "password", "registryuri")}
            conversion.ignored += _known(pre["auth"], _V2AuthSchema(), f"{where}.auth.")
            if auth.get("username"):
                auths[images[pre["name"]]] = auth
        conversion.ignored += _known(pre, _V2PrerequisiteSchema(), f"{where}.")
    return images, auths


def _role_as_v1(name: str, role: dict[str, Any], images: dict[str, str],
                deployment: dict[str, Any],
                conversion: _Conversion) -> tuple[dict[str, Any], str | None]:
    """A v2 task role as a v1 one (its deployment's pre- and postCommands
    around its commands), and the image it names (None when none is known)."""
    where = f"taskRoles.{name}"
    image = images.get(role["dockerImage"])
    if image is None:
        conversion.refuse(f"{where}.dockerImage",
                          f"No dockerimage prerequisite named {role['dockerImage']!r}.")
    stored, used = _role_prerequisites(role, where, conversion.others, conversion.errors)
    resource = role["resourcePerInstance"]
    steps = (deployment.get("preCommands") or []) + (role.get("commands") or []) \
        + (deployment.get("postCommands") or [])
    v1: dict[str, Any] = {
        "name": name, "taskNumber": role["instances"], "cpuNumber": resource["cpu"],
        "memoryMB": resource["memoryMB"], "gpuNumber": resource["gpu"],
        "command": "\n".join(_render_prerequisites(
            conversion.substitute(line, f"{where}.commands"), used) for line in steps),
        "portList": [{"label": label, "beginAt": 0, "portNumber": count}
                     for label, count in (resource.get("ports") or {}).items()],
    }
    completion = role.get("completion") or {}
    failed, succeeded = completion.get("minFailedInstances"), \
        completion.get("minSucceededInstances")
    if failed is not None:
        v1["minFailedTaskCount"] = failed  # -1: never fails on task failures
    if succeeded is not None and succeeded != -1:
        v1["minSucceededTaskCount"] = succeeded
    options = dict(role.get("extraContainerOptions") or {})
    if "shmMB" in options:
        v1["shmMB"] = options.pop("shmMB")
    conversion.ignored += [f"{where}.extraContainerOptions.{key}" for key in options]
    if role.get("taskRetryCount"):
        v1["taskRetryCount"] = role["taskRetryCount"]
    if stored:
        v1["prerequisites"] = stored
    if "instances" in resource:
        conversion.ignored.append(f"{where}.resourcePerInstance.instances")
    conversion.ignored += _known(role, _V2TaskRoleSchema(), f"{where}.")
    return v1, image


def _take_extras(job: dict[str, Any], config: dict[str, Any], ignored: list[str]) -> None:
    """The extras pai acts on (the ssh plugin asking for a key, hivedScheduler's
    class, capabilities, gangAllocation) into `config`; the rest ignored."""
    extras = dict(job.get("extras") or {})
    plugin = ssh.v2_plugin_parameters(extras.get(ssh.V2_PLUGINS))
    if plugin is not None and _asks_for_ssh(plugin[1]):  # acted on; other plugins are not
        position, config["ssh"] = plugin
        plugins = extras.pop(ssh.V2_PLUGINS)
        ignored += [f"extras.{ssh.V2_PLUGINS}.{at}" for at in range(len(plugins))
                    if at != position]
    acted = {}
    for key in ("hivedScheduler", "capabilities", "gangAllocation"):
        if key in extras:
            acted[key] = extras.pop(key)
    hived = acted.get("hivedScheduler")
    if isinstance(hived, dict):
        ignored += [f"extras.hivedScheduler.{k}" for k in hived if k != "jobPriorityClass"]
    ignored += [f"extras.{key}" for key in extras]
    if acted:
        config["extras"] = acted


def _loaded_prerequisite(pre: dict[str, Any], where: str,
                         errors: dict[str, list[str]]) -> prerequisites.Prerequisite | None:
    try:
        return prerequisites.from_v2(pre)
    except prerequisites.PrerequisiteError as error:
        errors.setdefault(where, []).append(f"{str(error)[:1].upper()}{str(error)[1:]}.")
        return None


def _asks_for_ssh(parameters: Any) -> bool:
    """Whether the ssh plugin's parameters ask for a key (or are wrong, which
    the v1 rules then name); a plugin asking for none is stored only."""
    try:
        return ssh.normalized(parameters) is not None
    except ssh.InvalidSshRequest:
        return True


def _dict_path(path: str) -> str:
    """marshmallow files a map's value errors under `<key>.value`; the user
    wrote `taskRoles.worker.resourcePerInstance.gpu`, so that is the path."""
    parts = path.split(".")
    for at in (2, 4):
        if len(parts) > at and parts[at] == "value" and (
                (at == 2 and parts[0] in ("taskRoles", "parameters"))
                or (at == 4 and parts[0] == "deployments" and parts[2] == "taskRoles")):
            del parts[at]
    return ".".join(parts)


def _deployment(job: dict[str, Any], errors: dict[str, list[str]]) -> dict[str, Any]:
    """The pre/postCommands of the deployment `defaults.deployment` names."""
    wanted = (job.get("defaults") or {}).get("deployment")
    if not wanted:
        return {}
    for deployment in job.get("deployments") or []:
        if deployment["name"] == wanted:
            unknown = set(deployment["taskRoles"]) - set(job["taskRoles"])
            if unknown:
                errors.setdefault("deployments", []).append(
                    f"No task role named {sorted(unknown)[0]!r}.")
            return dict(deployment["taskRoles"])
    errors.setdefault("defaults.deployment", []).append(f"No deployment named {wanted!r}.")
    return {}


_V1_TO_V2 = {"jobName": "name", "image": "prerequisites", "retryCount": "jobRetryCount",
             "virtualCluster": "defaults.virtualCluster", "taskNumber": "instances",
             "cpuNumber": "resourcePerInstance.cpu", "memoryMB": "resourcePerInstance.memoryMB",
             "gpuNumber": "resourcePerInstance.gpu", "command": "commands",
             "portList": "resourcePerInstance.ports", "shmMB": "extraContainerOptions.shmMB",
             "minFailedTaskCount": "completion.minFailedInstances",
             "minSucceededTaskCount": "completion.minSucceededInstances",
             "taskRetryCount": "taskRetryCount",
             "ssh": f"extras.{ssh.V2_PLUGINS}.{ssh.V2_PLUGIN}.parameters"}


def _v2_path(path: str, roles: list[dict[str, Any]]) -> str:
    """A v1 error path (`taskRoles.0.gpuNumber`) as the v2 field the user wrote."""
    parts = path.split(".")
    if parts[0] == "taskRoles" and len(parts) >= 3 and parts[1].isdigit() \
            and int(parts[1]) < len(roles):
        rest = _V1_TO_V2.get(parts[2], parts[2])
        return ".".join(["taskRoles", roles[int(parts[1])]["name"], rest])
    return ".".join([_V1_TO_V2.get(parts[0], parts[0]), *parts[1:]])
