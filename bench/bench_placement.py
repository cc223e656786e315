"""Placement: one scheduling pass of the pure core over a big queue.

`services.scheduler.policy.plan` places a queue of jobs (gangs of up to
16 nodes, a seeded mix of shapes) on a cluster of 8-GPU nodes, with no IO:
this is the scheduler's own cost, apart from reading Redis and committing.
Two workloads at several sizes (nodes N, queue 10 x N):

- "fill": every node empty, so the pass hands out every GPU and then has
  to turn the rest of the queue away;
- "busy": every node already holds some tasks (fragmented free GPUs), the
  steady state of a loaded cluster, where most of the queue waits.

Figures per size: jobs placed per second (the target: >= 5,000/s with
5,000 nodes and 50,000 queued jobs), queued jobs decided per second, and
the pass's time (best of 5, each on fresh nodes and a fresh queue) beside a
reference measured in the same run: the cost of building the Cluster index
from the same nodes (what any pass pays before placing anything). Building
the JobRequests (in the scheduler, from what it reads in Redis) is not in the
pass's time; it is shown beside it. The growth exponent is the slope of log(pass time)
against log(queue length) between the smallest and the largest size; n log n
over the same sizes is printed beside it.

Beside the core, one service-level figure: `Scheduler.run_pass` on a
throwaway Redis (SERVICE_NODES registered nodes, SERVICE_JOBS queued 1-GPU
jobs stored by `submit_job`), which also reads the queue from Redis, commits
each placement (a compare-and-set transaction) and sends its start message;
then a second pass with nothing to change, the steady state of a long queue.

PAI_BENCH_PLACEMENT_SIZES overrides the node counts (comma separated).
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Sequence

from bench import Figure, Figures, throwaway_redis
from services.scheduler.core import (
    Cluster,
    JobRequest,
    NodeFree,
    PortRequest,
    TaskRequest,
)
from services.scheduler.policy import plan as plan_pass
from services.scheduler.service import Scheduler
from shared.cluster import VcPolicy, vc_policies
from shared.config import Settings
from shared.lifecycle import submit_job
from shared.messaging import Messenger, make_celery
from shared.models import Gpu, Node
from shared.store import Store

SIZES = (500, 1000, 2000, 5000)
SERVICE_NODES = 500
SERVICE_JOBS = 5000
QUEUE_PER_NODE = 10
GPUS_PER_NODE = 8
CPUS_PER_NODE = 64
MEMORY_PER_NODE_MB = 512 * 1024
PORT_RANGE = (15000, 40000)
REPEATS = 5
SEED = 20240601
TARGET_NODES = 5000
TARGET_PLACEMENTS_PER_S = 5000.0
# (weight, tasks, GPUs, CPUs, memory MB, extra ports per task)
SHAPES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (40, 1, 1, 4, 16_000, 0),
    (12, 1, 2, 8, 32_000, 0),
    (8, 1, 4, 16, 64_000, 0),
    (8, 1, 8, 32, 128_000, 0),
    (20, 1, 0, 2, 4_000, 0),
    (4, 2, 8, 32, 128_000, 1),
    (3, 4, 8, 32, 128_000, 1),
    (2, 8, 4, 16, 64_000, 2),
    (2, 16, 8, 32, 128_000, 2),
    (1, 3, 2, 8, 32_000, 1),
)


def make_nodes(count: int, busy: bool, rng: random.Random) -> list[NodeFree]:
    """`count` 8-GPU nodes; `busy` ones already hold 1..8 GPUs' worth of tasks."""
    nodes = []
    for i in range(count):
        gpus = list(range(GPUS_PER_NODE))
        cpus, memory, used_ports = CPUS_PER_NODE, MEMORY_PER_NODE_MB, set[int]()
        if busy:
            held = rng.randint(1, GPUS_PER_NODE)
            taken = set(rng.sample(gpus, held))
            gpus = [g for g in gpus if g not in taken]
            cpus -= 4 * held
            memory -= 16_000 * held
            used_ports = set(range(PORT_RANGE[0], PORT_RANGE[0] + held))
        nodes.append(NodeFree(f"node-{i:05d}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                              gpus, cpus, memory, PORT_RANGE, used_ports,
                              all_gpus=tuple(range(GPUS_PER_NODE)), cpus=CPUS_PER_NODE,
                              memory_mb=MEMORY_PER_NODE_MB))
    return nodes


def make_queue(count: int, rng: random.Random) -> list[JobRequest]:
    weights = [s[0] for s in SHAPES]
    queue = []
    for i in range(count):
        _, tasks, gpus, cpus, memory, ports = rng.choices(SHAPES, weights)[0]
        port_requests = (PortRequest("ssh", ports),) if ports else ()
        queue.append(JobRequest(
            f"user{i % 97:02d}~job-{i:06d}", 1, 0,
            tuple(TaskRequest("worker", t, cpus, memory, gpus, port_requests)
                  for t in range(tasks)),
            vc=("default", "vision", "speech")[i % 3], seq=i))
    return queue


def policies(nodes_count: int) -> dict[str, VcPolicy]:
    """`vision` and `speech` are each guaranteed a quarter of the GPUs,
    `default` the rest: the pass weighs guarantees and borrowing as it would
    on a shared cluster."""
    quarter = nodes_count * GPUS_PER_NODE // 4
    return vc_policies({"default": None, "vision": quarter, "speech": quarter}, {},
                       nodes_count * GPUS_PER_NODE)


def measure(nodes_count: int, busy: bool) -> dict[str, Figure]:
    """Best of REPEATS passes, each on fresh nodes and a fresh queue.

    Building the nodes and the queue (the scheduler's reading of Redis) is
    left out of the timing; building the Cluster index is the reference.
    """
    seed = SEED + nodes_count * 2 + busy
    index_samples, pass_samples, build_samples = [], [], []
    plan, queue = None, []
    for _ in range(REPEATS):
        start = time.perf_counter()
        queue = make_queue(nodes_count * QUEUE_PER_NODE, random.Random(seed))
        build_samples.append(time.perf_counter() - start)
        nodes = make_nodes(nodes_count, busy, random.Random(seed))
        start = time.perf_counter()
        Cluster(nodes)
        index_samples.append(time.perf_counter() - start)
        cluster = Cluster(make_nodes(nodes_count, busy, random.Random(seed)))
        start = time.perf_counter()
        plan = plan_pass(cluster, queue, [], policies(nodes_count), 0)
        pass_samples.append(time.perf_counter() - start)
    assert plan is not None
    pass_s, index_s = min(pass_samples), min(index_samples)
    placed = len(plan.placed)
    tasks = sum(len(p.placements) for p in plan.placed)
    return {
        "queued": len(queue), "placed": placed, "tasks placed": tasks,
        "pass ms": pass_s * 1000, "placed/s": placed / pass_s,
        "decided/s": len(queue) / pass_s,
        "index ms": index_s * 1000, "ratio pass/index": pass_s / index_s,
        "queue build ms": min(build_samples) * 1000,
    }


def service_passes() -> dict[str, dict[str, Figure]]:
    """Two `Scheduler.run_pass`es over Redis: the first places, the second finds
    nothing new to do."""
    with throwaway_redis() as url:
        store = Store.from_url(url)
        for i in range(SERVICE_NODES):
            store.register_node(Node(f"node-{i:05d}", "10.0.0.1", cpus=CPUS_PER_NODE,
                                     memory_mb=MEMORY_PER_NODE_MB,
                                     gpus=[Gpu(g) for g in range(GPUS_PER_NODE)]))
        config = {"image": "busybox", "taskRoles": [{
            "name": "main", "taskNumber": 1, "cpuNumber": 4, "memoryMB": 16_000,
            "gpuNumber": 1, "command": "python train.py"}]}
        for j in range(SERVICE_JOBS):
            submit_job(store, f"user{j % 97:02d}", {**config, "jobName": f"job-{j:06d}"})
        settings = Settings(redis_url=url)
        scheduler = Scheduler(settings, store, Messenger(make_celery(settings)))
        table: dict[str, dict[str, Figure]] = {}
        for label in ("first pass", "second pass"):
            start = time.perf_counter()
            stats = scheduler.run_pass()
            seconds = time.perf_counter() - start
            table[label] = {"queued": stats.placed + stats.waiting, "placed": stats.placed,
                            "pass ms": seconds * 1000,
                            "placed/s": stats.placed / seconds if stats.placed else 0}
        store.r.close()
    return table


def growth_exponent(sizes: Sequence[int], seconds: Sequence[float]) -> float:
    """Slope of log(seconds) over log(queue length), smallest to largest size."""
    return math.log(seconds[-1] / seconds[0]) / math.log(sizes[-1] / sizes[0])


def nlogn_exponent(sizes: Sequence[int]) -> float:
    small, large = sizes[0] * QUEUE_PER_NODE, sizes[-1] * QUEUE_PER_NODE
    return math.log(large * math.log(large) / (small * math.log(small))) / math.log(large / small)


def run() -> Figures:
    raw = os.environ.get("PAI_BENCH_PLACEMENT_SIZES")
    sizes = tuple(int(s) for s in raw.split(",")) if raw else SIZES
    figures: dict[str, Figure | dict[str, dict[str, Figure]]] = {
        "node": f"{GPUS_PER_NODE} GPUs, {CPUS_PER_NODE} CPUs, {MEMORY_PER_NODE_MB // 1024} GB",
        "queue": f"{QUEUE_PER_NODE} x nodes, gangs of 1-16 tasks, seed {SEED}",
    }
    for busy in (False, True):
        workload = "busy" if busy else "fill"
        table = {f"{n} nodes": measure(n, busy) for n in sizes}
        figures[f"plan_pass, {workload}"] = table
        seconds = [float(table[f"{n} nodes"]["pass ms"]) for n in sizes]
        if len(sizes) > 1:
            figures[f"{workload}: growth exponent"] = growth_exponent(sizes, seconds)
        if TARGET_NODES in sizes:
            rate = float(table[f"{TARGET_NODES} nodes"]["placed/s"])
            figures[f"{workload}: placed/s vs target {TARGET_PLACEMENTS_PER_S:.0f}"] = \
                rate / TARGET_PLACEMENTS_PER_S
    if len(sizes) > 1:
        figures["n log n exponent over the same sizes"] = nlogn_exponent(sizes)
    figures[f"Scheduler.run_pass on Redis, {SERVICE_NODES} nodes"] = service_passes()
    return figures
