"""OpenPAI's `data`, `output` and `script` prerequisites, as pai runs them. No IO.

A protocol v2 task role names prerequisites two ways: the legacy fields
`data`, `output` and `script` (one each), and the list `prerequisites`.
Each names a top-level prerequisite, which pai turns into steps around the
role's commands, in the task's container, as OpenPAI's runtime does:

- `callbacks` (OpenPAI's `com.microsoft.pai.runtimeplugin.cmd`): the
  `taskStarts` commands run before the role's commands, prerequisite by
  prerequisite in the role's order; the `taskSucceeds` commands after the
  commands succeeded, in the reverse order.
- a `data` prerequisite's `uri` (one or a list) is fetched before the
  commands into `/pai/data/<name>/`: an http(s) URL, a `webhdfs://` URI or
  an `hdfs://` one (through the operator's WebHDFS endpoint,
  PAI_HDFS_WEBHDFS_URL), or a path in the user's storage, which is mounted
  there read-only instead of copied (a `dataDir`'s rule: own folder or a
  share).
- an `output` prerequisite's folder `/pai/output/<name>/` is uploaded after
  the commands succeeded to its `uri` (`webhdfs://`, `hdfs://`); a path in
  the user's own folder is mounted there read-write instead (an
  `outputDir`'s rule), so what the job writes lands as it writes it.
- a `script` prerequisite's `uri` is not fetched: as in OpenPAI, it is
  what its commands and the role's render (`git clone <% $script.uri %>`);
  its callbacks are what runs.

Every step that fails fails the task with an exit code of its own
(FIRST_STEP_EXIT + the step's position), and the container's label
`pai.prerequisites` lists the steps in that order, so the monitor names the
failed one in the task's exit reason (services/monitor/observations.py).
`<% $data.uri[0] %>`, `<% $script.name %>`... in commands are rendered at
submit from the role's `data` / `output` / `script` prerequisite, as
OpenPAI's REST server renders them.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import quote, urlsplit

from shared.domain import storage

KINDS = ("data", "output", "script")
CMD_PLUGIN = "com.microsoft.pai.runtimeplugin.cmd"
DATA_ROOT = "/pai/data"
OUTPUT_ROOT = "/pai/output"
RUNTIME_DIR = "/pai/runtime"
# Exit codes of the task when a step fails: FIRST_STEP_EXIT + its position
# (at most MAX_STEPS), and BARRIER_EXIT when the SSH barrier gives up.
FIRST_STEP_EXIT = 200
MAX_STEPS = 40
BARRIER_EXIT = FIRST_STEP_EXIT + MAX_STEPS
MAX_URIS = 100
# The step that stages an hdfs:// codeDir (the runner's first when there is one).
CODE_STEP = "codeDir: fetching it from HDFS"
MAX_COMMANDS = 1000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class PrerequisiteError(ValueError):
    """A prerequisite pai cannot run; the message says why."""


class Source(StrEnum):
    HTTP = "http"  # fetched with GET
    WEBHDFS = "webhdfs"  # OPEN / CREATE on a WebHDFS endpoint
    STORAGE = "storage"  # a path in the storage roots: mounted, not copied


@dataclass(frozen=True)
class Location:
    """Where a URI's bytes are: an http(s) URL (for WebHDFS, the file's
    `/webhdfs/v1/...` URL without a query), or a storage path."""

    source: Source
    url: str = ""
    path: str = ""

    @property
    def basename(self) -> str:
        where = self.path or urlsplit(self.url).path
        return posixpath.basename(where.rstrip("/")) or "index"


def locate(uri: str, roots: Sequence[str], hdfs_webhdfs_url: str = "") -> Location:
    """Where a prerequisite's URI points; PrerequisiteError for one pai
    cannot fetch from or upload to."""
    if not isinstance(uri, str) or not uri.strip():
        raise PrerequisiteError("a uri must be a non-empty string")
    uri = uri.strip()
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme in ("http", "https"):
        if not urlsplit(uri).hostname:
            raise PrerequisiteError(f"{uri!r} names no host")
        return Location(Source.HTTP, url=uri)
    if scheme in ("webhdfs", "swebhdfs", "hdfs"):
        parts = urlsplit(uri)
        path = quote(posixpath.normpath("/" + parts.path.lstrip("/")))
        if scheme == "hdfs":
            if not hdfs_webhdfs_url:
                raise PrerequisiteError(
                    f"{uri!r}: pai reaches hdfs:// through the cluster's WebHDFS endpoint, "
                    f"and the operator has not named one (PAI_HDFS_WEBHDFS_URL); use a "
                    f"webhdfs://host:port/path URI")
            return Location(Source.WEBHDFS, url=f"{hdfs_webhdfs_url.rstrip('/')}/webhdfs/v1{path}")
        if not parts.hostname:
            raise PrerequisiteError(f"{uri!r} names no host")
        web = "https" if scheme == "swebhdfs" else "http"
        return Location(Source.WEBHDFS, url=f"{web}://{parts.netloc}/webhdfs/v1{path}")
    if uri.startswith(("/", storage.FILE_PREFIX)):
        try:
            where = storage.resolve(uri, roots)
        except storage.StoragePathError as error:
            raise PrerequisiteError(str(error)) from None
        assert where is not None  # not hdfs://, not empty
        return Location(Source.STORAGE, path=where.path)
    raise PrerequisiteError(f"{uri!r} is neither an http(s), webhdfs:// or hdfs:// URI nor "
                            f"an absolute path in the storage")


# ---------------------------------------------------------------- one role's steps


@dataclass(frozen=True)
class Prerequisite:
    """One data, output or script prerequisite as a task role uses it: the
    stored form in the v1 config's `taskRoles[].prerequisites` is its dict."""

    name: str
    kind: str
    uris: tuple[str, ...] = ()
    on_start: tuple[str, ...] = ()
    on_success: tuple[str, ...] = ()
    ignore_failure: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.kind, "uris": list(self.uris),
                "taskStarts": list(self.on_start), "taskSucceeds": list(self.on_success),
                "failurePolicy": "ignore" if self.ignore_failure else "fail"}

    @classmethod
    def from_dict(cls, data: Any) -> Prerequisite:
        """The stored form back (from a v1 config too: a user may write it)."""
        if not isinstance(data, dict):
            raise PrerequisiteError("must be an object")
        unknown = sorted(set(data) - {"name", "type", "uris", "taskStarts", "taskSucceeds",
                                      "failurePolicy"})
        if unknown:
            raise PrerequisiteError(f"unknown field {unknown[0]!r}")
        name, kind = data.get("name"), data.get("type")
        if not isinstance(name, str) or not _NAME.match(name):
            raise PrerequisiteError(f"name {name!r} must be letters, digits, '.', '_' or '-' "
                                    f"(it names a folder)")
        if kind not in KINDS:
            raise PrerequisiteError(f"type {kind!r} must be one of {', '.join(KINDS)}")
        policy = data.get("failurePolicy", "fail")
        if policy not in ("fail", "ignore"):
            raise PrerequisiteError("failurePolicy must be fail or ignore")
        found = cls(name, kind, _strings(data.get("uris"), "uris", MAX_URIS),
                    _strings(data.get("taskStarts"), "taskStarts", MAX_COMMANDS),
                    _strings(data.get("taskSucceeds"), "taskSucceeds", MAX_COMMANDS),
                    policy == "ignore")
        if kind == "output" and len(found.uris) > 1:
            raise PrerequisiteError("an output prerequisite has one uri")
        if kind != "script" and not found.uris and not found.on_start \
                and not found.on_success:
            raise PrerequisiteError("it has neither a uri nor callbacks: nothing to run")
        return found


def _strings(value: Any, what: str, most: int) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PrerequisiteError(f"{what} must be a string or a list of strings")
    if len(value) > most:
        raise PrerequisiteError(f"at most {most} {what}")
    return tuple(value)


def from_v2(item: dict[str, Any]) -> Prerequisite:
    """A top-level v2 prerequisite (data, output or script) in its stored form."""
    plugin = item.get("plugin")
    if plugin is not None and plugin != CMD_PLUGIN:
        raise PrerequisiteError(f"plugin {plugin!r}: pai runs {CMD_PLUGIN} only")
    starts: list[str] = []
    succeeds: list[str] = []
    callbacks = item.get("callbacks") or []
    if not isinstance(callbacks, list):
        raise PrerequisiteError("callbacks must be a list of {event, commands}")
    for callback in callbacks:
        event = callback.get("event") if isinstance(callback, dict) else None
        if event not in ("taskStarts", "taskSucceeds"):
            raise PrerequisiteError(f"callback event {event!r} must be taskStarts or "
                                    f"taskSucceeds")
        commands = _strings(callback.get("commands"), "commands", MAX_COMMANDS)
        (starts if event == "taskStarts" else succeeds).extend(commands)
    uri = item.get("uri")
    return Prerequisite.from_dict({
        "name": item.get("name"), "type": item.get("type"),
        "uris": [] if uri is None else uri, "taskStarts": starts, "taskSucceeds": succeeds,
        "failurePolicy": item.get("failurePolicy", "fail")})


@dataclass(frozen=True)
class Step:
    """One thing the runner does that may fail the task (its exit code is
    FIRST_STEP_EXIT + its index in the role's steps)."""

    prerequisite: Prerequisite
    phase: str  # "fetch", "start", "success" or "upload"

    def describe(self) -> str:
        what = {"fetch": "fetching its uri", "start": "its taskStarts commands",
                "success": "its taskSucceeds commands", "upload": "uploading its folder"}
        return f"{self.prerequisite.kind} prerequisite {self.prerequisite.name}: " \
               f"{what[self.phase]}"


@dataclass(frozen=True)
class Plan:
    """A role's steps before its commands, then after they succeeded."""

    before: tuple[Step, ...] = ()
    after: tuple[Step, ...] = ()
    locations: dict[str, tuple[Location, ...]] = field(default_factory=dict)

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.before + self.after


def plan(prerequisites: Sequence[Prerequisite], roots: Sequence[str],
         hdfs_webhdfs_url: str = "") -> Plan:
    """What the runner does for a role, in order; PrerequisiteError for a
    URI pai cannot use, or more steps than exit codes."""
    before: list[Step] = []
    after: list[Step] = []
    locations: dict[str, tuple[Location, ...]] = {}
    for item in prerequisites:
        found = () if item.kind == "script" else \
            tuple(locate(u, roots, hdfs_webhdfs_url) for u in item.uris)
        locations[item.name] = found
        if item.kind == "output":
            if any(loc.source == Source.HTTP for loc in found):
                raise PrerequisiteError(f"output {item.name}: pai uploads to webhdfs://, "
                                        f"hdfs:// or a path in your folder, not http(s)")
        elif any(loc.source != Source.STORAGE for loc in found):
            before.append(Step(item, "fetch"))
        names = [loc.basename for loc in found]
        if len(set(names)) != len(names):
            raise PrerequisiteError(f"{item.name}: two uris end in the same name")
        if item.on_start:
            before.append(Step(item, "start"))
    for item in reversed(prerequisites):
        if item.on_success:
            after.append(Step(item, "success"))
    for item in prerequisites:
        if item.kind == "output" and any(loc.source == Source.WEBHDFS
                                         for loc in locations[item.name]):
            after.append(Step(item, "upload"))
    if len(before) + len(after) > MAX_STEPS:
        raise PrerequisiteError(f"a task role runs at most {MAX_STEPS} prerequisite steps")
    return Plan(tuple(before), tuple(after), locations)


def folder_of(item: Prerequisite) -> str:
    """Where a data or output prerequisite's files are in the container."""
    return posixpath.join(OUTPUT_ROOT if item.kind == "output" else DATA_ROOT, item.name)


def step_labels(steps: Sequence[Step]) -> str:
    """The container label naming each step, in exit code order."""
    return "\n".join(step.describe() for step in steps)


def failed_step(exit_code: int, label: str | None) -> str | None:
    """What a runner's exit code says failed, from the container's label
    (None: the task ran without the runner, its codes are its own)."""
    if label is None:
        return None
    if exit_code == BARRIER_EXIT:
        return "the SSH barrier: not every task's sshd answered in time"
    steps = label.split("\n") if label else []
    index = exit_code - FIRST_STEP_EXIT
    return f"{steps[index]} failed" if 0 <= index < len(steps) else None
