"""`GET /api/v1/openapi.json`: the API described by its own routes.

Nothing here is written per endpoint. Paths and path parameters come from
Flask's URL map (an `int` converter is an integer), operations from the YAML
after `---` in each view's docstring, bodies from the marshmallow schemas in
`services.api.schemas` and `shared.domain.jobspec`. The conventions every operation
shares are applied once, by `_ConventionsPlugin`, from what the code itself
declares, so a docstring lists only what is particular to its view: its
success responses (`200: User` for a JSON body of one schema, `200: [User]`
for a JSON array of them; `upserts: User` for a PUT that creates or changes
one: 201 or 200 with it) and its other errors by status (`errors: [404,
409]`). The rest is derived:

- the bearer token and 401, unless the endpoint is public (the same
  `PUBLIC_ENDPOINTS` the auth check reads);
- the request body a view declares with `@takes(Schema())` (the schema
  `load_body()` loads it by), with 400 and 413;
- the query parameters a view declares with `@takes_query(Schema())` (the
  schema `load_query()` loads them by), before any others it lists;
- 403 for an `@admin_only` view;
- no 404 on a path that names nothing: one view may serve two rules (submit,
  with and without `/user/<username>`), each documented on its own.

Operations documented alike say so once, with YAML anchors and aliases (the
task port proxy's methods): each operation is completed as a copy of its own.

A route with a method its docstring does not document fails the build, so a
new view cannot go undocumented.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from apispec import APISpec, BasePlugin, yaml_utils
from apispec.ext.marshmallow import MarshmallowPlugin
from apispec.ext.marshmallow.openapi import OpenAPIConverter
from apispec_webframeworks.flask import FlaskPlugin
from flask import Blueprint, Flask, current_app
from marshmallow import Schema, class_registry, fields
from werkzeug.routing import Rule

from services.api import schemas
from services.api.auth import ADMIN_ONLY, PUBLIC_ENDPOINTS
from services.api.bodies import BODY_SCHEMA
from services.api.queries import QUERY_SCHEMA
from shared.domain.jobspec import MAX_ENVS, BoundedList, EnvVars, JobConfigSchema
from shared.domain.jobspec_v2 import JobConfigV2Schema

bp = Blueprint("openapi", __name__, url_prefix="/api/v1")

OPENAPI_VERSION = "3.0.3"
BEARER = "bearerAuth"
_CACHE_KEY = "pai.openapi"
_DOCUMENTED = ("/api/v1/", "/healthz")
_HTTP_METHODS = ("get", "put", "post", "delete", "patch")

# Component name -> status; a view's docstring lists its errors by status (`errors: [404]`).
ERROR_RESPONSES = {
    "BadRequest": 400, "Unauthorized": 401, "Forbidden": 403, "NotFound": 404,
    "Conflict": 409, "TooLarge": 413, "TooManyRequests": 429,
    "ServiceUnavailable": 503, "GatewayTimeout": 504,
}
_ERROR_NAMES = {status: name for name, status in ERROR_RESPONSES.items()}
# <converter(args):name> in a Flask rule; the converter decides the type.
_RULE_VARIABLE = re.compile(r"<(?:(\w+)(?:\([^)]*\))?:)?(\w+)>")
_CONVERTER_TYPES: dict[str, dict[str, Any]] = {
    "int": {"type": "integer", "minimum": 0}, "float": {"type": "number"}}


@bp.get("/openapi.json")
def spec() -> dict[str, Any]:
    """This document, generated from the routes and schemas of this very server.
    ---
    get:
      tags: [meta]
      responses:
        200:
          description: an OpenAPI 3 document
          content: {application/json: {schema: {type: object}}}
    """
    return openapi_document(current_app)


def openapi_document(app: Flask) -> dict[str, Any]:
    """Built on first use and kept: the routes cannot change while the app runs."""
    document: dict[str, Any] | None = app.extensions.get(_CACHE_KEY)
    if document is None:
        document = build_spec(app).to_dict()
        app.extensions[_CACHE_KEY] = document
    return document


def build_spec(app: Flask) -> APISpec:
    marshmallow = MarshmallowPlugin(schema_name_resolver=_schema_name)
    api = APISpec(
        title="pai", version="v1", openapi_version=OPENAPI_VERSION,
        # The conventions before marshmallow: the body schemas they add are
        # turned into references like the docstrings' own.
        plugins=[_FlaskRulePlugin(), _ConventionsPlugin(), marshmallow],
        info={"description": "Submit, watch and stop GPU jobs (OpenPAI's v1 REST shapes). "
                             "Errors are {code, message, fields?}; times are epoch ms."},
    )
    assert marshmallow.converter is not None
    marshmallow.converter.add_attribute_function(_jobspec_field_properties)
    api.components.security_scheme(BEARER, {
        "type": "http", "scheme": "bearer", "bearerFormat": "JWT",
        "description": "POST /api/v1/token gives one"})
    for name, schema in schemas.COMPONENTS.items():
        api.components.schema(name, schema=schema)
    for name, status in ERROR_RESPONSES.items():
        api.components.response(name, {
            "description": HTTPStatus(status).phrase,
            "content": {"application/json": {"schema": "Error"}}})
    rules = sorted(app.url_map.iter_rules(), key=lambda r: (r.rule, r.endpoint))
    # A WebSocket rule is the twin of an HTTP rule on its path (Werkzeug
    # matches an upgrade only to the one, a request only to the other): the
    # HTTP rule documents the path, the docstring says how to upgrade.
    http_paths = {rule.rule for rule in rules if not rule.websocket}
    for rule in rules:
        if rule.websocket and rule.rule in http_paths:
            continue
        if rule.rule.startswith(_DOCUMENTED):
            api.path(view=app.view_functions[rule.endpoint], app=app, rule=rule,
                     parameters=_path_parameters(rule))
    return api


def _schema_name(schema: type[Schema] | Schema | str) -> str:
    if isinstance(schema, str):  # a schema class a docstring names (services/api/storage.py)
        schema = class_registry.get_class(schema)
    cls = schema if isinstance(schema, type) else type(schema)
    if cls is JobConfigSchema:
        return "JobConfig"
    if cls is JobConfigV2Schema:
        return "JobConfigV2"
    return cls.__name__.lstrip("_").removesuffix("Schema")


def _path_parameters(rule: Rule) -> list[dict[str, Any]]:
    return [{"in": "path", "name": name, "required": True,
             "schema": dict(_CONVERTER_TYPES.get(converter, {"type": "string"}))}
            for converter, name in _RULE_VARIABLE.findall(rule.rule)]


def _jobspec_field_properties(self: OpenAPIConverter, field: fields.Field,
                              **kwargs: Any) -> dict[str, Any]:
    """What the job config's own field types check, which apispec cannot see."""
    if isinstance(field, BoundedList):
        return {"minItems": field.min_items, "maxItems": field.max_items}
    if isinstance(field, EnvVars):
        return {"type": "object", "maxProperties": MAX_ENVS, "additionalProperties": {
            "oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}}
    return {}


class _FlaskRulePlugin(FlaskPlugin):
    """FlaskPlugin, documenting the rule it is given: its own lookup finds one
    rule per view function, and a view may serve two."""

    def path_helper(self, path: str | None = None, operations: dict[str, Any] | None = None,
                    parameters: list[dict[str, Any]] | None = None, **kwargs: Any) -> str:
        assert operations is not None
        rule: Rule = kwargs["rule"]
        view: Callable[..., Any] = kwargs["view"]
        loaded = yaml_utils.load_operations_from_docstring(view.__doc__ or "")
        # an alias (`post: *proxied`) is the very object it names: copy each
        operations.update({method: copy.deepcopy(operation)
                           for method, operation in loaded.items()})
        return self.flaskpath2openapi(rule.rule)


class _ConventionsPlugin(BasePlugin):
    """What every operation shares, applied after FlaskPlugin read the docstrings
    and before MarshmallowPlugin resolves their schemas."""

    def operation_helper(self, path: str | None = None,
                         operations: dict[str, Any] | None = None,
                         **kwargs: Any) -> None:
        assert operations is not None
        rule: Rule = kwargs["rule"]
        view: Callable[..., Any] = kwargs["view"]
        methods = {m.lower() for m in rule.methods or ()} & set(_HTTP_METHODS)
        missing = methods - operations.keys()
        if missing:
            raise ValueError(f"{rule.endpoint} ({rule.rule}) documents no "
                             f"{', '.join(sorted(missing))} operation in its docstring")
        for method in methods:
            if len(methods) > 1:  # one rule, several methods (the task port proxy)
                operations[method].setdefault("operationId", f"{rule.endpoint}.{method}")
            self._complete(operations[method], rule, view)

    @staticmethod
    def _complete(operation: dict[str, Any], rule: Rule, view: Callable[..., Any]) -> None:
        summary = (view.__doc__ or "").strip().split("\n", 1)[0].strip()
        operation.setdefault("operationId", rule.endpoint)
        operation.setdefault("tags", [rule.endpoint.split(".")[0]])
        if summary and summary != "---":
            operation.setdefault("summary", summary.rstrip("."))
        responses = operation.setdefault("responses", {})
        for status in operation.pop("errors", ()):
            responses.setdefault(status, _ERROR_NAMES[status])
        upserted = operation.pop("upserts", None)
        if upserted is not None:  # `upserts: User`: the one changed, or created
            responses.setdefault(200, {"description": "changed", "content": _json(upserted)})
            responses.setdefault(201, {"description": "created", "content": _json(upserted)})
        for status, response in list(responses.items()):
            if isinstance(response, str) and response not in ERROR_RESPONSES:
                responses[status] = {"content": _json(response)}  # `200: User`
            elif isinstance(response, list):
                (items,) = response  # `200: [User]`: an array of that schema
                responses[status] = {"content": _json({"type": "array", "items": items})}
        if rule.endpoint in PUBLIC_ENDPOINTS:
            operation["security"] = []
        else:
            operation["security"] = [{BEARER: []}]
            responses.setdefault(401, "Unauthorized")
        query_schema = getattr(view, QUERY_SCHEMA, None)
        if query_schema is not None:
            operation.setdefault("parameters", []).insert(0, {"in": "query",
                                                              "schema": query_schema})
        body_schema = getattr(view, BODY_SCHEMA, None)
        if body_schema is not None:
            operation.setdefault("requestBody", {
                "required": True, "content": {"application/json": {"schema": body_schema}}})
        if "requestBody" in operation:
            responses.setdefault(400, "BadRequest")
            responses.setdefault(413, "TooLarge")
        if getattr(view, ADMIN_ONLY, False):
            responses.setdefault(403, "Forbidden")
        if not _RULE_VARIABLE.search(rule.rule):
            responses.pop(404, None)  # a path that names nothing has nothing to miss
        for status, response in responses.items():
            if isinstance(response, dict):
                response.setdefault("description", HTTPStatus(int(status)).phrase)
        operation["responses"] = dict(sorted(responses.items(), key=lambda r: int(r[0])))


def _json(schema: str | dict[str, Any]) -> dict[str, Any]:
    """A response's content: a JSON body of `schema` (a component's name, or inline)."""
    return {"application/json": {"schema": schema}}
