"""The keyword search of a chunk of names finds exactly what `in` finds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shared.state.nameindex import _Chunk, job_name

NAMES = st.text(alphabet="abAB-.1", min_size=1, max_size=8)


def _chunk(names: list[str]) -> _Chunk:
    chunk = _Chunk()
    for number, name in enumerate(names):
        chunk.extend([f"user{number}~{name}"])
    return chunk


@given(st.lists(NAMES, max_size=40), st.text(alphabet="abAB-.1", min_size=1, max_size=4))
def test_matches_are_the_names_containing_the_needle(names: list[str], keyword: str) -> None:
    needle = keyword.lower()
    assert _chunk(names).matches(needle) == [i for i, n in enumerate(names) if needle in n.lower()]


def test_a_name_matching_twice_is_found_once_and_nothing_spans_two_names() -> None:
    chunk = _chunk(["aaaa", "ab", "ba"])
    assert chunk.matches("aa") == [0]
    assert chunk.matches("b\nb") == []
    assert chunk.matches("a") == [0, 1, 2]


def test_the_user_part_of_an_id_is_not_searched() -> None:
    assert job_name("alice~Bert-1") == "bert-1"
    assert _chunk(["x"]).matches("user") == []
