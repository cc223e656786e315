"""A log stream's format read without Redis (shared/state/logstream.py): an
entry a batch of lines numbered by its last, and the legacy entry a line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.state import logstream
from shared.state.logstream import Entry

BATCH: Entry = ("0-7", {"t": "five\nsix\nseven", "c": "9:1"})


def test_an_entrys_lines_are_numbered_back_from_its_id() -> None:
    assert logstream.entry_lines(BATCH) == [("0-5", "five"), ("0-6", "six"), ("0-7", "seven")]


def test_a_one_line_entry_is_its_id() -> None:
    assert logstream.entry_lines(("0-1", {"t": ""})) == [("0-1", "")]


def test_a_legacy_entry_is_one_line_with_the_entrys_id() -> None:
    legacy: Entry = ("1700000000000-3", {"l": "old", "c": "1:1"})
    assert logstream.is_legacy(legacy) and not logstream.is_legacy(BATCH)
    assert logstream.entry_lines(legacy) == [("1700000000000-3", "old")]


ENTRIES: list[Entry] = [("0-2", {"t": "1\n2"}), BATCH, ("0-8", {"t": "8"})]


@pytest.mark.parametrize(("after", "numbers"), [
    (None, [1, 2, 5, 6, 7, 8]),
    ("0-0", [1, 2, 5, 6, 7, 8]),
    ("0-1", [2, 5, 6, 7, 8]),
    ("0-2", [5, 6, 7, 8]),
    ("0-5", [6, 7, 8]),  # inside an entry: its later lines only
    ("0-6", [7, 8]),
    ("0-7", [8]),
    ("0-8", []),
    ("0-99", []),
])
def test_lines_after_a_line_are_those_numbered_past_it(after: str | None,
                                                        numbers: list[int]) -> None:
    text = {1: "1", 2: "2", 5: "five", 6: "six", 7: "seven", 8: "8"}
    assert logstream.lines_after(ENTRIES, after) == [(f"0-{n}", text[n]) for n in numbers]


def test_lines_after_a_legacy_id_compare_as_stream_ids() -> None:
    legacy: list[Entry] = [("1700000000000-0", {"l": "a"}), ("1700000000000-1", {"l": "b"}),
                           ("1700000000001-0", {"l": "c"})]
    assert [line for _, line in logstream.lines_after(legacy, "1700000000000-0")] == ["b", "c"]


@pytest.mark.parametrize(("older", "newer"), [
    ("1-0", "1-1"), ("1-9", "2-0"), ("9-0", "10-0"), ("0-0", "1700000000000-0"),
    ("0-9", "0-10"),
])
def test_ids_compare_as_numbers(older: str, newer: str) -> None:
    assert logstream.position(older) < logstream.position(newer)


def test_the_extent_counts_lines_from_the_first_kept_entrys_first_line() -> None:
    info = {"length": 2, "entries-added": 3, "first-entry": BATCH,
            "last-entry": ("0-8", {"t": "8"})}
    assert logstream.extent(info) == (4, 8)  # lines 5-8 kept, 8 given


def test_the_extent_of_a_legacy_stream_counts_entries() -> None:
    info = {"length": 3, "entries-added": 10, "first-entry": ("1-0", {"l": "a"}),
            "last-entry": ("3-0", {"l": "c"})}
    assert logstream.extent(info) == (3, 10)


def test_an_empty_stream_keeps_and_was_given_nothing() -> None:
    assert logstream.extent({"length": 0, "entries-added": 4, "first-entry": None,
                             "last-entry": None}) == (0, 0)


@pytest.mark.parametrize(("first", "text"), [
    (1, "1\n2\nfive\nsix\nseven\n8\n"),
    (3, "five\nsix\nseven\n8\n"),  # lines 3-4 were trimmed: the text starts at 5
    (6, "six\nseven\n8\n"),  # inside an entry
    (8, "8\n"),
    (9, ""),
])
def test_a_text_from_a_line_holds_it_and_every_later_line(first: int, text: str) -> None:
    assert logstream.text_from(ENTRIES, first) == text
    assert text == "".join(line + "\n" for line_id, line in logstream.lines_after(ENTRIES)
                           if logstream.position(line_id)[1] >= first)


def _stream(batches: list[int], trimmed: int) -> tuple[list[Entry], list[str]]:
    """Entries as the append script writes them for batches of these sizes, the
    first `trimmed` gone; and every line ever given, line n holding "n"."""
    entries: list[Entry] = []
    number = 0
    for size in batches:
        lines = [str(n) for n in range(number + 1, number + size + 1)]
        number += size
        entries.append((logstream.line_id(number), {"t": "\n".join(lines)}))
    return entries[trimmed:], [str(n) for n in range(1, number + 1)]


@given(batches=st.lists(st.integers(1, 20), min_size=1, max_size=12), data=st.data())
def test_every_reading_agrees_with_the_lines_given(batches: list[int],
                                                  data: st.DataObject) -> None:
    entries, given_lines = _stream(batches, data.draw(st.integers(0, len(batches) - 1)))
    kept = [line for _id, line in logstream.lines_after(entries)]
    assert kept == given_lines[len(given_lines) - len(kept):]  # the newest, in order
    info = {"length": len(entries), "first-entry": entries[0], "last-entry": entries[-1]}
    assert logstream.extent(info) == (len(kept), len(given_lines))
    after = data.draw(st.integers(0, len(given_lines) + 2))
    assert [line for _id, line in logstream.lines_after(entries, logstream.line_id(after))] \
        == [line for line in kept if int(line) > after]
    first = data.draw(st.integers(1, len(given_lines) + 2))
    assert logstream.text_from(entries, first) == "".join(
        line + "\n" for line in kept if int(line) >= first)
