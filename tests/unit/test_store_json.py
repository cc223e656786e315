"""The store's fast JSON encoders write exactly what json.dumps writes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.state.store.codec import _event_json, compact_json, event_fields

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


@pytest.mark.parametrize("value, text", [
    (True, "true"), (0, "0"), (-7, "-7"), ("exclusive", '"exclusive"'),
    ("naïve \"q\"", '"na\\u00efve \\"q\\""'), (["n1", "n2"], '["n1", "n2"]'),
    ({"gpus": (0, 1), "ports": {}}, '{"gpus": [0, 1], "ports": {}}'),
])
def test_event_fields_text(value: Any, text: str) -> None:
    fields = event_fields("placed", value=value)
    assert (fields["kind"], fields["value"]) == ("placed", text)
    assert fields["time"].isdigit()
