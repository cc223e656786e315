"""Where a task's full log file goes: the platform's log tree, by a link-free walk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.monitor.logfile import TaskLogFile, log_file_parts
from shared.node.containers import TaskRef

REF = TaskRef("alice~job", 0, "main", 0)
HOST_CONTENT = b"root:x:0:0:root:/root:/bin/sh\n"


def test_the_log_file_is_per_job_attempt_role_and_index() -> None:
    assert log_file_parts(TaskRef("alice~job", 2, "worker", 3)) == \
        ("alice~job", "2", "worker-3.log")


def test_lines_are_appended_batch_after_batch(tmp_path: Path) -> None:
    log = TaskLogFile(str(tmp_path / ".pai-logs"), REF)

    log.append(["one", "two"])
    log.append(["three"])

    assert (tmp_path / ".pai-logs" / "alice~job" / "0" / "main-0.log").read_text() == \
        "one\ntwo\nthree\n"


def test_the_tree_is_not_made_where_its_parent_is_missing(tmp_path: Path) -> None:
    """An unmounted storage root must not get a local log folder in its place."""
    log = TaskLogFile(str(tmp_path / "not-mounted" / ".pai-logs"), REF)
    log.append(["kept in Redis"])
    assert log.failed
    assert not (tmp_path / "not-mounted").exists()


def test_a_file_that_cannot_be_written_is_given_up_once(tmp_path: Path) -> None:
    tree = tmp_path / ".pai-logs"
    tree.mkdir()
    (tree / "alice~job").write_text("a file where the folder should be")
    log = TaskLogFile(str(tree), REF)

    log.append(["lost to the file, kept in Redis"])
    log.append(["again"])

    assert log.failed


COMPONENTS = ["alice~job", "alice~job/0", "alice~job/0/main-0.log"]


@pytest.mark.parametrize("planted", COMPONENTS, ids=[f"link at {c}" for c in COMPONENTS])
def test_a_link_planted_in_the_tree_is_not_followed(tmp_path: Path, planted: str) -> None:
    """Threat: a link at any component of a task's log path makes the monitor
    (root on the node) append the job's output to a host file. The tree is
    not mounted into jobs, so this is defence in depth; the file is untouched."""
    host = tmp_path / "etc" / "passwd"
    host.parent.mkdir()
    host.write_bytes(HOST_CONTENT)
    tree = tmp_path / ".pai-logs"
    link = tree / planted
    link.parent.mkdir(parents=True)
    os.symlink(host if planted.endswith(".log") else host.parent, link)
    log = TaskLogFile(str(tree), REF)

    log.append(["forged: root::0:0::/:/bin/sh"])

    assert log.failed
    assert host.read_bytes() == HOST_CONTENT
    assert [p.name for p in host.parent.iterdir()] == ["passwd"]
