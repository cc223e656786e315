"""Task samples in Redis: a full stream's memory and one round's writes.

On a throwaway Redis: fills one task attempt's stream past its cap at the
defaults (15 s, two days, 4 GPUs) and gives its MEMORY USAGE, then times
three sampling rounds' pipelines for 100 tasks (`python -m bench task_samples`).
"""

from __future__ import annotations

import time

import redis

from bench import Figures, throwaway_redis
from shared.state import keys, tasksamples

TASKS = 100
ROUNDS = 3
T0 = 1_795_000_000_000


def run() -> Figures:
    with throwaway_redis() as url:
        r = redis.Redis.from_url(url, decode_responses=True)
        cap = tasksamples.max_samples(15.0, 2 * 86400.0)
        pipe = r.pipeline(transaction=False)
        for i in range(cap + 500):
            tasksamples.add(pipe, "alice~job", 0, "main", 0, tasksamples.Sample(
                T0 + i * 15_000, 123.45, 1_234_567_890, (97.0, 0.0, 55.5, 12.0)), cap)
            if i % 1000 == 0:
                pipe.execute()
        pipe.execute()
        key = keys.task_samples("alice~job", 0, "main", 0)
        entries, stream_bytes = r.xlen(key), r.memory_usage(key, samples=0)
        rounds: list[float] = []
        for _ in range(ROUNDS):
            start = time.perf_counter()
            pipe = r.pipeline(transaction=False)
            for t in range(TASKS):
                tasksamples.add(pipe, f"u~j{t}", 0, "main", 0,
                                tasksamples.Sample(T0, 1.0, 1, (0.0, 0.0)), cap)
            pipe.hgetall(keys.idle_tasks("n"))
            pipe.execute()
            rounds.append((time.perf_counter() - start) * 1000)
        r.close()
    return {
        "stream": "one task attempt, 15 s samples kept two days, 4 GPUs",
        "entries (cap)": f"{entries} ({cap})",
        "MiB when full": (stream_bytes or 0) / 2**20,
        f"{TASKS}-task round ms, {ROUNDS} rounds": " / ".join(f"{ms:.2f}" for ms in rounds),
    }
