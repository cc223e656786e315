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

Beside the core, the service: `Scheduler.run_pass` on a throwaway Redis
(SERVICE_NODES registered nodes, SERVICE_JOBS queued 1-GPU jobs stored by
`submit_job`), which also reads the queue from Redis, commits the placements
(`commit_placements`: one compare-and-set script call per 1,000 tasks) and
sends the starts (an entry per node); then two passes with nothing to
change, the second of them the steady state of a long queue. The same
placing pass again on a scheduler that had read the queue before (a pass
while every node was cordoned), as a running scheduler has when capacity
comes back. Its committed placements/s stand beside the pure policy's
decide rate on the same nodes and queue, timed in
the same run, with their ratio; the CPU seconds of the scheduler's process
and of redis-server during each pass are shown too (steadier than the wall
clock on a shared machine).

Big gangs: `core.place_gang` alone for one gang of 16 to 512 two-GPU tasks
on nodes of 8 GPUs (4 tasks a node, so 64 tasks span 16 nodes), and the
same gang committed through `commit_placements` on Redis; the growth
exponent over gang size (of the CPU time, which a busy machine moves less
than the wall clock) says whether either is near linear (1.0).

PAI_BENCH_PLACEMENT_SIZES overrides the node counts (comma separated);
PAI_BENCH_SERVICE_NODES the service's (500).
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Sequence

from bench import Figure, Figures, cpu_seconds, redis_pid, throwaway_redis
from services.scheduler.core import (
    Cluster,
    JobRequest,
    NodeFree,
    PortRequest,
    TaskRequest,
    free_view,
    job_request,
    place_gang,
)
from services.scheduler.heap import paused_gc
from services.scheduler.policy import plan as plan_pass
from services.scheduler.service import Scheduler
from shared.domain.asks import Ask
from shared.domain.cluster import VcPolicy, vc_policies
from shared.domain.models import Gpu, JobSpec, Node, TaskPlacement
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state import keys
from shared.state.lifecycle import submit_job
from shared.state.placing import PlacementCommit, commit_placements
from shared.state.store import Store

SIZES = (500, 1000, 2000, 5000)
# The service's passes on Redis: PAI_BENCH_SERVICE_NODES nodes, ten queued jobs a node.
SERVICE_NODES = int(os.environ.get("PAI_BENCH_SERVICE_NODES", "500"))
SERVICE_JOBS = 10 * SERVICE_NODES
QUEUE_PER_NODE = 10
GPUS_PER_NODE = 8
CPUS_PER_NODE = 64
MEMORY_PER_NODE_MB = 512 * 1024
PORT_RANGE = (15000, 40000)
REPEATS = 5
SEED = 20240601
TARGET_NODES = 5000
TARGET_PLACEMENTS_PER_S = 5000.0
# Raised (issue 36): committed placements at 10,000 nodes and 100,000 queued,
# the service's size with PAI_BENCH_SERVICE_NODES=10000
RAISED_TARGET_PER_S = 10_000.0
RAISED_TARGET_NODES = 10_000
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


SERVICE_CONFIG = {"image": "busybox", "taskRoles": [{
    "name": "main", "taskNumber": 1, "cpuNumber": 4, "memoryMB": 16_000,
    "gpuNumber": 1, "command": "python train.py"}]}


def service_nodes() -> list[Node]:
    return [Node(f"node-{i:05d}", "10.0.0.1", cpus=CPUS_PER_NODE, memory_mb=MEMORY_PER_NODE_MB,
                 gpus=[Gpu(g) for g in range(GPUS_PER_NODE)]) for i in range(SERVICE_NODES)]


def decide_only() -> dict[str, Figure]:
    """The policy alone on what the service passes' first pass decides on:
    the same nodes (`free_view`) and the same requests (`job_request` of the
    same config, the default port included); best of 3."""
    ask = Ask.of(JobSpec.from_config({**SERVICE_CONFIG, "jobName": "job"}))
    samples, cpu_samples, placed = [], [], 0
    for _ in range(3):
        cluster = Cluster(free_view(node, []) for node in service_nodes())
        queue = [job_request(f"user{j % 97:02d}~job-{j:06d}", 1, 0, ask, j + 1)
                 for j in range(SERVICE_JOBS)]
        policy = vc_policies({"default": None}, {}, SERVICE_NODES * GPUS_PER_NODE)
        start, cpu = time.perf_counter(), time.process_time()
        plan = plan_pass(cluster, queue, [], policy, now_ms())
        samples.append(time.perf_counter() - start)
        cpu_samples.append(time.process_time() - cpu)
        placed = len(plan.placed)
    seconds = min(samples)
    return {"queued": SERVICE_JOBS, "placed": placed, "pass ms": seconds * 1000,
            "placed/s": placed / seconds, "scheduler CPU ms": min(cpu_samples) * 1000,
            "placed per CPU s": placed / min(cpu_samples)}


def _loaded_store(url: str) -> Store:
    """SERVICE_NODES registered nodes and SERVICE_JOBS queued jobs on `url`."""
    store = Store.from_url(url)
    for node in service_nodes():
        store.register_node(node)
    for j in range(SERVICE_JOBS):
        submit_job(store, f"user{j % 97:02d}", {**SERVICE_CONFIG, "jobName": f"job-{j:06d}"})
    return store


def _measured_pass(scheduler: Scheduler, store: Store, server: int | None) -> dict[str, Figure]:
    """One `run_pass`, the nodes' heartbeats stamped first: no agents renew
    these nodes, and a big queue's submits and passes outlast their READY."""
    for node in service_nodes():
        store.heartbeat(node.name)
    redis_cpu, cpu = cpu_seconds(server), time.process_time()
    start = time.perf_counter()
    stats = scheduler.run_pass()
    seconds = time.perf_counter() - start
    cpu, redis_cpu = time.process_time() - cpu, cpu_seconds(server) - redis_cpu
    row: dict[str, Figure] = {
        "queued": stats.placed + stats.waiting, "placed": stats.placed,
        "pass ms": seconds * 1000, "placed/s": stats.placed / seconds if stats.placed else 0,
        "modes changed": stats.modes_changed, "scheduler CPU ms": cpu * 1000}
    if server is not None:
        row["Redis CPU ms"] = redis_cpu * 1000
    if stats.placed:
        row["placed per CPU s"] = stats.placed / (cpu + redis_cpu)
    return row


def _set_schedulable(store: Store, nodes: Sequence[Node], schedulable: bool) -> None:
    for node in nodes:
        store.set_node_flags(node.name, schedulable=schedulable, by="bench")


def service_passes() -> dict[str, dict[str, Figure]]:
    """`Scheduler.run_pass`es over Redis. A scheduler that never saw the
    queue: the first pass places, the second finds nothing new to do (and
    reads the running jobs for the first time), the third neither (the
    steady state), the fourth runs with half the nodes cordoned (the default
    VC's guarantee halves, so half the running jobs are demoted to
    borrowed). Then, on the
    same nodes and queue stored again, a scheduler whose earlier pass read
    the queue while every node was cordoned (as a running scheduler has,
    when capacity comes back to a long queue): that pass, and the one that
    places once the nodes are back. Beside them, the policy alone on the
    same work."""
    table: dict[str, dict[str, Figure]] = {}
    nodes = service_nodes()
    with throwaway_redis() as url:
        store = _loaded_store(url)
        settings = Settings(redis_url=url)
        scheduler = Scheduler(settings, store, Messenger(make_celery(settings)))
        server = redis_pid(url)
        table["first pass"] = _measured_pass(scheduler, store, server)
        table["second pass"] = _measured_pass(scheduler, store, server)
        table["third pass (running jobs read before)"] = _measured_pass(scheduler, store, server)
        _set_schedulable(store, nodes[::2], False)  # the guarantee halves: jobs demoted
        table["half the nodes cordoned"] = _measured_pass(scheduler, store, server)
        store.r.close()
    with throwaway_redis() as url:
        store = _loaded_store(url)
        settings = Settings(redis_url=url)
        scheduler = Scheduler(settings, store, Messenger(make_celery(settings)))
        server = redis_pid(url)
        _set_schedulable(store, nodes, False)
        table["queue read, every node cordoned"] = _measured_pass(scheduler, store, server)
        _set_schedulable(store, nodes, True)
        table["first pass, queue read before"] = _measured_pass(scheduler, store, server)
        store.r.close()
    table["policy alone (decide)"] = decide_only()
    return table


GANG_SIZES = (16, 32, 64, 128, 256, 512)
GANG_TASKS_PER_NODE = 4
GANG_TASK_GPUS = GPUS_PER_NODE // GANG_TASKS_PER_NODE


def gang_request(tasks: int) -> JobRequest:
    return JobRequest(f"alice~gang-{tasks}", 1, 0, tuple(
        TaskRequest("worker", t, 8, 32_000, GANG_TASK_GPUS, (PortRequest("ssh", 1),))
        for t in range(tasks)))


def gang_nodes(tasks: int) -> list[NodeFree]:
    """Exactly the nodes the gang needs (4 tasks a node), plus as many again
    with one free GPU, too few for any of its tasks."""
    count = -(-tasks // GANG_TASKS_PER_NODE)
    nodes = make_nodes(2 * count, False, random.Random(SEED))
    for node in nodes[count:]:
        node.free_gpus = node.free_gpus[:1]
    return nodes


def big_gangs() -> dict[str, dict[str, Figure]]:
    """One gang of each size: the core's `place_gang` (best of 5, wall clock
    and CPU), then the gang bound through `commit_placements` on Redis (best
    of 3: the wall clock, the scheduler's CPU, redis-server's CPU)."""
    table: dict[str, dict[str, Figure]] = {}
    with throwaway_redis() as url:
        store = Store.from_url(url)
        server = redis_pid(url)
        for tasks in GANG_SIZES:
            samples: list[float] = []
            cpu_samples: list[float] = []
            placements: tuple[TaskPlacement, ...] = ()
            for _ in range(REPEATS):
                cluster = Cluster(gang_nodes(tasks))
                request = gang_request(tasks)
                start, cpu = time.perf_counter(), time.process_time()
                with paused_gc():  # as in a pass (policy.plan)
                    result = place_gang(cluster, request)
                samples.append(time.perf_counter() - start)
                cpu_samples.append(time.process_time() - cpu)
                assert result.placements is not None, "the benchmark's gang must fit"
                placements = result.placements
            nodes = sorted({p.node for p in placements})
            for name in nodes:
                store.register_node(Node(name, "10.0.0.1", cpus=CPUS_PER_NODE,
                                         memory_mb=MEMORY_PER_NODE_MB,
                                         gpus=[Gpu(g) for g in range(GPUS_PER_NODE)]))
            commit: list[tuple[float, float, float]] = []
            for n in range(3):
                job = submit_job(store, "alice", {
                    "jobName": f"gang-{tasks}-{n}", "image": "busybox", "taskRoles": [{
                        "name": "worker", "taskNumber": tasks, "cpuNumber": 8,
                        "memoryMB": 32_000, "gpuNumber": GANG_TASK_GPUS, "command": "true"}]})
                redis_cpu, cpu = cpu_seconds(server), time.process_time()
                start = time.perf_counter()
                [bound] = commit_placements(store, [PlacementCommit(
                    job.id, job.version, 0, tuple(placements), queue_seq=job.queue_seq,
                    vc=job.virtual_cluster)], launch_deadline_ms=2**41)
                commit.append((time.perf_counter() - start, time.process_time() - cpu,
                               cpu_seconds(server) - redis_cpu))
                assert bound, "the benchmark's gang must be bound"
                for name in nodes:  # the next one starts on empty nodes again
                    store.r.delete(keys.node_alloc(name))
            table[f"{tasks} tasks"] = {
                "nodes": len(nodes), "place_gang ms": min(samples) * 1000,
                "place_gang CPU ms": min(cpu_samples) * 1000,
                "commit ms": min(c[0] for c in commit) * 1000,
                "commit CPU ms": min(c[1] for c in commit) * 1000}
            if server is not None:  # in 10 ms ticks: a sum over the three
                table[f"{tasks} tasks"]["commit Redis CPU ms (3 commits)"] = \
                    sum(c[2] for c in commit) * 1000
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
    service = service_passes()
    figures[f"Scheduler.run_pass on Redis, {SERVICE_NODES} nodes"] = service
    committed = float(service["first pass"]["placed/s"])
    decided = float(service["policy alone (decide)"]["placed/s"])
    figures["committed placements/s (first pass)"] = committed
    figures[f"committed vs target {TARGET_PLACEMENTS_PER_S:.0f}"] = \
        committed / TARGET_PLACEMENTS_PER_S
    figures["committed / decided (same nodes and queue)"] = committed / decided
    # The same per CPU second (the pass's scheduler and Redis CPU, the policy's
    # own): steadier than the wall clock when other work shares the machine.
    committed_cpu = float(service["first pass"]["placed per CPU s"])
    figures["committed per CPU s (scheduler + Redis)"] = committed_cpu
    figures[f"committed per CPU s vs target {TARGET_PLACEMENTS_PER_S:.0f}"] = \
        committed_cpu / TARGET_PLACEMENTS_PER_S
    figures["committed / decided, per CPU s"] = \
        committed_cpu / float(service["policy alone (decide)"]["placed per CPU s"])
    figures["committed placements/s (first pass, queue read before)"] = \
        float(service["first pass, queue read before"]["placed/s"])
    figures[f"committed, queue read before, vs target {TARGET_PLACEMENTS_PER_S:.0f}"] = \
        float(service["first pass, queue read before"]["placed/s"]) / TARGET_PLACEMENTS_PER_S
    if SERVICE_NODES >= RAISED_TARGET_NODES:
        for label in ("first pass", "first pass, queue read before"):
            figures[f"{label}: committed vs raised target {RAISED_TARGET_PER_S:.0f}"] = \
                float(service[label]["placed/s"]) / RAISED_TARGET_PER_S
    gangs = big_gangs()
    figures["big gangs (4 two-GPU tasks a node)"] = gangs
    sizes_run = list(GANG_SIZES)
    for column, label in (("place_gang CPU ms", "place_gang CPU"),
                          ("commit CPU ms", "commit CPU"), ("commit ms", "commit wall clock")):
        seconds = [float(gangs[f"{n} tasks"][column]) for n in sizes_run]
        figures[f"big gangs: {label} growth exponent"] = math.log(
            seconds[-1] / seconds[0]) / math.log(sizes_run[-1] / sizes_run[0])
    return figures
