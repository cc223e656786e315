"""Query strings as marshmallow schemas, loaded like bodies: a view declares
its query with `@takes_query(Schema())` and loads it with `load_query()`;
the OpenAPI document shows the same schema's fields as the parameters
(services/api/openapi.py), so it shows what the code enforces, and a bad
value is a 400 that names the parameter (services/api/bodies.py `load`),
never a 500 or a silent default.

Two kinds. The job list's, a task log's and a submit's queries are
`_ClientQuery`s: OpenPAI's clients and HTML forms send parameters of their
own and leave filters empty (`state=`), so an unknown parameter is ignored
and an empty one is not given, as they always were; a number must still be
one. The others refuse an unknown parameter, as bodies do.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from flask import request
from marshmallow import (
    EXCLUDE,
    Schema,
    ValidationError,
    fields,
    post_load,
    pre_load,
    validate,
    validates_schema,
)

from services.api.bodies import View, declared_schema, declares, load
from services.api.execschemas import check_argv
from services.api.schemabase import MS
from services.api.schemas import JOB_STATES, MAX_TAIL
from shared.domain import jobsort
from shared.domain.names import INPUT_PATTERN
from shared.state import execs, execsessions

QUERY_SCHEMA = "query_schema"  # the attribute `takes_query` sets on a view
MAX_OFFSET = 10**12  # past any real job count; keeps Redis' int64 ranges valid
MAX_LIST_LIMIT = 1000


def takes_query(schema: Schema) -> Callable[[View], View]:
    """Declare a view's query: `load_query()` loads it by `schema`, and the
    OpenAPI document shows its fields as the operation's query parameters."""
    return declares(QUERY_SCHEMA, schema)


def query_of(view: Callable[..., Any]) -> Schema:
    """The query `view` declared: for a view that serves another's answer
    (the portal's log view calls the API's), whose query it takes as it is."""
    schema: Schema = getattr(view, QUERY_SCHEMA)
    return schema


def load_query() -> dict[str, Any]:
    """The request's query loaded by the view's declared schema (a list field
    takes every value of its parameter, any other field the first); a 400
    naming every refused parameter."""
    schema = declared_schema(QUERY_SCHEMA)
    args = request.args
    data: dict[str, Any] = {}
    for key in args:
        named = next((f for f in schema.fields.values() if (f.data_key or f.name) == key), None)
        data[key] = args.getlist(key) if isinstance(named, fields.List) else args[key]
    return load(schema, data, what="query")


class _ClientQuery(Schema):
    """A query as forms and OpenPAI's clients send it (see the module's doc)."""

    class Meta:
        unknown = EXCLUDE

    @pre_load
    def drop_empty(self, data: dict[str, Any], **_: object) -> dict[str, Any]:
        numbers = {f.data_key or f.name for f in self.fields.values()
                   if isinstance(f, fields.Number)}
        return {key: value for key, value in data.items() if value != "" or key in numbers}


class Clamped(fields.Integer):
    """A whole number brought into [low, high] rather than refused: paging
    past the ends is an empty or a whole page (OpenPAI's list does the same).
    Not a whole number (`ten`, `1.5`, `1e3`, empty) is still a 400."""

    def __init__(self, low: int, high: int, **kwargs: Any) -> None:
        metadata = {"minimum": low, "maximum": high, **kwargs.pop("metadata", {})}
        super().__init__(metadata=metadata, **kwargs)
        self.low, self.high = low, high

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> int:
        number: int = super()._deserialize(value, attr, data, **kwargs)
        return min(self.high, max(self.low, number))


def _attempt() -> fields.Integer:
    return fields.Integer(validate=validate.Range(min=0),
                          metadata={"description": "default: the job's current attempt"})


# ---------------------------------------------------------------- jobs


class SubmitQuerySchema(_ClientQuery):
    dryRun = fields.Boolean(load_default=False,
                            metadata={"description": "validate and answer 200; store nothing"})


LIST_ORDERS = ("desc", "asc")  # by the sort field (submit time unless named): down, or up


class JobListQuerySchema(_ClientQuery):
    offset = Clamped(0, MAX_OFFSET, load_default=0,
                     metadata={"description": "past the last job: an empty page"})
    limit = Clamped(1, MAX_LIST_LIMIT, load_default=50)
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


class TaskLogQuerySchema(_ClientQuery):
    attempt = _attempt()
    tail = Clamped(0, MAX_TAIL, load_default=1000,
                   metadata={"description": "the last lines to send"})
    follow = fields.Boolean(load_default=False, metadata={
        "description": "server-sent events: the tail, then new lines until the task ends"})


class TaskSamplesQuerySchema(Schema):
    attempt = _attempt()
    limit = fields.Integer(load_default=2000, validate=validate.Range(min=1, max=20_000),
                           metadata={"description": "the last samples to send"})


MAX_METRICS_STEP_SECONDS = 86_400


class JobMetricsQuerySchema(Schema):
    attempt = _attempt()
    from_ = fields.Integer(data_key="from", validate=validate.Range(min=0), metadata={
        **MS, "description": "default: when the job was submitted"})
    to = fields.Integer(validate=validate.Range(min=0), metadata={
        **MS, "description": "default: when the job finished, else now"})
    step = fields.Float(validate=validate.Range(min=1, max=MAX_METRICS_STEP_SECONDS), metadata={
        "description": "seconds between points; at least the span in 1,000 points"})

    @validates_schema
    def check_span(self, data: dict[str, Any], **_: object) -> None:
        if "from_" in data and "to" in data and data["from_"] >= data["to"]:
            raise ValidationError(["must be before `to`"], "from")


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
            check_argv(data["command"])


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
