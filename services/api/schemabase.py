"""What the API's schemas share (services/api/schemas.py, execschemas.py,
queries.py): a request body that refuses unknown fields, JSON's own
booleans, and the epoch-milliseconds field every time is."""

from __future__ import annotations

from typing import Any

from marshmallow import RAISE, Schema, fields

MS = {"description": "epoch milliseconds"}


def epoch_ms(*, allow_none: bool = False) -> fields.Integer:
    return fields.Integer(required=True, allow_none=allow_none, metadata=MS)


class RequestSchema(Schema):
    """A request body: a field the schema does not know is a 400 naming it
    (a typo must not be silently ignored)."""

    class Meta:
        unknown = RAISE


class JsonBoolean(fields.Boolean):
    """Only JSON's true and false: a set of {True} alone would still let 1 in
    (1 == True in Python)."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if type(value) is not bool:
            raise self.make_error("invalid", input=value)
        return value


def flag(**kwargs: object) -> fields.Boolean:
    """JSON's true and false only (not "yes", 1 or "on")."""
    return JsonBoolean(**kwargs)  # type: ignore[arg-type]
