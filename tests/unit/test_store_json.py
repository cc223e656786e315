"""The store's fast JSON encoders write exactly what json.dumps writes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.states import TaskState
from shared.state.store.codec import _event_json, compact_json, event_fields, plain_json

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner) | st.tuples(inner, inner)
    | st.dictionaries(st.text(), inner),
    max_leaves=25)


@given(VALUES)
def test_event_values_read_as_json_dumps_writes_them(value: Any) -> None:
    assert _event_json(value) == json.dumps(value)


@given(VALUES)
def test_compact_json_is_json_dumps_without_spaces(value: Any) -> None:
    assert compact_json(value) == json.dumps(value, separators=(",", ":"))


# plain_json's domain: no floats
PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.sampled_from(TaskState)
    | st.text(st.characters(max_codepoint=127)),
    lambda inner: st.lists(inner) | st.tuples(inner, inner)
    | st.dictionaries(st.text(st.characters(max_codepoint=127)) | st.text(), inner),
    max_leaves=25)


@given(PLAIN)
def test_plain_json_is_compact_json(value: Any) -> None:
    assert plain_json(value) == json.dumps(value, separators=(",", ":"))


@pytest.mark.parametrize("value", [
    "\x00\x1f\x7f\b\f\n\r\t\"\\/", "naïve", "\ud800", 2**64, -2**63 - 1,
    {"s": TaskState.LAUNCHING, "t": (1, (2,)), "n": None, "b": [True, False]},
], ids=["ascii controls", "non-ascii", "lone surrogate", "past 64 bits", "below int64",
        "a record's kinds"])
def test_plain_json_edges(value: Any) -> None:
    assert plain_json(value) == json.dumps(value, separators=(",", ":"))


@pytest.mark.parametrize("value, text", [
    (True, "true"), (0, "0"), (-7, "-7"), ("exclusive", '"exclusive"'),
    ("naïve \"q\"", '"na\\u00efve \\"q\\""'), (["n1", "n2"], '["n1", "n2"]'),
    ({"gpus": (0, 1), "ports": {}}, '{"gpus": [0, 1], "ports": {}}'),
])
def test_event_fields_text(value: Any, text: str) -> None:
    fields = event_fields("placed", value=value)
    assert (fields["kind"], fields["value"]) == ("placed", text)
    assert fields["time"].isdigit()
