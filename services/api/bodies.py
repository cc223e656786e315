"""Request bodies: read within the size limit, parsed strictly, and loaded
by the view's marshmallow schema, the same schema the OpenAPI document shows:
a view names it once, with `@takes(Schema())`, and both `load_body()` and
services/api/openapi.py read it from there.

Every way a body can be wrong ends here as a 4xx with the API's one error
shape, never a 500: a body over the limit, chunked or not (413); bytes that
are not UTF-8; JSON that is invalid, nested deeper than MAX_DEPTH, or holds
numbers JSON cannot mean (NaN, Infinity, 1e400, ten thousand digits); and
fields the schema refuses or does not know (400, each named in `fields`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import yaml
from flask import current_app, request
from marshmallow import Schema, ValidationError

from services.api.errors import ApiError
from shared.domain.jobspec import flat_errors

View = TypeVar("View", bound=Callable[..., Any])
BODY_SCHEMA = "body_schema"  # the attribute `takes` sets on a view

MAX_DEPTH = 32  # a job config nests about 6 deep; a parser's stack is not a quota


def _bad(message: str) -> NoReturn:
    raise ApiError("BadRequestError", message, 400)


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        _bad(f"the number {text[:40]} is too large")
    return value


def _no_constant(name: str) -> NoReturn:
    _bad(f"{name} is not a JSON number")


def read_limited() -> bytes:
    """The raw body, refused with 413 beyond the limit even when it comes
    chunked (no Content-Length), where it would otherwise be cut short."""
    limit = current_app.config.get("MAX_CONTENT_LENGTH") or 1024 * 1024
    # With a Content-Length, Werkzeug refuses an oversized body itself. A
    # chunked one it would end quietly at the limit, so read the server's
    # own stream, one byte past the limit, to tell "whole" from "cut".
    stream = request.stream if request.content_length is not None \
        else request.environ["wsgi.input"]
    data: bytes = stream.read(limit + 1)
    if len(data) > limit:
        raise ApiError("RequestEntityTooLargeError",
                       f"request body is larger than the {limit // 1024} KiB limit", 413)
    return data


def _read_text(wanted: str) -> str:
    """The body within its limit, as text: a 400 when it is empty (saying to
    send `wanted`) or not UTF-8, whichever format it is meant to be."""
    raw = read_limited()
    if not raw.strip():
        _bad(f"the request body is empty; send {wanted}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        _bad("the request body is not UTF-8")


def _too_deep(value: Any) -> bool:
    """Whether containers nest deeper than MAX_DEPTH (iteratively: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if type(item) is dict else item if type(item) is list else ()
        for child in children:
            if type(child) in (dict, list):
                if depth + 1 > MAX_DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


def read_json() -> Any:
    """The body as JSON, or a 4xx saying what is wrong with it."""
    text = _read_text("a JSON object")
    try:
        value = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        _bad(f"the JSON is nested more than {MAX_DEPTH} levels deep")
    except ValueError as error:  # includes ints beyond Python's digit limit
        _bad(f"the body is not valid JSON: {error}")
    if _too_deep(value):
        _bad(f"the JSON is nested more than {MAX_DEPTH} levels deep")
    return value


YAML_TYPES = ("text/yaml", "application/yaml", "application/x-yaml", "text/x-yaml")


# libyaml when present: the pure-Python parser takes seconds of CPU for a
# body at the size limit, libyaml a fraction of one.
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _YamlLoader(_SAFE_LOADER):
    """safe_load, keeping timestamps the strings the user wrote, as in JSON."""


def _timestamp_as_text(loader: Any, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))


_YamlLoader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)


def _refuse_costly_yaml(text: str) -> None:
    """A first pass over the parser's events, before anything is built:
    aliases (a few hundred bytes of them expand to a billion nodes for any
    walker) and nesting deeper than MAX_DEPTH are refused."""
    depth = 0
    for event in yaml.parse(text, Loader=_SAFE_LOADER):
        if isinstance(event, yaml.AliasEvent):
            _bad("the YAML uses aliases (*name), which are not accepted")
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                _bad(f"the YAML is nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1


def _json_shaped(value: Any) -> bool:
    """Whether a parsed YAML value is one JSON could carry: string keys,
    finite numbers, no sets, bytes or other tagged types."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            if any(type(k) is not str for k in item):
                return False
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
        elif type(item) is float:
            if item != item or item in (float("inf"), float("-inf")):
                return False
        elif item is not None and type(item) not in (str, int, bool):
            return False
    return True


def read_yaml() -> Any:
    """The body as YAML (JSON is YAML: OpenPAI's clients send either under a
    YAML content type), within the limits JSON bodies have, or a 4xx."""
    text = _read_text("a YAML or JSON object")
    try:
        _refuse_costly_yaml(text)
        value = yaml.load(text, Loader=_YamlLoader)  # a SafeLoader, see above
    except RecursionError:
        _bad(f"the YAML is nested more than {MAX_DEPTH} levels deep")
    except yaml.YAMLError as error:
        _bad(f"the body is not valid YAML: {str(error)[:300]}")
    except ValueError as error:  # ints beyond Python's digit limit
        _bad(f"the body is not valid YAML: {str(error)[:300]}")
    if _too_deep(value):
        _bad(f"the YAML is nested more than {MAX_DEPTH} levels deep")
    if not _json_shaped(value):
        _bad("the YAML holds values JSON cannot: keys must be strings, numbers finite, "
             "and no tagged types (!!set, !!binary, ...)")
    return value


def read_document() -> Any:
    """The body as YAML when its content type says so, else as JSON."""
    return read_yaml() if request.mimetype in YAML_TYPES else read_json()


def load(schema: Schema, data: Any, what: str = "request body") -> dict[str, Any]:
    """`data` loaded by `schema`; a 400 naming every refused field (or query
    parameter: services/api/queries.py)."""
    try:
        loaded: dict[str, Any] = schema.load(data)
    except ValidationError as error:
        refused = flat_errors(error.messages)
        said = "; ".join(f"{name}: {' '.join(problems)}" for name, problems in refused.items())
        raise ApiError("BadRequestError", f"the {what} is not valid: {said}", 400,
                       fields=refused) from None
    return loaded


def takes(schema: Schema) -> Callable[[View], View]:
    """Declare a view's JSON request body: `load_body()` loads it by `schema`,
    and the OpenAPI document shows `schema` as the body (with 400 and 413)."""
    return declares(BODY_SCHEMA, schema)


def declares(what: str, schema: Schema) -> Callable[[View], View]:
    """Set `schema` on a view under `what` (a body's, a query's): the one
    declaration both the view's loading and the OpenAPI document read."""

    def declare(view: View) -> View:
        setattr(view, what, schema)
        return view

    return declare


def declared_schema(what: str = BODY_SCHEMA) -> Schema:
    """The schema the current request's view declared under `what` (`takes`
    for a body, services/api/queries.py's `takes_query` for a query)."""
    view = current_app.view_functions[request.endpoint or ""]
    schema: Schema | None = getattr(view, what, None)
    if schema is None:
        raise LookupError(f"{request.endpoint} loads what it declares no {what} for")
    return schema


def load_body() -> dict[str, Any]:
    """The JSON body loaded by the view's declared schema (a non-object is a 400 too)."""
    return load(declared_schema(), read_json())
