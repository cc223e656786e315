"""The schemas of exec (a command in a running task, and the interactive
terminal's control messages) and of SSH access: what services/api/execs.py,
exectty.py and ssh.py load and answer."""

from __future__ import annotations

from typing import Any

from marshmallow import EXCLUDE, Schema, ValidationError, fields, validate, validates_schema

from services.api.schemabase import RequestSchema
from shared.state import execs, execsessions


def check_argv(argv: list[str]) -> None:
    """A command line an exec may run (shared/state/execs.py), else its problems as
    the `command` field's errors."""
    problems = execs.argv_problems(argv)
    if problems:
        raise ValidationError(problems, "command")


class ExecRequestSchema(RequestSchema):
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
        check_argv(data.get("command") or [])
        if data.get("timeoutSec", 0) > self.max_timeout:
            raise ValidationError([f"at most {self.max_timeout} seconds on this platform"],
                                  "timeoutSec")


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
            check_argv(data["command"])


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
