"""The log tree's group (PAI_LOG_GROUP): what the writers make, on real folders."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.monitor.logfile import TaskLogFile
from shared.infra import safefs
from shared.infra.config import ConfigError, load_settings
from shared.node.containers import TaskRef
from shared.state import logfiles
from shared.state.logfiles import TreeModes

GROUP = 10001  # the image's group pai; root may give a file any group
PARTS = ("job", "0", "main-0.log")
HOST_CONTENT = b"root:x:0:0:root:/root:/bin/sh\n"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="gives files a group not its own")


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The umask services run with: it would cut 0660 to 0640 if not undone."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode_and_group(path: Path) -> tuple[int, int]:
    info = path.lstat()
    return stat.S_IMODE(info.st_mode), info.st_gid


@pytest.mark.parametrize(("group", "dir_mode", "file_mode"), [
    (None, 0o750, 0o640),
    (GROUP, 0o2770, 0o660),
    (0, 0o2770, 0o660),
])
def test_tree_modes(group: int | None, dir_mode: int, file_mode: int) -> None:
    modes = TreeModes(group)
    assert (modes.dir_mode, modes.file_mode) == (dir_mode, file_mode)
    assert not modes.dir_mode & 0o007 and not modes.file_mode & 0o007  # users' logs: no others


@pytest.mark.parametrize(("raw", "expected"), [("", None), ("10001", 10001), (" 0 ", 0)])
def test_the_setting_is_a_numeric_group(raw: str, expected: int | None) -> None:
    assert load_settings({"PAI_LOG_GROUP": raw}).log_group == expected


@pytest.mark.parametrize("raw", ["pai", "-1", "10001.5"])
def test_a_malformed_group_is_refused_by_name(raw: str) -> None:
    with pytest.raises(ConfigError, match="PAI_LOG_GROUP"):
        load_settings({"PAI_LOG_GROUP": raw})


@needs_root
def test_append_with_a_group_makes_folders_2770_and_files_0660_of_the_group(
        tmp_path: Path) -> None:
    modes = TreeModes(GROUP)
    safefs.append(str(tmp_path), PARTS, b"one\n", dir_mode=modes.dir_mode,
                  file_mode=modes.file_mode, group=GROUP)
    safefs.append(str(tmp_path), PARTS, b"two\n", dir_mode=modes.dir_mode,
                  file_mode=modes.file_mode, group=GROUP)

    assert (tmp_path / "job" / "0" / "main-0.log").read_bytes() == b"one\ntwo\n"
    assert mode_and_group(tmp_path / "job") == (0o2770, GROUP)
    assert mode_and_group(tmp_path / "job" / "0") == (0o2770, GROUP)
    assert mode_and_group(tmp_path / "job" / "0" / "main-0.log") == (0o660, GROUP)


@needs_root
def test_replace_with_a_group_makes_its_file_0660_of_the_group(tmp_path: Path) -> None:
    safefs.replace(str(tmp_path), PARTS, [b"whole\n"], dir_mode=0o2770, file_mode=0o660,
                   group=GROUP)
    assert mode_and_group(tmp_path / "job" / "0" / "main-0.log") == (0o660, GROUP)
    assert mode_and_group(tmp_path / "job") == (0o2770, GROUP)


def test_without_a_group_a_new_file_is_0640_whatever_the_umask(tmp_path: Path) -> None:
    os.umask(0o077)
    safefs.append(str(tmp_path), PARTS, b"one\n")
    assert mode_and_group(tmp_path / "job" / "0" / "main-0.log")[0] == 0o640
    assert mode_and_group(tmp_path / "job")[0] == 0o750


@needs_root
def test_an_existing_file_keeps_its_owner_group_and_mode_when_appended_to(
        tmp_path: Path) -> None:
    safefs.append(str(tmp_path), PARTS, b"one\n")
    safefs.append(str(tmp_path), PARTS, b"two\n", dir_mode=0o2770, file_mode=0o660,
                  group=GROUP)
    assert mode_and_group(tmp_path / "job" / "0" / "main-0.log") == (0o640, 0)


@needs_root
@pytest.mark.parametrize("planted", ["job", "job/0", "job/0/main-0.log"])
def test_with_a_group_a_planted_link_is_still_refused_and_its_target_untouched(
        tmp_path: Path, planted: str) -> None:
    host = tmp_path / "host"
    host.mkdir(mode=0o700)
    (host / "passwd").write_bytes(HOST_CONTENT)
    (host / "passwd").chmod(0o600)
    tree = tmp_path / "tree"
    tree.mkdir()
    link = tree / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(host / "passwd" if planted.endswith(".log") else host)

    with pytest.raises(safefs.UnsafePath):
        safefs.append(str(tree), PARTS, b"owned\n", dir_mode=0o2770, file_mode=0o660,
                      group=GROUP)

    assert (host / "passwd").read_bytes() == HOST_CONTENT
    assert mode_and_group(host) == (0o700, 0)
    assert mode_and_group(host / "passwd") == (0o600, 0)


@needs_root
def test_the_monitor_writes_with_the_group(tmp_path: Path) -> None:
    tree = tmp_path / ".pai-logs"
    log_file = TaskLogFile(str(tree), TaskRef("u~j", 0, "main", 0), group=GROUP)
    log_file.append(["hello"])
    assert not log_file.failed
    assert mode_and_group(tree) == (0o2770, GROUP)
    assert mode_and_group(Path(log_file.path)) == (0o660, GROUP)


@needs_root
def test_an_old_tree_is_brought_over_whole_without_following_a_link(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir(mode=0o700)
    (host / "passwd").write_bytes(HOST_CONTENT)
    (host / "passwd").chmod(0o600)
    tree = tmp_path / ".pai-logs"
    logfiles.ensure_tree(str(tree), None)
    for parts in (PARTS, ("job", "1", "main-0.log"), ("other", "0", "worker-3.log")):
        safefs.append(str(tree), parts, b"old\n")
    (tree / "job" / "0" / "planted.log").symlink_to(host / "passwd")
    (tree / "other" / "planted-dir").symlink_to(host)
    assert mode_and_group(tree) == (0o750, 0)

    logfiles.ensure_tree(str(tree), GROUP)

    for folder in (tree, tree / "job", tree / "job" / "0", tree / "job" / "1", tree / "other",
                   tree / "other" / "0"):
        assert mode_and_group(folder) == (0o2770, GROUP), folder
    for log in (PARTS, ("job", "1", "main-0.log"), ("other", "0", "worker-3.log")):
        assert mode_and_group(tree.joinpath(*log)) == (0o660, GROUP), log
    assert mode_and_group(host) == (0o700, 0)
    assert mode_and_group(host / "passwd") == (0o600, 0)


@needs_root
def test_a_tree_of_the_group_is_left_as_it_is(tmp_path: Path) -> None:
    """Once the tree's own folder is the group's, nothing below is walked again:
    a file an operator chose to close stays closed."""
    tree = tmp_path / ".pai-logs"
    logfiles.ensure_tree(str(tree), GROUP)
    safefs.append(str(tree), PARTS, b"x\n", dir_mode=0o2770, file_mode=0o660, group=GROUP)
    (tree / "job" / "0" / "main-0.log").chmod(0o600)

    logfiles.ensure_tree(str(tree), GROUP)
    logfiles.ensure_tree(str(tree), None)  # the setting dropped: nothing taken away

    assert mode_and_group(tree / "job" / "0" / "main-0.log") == (0o600, GROUP)
    assert mode_and_group(tree) == (0o2770, GROUP)


def test_ensure_tree_never_makes_the_trees_parents(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        logfiles.ensure_tree(str(tmp_path / "unmounted" / ".pai-logs"), GROUP)
    assert not (tmp_path / "unmounted").exists()
