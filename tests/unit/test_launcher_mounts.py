"""Which host paths a task's container gets, checked on the node itself."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from services.launcher.mounts import (
    CODE_MOUNT,
    BindMount,
    TaskSetupError,
    host_path,
    plan_storage,
)
from shared.domain.models import JobSpec
from shared.domain.storage import StoragePath


def spec(**dirs: str) -> JobSpec:
    config: dict[str, Any] = {"jobName": "j", "image": "busybox", "taskRoles": [
        {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "command": "true"}]}
    return JobSpec.from_config({**config, **dirs})


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param("", None, id="unset: nothing to mount"),
    pytest.param("hdfs://nn:9000/data", None, id="hdfs: environment only"),
    pytest.param("/nfs/a/data", ("/nfs/a/data", "/nfs"), id="host path under a root"),
    pytest.param("file:///nfs/a/data", ("/nfs/a/data", "/nfs"), id="file URI"),
    pytest.param("/nfs//a/./data/", ("/nfs/a/data", "/nfs"), id="normalized"),
    pytest.param("/nfs", ("/nfs", "/nfs"), id="the root itself"),
])
def test_host_path_accepts(value: str, expected: tuple[str, str] | None) -> None:
    assert host_path("dataDir", value, ["/data", "/nfs"]) == \
        (StoragePath(*expected) if expected else None)


@pytest.mark.parametrize(("value", "message"), [
    pytest.param("/etc", "must be under one of the storage roots", id="outside the roots"),
    pytest.param("/nfsother/x", "must be under one of the storage roots",
                 id="sibling with the root prefix"),
    pytest.param("/nfs/../etc", "must not contain a '..' segment", id="dot-dot"),
    pytest.param("relative/dir", "absolute", id="relative"),
])
def test_host_path_refuses(value: str, message: str) -> None:
    with pytest.raises(TaskSetupError, match=message):
        host_path("dataDir", value, ["/nfs"])


def test_no_roots_configured_is_named() -> None:
    with pytest.raises(TaskSetupError, match="no storage roots are configured on this node"):
        host_path("codeDir", "/nfs/x", [])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    storage = tmp_path / "storage"
    (storage / "bob" / "data").mkdir(parents=True)
    (storage / "bob" / "code").mkdir(parents=True)
    return storage


def test_plan_mounts_data_code_and_output(root: Path) -> None:
    plan = plan_storage(spec(dataDir=f"{root}/bob/data", codeDir=f"{root}/bob/code",
                             outputDir=f"{root}/bob/j/output"), [str(root)], "n1")
    assert plan.mounts == (
        BindMount(f"{root}/bob/data", f"{root}/bob/data", True),
        BindMount(f"{root}/bob/code", f"{root}/bob/code", True),
        BindMount(f"{root}/bob/code", CODE_MOUNT, True),
        BindMount(f"{root}/bob/j/output", f"{root}/bob/j/output", False),
    )
    assert plan.working_dir == CODE_MOUNT
    output = root / "bob" / "j" / "output"
    assert output.is_dir()
    assert stat.S_IMODE(output.stat().st_mode) == 0o777


def test_no_dirs_no_mounts(root: Path) -> None:
    plan = plan_storage(spec(), [str(root)], "n1")
    assert (plan.mounts, plan.working_dir) == ((), None)


def test_hdfs_dirs_are_not_mounted(root: Path) -> None:
    plan = plan_storage(spec(dataDir="hdfs://nn/d", outputDir="hdfs://nn/o"), [str(root)], "n1")
    assert plan.mounts == ()


@pytest.mark.parametrize(("field", "value", "message"), [
    pytest.param("dataDir", "{root}/bob/nothing", "dataDir {root}/bob/nothing does not exist "
                 "on node n1", id="missing dataDir"),
    pytest.param("codeDir", "{root}/bob/nothing", "codeDir {root}/bob/nothing does not exist",
                 id="missing codeDir"),
    pytest.param("dataDir", "/etc", "must be under one of the storage roots",
                 id="dataDir outside roots"),
    pytest.param("dataDir", "{root}/bob/link", "leads outside its storage root",
                 id="symlink out of the root"),
    pytest.param("dataDir", "{root}/bob/inside", "passes through a symbolic link",
                 id="symlink to another folder inside the root"),
    pytest.param("codeDir", "{root}/bob/inside/x", "passes through a symbolic link",
                 id="symlink as a middle component"),
])
def test_plan_refuses(root: Path, field: str, value: str, message: str) -> None:
    os.symlink("/etc", root / "bob" / "link")
    (root / "alice" / "x").mkdir(parents=True)
    os.symlink(root / "alice", root / "bob" / "inside")
    with pytest.raises(TaskSetupError) as caught:
        plan_storage(spec(**{field: value.format(root=root)}), [str(root)], "n1")
    assert message.format(root=root) in str(caught.value)


def test_unmounted_root_is_not_created(tmp_path: Path) -> None:
    root = tmp_path / "not-mounted"
    with pytest.raises(TaskSetupError, match="is not mounted on node n1"):
        plan_storage(spec(outputDir=f"{root}/bob/out"), [str(root)], "n1")
    assert not root.exists()


def test_same_dir_twice_is_mounted_once_writable(root: Path) -> None:
    plan = plan_storage(spec(dataDir=f"{root}/bob/data", outputDir=f"{root}/bob/data"),
                        [str(root)], "n1")
    assert plan.mounts == (BindMount(f"{root}/bob/data", f"{root}/bob/data", False),)


OUTPUT_LINKS = ["bob", "bob/j", "bob/j/output"]


@pytest.mark.parametrize("planted", OUTPUT_LINKS, ids=[f"link at {p}" for p in OUTPUT_LINKS])
def test_output_dir_is_never_created_through_a_link(tmp_path: Path, planted: str) -> None:
    """Threat: a job (or the user's earlier job) plants a symbolic link at a
    component of a later job's outputDir so that the launcher, root on the
    node, creates and chmods 0777 a folder elsewhere (here: a folder of
    alice's, inside the root, which the realpath check alone lets through)."""
    root = tmp_path / "storage"
    victim = root / "alice" / "private"
    victim.mkdir(parents=True)
    os.chmod(victim, 0o700)
    link = root / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim, link)

    with pytest.raises(TaskSetupError, match="passes through a symbolic link"):
        plan_storage(spec(outputDir=f"{root}/bob/j/output"), [str(root)], "n1")

    assert list(victim.iterdir()) == []
    assert stat.S_IMODE(victim.stat().st_mode) == 0o700


@pytest.mark.parametrize("field", ["dataDir", "outputDir"])
def test_no_mount_overlaps_the_platform_log_tree(root: Path, field: str) -> None:
    """Threat: a job (an admin's too) mounts the log tree, or a folder holding
    it, and plants links or forges lines in other jobs' logs."""
    (root / ".pai-logs").mkdir()
    with pytest.raises(TaskSetupError, match="keeps for itself"):
        plan_storage(spec(**{field: str(root)}), [str(root)], "n1",
                     reserved=[f"{root}/.pai-logs"])


@pytest.mark.parametrize("field", ["dataDir", "codeDir", "outputDir"])
def test_a_dir_the_api_left_unmounted_is_never_mounted(root: Path, field: str) -> None:
    """Threat: a path the API passed on unchecked as outside its roots lies
    under a root of this node (configured differently); mounting it would
    skip the per-user checks the API never made."""
    (root / "bob").mkdir(exist_ok=True)
    left = dataclasses.replace(spec(**{field: str(root / "bob")}), unmounted_dirs=(field,))
    plan = plan_storage(left, [str(root)], "n1")
    assert plan.mounts == () and plan.working_dir is None
