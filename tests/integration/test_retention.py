"""Retention on a real Redis and a real log tree: compaction, filed logs, expiry.

Jobs are submitted through the API and finished with the platform's own
steps; their logs are shipped as the monitor ships them (the stream, then the
file, batch by batch). The sweep runs with its clock moved past the delays.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from services.api.app import create_app
from services.monitor.logfile import TaskLogFile
from services.monitor.logs import append_log_entries
from shared.domain.models import Gpu, Node, TaskPlacement
from shared.domain.storage import task_log_parts
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.node.containers import TaskRef
from shared.state import keys, logfiles, retention
from shared.state.lifecycle import mark_task_running, request_stop, set_waiting
from shared.state.placing import commit_placement
from shared.state.store import Store
from shared.state.taskexits import record_task_exit
from tests.support import REPO_ROOT
from tests.support.api import login

pytestmark = pytest.mark.redis

BOUND = 200  # PAI_LOG_MAX_LINES: the stream keeps about this many lines
LATER = 10**9  # ms: a clock past every retention delay but the expiry's
DEADLINE_SECONDS = 60


@pytest.fixture
def settings(redis_server: str, redis_client: redis.Redis, tmp_path: Path) -> Settings:
    return Settings(redis_url=redis_server, storage_roots=(str(tmp_path),),
                    admin_user="root", admin_password="root-password", log_max_lines=BOUND,
                    retention_batch=1000)


@pytest.fixture
def store(redis_client: redis.Redis) -> Store:
    return Store(redis_client)


@pytest.fixture
def client(settings: Settings) -> FlaskClient:
    client = create_app(settings).test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {login(client, 'root', 'root-password')}"
    return client


def submit(client: FlaskClient, name: str, tasks: int = 1) -> str:
    job = {"jobName": name, "image": "busybox", "taskRoles": [
        {"name": "main", "taskNumber": tasks, "cpuNumber": 1, "memoryMB": 128, "gpuNumber": 0,
         "command": "true"}]}
    resp = client.post("/api/v1/jobs", json=job)
    assert resp.status_code == 202, resp.json
    return f"root~{name}"


def ship(store: Store, settings: Settings, job_id: str, first: int, last: int, *,
         index: int = 0, to_file: bool = True) -> None:
    """Lines first..last of main[index], as the monitor ships them: 50 a batch,
    each to the stream, then to the file."""
    ref = TaskRef(job_id, 0, "main", index)
    log_file = TaskLogFile(settings.task_log_dir or "", ref)
    for start in range(first, last + 1, 50):
        batch = [f"line {n} of {job_id}" for n in range(start, min(last, start + 49) + 1)]
        append_log_entries(store.r, ref, batch, BOUND)
        if to_file:
            log_file.append(batch)


def finished(client: FlaskClient, store: Store, settings: Settings, name: str,
             lines: int = 500) -> str:
    job_id = submit(client, name)
    ship(store, settings, job_id, 1, lines)
    request_stop(store, job_id)  # nothing ran: STOPPED at once
    return job_id


def log_url(job_id: str, index: int = 0) -> str:
    user, name = job_id.split("~")
    return f"/api/v1/user/{user}/jobs/{name}/tasks/main/{index}/log"


def text(client: FlaskClient, job_id: str, **query: str) -> str:
    resp = client.get(log_url(job_id), query_string=query)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_data(as_text=True)


def followed(client: FlaskClient, job_id: str, **query: str) -> list[str]:
    """A follow's data lines, and the end event, without ids."""
    body = client.get(log_url(job_id), query_string={"follow": "1", **query}) \
        .get_data(as_text=True)
    events = [e for e in body.split("\n\n") if e and not e.startswith(":")]
    return [next(f for f in e.split("\n") if f.startswith(("data:", "event:")))
            for e in events]


def job_key_names(r: redis.Redis, job_id: str) -> list[str]:
    return sorted(k for k in r.scan_iter(match="pai:*", count=1000) if job_id in k)


def compact_all(store: Store, settings: Settings) -> retention.SweepReport:
    return retention.sweep(store, settings, now=now_ms() + LATER)


# ---------------------------------------------------------------- logs


def test_a_finished_jobs_log_reads_the_same_after_its_stream_left_redis(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    job_id = finished(client, store, settings, "filed", lines=120)
    before = {"tail": text(client, job_id), "tail 7": text(client, job_id, tail="7"),
              "none": text(client, job_id, tail="0"), "follow": followed(client, job_id),
              "follow 3": followed(client, job_id, tail="3")}

    assert compact_all(store, settings).compacted == 1

    assert not store.r.exists(keys.task_log(job_id, 0, "main", 0))
    after = {"tail": text(client, job_id), "tail 7": text(client, job_id, tail="7"),
             "none": text(client, job_id, tail="0"), "follow": followed(client, job_id),
             "follow 3": followed(client, job_id, tail="3")}
    assert after == before
    assert before["follow 3"] == [f"data: line {n} of {job_id}" for n in (118, 119, 120)] + \
        ["event: end"]


def test_a_follow_of_a_filed_log_resumes_after_the_line_it_saw(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    job_id = finished(client, store, settings, "resumed", lines=30)
    compact_all(store, settings)

    body = client.get(log_url(job_id), query_string={"follow": "1", "tail": "5"}).get_data(
        as_text=True)
    assert "id: 0-26\n" in body and "id: 0-30\n" in body

    resumed = client.get(log_url(job_id), query_string={"follow": "1"},
                         headers={"Last-Event-ID": "0-27"}).get_data(as_text=True)
    assert [line for line in resumed.split("\n") if line.startswith("data: line")] == \
        [f"data: line {n} of {job_id}" for n in (28, 29, 30)]


def test_a_live_logs_line_ids_are_its_filed_line_numbers_so_a_resume_crosses_the_move(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    job_id = finished(client, store, settings, "moved", lines=30)

    def ids() -> list[str]:
        body = client.get(log_url(job_id), query_string={"follow": "1", "tail": "5"})
        return [f for f in body.get_data(as_text=True).split("\n") if f.startswith("id: ")]

    live = ids()
    assert live == [f"id: 0-{n}" for n in range(26, 31)]
    compact_all(store, settings)
    assert ids() == live

    resumed = client.get(log_url(job_id), query_string={"follow": "1"},
                         headers={"Last-Event-ID": "0-27"}).get_data(as_text=True)
    assert [line for line in resumed.split("\n") if line.startswith("data: line")] == \
        [f"data: line {n} of {job_id}" for n in (28, 29, 30)]


def test_a_log_whose_file_missed_a_batch_is_made_whole_before_its_stream_goes(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    """The monitor was killed between a batch's two writes: the file lacks it."""
    job_id = submit(client, "gap")
    ship(store, settings, job_id, 1, 100)
    ship(store, settings, job_id, 101, 150, to_file=False)  # lost from the file
    ship(store, settings, job_id, 151, 180)
    request_stop(store, job_id)
    expected = [f"line {n} of {job_id}" for n in range(1, 181)]

    compact_all(store, settings)

    assert text(client, job_id, tail="100000").splitlines() == expected


def run(store: Store, job_id: str) -> None:
    """Place main[0] and start it, as the scheduler and the monitor would."""
    store.register_node(Node(name="n1", ip="127.0.0.1", cpus=8, memory_mb=8192,
                             gpus=[Gpu(index=0)]))
    job = store.get_job(job_id)
    assert job is not None
    assert commit_placement(store, job_id, version=job.version, attempt=0, launch_deadline_ms=0,
                            placements=[TaskPlacement("main", 0, "n1", "127.0.0.1", (), 1, 128,
                                                      {"default": [15000]})])
    assert mark_task_running(store, job_id, 0, "main", 0, "c" * 64)


def test_a_running_job_is_never_touched(client: FlaskClient, store: Store,
                                        settings: Settings) -> None:
    job_id = submit(client, "live")
    run(store, job_id)
    ship(store, settings, job_id, 1, 100)
    store.r.zadd(keys.RETENTION_PENDING, {job_id: 1})  # as if it had finished long ago
    kept = {k: store.r.dump(k) for k in job_key_names(store.r, job_id)}

    report = retention.sweep(store, replace(settings, retention_days=1),
                             now=now_ms() + 400 * retention.DAY_MS)

    assert report == retention.SweepReport(compacted=0, expired=0)
    assert {k: store.r.dump(k) for k in job_key_names(store.r, job_id)} == kept
    assert store.r.zscore(keys.RETENTION_PENDING, job_id) is None  # not final: not pending


def test_a_compacted_job_reads_the_same_through_the_api(client: FlaskClient, store: Store,
                                                        settings: Settings) -> None:
    job_id = finished(client, store, settings, "same", lines=10)
    detail = client.get("/api/v1/user/root/jobs/same").json
    config = client.get("/api/v1/user/root/jobs/same/config").json
    listed = client.get("/api/v1/jobs").json

    compact_all(store, settings)

    assert client.get("/api/v1/user/root/jobs/same/config").json == config
    assert client.get("/api/v1/jobs").json == listed
    assert client.get("/api/v1/user/root/jobs/same").json == detail
    assert job_key_names(store.r, job_id) == [keys.job_archive(job_id)]  # the record in it


def test_a_failed_job_that_waited_keeps_its_record_in_the_archive_and_reads_the_same(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    """A waiting explanation (past Redis's 64-byte compact value) turned the
    record into a hash table: compaction folds what is left into the archive."""
    job_id = submit(client, "waited")
    assert set_waiting(store, job_id, "no node has a free GPU", "{\"reason\": \"" + "x" * 200 +
                       "\"}")
    run(store, job_id)
    record_task_exit(store, job_id, 0, "main", 0, exit_code=3,
                     diagnostics="the program exited with code 3 after a long explanation")
    detail: dict[str, Any] = client.get("/api/v1/user/root/jobs/waited").json or {}
    assert detail["jobStatus"]["state"] == "FAILED" and detail["jobStatus"]["appExitDiagnostics"]
    assert store.r.object("encoding", keys.job(job_id)) == "hashtable"

    compact_all(store, settings)

    assert job_key_names(store.r, job_id) == [keys.job_archive(job_id)]
    status = detail["taskRoles"]["main"]["taskStatuses"][0]
    status["containerId"] = status["containerId"][:12]  # Docker's short id, once compacted
    assert client.get("/api/v1/user/root/jobs/waited").json == detail


LISTINGS = [
    {}, {"withTotalCount": "true"}, {"state": "STOPPED", "withTotalCount": "true"},
    {"state": "WAITING"}, {"username": "root", "limit": "2"},
    {"username": "root", "offset": "2", "limit": "2", "withTotalCount": "true"},
    {"vc": "default", "state": "STOPPED", "offset": "1", "limit": "2"},
    {"keyword": "mix-00", "withTotalCount": "true"}, {"keyword": "mix", "offset": "4"},
    {"username": "nobody"},
]


def test_a_listing_reads_the_same_whichever_of_its_jobs_are_compacted(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    """Filters, paging, totals and order over live, compacted and uncompacted
    finished jobs: the compacted records come from the archives."""
    names = [f"mix-{n:03d}" for n in range(7)]
    for n, name in enumerate(names):
        if n % 3 == 2:
            submit(client, name)  # still waiting
        else:
            finished(client, store, settings, name, lines=1)
    before = [(query, client.get("/api/v1/jobs", query_string=query).json)
              for query in LISTINGS]
    own = client.get("/api/v1/user/root/jobs").json

    for name in names[:4]:  # two compacted, two not, one waiting
        retention.compact_job(store, f"root~{name}", settings.task_log_dir)

    assert [keys.job(f"root~{name}") in job_key_names(store.r, f"root~{name}")
            for name in names] == [False, False, True, False, True, True, True]
    assert [(query, client.get("/api/v1/jobs", query_string=query).json)
            for query in LISTINGS] == before
    assert client.get("/api/v1/user/root/jobs").json == own
    assert len(before[2][1]["data"]) == before[2][1]["totalCount"] == 5  # not a vacuous page


def test_the_name_of_a_compacted_job_stays_taken_until_it_is_deleted(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    """Its record is no longer a hash of its own: a submit must not take the
    name over (a second record beside the first, the first one's archive
    read as the new job's)."""
    job_id = finished(client, store, settings, "taken", lines=1)
    compact_all(store, settings)
    kept = store.r.dump(keys.job_archive(job_id))
    job = {"jobName": "taken", "image": "busybox", "taskRoles": [
        {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128, "gpuNumber": 0,
         "command": "true"}]}

    assert client.post("/api/v1/jobs", json=job).status_code == 409

    assert job_key_names(store.r, job_id) == [keys.job_archive(job_id)]
    assert store.r.dump(keys.job_archive(job_id)) == kept
    assert client.delete("/api/v1/user/root/jobs/taken").status_code == 200
    assert client.post("/api/v1/jobs", json=job).status_code == 202


def test_a_job_compacted_with_its_record_beside_the_archive_reads_the_same_and_is_folded(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    """Jobs compacted before the record moved into the archive (a version 1
    archive and a record hash): read as they are, then folded by the sweep."""
    job_id = finished(client, store, settings, "earlier", lines=3)
    compact_all(store, settings)
    archive = store.read_archive(store.r, job_id)
    assert archive is not None and archive.record is not None
    pipe = store.r.pipeline()
    pipe.set(keys.job_archive(job_id), replace(archive, record=None).encode())
    pipe.hset(keys.job(job_id), mapping=archive.record)
    pipe.execute()
    detail = client.get("/api/v1/user/root/jobs/earlier").json
    listed = client.get("/api/v1/jobs", query_string={"state": "STOPPED"}).json
    log = text(client, job_id)

    report = compact_all(store, settings)

    assert (report.enrolled, report.compacted) == (1, 1)
    assert job_key_names(store.r, job_id) == [keys.job_archive(job_id)]
    assert store.read_archive(store.r, job_id) == archive
    assert client.get("/api/v1/user/root/jobs/earlier").json == detail
    assert client.get("/api/v1/jobs", query_string={"state": "STOPPED"}).json == listed
    assert text(client, job_id) == log
    assert compact_all(store, settings) == retention.SweepReport()  # nothing more to do


# ---------------------------------------------------------------- expiry and delete


def test_an_expired_job_loses_every_key_index_entry_and_log_file(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    old = finished(client, store, settings, "old")
    compact_all(store, settings)
    log_dir = settings.task_log_dir or ""
    assert os.path.isdir(os.path.join(log_dir, old))
    old_job = store.get_job(old)
    assert old_job is not None and old_job.completed_ms is not None
    cutoff_ms = old_job.completed_ms + 1  # "old" finished before it, "young" after
    deadline = time.monotonic() + DEADLINE_SECONDS
    while now_ms() <= cutoff_ms:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    young = finished(client, store, settings, "young")
    days = 30

    report = retention.sweep(store, replace(settings, retention_days=days),
                             now=cutoff_ms + days * retention.DAY_MS)

    assert report.expired == 1
    assert job_key_names(store.r, old) == []
    for index in (keys.JOBS, keys.user_jobs("root"), keys.vc_jobs("default"),
                  keys.state_jobs("STOPPED"), keys.RETENTION_PENDING):
        assert store.r.zscore(index, old) is None
    assert not os.path.exists(os.path.join(log_dir, old))
    assert store.get_job(young) is not None
    assert client.get("/api/v1/user/root/jobs/old").status_code == 404


def test_a_deleted_compacted_job_leaves_no_key_and_its_name_starts_afresh(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    job_id = finished(client, store, settings, "again")
    compact_all(store, settings)
    store.append_log(job_id, 0, "main", 0, ["a line shipped late"], BOUND)

    assert client.delete("/api/v1/user/root/jobs/again").status_code == 200

    assert job_key_names(store.r, job_id) == []
    assert store.r.zscore(keys.JOBS, job_id) is None
    submit(client, "again")
    assert logfiles.tail(settings.task_log_dir or "", task_log_parts(job_id, 0, "main", 0),
                         10) == []


# ---------------------------------------------------------------- kill -9


SWEEP = """
import sys
from shared.state import retention
from shared.infra.config import Settings
from shared.infra.clock import now_ms
from shared.state.store import Store
settings = Settings(redis_url=sys.argv[1], storage_roots=(sys.argv[2],), retention_batch=1)
store = Store.from_url(settings.redis_url)
for _ in range(100_000):
    retention.sweep(store, settings, now=now_ms() + 10**9)
"""


def test_a_sweep_killed_half_way_then_run_again_converges(
        client: FlaskClient, store: Store, settings: Settings, redis_server: str,
        tmp_path: Path) -> None:
    jobs = [finished(client, store, settings, f"kill-{n:03d}", lines=300) for n in range(60)]
    pending = store.r.zcard(keys.RETENTION_PENDING)
    proc = subprocess.Popen([sys.executable, "-c", SWEEP, redis_server, str(tmp_path)],
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while store.r.zcard(keys.RETENTION_PENDING) > pending // 2:
            assert time.monotonic() < deadline, "the sweep made no progress"
            assert proc.poll() is None, "the sweep process died"
            time.sleep(0.01)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert store.r.zcard(keys.RETENTION_PENDING) > 0, "killed too late to prove anything"

    for _ in range(10):
        if not store.r.zcard(keys.RETENTION_PENDING):
            break
        compact_all(store, settings)

    assert store.r.zcard(keys.RETENTION_PENDING) == 0
    for job_id in jobs:
        assert job_key_names(store.r, job_id) == [keys.job_archive(job_id)]
        assert text(client, job_id, tail="100000").splitlines() == \
            [f"line {n} of {job_id}" for n in range(1, 301)]


def test_a_sweep_that_died_after_filing_a_log_files_it_once(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    """The first half of a compaction (the file made whole) ran, the second did not."""
    job_id = submit(client, "half")
    ship(store, settings, job_id, 1, 100, to_file=False)
    request_stop(store, job_id)
    lines = [line for _id, line in store.read_log(job_id, 0, "main", 0)]
    logfiles.make_whole(settings.task_log_dir or "", job_id, 0, "main", 0, lines, 100)

    compact_all(store, settings)

    assert text(client, job_id, tail="100000").splitlines() == \
        [f"line {n} of {job_id}" for n in range(1, 101)]


# ---------------------------------------------------------------- the cap


def test_a_task_log_file_stops_at_its_cap_with_one_marker_line(tmp_path: Path) -> None:
    ref = TaskRef("root~big", 0, "main", 0)
    log_file = TaskLogFile(str(tmp_path / "logs"), ref, max_bytes=1000)
    for batch in range(20):
        log_file.append([f"batch {batch} line {n:02d}" for n in range(10)])
    TaskLogFile(str(tmp_path / "logs"), ref, max_bytes=1000).append(["after a restart"])

    path = tmp_path / "logs" / "root~big" / "0" / "main-0.log"
    content = path.read_text().splitlines()
    assert content[-1] == logfiles.cut_marker(1000)
    assert sum(len(line) + 1 for line in content[:-1]) <= 1000
    assert content[:-1] == [f"batch {b} line {n:02d}" for b in range(20)
                            for n in range(10)][:len(content) - 1]
    assert logfiles.count_lines(str(tmp_path / "logs"), ("root~big", "0", "main-0.log")) == \
        (len(content), True)


def test_the_api_exports_redis_memory_used_and_its_maximum(client: FlaskClient,
                                                           settings: Settings) -> None:
    body = client.get("/metrics").get_data(as_text=True)
    values = {line.split()[0]: float(line.split()[1]) for line in body.splitlines()
              if line.startswith("pai_redis_memory")}

    assert values["pai_redis_memory_used_bytes"] > 0
    assert values["pai_redis_memory_max_bytes"] == settings.redis_maxmemory_bytes


def test_a_job_that_finished_before_the_sweep_existed_is_found_and_compacted(
        client: FlaskClient, store: Store, settings: Settings) -> None:
    job_id = finished(client, store, settings, "older")
    store.r.zrem(keys.RETENTION_PENDING, job_id)  # as an earlier version left it

    report = compact_all(store, settings)

    assert (report.enrolled, report.compacted) == (1, 1)
    assert job_key_names(store.r, job_id) == [keys.job_archive(job_id)]


def test_a_link_planted_where_a_filed_log_lies_is_never_followed(
        client: FlaskClient, store: Store, settings: Settings, tmp_path: Path) -> None:
    """Threat: a link in the log tree (planted by whoever can write the shared
    storage) makes the API, which serves finished jobs' logs from files, send
    a host file to a user. The walk follows no link: the read fails, clearly."""
    job_id = finished(client, store, settings, "planted", lines=5)
    compact_all(store, settings)
    secret = tmp_path / "host-secret"
    secret.write_text("the host's secret\n")
    path = Path(settings.task_log_dir or "", *task_log_parts(job_id, 0, "main", 0))
    path.unlink()
    path.symlink_to(secret)

    for query in ({}, {"follow": "1"}):
        resp = client.get(log_url(job_id), query_string=query)
        assert resp.status_code == 503
        assert "secret" not in resp.get_data(as_text=True)
