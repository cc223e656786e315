"""Jobs that attack the node's file system and other users' storage, run on the
real Docker engine and Redis: the launcher mounts and creates their folders,
the monitor ships their logs, and the host files they aim at stay untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from services.api.app import create_app
from services.launcher.service import EXIT_SETUP_FAILED
from services.monitor.logs import LogShipping
from shared.domain.states import TaskState
from shared.node.containers import TaskRef
from shared.state import keys
from shared.state.taskexits import record_task_exit
from tests.support.api import AuthedClient, new_user, signed_in
from tests.support.launcher_rig import USER, WAIT_SECONDS, Rig
from tests.support.launcher_rig import rig as rig  # the fixture

pytestmark = [pytest.mark.docker, pytest.mark.redis]

HOST_CONTENT = b"root:x:0:0:root:/root:/bin/sh\n"
BB = "/bin/busybox"


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    """A file outside every storage root, standing for /etc/passwd on the node."""
    target = tmp_path / "host-etc" / "passwd"
    target.parent.mkdir()
    target.write_bytes(HOST_CONTENT)
    return target


def _untouched(host_file: Path) -> None:
    assert host_file.read_bytes() == HOST_CONTENT
    assert [p.name for p in host_file.parent.iterdir()] == ["passwd"]


def _run(rig: Rig, config: dict[str, Any]) -> tuple[Any, Any]:
    job = rig.submit(config)
    rig.launcher.start_task(job.id, 0, "main", 0)
    container = rig.container(job)
    assert container is not None, rig.task(job).diagnostics
    assert container.wait(timeout=WAIT_SECONDS)["StatusCode"] == 0, container.logs()
    return job, container


PLANTS = {
    "logs": f'{BB} ln -s {{dir}} "$PAI_OUTPUT_DIR/logs"',
    "logs/0": f'{BB} mkdir -p "$PAI_OUTPUT_DIR/logs" && {BB} ln -s {{dir}} '
              f'"$PAI_OUTPUT_DIR/logs/0"',
    "logs/0/main-0.log": f'{BB} mkdir -p "$PAI_OUTPUT_DIR/logs/0" && {BB} ln -s {{file}} '
                         f'"$PAI_OUTPUT_DIR/logs/0/main-0.log"',
}


@pytest.mark.parametrize("planted", list(PLANTS), ids=[f"link at {p}" for p in PLANTS])
def test_a_job_cannot_make_the_monitor_write_a_host_file(rig: Rig, host_file: Path,
                                                         planted: str) -> None:
    """Threat: a job plants a symbolic link where its log file used to be
    written (`<outputDir>/logs`, the attempt folder, the file) so that the
    monitor, root on the node, appends the job's output to a host file.
    Logs now go to the platform's own tree, which no container mounts."""
    plant = PLANTS[planted].format(dir=host_file.parent, file=host_file)
    job, container = _run(rig, rig.config(
        f"{plant} && {BB} echo 'evil::0:0::/:/bin/sh' && {BB} seq 1 20"))
    ref = TaskRef(job.id, 0, "main", 0)
    shipping = LogShipping(rig.store, 1000, log_dir=rig.settings.task_log_dir)
    try:
        assert shipping.drain(container, ref, WAIT_SECONDS)
    finally:
        shipping.close()

    _untouched(host_file)
    assert rig.settings.task_log_dir is not None
    full = Path(rig.settings.task_log_dir, ref.job_id, "0", "main-0.log")
    assert full.read_text().splitlines() == ["evil::0:0::/:/bin/sh",
                                             *[str(n) for n in range(1, 21)]]


@pytest.mark.parametrize("aim", ["host", "another user"])
def test_a_job_cannot_plant_a_link_for_its_users_next_output_dir(
        rig: Rig, host_file: Path, aim: str) -> None:
    """Threat: a job whose outputDir is the user's whole folder plants a link
    where the next job's outputDir will be made, so that the launcher (root)
    creates it, chmod 0777, in a host folder or in another user's folder
    (which a realpath check alone lets through: it stays in the root) and
    mounts it writable."""
    own = rig.storage / USER
    victim = rig.storage / "bob" if aim == "another user" else host_file.parent
    victim.mkdir(exist_ok=True)
    before = sorted(p.name for p in victim.iterdir())
    first, _ = _run(rig, rig.config(f'{BB} ln -s {victim} "$PAI_OUTPUT_DIR/next"',
                                    outputDir=str(own)))
    assert (own / "next").is_symlink()
    record_task_exit(rig.store, first.id, 0, "main", 0, exit_code=0)
    rig.store.r.delete(keys.node_alloc(rig.node.name))  # as the scheduler frees them

    job = rig.submit(rig.config("true", jobName="next"))  # outputDir <own>/next/output
    rig.launcher.start_task(job.id, 0, "main", 0)

    task = rig.task(job)
    assert (task.state, task.exit_code) == (TaskState.FAILED, EXIT_SETUP_FAILED)
    assert "symbolic link" in task.diagnostics
    assert rig.containers_of(job) == []
    assert sorted(p.name for p in victim.iterdir()) == before
    _untouched(host_file)


def test_the_launcher_never_mounts_the_log_tree(rig: Rig) -> None:
    """Threat: a job (an admin's, which the API lets name any folder) mounts the
    storage root holding the platform's log tree and rewrites other jobs' logs.
    The API refuses it; the launcher, on its own, refuses it too."""
    job = rig.submit(rig.config("true", outputDir=str(rig.storage)))
    rig.launcher.start_task(job.id, 0, "main", 0)
    task = rig.task(job)
    assert (task.state, task.exit_code) == (TaskState.FAILED, EXIT_SETUP_FAILED)
    assert "keeps for itself" in task.diagnostics
    assert rig.containers_of(job) == []


# ---------------------------------------------------------------- shares


@pytest.fixture
def api(rig: Rig) -> Iterator[FlaskClient]:
    """The API on the launcher's Redis and storage root, so that what it
    accepts is what the launcher then mounts."""
    settings = replace(rig.settings, admin_user="root", admin_password="root-password")
    yield create_app(settings).test_client()


def test_shared_data_is_accepted_and_mounted_read_only(rig: Rig, api: FlaskClient) -> None:
    """A folder an admin shared with the user's VC: the API accepts it as
    dataDir and the container sees it read-only (a write fails)."""
    admin = signed_in(api, "root")
    user: AuthedClient = new_user(api, admin, USER)
    shared = rig.storage / "datasets" / "mnist"
    shared.mkdir(parents=True)
    (shared / "train.csv").write_text("1,2\n")
    assert admin.put("/api/v1/virtual-clusters/vision", json={"gpuQuota": None}).status_code \
        == 201
    assert admin.put(f"/api/v1/user/{USER}/virtualClusters",
                     json={"virtualClusters": ["default", "vision"]}).status_code == 200
    assert admin.put("/api/v1/storage/shares/mnist", json={
        "path": str(shared), "virtualClusters": ["vision"]}).status_code == 201

    wanted = rig.config(
        f'{BB} cat $PAI_DATA_DIR/train.csv > "$PAI_OUTPUT_DIR/seen"; '
        f'{BB} touch $PAI_DATA_DIR/forged 2>/dev/null && {BB} echo yes > "$PAI_OUTPUT_DIR/wrote"; '
        f'true', dataDir=str(shared))
    accepted = user.post(f"/api/v1/user/{USER}/jobs?dryRun=true", json=wanted)
    assert accepted.status_code == 200, accepted.json
    job, container = _run(rig, accepted.json["config"])

    mounts = {m["Destination"]: m["RW"] for m in container.attrs["Mounts"]}
    assert mounts[str(shared)] is False
    output = rig.storage / USER / job.name / "output"
    assert (output / "seen").read_text() == "1,2\n"
    assert not (output / "wrote").exists()
    assert sorted(p.name for p in shared.iterdir()) == ["train.csv"]
