"""`GET /api/v1/jobs` with 100,000 stored jobs: how long does a page take?

The jobs are stored with the platform's own writers (`submit_job`, then
`Store.bump` + `Store.write_job` for a mix of states), so every index the list
reads is what the services would have left. Each case is timed through
Flask's test client (token check, Redis reads, JSON rows) and set beside a
bare ZREVRANGE of the same page of the index it starts from, measured in the
same run: the ratio is what the API adds on top of Redis's own range.
Lists other than one index's range (two filters, a keyword, a sort by
another field) come from the API process's job table
(shared/state/jobtable.py): its load, on a process's first such list, is
timed on its own, and its feed of changes is weighed in Redis.

PAI_BENCH_JOBS overrides the number of jobs (a quick look: 10000; the
issue's scale: 1000000, about 8 GB of Redis and half an hour to fill).
"""

from __future__ import annotations

import os
import platform
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis
from flask.testing import FlaskClient

from bench import BenchError, Figure, Figures, percentile, throwaway_redis, time_calls
from services.api.app import create_app
from shared.domain.jobspec import validate_job_config
from shared.domain.states import JobState
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.state import keys
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.lifecycle import submit_job
from shared.state.store import Store

JOBS = 100_000
USERS = 100
VCS = ("default", "vision", "speech", "nlp", "rl")
MODELS = ("mnist", "resnet", "bert", "gpt", "yolo")
# Most of a busy cluster's history has ended; a few jobs are still live.
STATE_MIX = ((JobState.WAITING, 5), (JobState.RUNNING, 5), (JobState.STOPPED, 10),
             (JobState.FAILED, 20), (JobState.SUCCEEDED, 60))
REQUESTS = 50
PAGE = 50  # the API's default limit
FILL_BATCH = 500
SEED = 20240501
ADMIN, ADMIN_PASSWORD = "bench-admin", "bench-admin-password"


@dataclass(frozen=True)
class StoredJob:
    index: int
    username: str
    vc: str
    name: str
    state: JobState


def planned_job(index: int) -> StoredJob:
    """Job number `index`, the same in every run and every fill worker."""
    rng = random.Random(SEED * 1_000_003 + index)
    state = rng.choices([s for s, _ in STATE_MIX], [w for _, w in STATE_MIX])[0]
    return StoredJob(index, f"user{rng.randrange(USERS):03d}", rng.choice(VCS),
                     f"{rng.choice(MODELS)}-{index:06d}", state)


def _base_config() -> dict[str, Any]:
    raw = {"jobName": "placeholder", "image": "busybox",
           "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1,
                          "memoryMB": 256, "gpuNumber": 1, "command": "python train.py"}]}
    return validate_job_config(raw, username="user000", storage_roots=()).config


def fill_range(url: str, start: int, stop: int) -> int:
    """Submit jobs start..stop-1, then move each to its planned state.

    Submission is one `submit_job` transaction per job, as the API does it;
    the state moves go through `Store.bump` (the legal-move table) and
    `Store.write_job` (record and per-state index), batched in pipelines.
    """
    store = Store.from_url(url)
    base = _base_config()
    for batch_start in range(start, stop, FILL_BATCH):
        pipe = store.r.pipeline(transaction=False)
        for index in range(batch_start, min(stop, batch_start + FILL_BATCH)):
            plan = planned_job(index)
            job = submit_job(store, plan.username,
                             {**base, "jobName": plan.name, "virtualCluster": plan.vc})
            if plan.state == JobState.WAITING:
                continue
            previous = store.bump(job, plan.state)
            if plan.state.is_final:
                job.completed_ms = now_ms()
                job.exit_code = 0 if plan.state == JobState.SUCCEEDED else 1
            if plan.state == JobState.STOPPED:
                job.execution_type = "STOP"
            pipe.zrem(keys.QUEUE, job.id)
            store.write_job(pipe, job, previous)
        pipe.execute()
    store.r.close()
    return stop - start


def fill(url: str, jobs: int, workers: int) -> float:
    """Store `jobs` jobs with `workers` processes; the seconds it took."""
    accounts = Accounts(Store.from_url(url))
    for vc in VCS:
        accounts.put_vc(VirtualCluster(vc, None, f"benchmark VC {vc}"))
    step = -(-jobs // workers)
    ranges = [(i, min(jobs, i + step)) for i in range(0, jobs, step)]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        stored = sum(pool.map(fill_range, [url] * len(ranges), *zip(*ranges, strict=True)))
    if stored != jobs or accounts.r.zcard(keys.JOBS) != jobs:
        raise BenchError(f"meant to store {jobs} jobs, the index holds "
                         f"{accounts.r.zcard(keys.JOBS)}")
    return time.perf_counter() - start


@dataclass(frozen=True)
class Case:
    label: str
    query: str
    index: str  # the index the list starts from, for the bare ZREVRANGE reference
    offset: int = 0


def cases(jobs: int) -> list[Case]:
    user = planned_job(jobs // 2).username
    rare = planned_job(jobs // 3).name.partition("-")[2]
    return [
        Case("first page", "", keys.JOBS),
        Case(f"deep page (offset {jobs // 2})", f"offset={jobs // 2}", keys.JOBS, jobs // 2),
        Case("withTotalCount", "withTotalCount=true", keys.JOBS),
        Case("username", f"username={user}", keys.user_jobs(user)),
        Case("username+state RUNNING", f"username={user}&state=RUNNING",
             keys.user_jobs(user)),
        Case("vc+state WAITING", "vc=speech&state=WAITING", keys.state_jobs("WAITING")),
        Case("keyword (1 in 5 match)", "keyword=bert", keys.JOBS),
        Case("keyword (1 match)", f"keyword={rare}", keys.JOBS),
        Case("keyword+withTotalCount", "keyword=bert&withTotalCount=true", keys.JOBS),
        # Sorted by another field than submit time: the API process's job table
        # (shared/state/jobtable.py), every row of the filtered set ranked.
        Case("sort=name", "sort=name", keys.JOBS),
        Case(f"sort=name&order=asc (offset {jobs // 2})",
             f"sort=name&order=asc&offset={jobs // 2}", keys.JOBS, jobs // 2),
        Case("sort=gpus (a field of every job)", "sort=gpus", keys.JOBS),
        Case("sort=gpus&order=asc", "sort=gpus&order=asc", keys.JOBS),
        Case("sort=completedTime", "sort=completedTime", keys.JOBS),
        Case("sort=duration", "sort=duration", keys.JOBS),
        Case("sort=state&order=asc", "sort=state&order=asc", keys.JOBS),
        Case("vc=speech&sort=state", "vc=speech&sort=state", keys.vc_jobs("speech")),
        Case("state=SUCCEEDED&sort=completedTime", "state=SUCCEEDED&sort=completedTime",
             keys.state_jobs("SUCCEEDED")),
        Case("vc=nlp&state=RUNNING&sort=gpus&order=asc",
             "vc=nlp&state=RUNNING&sort=gpus&order=asc", keys.state_jobs("RUNNING")),
        Case("username&sort=duration", f"username={user}&sort=duration",
             keys.user_jobs(user)),
        Case("username&vc=vision&sort=name", f"username={user}&vc=vision&sort=name",
             keys.user_jobs(user)),
        Case("keyword (1 in 5)&sort=completedTime", "keyword=bert&sort=completedTime",
             keys.JOBS),
    ]


SORTED_SET = "bench:sort:name"  # the alternative: a sorted set per sortable field


def sorted_set_alternative(url: str) -> dict[str, Figure]:
    """What a sorted set kept per sortable field would give for `sort=name`:
    one ZADD per job (all scores 0, members `name\0id`, so ZRANGE is by name),
    a page by rank, and the memory it costs. Filters would need a ZINTERSTORE
    of the whole set with each filter's index per request; not measured."""
    client = redis.Redis.from_url(url, decode_responses=True)
    ids = [str(i) for i in client.zrange(keys.JOBS, 0, -1)]
    start = time.perf_counter()
    for at in range(0, len(ids), FILL_BATCH):
        pipe = client.pipeline(transaction=False)
        pipe.zadd(SORTED_SET, {f"{i.partition('~')[2].casefold()}\0{i}": 0
                               for i in ids[at:at + FILL_BATCH]})
        pipe.execute()
    build = time.perf_counter() - start
    middle = len(ids) // 2

    def page() -> object:
        members = [str(m) for m in client.zrange(SORTED_SET, middle, middle + PAGE - 1)]
        pipe = client.pipeline(transaction=False)
        for member in members:
            pipe.hgetall(keys.job(member.partition("\0")[2]))
        return pipe.execute()
    times = time_calls(page, REQUESTS)
    used = int(client.memory_usage(SORTED_SET) or 0)
    client.delete(SORTED_SET)
    client.close()
    return {"requests": len(times), "rows": PAGE, "p50 ms": percentile(times, 0.5),
            "p99 ms": percentile(times, 0.99), "build s": build, "memory MB": used / 1e6}


def _api_call(client: FlaskClient, headers: dict[str, str], path: str) -> Callable[[], int]:
    def call() -> int:
        resp = client.get(path, headers=headers)
        if resp.status_code != 200:
            raise BenchError(f"GET {path} answered {resp.status_code}: {resp.get_data()!r}")
        body = resp.json
        return len(body["data"] if isinstance(body, dict) else body or [])
    return call


def _bare_range(bare: redis.Redis, case: Case) -> Callable[[], object]:
    """The reference: the same page of the case's starting index, straight from Redis."""
    def call() -> object:
        return bare.zrevrange(case.index, case.offset, case.offset + PAGE - 1)
    return call


def _row(api: Sequence[float], bare: Sequence[float], rows: int) -> dict[str, Figure]:
    p50, bare_p50 = percentile(api, 0.5), percentile(bare, 0.5)
    return {"requests": len(api), "rows": rows, "p50 ms": p50, "p99 ms": percentile(api, 0.99),
            "ZREVRANGE p50 ms": bare_p50, "ratio p50": p50 / bare_p50}


def measure(url: str, jobs: int) -> dict[str, dict[str, Figure]]:
    settings = Settings(redis_url=url, admin_user=ADMIN, admin_password=ADMIN_PASSWORD)
    client = create_app(settings).test_client()
    login = client.post("/api/v1/token", json={"username": ADMIN, "password": ADMIN_PASSWORD})
    headers = {"Authorization": f"Bearer {login.json['token']}"}  # type: ignore[index]
    bare = redis.Redis.from_url(url, decode_responses=True)
    table: dict[str, dict[str, Figure]] = {}
    # A new API process loads its job table on its first sorted list.
    start = time.perf_counter()
    _api_call(client, headers, "/api/v1/jobs?sort=gpus")()
    table["job table load (first sorted list of a process)"] = {
        "requests": 1, "rows": int(bare.zcard(keys.JOBS)),
        "p50 ms": (time.perf_counter() - start) * 1000}
    for case in cases(jobs):
        call = _api_call(client, headers, f"/api/v1/jobs?{case.query}")
        api = time_calls(call, REQUESTS)
        reference = time_calls(_bare_range(bare, case), REQUESTS)
        table[case.label] = _row(api, reference, call())
    table["alternative: sorted set by name, a page by rank + HGETALLs (Redis only)"] = \
        sorted_set_alternative(url)
    table["the feed of changes (shared/state/jobfeed.py), Redis"] = {
        "entries": int(bare.xlen(keys.JOB_CHANGES)),
        "memory MB": int(bare.memory_usage(keys.JOB_CHANGES, samples=0) or 0) / 1e6,
        "bytes per job": int(bare.memory_usage(keys.JOB_CHANGES, samples=0) or 0) / jobs}
    bare.close()
    return table


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run() -> Figures:
    jobs = int(os.environ.get("PAI_BENCH_JOBS", JOBS))
    workers = max(1, min(4, os.cpu_count() or 1))
    with throwaway_redis() as url:
        fill_seconds = fill(url, jobs, workers)
        with redis.Redis.from_url(url) as info_client:
            # MEMORY STATS and not INFO: the platform's Redis user may run only the first
            version = info_client.execute_command("HELLO")[b"version"].decode()
            used = int(info_client.memory_stats()["total.allocated"])
        table = measure(url, jobs)
    return {
        "machine": f"{os.cpu_count()} x {_cpu_model()}, Python {platform.python_version()}, "
                   f"Redis {version}",
        "jobs stored": jobs,
        "users / VCs": f"{USERS} / {len(VCS)}",
        "state mix %": ", ".join(f"{s.value} {w}" for s, w in STATE_MIX),
        "fill seconds": fill_seconds,
        "fill jobs/s": jobs / fill_seconds,
        "redis used memory MB": used / 1e6,
        "GET /api/v1/jobs?...": table,
    }
