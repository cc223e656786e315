"""The job table's name order and name text (shared/domain/jobnames.py),
without Redis: the order is `sorted` by name then row, whatever way the rows
came; the text finds exactly the names `in` finds."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.jobnames import PLACE_AT_MOST, NameOrder, NameText
from shared.domain.jobsort import name_key

NAMES = st.text(alphabet="abAB-.1~", min_size=1, max_size=8)


def _ids(names: list[str]) -> list[str]:
    return [f"user{n % 3}~{name}" for n, name in enumerate(names)]


def _expected_order(ids: list[str]) -> list[int]:
    return sorted(range(len(ids)), key=lambda row: (name_key(ids[row]), row))


@given(st.lists(NAMES, max_size=60), st.lists(st.integers(1, 20), max_size=6))
def test_the_order_is_by_name_then_row_however_the_rows_came(
        names: list[str], steps: list[int]) -> None:
    ids, order, rows = _ids(names), NameOrder(), 0
    for step in [*steps, len(names)]:  # rows arrive a few at a time, then the rest
        rows = min(len(ids), rows + step)
        ranks = order.ranks(ids, rows)
        expected = _expected_order(ids[:rows])
        assert order.order.tolist() == expected
        assert sorted(range(rows), key=lambda row: int(ranks[row])) == expected


def test_many_new_rows_are_sorted_at_once_and_a_few_placed() -> None:
    ids = _ids([f"job-{n * 7919 % 1000:03d}" for n in range(3 * PLACE_AT_MOST)])
    order = NameOrder()
    order.ranks(ids, 2 * PLACE_AT_MOST)  # a load: sorted whole
    order.ranks(ids, 2 * PLACE_AT_MOST + 10)  # a few more: placed
    assert order.order.tolist() == _expected_order(ids[:2 * PLACE_AT_MOST + 10])


@given(st.lists(NAMES, min_size=1, max_size=30), st.integers(0, 29))
def test_renumbered_rows_are_placed_again(names: list[str], cut: int) -> None:
    ids = _ids(names)
    order = NameOrder()
    order.ranks(ids, len(ids))
    cut = min(cut, len(ids))
    order.forget_from(cut)
    moved = ids[:cut] + list(reversed(ids[cut:]))  # the table reordered its tail
    order.ranks(moved, len(moved))
    assert order.order.tolist() == _expected_order(moved)


@given(st.lists(NAMES, min_size=1, max_size=30), st.data())
def test_dropped_rows_leave_the_others_in_order(names: list[str], data: st.DataObject) -> None:
    ids = _ids(names)
    order = NameOrder()
    order.ranks(ids, len(ids))
    kept = np.array(data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids))))
    order.renumber(np.cumsum(kept) - 1, kept)
    left = [i for i, keep in zip(ids, kept, strict=True) if keep]
    assert order.order.tolist() == _expected_order(left)
    assert order.ranks(left, len(left)).tolist() == \
        [_expected_order(left).index(row) for row in range(len(left))]


@given(st.lists(NAMES, max_size=40), st.text(alphabet="abAB-.1~\n", min_size=1, max_size=4),
       st.integers(0, 40))
def test_the_text_finds_the_names_holding_the_keyword(names: list[str], keyword: str,
                                                      first: int) -> None:
    ids, text = _ids(names), NameText()
    text.rows_with("x", ids, min(first, len(ids)))  # taken in two steps
    needle = keyword.lower()
    expected = [n for n, name in enumerate(names) if "\n" not in needle
                and needle in name.lower()]
    found = text.rows_with(keyword, ids, len(ids)).tolist()
    assert found == sorted(found)
    assert sorted(set(found)) == expected


def test_a_name_holding_it_twice_is_found_twice_and_nothing_spans_two_names() -> None:
    ids, text = _ids(["aaaa", "ab", "ba"]), NameText()
    assert text.rows_with("aa", ids, 3).tolist() == [0, 0, 0]
    assert text.rows_with("b\nb", ids, 3).tolist() == []
    assert text.rows_with("A", ids, 3).tolist() == [0, 0, 0, 0, 1, 2]
    assert text.rows_with("user", ids, 3).tolist() == []  # the user part is not searched
    assert text.rows_with("ba~", ids, 3).tolist() == []


def test_renumbered_rows_are_taken_in_again() -> None:
    ids, text = _ids(["mnist", "bert", "gpt"]), NameText()
    assert text.rows_with("bert", ids, 3).tolist() == [1]
    text.forget_from(1)
    moved = [ids[0], ids[2], ids[1]]
    assert text.rows_with("bert", moved, 3).tolist() == [2]
