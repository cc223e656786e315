"""The portal's pure parts (services/portal/pages.py): no IO, table-driven."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from services.portal import pages


@pytest.mark.parametrize(("target", "expected"), [
    ("/jobs?state=WAITING", "/jobs?state=WAITING"),
    ("/", "/"),
    (None, "/"),
    ("", "/"),
    ("jobs", "/"),
    ("//evil.example/x", "/"),
    ("/\\evil.example", "/"),
    ("https://evil.example/", "/"),
    ("/jobs\r\nSet-Cookie: x=1", "/"),
    ("/a\\b", "/"),
])
def test_local_target_stays_on_the_site(target: str | None, expected: str) -> None:
    assert pages.local_target(target) == expected


@given(st.text(max_size=40))
def test_local_target_never_names_a_host(target: str) -> None:
    shown = pages.local_target(target)
    assert shown.startswith("/") and not shown.startswith("//") and "\\" not in shown


@pytest.mark.parametrize(("args", "page", "size", "offset"), [
    ({}, 1, 20, 0),
    ({"page": "3", "size": "50"}, 3, 50, 100),
    ({"page": "0"}, 1, 20, 0),
    ({"page": "-4", "size": "0"}, 1, 1, 0),
    ({"page": "x", "size": "y"}, 1, 20, 0),
    ({"size": "100000"}, 1, 100, 0),
    ({"page": str(10**30)}, pages.MAX_PAGE, 20, (pages.MAX_PAGE - 1) * 20),
])
def test_paging_of_clamps_what_a_url_says(args: dict[str, str], page: int, size: int,
                                          offset: int) -> None:
    paging = pages.paging_of(args)
    assert (paging.page, paging.size, paging.offset) == (page, size, offset)


@pytest.mark.parametrize(("page", "total", "pages_", "previous", "next_"), [
    (1, 0, 1, False, False),
    (1, 20, 1, False, False),
    (1, 21, 2, False, True),
    (2, 21, 2, True, False),
])
def test_paging_counts_pages(page: int, total: int, pages_: int, previous: bool,
                             next_: bool) -> None:
    paging = pages.Paging(page, 20, total)
    assert (paging.pages, paging.has_previous, paging.has_next) == (pages_, previous, next_)


ROWS: list[dict[str, Any]] = [
    {"name": "b", "username": "u2", "state": "WAITING", "virtualCluster": "x", "gpus": 2,
     "createdTime": 2},
    {"name": "a", "username": "u1", "state": "RUNNING", "virtualCluster": "y", "gpus": None,
     "createdTime": 3},
]


@pytest.mark.parametrize(("sort", "descending", "names"), [
    ("name", False, ["a", "b"]),
    ("name", True, ["b", "a"]),
    ("gpus", False, ["a", "b"]),
    ("created", True, ["a", "b"]),
    ("", True, ["b", "a"]),        # as the API gave them
    ("nonsense", False, ["b", "a"]),
])
def test_sorted_rows(sort: str, descending: bool, names: list[str]) -> None:
    assert [r["name"] for r in pages.sorted_rows(ROWS, sort, descending)] == names


def test_clone_renames_a_v1_job_as_json_and_a_v2_job_as_yaml() -> None:
    v1 = json.loads(pages.clone_text({"jobName": "mnist", "image": "b"}, "beef"))
    assert v1 == {"jobName": "mnist-beef", "image": "b"}
    v2 = yaml.safe_load(pages.clone_text({"protocolVersion": 2, "name": "ps"}, "beef"))
    assert v2 == {"protocolVersion": 2, "name": "ps-beef"}


@pytest.mark.parametrize(("body", "rows"), [
    ({"fields": {"b": ["x"], "a.0": ["y", "z"]}}, [("a.0", ["y", "z"]), ("b", ["x"])]),
    ({"fields": {"a": "one"}}, [("a", ["one"])]),
    ({"message": "m"}, []),
    ("text", []),
    (None, []),
])
def test_error_fields(body: Any, rows: list[tuple[str, list[str]]]) -> None:
    assert pages.error_fields(body) == rows


@pytest.mark.parametrize(("text", "ref"), [
    ("alice/job", ("alice", "job")),
    ("alice", None),
    ("/job", None),
    ("alice/", None),
    ("alice/a/b", None),
])
def test_job_ref(text: str, ref: tuple[str, str] | None) -> None:
    assert pages.job_ref(text) == ref


@pytest.mark.parametrize(("total", "count", "offset"), [(0, 5, 0), (3, 5, 0), (12, 5, 7)])
def test_oldest_offset(total: int, count: int, offset: int) -> None:
    assert pages.oldest_offset(total, count) == offset
