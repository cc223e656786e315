"""Task samples in Redis: a full stream's memory and one round's writes.

`python -m bench.bench_task_samples redis://127.0.0.1:<port>/0` against a
throwaway Redis (it flushes it): fills one task attempt's stream past its
cap at the defaults (15 s, two days, 4 GPUs) and prints its MEMORY USAGE,
then times three sampling rounds' pipelines for 100 tasks.

Nothing is asserted; docs/performance.md records the figures.
"""

from __future__ import annotations

import sys
import time

import redis

from shared import keys, tasksamples

TASKS = 100
T0 = 1_795_000_000_000


def main(url: str) -> None:
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushall()
    cap = tasksamples.max_samples(15.0, 2 * 86400.0)
    pipe = r.pipeline(transaction=False)
    for i in range(cap + 500):
        tasksamples.add(pipe, "alice~job", 0, "main", 0, tasksamples.Sample(
            T0 + i * 15_000, 123.45, 1_234_567_890, (97.0, 0.0, 55.5, 12.0)), cap)
        if i % 1000 == 0:
            pipe.execute()
    pipe.execute()
    key = keys.task_samples("alice~job", 0, "main", 0)
    print(f"entries {r.xlen(key)} cap {cap} bytes {r.memory_usage(key, samples=0)}")
    for _ in range(3):
        start = time.perf_counter()
        pipe = r.pipeline(transaction=False)
        for t in range(TASKS):
            tasksamples.add(pipe, f"u~j{t}", 0, "main", 0,
                            tasksamples.Sample(T0, 1.0, 1, (0.0, 0.0)), cap)
        pipe.hgetall(keys.idle_tasks("n"))
        pipe.execute()
        print(f"{TASKS}-task round {(time.perf_counter() - start) * 1000:.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
