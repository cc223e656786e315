"""The log tree is shared with the unprivileged api and scheduler (PAI_LOG_GROUP).

The node agent writes the tree as root; the api and the scheduler run as
uid 10001 (the image's user pai) in Compose and Kubernetes. These tests run
as root and play both sides: root ships a job's log as the monitor does,
then a process running as uid/gid 10001 runs the real retention sweep
(which files logs into the tree) and reads the filed log as the API does.
With the group the unprivileged side files and reads; without it, it cannot
(the logs stay in Redis), which is what the setting is for.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from services.api.app import create_app
from services.monitor.logfile import TaskLogFile
from services.monitor.logs import append_log_entries
from shared.domain.storage import task_log_parts
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.node.containers import TaskRef
from shared.state import keys, logfiles, retention
from shared.state.lifecycle import request_stop
from shared.state.store import Store
from tests.support.api import login

pytestmark = [pytest.mark.redis,
              pytest.mark.skipif(os.geteuid() != 0, reason="plays root and uid 10001")]

PAI = 10001  # the image's user and group pai (Dockerfile)
BOUND = 200

@pytest.fixture
def storage_root() -> Iterator[Path]:
    """A storage root uid 10001 may pass through (pytest's own folders are root's only)."""
    root = Path(tempfile.mkdtemp(prefix="pai-logtree-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root)


def settings_for(redis_server: str, root: Path, group: int | None) -> Settings:
    return Settings(redis_url=redis_server, storage_roots=(str(root),), admin_user="root",
                    admin_password="root-password", log_max_lines=BOUND, log_group=group)


def finished_job(settings: Settings, store: Store, name: str, *, to_file: bool) -> str:
    """A job whose main[0] shipped 60 lines (to its file too when `to_file`), then stopped."""
    client: FlaskClient = create_app(settings).test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {login(client, 'root', 'root-password')}"
    resp = client.post("/api/v1/jobs", json={"jobName": name, "image": "busybox", "taskRoles": [
        {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128, "gpuNumber": 0,
         "command": "true"}]})
    assert resp.status_code == 202, resp.json
    job_id = f"root~{name}"
    ref = TaskRef(job_id, 0, "main", 0)
    log_file = TaskLogFile(settings.task_log_dir or "", ref, group=settings.log_group)
    for start in (1, 31):
        batch = [f"line {n} of {job_id}" for n in range(start, start + 30)]
        append_log_entries(store.r, ref, batch, BOUND)
        if to_file:
            log_file.append(batch)
    assert not log_file.failed
    request_stop(store, job_id)  # nothing ran: STOPPED at once
    return job_id


def as_pai(redis_server: str, root: Path, group: int | None, job_id: str, *,
           remove: bool = False) -> dict[str, Any]:
    """In a forked child running as uid/gid 10001 with no other group (the
    interpreter lives under /root, out of its reach, so no new process): the
    scheduler's retention sweep, then the API's read of the filed log, and
    with `remove` the API's removal of the job's logs (a user's delete)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(PAI, PAI, PAI)
            os.setresuid(PAI, PAI, PAI)
            settings = Settings(redis_url=redis_server, storage_roots=(str(root),),
                                log_group=group)
            report = retention.sweep(Store.from_url(redis_server), settings,
                                     now=now_ms() + 10**9)
            try:
                lines = logfiles.tail(settings.task_log_dir or "",
                                      task_log_parts(job_id, 0, "main", 0), 3)
                read = "ok"
            except PermissionError:
                lines, read = [], "denied"
            removed = logfiles.remove_job_logs(settings.task_log_dir or "", job_id) \
                if remove else False
            os.write(write_end, json.dumps({"compacted": report.compacted, "read": read,
                                            "lines": lines, "removed": removed}).encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        raw = reader.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the unprivileged side failed"
    result: dict[str, Any] = json.loads(raw)
    return result


def mode_and_group(path: Path) -> tuple[int, int]:
    info = path.stat()
    return stat.S_IMODE(info.st_mode), info.st_gid


def test_with_the_group_the_unprivileged_sweep_files_and_reads_the_logs_root_wrote(
        redis_server: str, redis_client: redis.Redis, storage_root: Path) -> None:
    settings = settings_for(redis_server, storage_root, PAI)
    store = Store(redis_client)
    written = finished_job(settings, store, "by-root", to_file=True)
    tree = Path(settings.task_log_dir or "")
    root_file = tree.joinpath(*task_log_parts(written, 0, "main", 0))
    assert root_file.stat().st_uid == 0
    assert mode_and_group(root_file) == (0o660, PAI)
    assert mode_and_group(tree) == (0o2770, PAI)
    assert mode_and_group(root_file.parent) == (0o2770, PAI)

    result = as_pai(redis_server, storage_root, PAI, written, remove=True)

    assert result["read"] == "ok"
    assert result["lines"] == [f"line {n} of {written}" for n in (58, 59, 60)]
    assert result["compacted"] == 1
    assert not redis_client.exists(keys.task_log(written, 0, "main", 0))  # filed: out of Redis
    assert result["removed"] and not (tree / written).exists()  # a user's delete, by the API


def test_with_the_group_the_unprivileged_sweep_files_a_new_log_in_the_tree(
        redis_server: str, redis_client: redis.Redis, storage_root: Path) -> None:
    """The monitor's file write failed: the sweep (uid 10001) writes it whole
    from the stream, in a job folder root made, and what it makes keeps the group."""
    settings = settings_for(redis_server, storage_root, PAI)
    store = Store(redis_client)
    finished_job(settings, store, "other", to_file=True)  # the tree exists, root's
    missing = finished_job(settings, store, "lost-file", to_file=False)

    result = as_pai(redis_server, storage_root, PAI, missing)

    assert result["read"] == "ok"
    assert result["lines"] == [f"line {n} of {missing}" for n in (58, 59, 60)]
    assert not redis_client.exists(keys.task_log(missing, 0, "main", 0))
    made = Path(settings.task_log_dir or "").joinpath(*task_log_parts(missing, 0, "main", 0))
    assert made.stat().st_uid == PAI
    assert mode_and_group(made) == (0o660, PAI)
    assert mode_and_group(made.parent) == (0o2770, PAI)
    assert mode_and_group(made.parent.parent) == (0o2770, PAI)


def test_without_the_group_the_unprivileged_side_can_neither_read_nor_file(
        redis_server: str, redis_client: redis.Redis, storage_root: Path) -> None:
    settings = settings_for(redis_server, storage_root, None)
    store = Store(redis_client)
    written = finished_job(settings, store, "root-only", to_file=True)
    missing = finished_job(settings, store, "root-only-lost", to_file=False)
    tree = Path(settings.task_log_dir or "")
    assert mode_and_group(tree) == (0o750, 0)

    result = as_pai(redis_server, storage_root, None, written)

    assert result["read"] == "denied"
    for job_id in (written, missing):  # nothing filed: the logs stay in Redis
        assert redis_client.exists(keys.task_log(job_id, 0, "main", 0))
    assert not tree.joinpath(*task_log_parts(missing, 0, "main", 0)).exists()


def test_a_tree_an_earlier_version_made_is_brought_over_to_the_group(
        redis_server: str, redis_client: redis.Redis, storage_root: Path) -> None:
    """Upgrading: the tree is root's (0750/0640); the node agent's next write,
    with the setting, gives the whole tree to the group, so the sweep and
    the API read the old files too."""
    store = Store(redis_client)
    old = finished_job(settings_for(redis_server, storage_root, None), store, "old",
                       to_file=True)
    settings = settings_for(redis_server, storage_root, PAI)
    finished_job(settings, store, "new", to_file=True)  # root, now with the group
    tree = Path(settings.task_log_dir or "")
    old_file = tree.joinpath(*task_log_parts(old, 0, "main", 0))
    assert mode_and_group(old_file) == (0o660, PAI)
    assert mode_and_group(old_file.parent) == (0o2770, PAI)

    result = as_pai(redis_server, storage_root, PAI, old)

    assert result["read"] == "ok"
    assert result["lines"] == [f"line {n} of {old}" for n in (58, 59, 60)]
