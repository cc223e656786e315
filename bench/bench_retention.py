"""Redis memory per 100,000 finished jobs, before and after retention's compaction.

A throwaway Redis is filled with finished jobs of a realistic mix (one to
three task roles, one to three attempts, the events each step leaves; logs
excluded, as the target says), then the retention sweep's compaction runs
over every one of them (shared/state/retention.py `compact_job`), and Redis's own
count of its memory (MEMORY STATS `total.allocated`, INFO's `used_memory`)
is read before and after. Then 10,000 more jobs are added and compacted:
the growth they cause is the cost of one more job at that size. Where the
compacted bytes go is broken down by kind of key (MEMORY USAGE: the jobs'
archives and any record hash, each job index), so the next saving is
looked for where the bytes are.

The records are written with the platform's writers: a sample of the jobs
goes through the lifecycle itself (submit, placement, starts, exits, with
retries), the rest through the same Store methods those steps call, batched
in pipelines so that 110,000 jobs fill in a minute or two. The per-job
bytes of both (MEMORY USAGE over each job's keys) are printed side by side,
so the fill is seen to write what the lifecycle writes.

PAI_BENCH_JOBS overrides the number of jobs (a quick look: 10000).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import redis

from bench import Figure, Figures, Table, throwaway_redis
from shared.domain.jobspec import validate_job_config
from shared.domain.models import Attempt, Gpu, Job, JobSpec, Node, Task, TaskPlacement, job_id_of
from shared.domain.states import JobState, TaskState
from shared.state import keys, retention
from shared.state.lifecycle import initial_tasks, mark_task_running, submit_job
from shared.state.placing import commit_placement
from shared.state.store import Store
from shared.state.taskexits import record_task_exit

JOBS = 100_000
MORE = 10_000
SAMPLE = 200  # jobs driven through the lifecycle itself
USERS = 200
VCS = ("default", "vision", "speech", "nlp", "rl")
FILL_BATCH = 250
SEED = 16_03
MB = 1024 * 1024
NODES = 50
IMAGES = ("registry.example.com/ml/pytorch:2.1-cuda12.1", "nvcr.io/nvidia/tensorflow:23.10-tf2",
          "registry.example.com/ml/jax:0.4.20", "openpai/standard:python_3.6-pytorch_1.2.0-gpu")


def _role(name: str, tasks: int, gpus: int, command: str, ports: bool = False) -> dict[str, Any]:
    role: dict[str, Any] = {"name": name, "taskNumber": tasks, "cpuNumber": 4 * max(1, gpus),
                            "memoryMB": 16384 * max(1, gpus), "gpuNumber": gpus,
                            "command": command}
    if ports:
        role["portList"] = [{"label": "nccl", "beginAt": 0, "portNumber": 1}]
    return role


def planned_config(index: int) -> tuple[str, dict[str, Any], int, JobState]:
    """Job number `index`: its user, raw config, attempts and final state,
    the same in every run and every fill worker. Most jobs of a real cluster
    are single tasks; some are data-parallel, a few have several roles."""
    rng = random.Random(SEED * 1_000_003 + index)
    user = f"user{rng.randrange(USERS):03d}"
    kind = rng.choices(("single", "parallel", "ps", "three"), (55, 25, 15, 5))[0]
    epochs = rng.randrange(1, 300)
    if kind == "single":
        roles = [_role("main", 1, rng.choice((1, 1, 2, 4)),
                       f"python train.py --epochs {epochs} --lr 0.0{rng.randrange(1, 9)}")]
    elif kind == "parallel":
        roles = [_role("worker", rng.randrange(2, 5), rng.choice((1, 2, 4, 8)),
                       f"torchrun --nproc-per-node 1 train.py --epochs {epochs}", ports=True)]
    elif kind == "ps":
        roles = [_role("ps", 1, 0, "python train.py --role ps"),
                 _role("worker", rng.randrange(2, 5), 1,
                       f"python train.py --role worker --epochs {epochs}", ports=True)]
    else:
        roles = [_role("ps", 1, 0, "python train.py --role ps"),
                 _role("worker", 4, 1, f"python train.py --role worker --epochs {epochs}",
                       ports=True),
                 _role("evaluator", 1, 0, "python eval.py --every 1000")]
    config: dict[str, Any] = {
        "jobName": f"{rng.choice(('resnet', 'bert', 'gpt', 'yolo', 'wav2vec'))}-{index:07d}",
        "image": rng.choice(IMAGES), "virtualCluster": rng.choice(VCS),
        "retryCount": rng.choice((0, 0, 1, 2)), "taskRoles": roles}
    if rng.random() < 0.3:
        config["jobEnvs"] = {"WANDB_PROJECT": config["jobName"].split("-")[0], "SEED": str(index)}
    attempts = rng.choices((1, 2, 3), (85, 12, 3))[0]
    state = rng.choices((JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED), (65, 25, 10))[0]
    return user, config, attempts, state


def user_uid(user: str) -> str:
    """The user's id as accounts.py gives one (`secrets.token_hex(12)`), the
    same in every run: 24 hex digits that do not compress, as in a real
    record."""
    return random.Random(f"{SEED}:{user}").randbytes(12).hex()


def _validated(user: str, raw: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = validate_job_config(raw, username=user, storage_roots=()).config
    return config


def _node(n: int) -> Node:
    return Node(name=f"gpu-node-{n:03d}", ip=f"10.0.{n // 250}.{n % 250 + 1}", cpus=128,
                memory_mb=1_024_000, gpus=[Gpu(index=g, model="A100", memory_mb=81920)
                                           for g in range(8)])


def _placements(rng: random.Random, spec: JobSpec, first_node: int) -> list[TaskPlacement]:
    """One node per task (a task of 8 GPUs fills one), from `first_node` on."""
    placements: list[TaskPlacement] = []
    port = rng.randrange(15000, 39000)
    for role in spec.task_roles:
        for index in range(role.task_number):
            node = _node((first_node + len(placements)) % NODES)
            ports = {"default": [port]} | ({"nccl": [port + 1]} if role.ports else {})
            port += 2
            placements.append(TaskPlacement(role.name, index, node.name, node.ip,
                                            tuple(range(role.gpu_number)), role.cpu_number,
                                            role.memory_mb, ports))
    return placements


def _exit_code(attempt: int, last: int, state: JobState, position: int) -> int:
    if attempt < last:
        return 1 if position == 0 else 0
    return 0 if state == JobState.SUCCEEDED else (1 if position == 0 else 0)


# ------------------------------------------------------------- the lifecycle


def drive_through_lifecycle(store: Store, index: int) -> str:
    """Job `index` from submit to its end with the platform's own steps
    (placement, starts, exits, retries), as the services would do it."""
    rng = random.Random(index)
    user, raw, attempts, state = planned_config(index)
    raw["retryCount"] = attempts - 1
    job = submit_job(store, user, _validated(user, raw), user_id=user_uid(user))
    spec = JobSpec.from_config(store.get_config(job.id) or {})
    for attempt in range(attempts):
        current = store.get_job(job.id)
        assert current is not None
        commit_placement(store, job.id, version=current.version, attempt=attempt,
                         placements=_placements(rng, spec, index), launch_deadline_ms=0)
        tasks = store.get_tasks(job.id, attempt)
        for task in tasks:
            mark_task_running(store, job.id, attempt, task.role, task.index,
                              rng.randbytes(32).hex())
        if attempt == attempts - 1 and state == JobState.STOPPED:
            from shared.state.lifecycle import request_stop
            request_stop(store, job.id)
        for position, task in enumerate(tasks):
            record_task_exit(store, job.id, attempt, task.role, task.index,
                             exit_code=_exit_code(attempt, attempts - 1, state, position),
                             diagnostics="" if position else "exited with code 1")
        for node in {t.node for t in tasks if t.node}:
            for key in list(store.get_allocations(store.r, node)):
                store.release_allocation(node, key)
    return job.id


# ------------------------------------------------------------- the fill


def _write_finished(store: Store, pipe: Any, index: int) -> None:
    """Job `index` as the lifecycle leaves it when it has ended, written with
    the Store's own writers on `pipe` (records, indexes, the event stream)."""
    rng = random.Random(index)
    user, raw, attempts, state = planned_config(index)
    config = _validated(user, raw)
    spec = JobSpec.from_config(config)
    created = 1_760_000_000_000 + index * 1000
    job = Job(id=job_id_of(user, spec.name), username=user, name=spec.name,
              virtual_cluster=spec.virtual_cluster, created_ms=created, version=1,
              gpus=sum(r.gpu_number * r.task_number for r in spec.task_roles),
              user_id=user_uid(user), priority=spec.priority_class, queue_seq=index + 1)
    pipe.set(keys.job_config(job.id), json.dumps(config, separators=(",", ":")))
    pipe.zadd(keys.JOBS, {job.id: created})
    pipe.zadd(keys.user_jobs(user), {job.id: created})
    pipe.zadd(keys.vc_jobs(job.virtual_cluster), {job.id: created})
    store.add_event(pipe, job.id, "submitted", attempt=0)
    clock = created
    for attempt in range(attempts):
        last = attempt == attempts - 1
        record = Attempt(index=attempt, created_ms=clock, started_ms=clock + 2000)
        tasks: list[Task] = []
        placements = _placements(rng, spec, index)
        store.add_event(pipe, job.id, "placed", attempt=attempt,
                        nodes=sorted({p.node for p in placements}), mode="")
        for position, (task, placed) in enumerate(zip(initial_tasks(spec), placements,
                                                      strict=True)):
            code = _exit_code(attempt, attempts - 1, state, position)
            task.state = TaskState.SUCCEEDED if code == 0 else TaskState.FAILED
            if last and state == JobState.STOPPED:
                task.state, code = TaskState.STOPPED, 137
            task.node, task.ip, task.gpus, task.ports = placed.node, placed.ip, \
                list(placed.gpus), placed.ports
            task.container_id, task.exit_code = rng.randbytes(32).hex(), code
            task.diagnostics = "" if code == 0 else f"exited with code {code}"
            task.launched_ms, task.started_ms = clock + 1000, clock + 2000
            task.completed_ms = clock + 2000 + rng.randrange(60_000, 3_600_000)
            tasks.append(task)
            store.add_event(pipe, job.id, "task-running", attempt=attempt, role=task.role,
                            index=task.index, node=task.node)
        for task in tasks:
            store.add_event(pipe, job.id, "task-exit", attempt=attempt, role=task.role,
                            index=task.index, state=task.state, exitCode=task.exit_code,
                            diagnostics=task.diagnostics)
        clock = max(t.completed_ms or 0 for t in tasks)
        record.completed_ms = clock
        record.state = state.value if last else JobState.FAILED.value
        record.exit_code = None if state == JobState.STOPPED and last else \
            (0 if last and state == JobState.SUCCEEDED else 1)
        record.reason = "all tasks completed" if record.exit_code == 0 else \
            "stopped by user" if record.exit_code is None else \
            f"1 task(s) of role {tasks[0].role} failed; {tasks[0].role}[0]: exited with code 1"
        store.write_tasks(pipe, job.id, attempt, tasks)
        store.write_attempt(pipe, job.id, record)
        store.add_event(pipe, job.id, "attempt-end", attempt=attempt,
                        state=state.value if last else JobState.WAITING.value, retried=not last)
    job.attempt, job.retries = attempts - 1, attempts - 1
    job.state, job.version = state, 10 + 8 * attempts
    job.completed_ms, job.started_ms = clock, clock - 60_000
    job.exit_code = {JobState.SUCCEEDED: 0, JobState.FAILED: 1}.get(state)
    job.exit_diagnostics = record.reason
    store.write_job(pipe, job, previous_state=None)


def fill_range(url: str, start: int, stop: int) -> int:
    store = Store(redis.Redis.from_url(url, decode_responses=True))
    for first in range(start, stop, FILL_BATCH):
        pipe = store.r.pipeline(transaction=False)
        for index in range(first, min(stop, first + FILL_BATCH)):
            _write_finished(store, pipe, index)
        pipe.execute()
    store.r.close()
    return stop - start


def compact_range(url: str, ids: Sequence[str]) -> int:
    store = Store(redis.Redis.from_url(url, decode_responses=True))
    done = sum(retention.compact_job(store, job_id, None) for job_id in ids)
    store.r.close()
    return done


def _split(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    step = -(-(stop - start) // parts)
    return [(s, min(stop, s + step)) for s in range(start, stop, step)]


def fill(url: str, start: int, stop: int, workers: int) -> None:
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(fill_range, [url] * workers, *zip(*_split(start, stop, workers),
                                                         strict=True)))


def compact_all(url: str, workers: int) -> int:
    r = redis.Redis.from_url(url, decode_responses=True)
    ids = [str(i) for i in r.zrange(keys.RETENTION_PENDING, 0, -1)]
    r.close()
    chunks = [ids[n::workers] for n in range(workers)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(compact_range, [url] * workers, chunks))


def used_memory(r: redis.Redis) -> int:
    """INFO's used_memory, by a command the platform's Redis user may run."""
    return int(r.memory_stats()["total.allocated"])


def job_bytes(r: redis.Redis, job_ids: Sequence[str]) -> float:
    """Mean MEMORY USAGE of the jobs' own keys (indexes aside)."""
    total = 0
    for job_id in job_ids:
        for key in r.scan_iter(match=f"pai:job:{job_id}*", count=1000):
            total += int(r.memory_usage(key) or 0)
    return total / max(1, len(job_ids))


def key_kind(key: str) -> str:
    """Which part of the platform's data a key is, for `memory_by_kind`."""
    if key == keys.JOBS:
        return "index: all jobs"
    for prefix, kind in ((keys.user_jobs(""), "index: per user"),
                         (keys.vc_jobs(""), "index: per VC"),
                         (keys.state_jobs(""), "index: per state")):
        head, _, tail = prefix.partition("::")
        if key.startswith(head + ":") and key.endswith(":" + tail):
            return kind
    if key.startswith(keys.job("")):
        rest = key.removeprefix(keys.job(""))
        return "job: " + (rest.rpartition(":")[2] if ":" in rest else "record hash")
    return "other"


def memory_by_kind(r: redis.Redis, jobs: int) -> Table:
    """MEMORY USAGE summed by kind of key, per job; and how many such keys
    (with their encoding, which decides their cost) there are."""
    total: dict[str, int] = {}
    count: dict[str, int] = {}
    encodings: dict[str, set[str]] = {}
    batch: list[str] = []

    def measure() -> None:
        pipe = r.pipeline(transaction=False)
        for key in batch:
            pipe.memory_usage(key, samples=0)
            pipe.object("encoding", key)
        replies = pipe.execute()
        for n, key in enumerate(batch):
            kind = key_kind(key)
            total[kind] = total.get(kind, 0) + int(replies[2 * n] or 0)
            count[kind] = count.get(kind, 0) + 1
            encodings.setdefault(kind, set()).add(str(replies[2 * n + 1]))
        batch.clear()

    for key in r.scan_iter(count=1000):
        batch.append(key)
        if len(batch) == 1000:
            measure()
    measure()
    return {kind: {"keys": count[kind], "bytes/job": round(total[kind] / jobs, 1),
                   "encoding": "/".join(sorted(encodings[kind]))}
            for kind in sorted(total, key=lambda k: -total[k])}


def run() -> Figures:
    jobs = int(os.environ.get("PAI_BENCH_JOBS", JOBS))
    more = max(1, jobs // 10) if jobs != JOBS else MORE
    workers = max(1, min(4, os.cpu_count() or 1))
    figures: dict[str, Figure | Table] = {"jobs": jobs}
    with throwaway_redis() as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        store = Store(r)
        empty = used_memory(r)
        for n in range(NODES):
            store.register_node(_node(n))
        sample = [drive_through_lifecycle(store, jobs + more + n) for n in range(SAMPLE)]
        twins = []
        for n in range(SAMPLE):
            pipe = r.pipeline(transaction=False)
            _write_finished(store, pipe, jobs + more + SAMPLE + n)
            pipe.execute()
            user, raw, _, _ = planned_config(jobs + more + SAMPLE + n)
            twins.append(job_id_of(user, raw["jobName"]))
        lifecycle_bytes, fill_bytes = job_bytes(r, sample), job_bytes(r, twins)
        figures["job keys, lifecycle-written (bytes/job)"] = round(lifecycle_bytes)
        figures["job keys, bench-written (bytes/job)"] = round(fill_bytes)
        for job_id in sample + twins:
            retention.compact_job(store, job_id, None)
        figures["job keys after compaction, lifecycle-written"] = round(job_bytes(r, sample))
        figures["job keys after compaction, bench-written"] = round(job_bytes(r, twins))
        base = used_memory(r)
        fill(url, 0, jobs, workers)
        before = used_memory(r) - base
        compacted = compact_all(url, workers)
        after = used_memory(r) - base
        # the lifecycle's sample and its twins are there too
        figures["compacted, by kind of key (MEMORY USAGE)"] = memory_by_kind(r, jobs + 2 * SAMPLE)
        fill(url, jobs, jobs + more, workers)
        grown_before = used_memory(r) - base
        compact_all(url, workers)
        grown = used_memory(r) - base
        scale = 100_000 / jobs
        figures["redis used_memory, empty (MB)"] = round(empty / MB, 1)
        figures["per 100,000 finished jobs, as the lifecycle leaves them (MB)"] = \
            round(before * scale / MB, 1)
        figures["per 100,000 finished jobs, compacted (MB)"] = round(after * scale / MB, 1)
        figures["compacted / uncompacted"] = round(after / before, 3)
        figures["jobs compacted"] = compacted
        figures[f"growth with {more:,} more, before compaction (MB)"] = \
            round((grown_before - after) / MB, 1)
        figures[f"growth with {more:,} more, compacted (MB)"] = round((grown - after) / MB, 1)
        figures["bytes per compacted job, at the margin"] = round((grown - after) / more)
        figures["target (MB per 100,000, compacted)"] = 100
        r.close()
    return figures


if __name__ == "__main__":
    import time

    from bench.__main__ import print_figures

    started = time.perf_counter()
    print_figures("retention", run(), time.perf_counter() - started)
