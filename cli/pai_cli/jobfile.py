"""Reading a job config from a file or standard input.

OpenPAI's documents show job JSON with `//` comments and users copy them, so
comments are stripped before parsing (the API itself takes strict JSON).
YAML files (`.yaml`, `.yml`) are read too; the API decides what it accepts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import IO, Any

import yaml

_JSON_COMMENT = re.compile(
    r'(?P<string>"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z))'
    r"|(?P<line>//[^\n]*+)"
    r"|(?P<block>/\*.*?(?:\*/|\Z))",
    re.DOTALL,
)


class JobFileError(Exception):
    """The file cannot be read or is not a JSON/YAML object."""


def read_source(source: str, stdin: IO[str]) -> tuple[str, str]:
    """(display name, text) of a path, or of standard input for `-`."""
    if source == "-":
        return "<stdin>", stdin.read()
    try:
        return source, Path(source).read_text(encoding="utf-8")
    except OSError as error:
        raise JobFileError(f"cannot read {source}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise JobFileError(f"{source} is not UTF-8 text") from None


def parse_job_config(name: str, text: str) -> dict[str, Any]:
    """The config in `text`: YAML for .yaml/.yml names, else JSON with comments
    (falling back to YAML when the text does not look like JSON at all)."""
    if name.lower().endswith((".yaml", ".yml")):
        return _as_object(name, _load_yaml(name, text))
    stripped = strip_json_comments(text)
    if not stripped.strip():
        raise JobFileError(f"{name} holds no job config")
    if not stripped.lstrip().startswith(("{", "[")):
        return _as_object(name, _load_yaml(name, text))
    try:
        return _as_object(name, json.loads(stripped))
    except json.JSONDecodeError as error:
        raise JobFileError(f"{name}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}") \
            from None


def strip_json_comments(text: str) -> str:
    """OpenPAI's documents show job JSON with // and /* */ comments, and users
    copy them; the CLI strips them before sending strict JSON. Comment markers
    inside strings ("http://x") are kept. A block comment keeps its newlines so
    a JSON error still points at the right line."""

    def replace(match: re.Match[str]) -> str:
        if match.group("string") is not None:
            return match.group(0)
        if match.group("line") is not None:
            return ""
        return "\n" * match.group(0).count("\n") or " "

    return _JSON_COMMENT.sub(replace, text)


def _load_yaml(name: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise JobFileError(f"{where}: invalid YAML: {problem}") from None


def _as_object(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise JobFileError(f"{name}: a job config is an object (got "
                           f"{type(value).__name__ if value is not None else 'nothing'})")
    return value


def apply_overrides(config: dict[str, Any], *, name: str | None,
                    vc: str | None) -> dict[str, Any]:
    """A copy of `config` with `--name` and `--vc` applied, in the protocol's
    own fields (v2: `name` and `defaults.virtualCluster`)."""
    result = dict(config)
    v2 = "protocolVersion" in result
    if name:
        result["name" if v2 else "jobName"] = name
    if vc and v2:
        result["defaults"] = {**(result.get("defaults") or {}), "virtualCluster": vc}
    elif vc:
        result["virtualCluster"] = vc
    return result
