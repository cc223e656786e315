"""Walks that no symbolic link can redirect, on real temporary folders."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shared.infra import safefs

HOST_CONTENT = b"root:x:0:0:root:/root:/bin/sh\n"


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    """A file outside the walked tree standing for /etc/passwd on the node."""
    target = tmp_path / "host" / "passwd"
    target.parent.mkdir()
    target.write_bytes(HOST_CONTENT)
    return target


@pytest.fixture
def start(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    return tree


def test_append_creates_folders_and_appends(start: Path) -> None:
    safefs.append(str(start), ("job", "0", "main-0.log"), b"one\n")
    safefs.append(str(start), ("job", "0", "main-0.log"), b"two\n")
    assert (start / "job" / "0" / "main-0.log").read_bytes() == b"one\ntwo\n"
    assert stat.S_IMODE((start / "job").stat().st_mode) == 0o750


PARTS = ("job", "0", "main-0.log")


@pytest.mark.parametrize("depth", range(len(PARTS)),
                         ids=[f"link at {'/'.join(PARTS[:d + 1])}" for d in range(len(PARTS))])
def test_a_planted_link_at_any_component_is_refused(start: Path, host_file: Path,
                                                    depth: int) -> None:
    """Threat: a job plants a symbolic link at a component of a path the
    platform (root on the node) appends to, to make it write a host file."""
    parent = start.joinpath(*PARTS[:depth])
    parent.mkdir(parents=True, exist_ok=True)
    target = host_file if depth == len(PARTS) - 1 else host_file.parent
    os.symlink(target, parent / PARTS[depth])

    with pytest.raises(safefs.UnsafePath):
        safefs.append(str(start), PARTS, b"forged line\n")

    assert host_file.read_bytes() == HOST_CONTENT
    assert sorted(p.name for p in host_file.parent.iterdir()) == ["passwd"]


def test_a_hard_link_is_not_written_through(start: Path, host_file: Path) -> None:
    """Threat: a hard link to a host file (same file system) planted as the log."""
    (start / "job" / "0").mkdir(parents=True)
    os.link(host_file, start / "job" / "0" / "main-0.log")
    with pytest.raises(safefs.UnsafePath):
        safefs.append(str(start), PARTS, b"forged line\n")
    assert host_file.read_bytes() == HOST_CONTENT


def test_a_fifo_is_not_opened_for_writing(start: Path) -> None:
    """Threat: a FIFO planted as the file would block the writer for ever."""
    (start / "job" / "0").mkdir(parents=True)
    os.mkfifo(start / "job" / "0" / "main-0.log")
    with pytest.raises(safefs.UnsafePath):
        safefs.append(str(start), PARTS, b"line\n")


def test_real_dir_creates_with_the_exact_mode(start: Path) -> None:
    path = safefs.real_dir(str(start), ("bob", "out"), create=True, mode=0o777)
    assert path == str(start / "bob" / "out")
    assert stat.S_IMODE((start / "bob" / "out").stat().st_mode) == 0o777


def test_real_dir_without_create_needs_the_folder(start: Path) -> None:
    with pytest.raises(FileNotFoundError):
        safefs.real_dir(str(start), ("missing",))


def test_a_link_to_a_folder_inside_the_tree_is_refused_too(start: Path) -> None:
    """A link that stays inside the tree would still widen what is reached."""
    (start / "alice").mkdir()
    os.symlink(start / "alice", start / "bob")
    with pytest.raises(safefs.UnsafePath):
        safefs.real_dir(str(start), ("bob",))


def test_a_file_where_a_folder_belongs_is_refused(start: Path) -> None:
    (start / "bob").write_text("not a folder")
    with pytest.raises(safefs.UnsafePath):
        safefs.real_dir(str(start), ("bob", "out"), create=True)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\x00b"])
def test_only_single_components_are_walked(start: Path, name: str) -> None:
    with pytest.raises(safefs.UnsafePath):
        safefs.real_dir(str(start), ("ok", name), create=True)
    assert not (start / "ok").exists()


def test_the_start_itself_may_be_a_link(tmp_path: Path, start: Path) -> None:
    """The start (a storage root, the log tree) is the operator's, so trusted."""
    os.symlink(start, tmp_path / "root-link")
    safefs.append(str(tmp_path / "root-link"), PARTS, b"ok\n")
    assert (start / "job" / "0" / "main-0.log").read_bytes() == b"ok\n"
