"""The JSON text the store writes: records, script arguments and job
events, the same text as json.dumps, made without its per-call set-up (a
pass writes thousands at once).
"""

from __future__ import annotations

import json
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

import orjson

from shared.infra.clock import now_ms


def event_fields(kind: str, **data: Any) -> dict[str, str]:
    """A job event as its stream entry stores it (`Store.read_events` reads it)."""
    fields = {"kind": kind, "time": str(now_ms())}
    fields.update({k: _event_json(v) for k, v in data.items()})
    return fields


def _event_json(value: Any) -> str:
    """`json.dumps(value)`, the same text, without its encoder's set-up for the
    values most events carry (a pass writes thousands of events at once)."""
    kind = type(value)
    if kind is int:  # not bool, whose text differs
        return int.__repr__(value)
    if kind is str:
        return encode_basestring_ascii(value)
    return _dumps(value)


def _c_encoder(item_separator: str, key_separator: str) -> Any:
    """json's C encoder (ASCII, no circularity check: the values are trees),
    made once: calling it directly skips the set-up json.dumps does on every
    call, which is most of the cost of a small value. None without it."""
    if c_make_encoder is None:
        return None
    return c_make_encoder(None, None, encode_basestring_ascii, None, key_separator,
                          item_separator, False, False, True)


_dumps_chunks = _c_encoder(", ", ": ")
_compact_chunks = _c_encoder(",", ":")


def _dumps(value: Any) -> str:
    """`json.dumps(value)`, the same text."""
    if _dumps_chunks is None or not isinstance(value, list | dict):
        return json.dumps(value)
    return "".join(_dumps_chunks(value, 0))


def compact_json(value: Any) -> str:
    """`json.dumps(value, separators=(",", ":"))`, the same text: records and
    script arguments as the store writes them."""
    if _compact_chunks is None or not isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return "".join(_compact_chunks(value, 0))


def plain_json(value: Any) -> str:
    """`compact_json(value)`, the same text, for a tree of strings, integers,
    booleans, None, lists, tuples and string-keyed dicts (a task's or an
    allocation's record, a script's entries: not floats, whose exponents
    orjson writes otherwise), three to ten times faster. orjson writes such
    a tree as json does (tests/unit/test_store_json.py) where the text is
    printable ASCII; a string that is not (json escapes all else, DEL
    included), or what orjson refuses (a lone surrogate, an integer past 64
    bits), gets json's text."""
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return compact_json(value)
    if text.isascii() and b"\x7f" not in text:
        return text.decode()
    return compact_json(value)
