"""What `pai fs put` does with each file (pai_cli/transfers.py), as a table."""

from __future__ import annotations

from pathlib import Path

import pytest

from pai_cli.transfers import (
    CHECKED_TAIL,
    Action,
    TransferError,
    plan_put,
    tail_range,
    upload_plan,
)
from pai_cli.webhdfs import Entry


def remote(length: int, kind: str = "FILE") -> Entry:
    return Entry("f", kind, length, 0, "644", "alice")


@pytest.mark.parametrize(("size", "there", "overwrite", "resume", "expected"), [
    pytest.param(10, None, False, False, (Action.CREATE, 0), id="nothing there: create"),
    pytest.param(10, remote(3), True, False, (Action.CREATE, 0), id="overwrite replaces"),
    pytest.param(10, remote(3), False, True, (Action.APPEND, 3), id="resume appends the rest"),
    pytest.param(10, remote(10), False, True, (Action.SKIP, 10), id="resume of a whole file"),
    pytest.param(10, remote(0), False, True, (Action.APPEND, 0), id="resume from nothing"),
])
def test_plan_put(size: int, there: Entry | None, overwrite: bool, resume: bool,
                  expected: tuple[Action, int]) -> None:
    assert plan_put(size, there, overwrite=overwrite, resume=resume) == expected


@pytest.mark.parametrize(("size", "there", "resume", "why"), [
    pytest.param(10, remote(3), False, "--resume", id="exists, no flag"),
    pytest.param(10, remote(11), True, "more than", id="remote longer: another file"),
    pytest.param(10, remote(0, "DIRECTORY"), True, "folder", id="a folder is there"),
])
def test_plan_put_refuses(size: int, there: Entry, resume: bool, why: str) -> None:
    with pytest.raises(TransferError, match=why):
        plan_put(size, there, overwrite=False, resume=resume)


@pytest.mark.parametrize(("offset", "expected"), [
    (0, (0, 0)), (10, (0, 10)), (CHECKED_TAIL * 3, (CHECKED_TAIL * 2, CHECKED_TAIL))])
def test_the_tail_compared_before_appending(offset: int, expected: tuple[int, int]) -> None:
    assert tail_range(offset) == expected


def test_upload_plan_walks_a_folder_without_entering_links(tmp_path: Path) -> None:
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.txt").write_text("xx")
    (tmp_path / "src" / "y.txt").write_text("y")
    (tmp_path / "src" / "loop").symlink_to(tmp_path / "src")
    plan = upload_plan(tmp_path / "src", "/r/alice/src", recursive=True)
    assert plan.folders == ("/r/alice/src", "/r/alice/src/a")
    assert [(s.remote, s.size) for s in plan.files] == [("/r/alice/src/y.txt", 1),
                                                        ("/r/alice/src/a/x.txt", 2)]
    assert plan.total == 3
