"""One chaos run: the platform as processes, jobs with known outcomes, kill -9s
on a seeded schedule, then the invariants (tests/chaos/audit.py).

`python -m tests.chaos.run --seed N` runs one outside pytest (DOCKER_HOST
set, the test image built); tests/chaos/test_chaos.py runs it under pytest.
The summary line names the seed: the same seed gives the same jobs and the
same fault schedule (the moments land on a busy machine's clock, so the
interleavings differ run to run; the invariants must hold for every one).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from shared.state import keys
from shared.state.store import Store
from tests.chaos import audit
from tests.chaos.harness import USER, Api, ChaosCluster, free_and_total
from tests.chaos.workload import RUNS, ChaosJob, Fault, fault_plan, workload

FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
TICK_S = 0.2
PORT_BASES = (24000, 24500, 25000)


@dataclass
class Summary:
    seed: int
    jobs: int
    faults: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)  # never final, or final in the wrong state
    duplicated: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    charged: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)
    died: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    refused: int = 0
    seconds: float = 0.0
    # What the checks covered: task runs counted, GPU/port spans audited,
    # attempts that failed by the platform's fault (retried uncharged)
    runs: int = 0
    lost_tasks: int = 0  # containers that died with the lost node
    compacted: int = 0  # finished jobs folded into their archive (must be none: see harness)
    spans: int = 0
    platform_retries: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.leaked or self.overlaps
                    or self.charged or self.unreadable or self.server_errors or self.died)

    def line(self) -> str:
        return ("chaos " + " ".join(f"{k}={v}" for k, v in (
            ("seed", self.seed), ("faults", json.dumps(dict(sorted(self.faults.items())),
                                                      separators=(",", ":"))),
            ("jobs", self.jobs), ("lost", len(self.lost)),
            ("duplicated", len(self.duplicated)),
            ("leaked", len(self.leaked) + len(self.overlaps)),
            ("5xx", len(self.server_errors)), ("503", self.statuses.get(503, 0)),
            ("refused", self.refused), ("wrong-retries", len(self.charged)),
            ("unreadable-logs", len(self.unreadable)), ("died", len(self.died)),
            ("runs", self.runs), ("spans", self.spans), ("died-with-node", self.lost_tasks),
            ("compacted", self.compacted),
            ("platform-retries", self.platform_retries),
            ("seconds", round(self.seconds)))))

    def details(self) -> str:
        parts = []
        for name in ("lost", "duplicated", "leaked", "overlaps", "charged", "unreadable",
                     "server_errors", "died"):
            values = getattr(self, name)
            if values:
                parts.append(f"{name}:\n  " + "\n  ".join(values[:20]))
        return "\n".join(parts)


class Run:
    def __init__(self, cluster: ChaosCluster, jobs: list[ChaosJob], faults: list[Fault],
                 summary: Summary, seconds: float) -> None:
        self.cluster, self.jobs, self.plan = cluster, jobs, list(faults)
        self.summary, self.seconds = summary, seconds
        self.by_name = {j.name: j for j in jobs}
        self.accepted: dict[str, float] = {}
        self.stop_sent: set[str] = set()
        self.running_since: dict[str, float] = {}
        self.states: dict[str, str] = {}
        self.restarts: list[tuple[float, str]] = []
        self.spare_ports = list(PORT_BASES[2:])
        self.next_node = 2

    def live_nodes(self) -> list[str]:
        return [n for n in self.cluster.nodes if n not in self.cluster.lost]

    def resolve(self, target: str) -> str | None:
        if "#" not in target:
            return target
        kind, _, number = target.partition("#")
        nodes = self.live_nodes()
        node = nodes[int(number)] if int(number) < len(nodes) else None
        return None if node is None else f"{kind}@{node}"

    def inject(self, fault: Fault, now: float) -> None:
        cluster = self.cluster
        if fault.target == "lose":
            # The busiest node: best fit packs work onto few nodes, and a loss
            # of an idle one would prove nothing.
            nodes = self.live_nodes()
            name = max(nodes, key=lambda n: (sum(
                c.status == "running" for c in cluster.containers(n)), nodes.index(n)))
            self.summary.lost_tasks += cluster.lose_node(name)
            self.summary.faults["node-lost"] += 1
            # A new machine takes its place, so gangs across two nodes still fit.
            cluster.add_node(f"n{self.next_node}", self.spare_ports.pop(0))
            self.next_node += 1
            return
        service = self.resolve(fault.target)
        if service is None or service in cluster.down:
            return
        cluster.kill(service)
        self.summary.faults[service.partition("@")[0]] += 1
        self.restarts.append((now + fault.down_s, service))

    def tick(self, api: Api, now: float, submit_until: float) -> None:
        while self.plan and self.plan[0].at_s <= now:
            self.inject(self.plan.pop(0), now)
        for at, service in [r for r in self.restarts if r[0] <= now]:
            self.restarts.remove((at, service))
            if service in self.cluster.down and not (
                    "@" in service and service.partition("@")[2] in self.cluster.lost):
                self.cluster.start(service)
        due = int(len(self.jobs) * min(1.0, now / submit_until)) if submit_until else len(
            self.jobs)
        for job in self.jobs[:due]:
            if job.name in self.accepted:
                continue
            resp = api.call("POST", f"/api/v1/user/{USER[0]}/jobs", json=job.config)
            if resp is None or resp.status_code >= 500:
                break  # down: the next tick tries again
            if resp.status_code in (202, 409):  # 409: an earlier try got in
                self.accepted[job.name] = now
            else:
                raise AssertionError(f"{job.name} refused: {resp.status_code} {resp.text}")

    def poll(self, api: Api, now: float) -> None:
        resp = api.call("GET", "/api/v1/jobs", params={"username": USER[0], "limit": 1000})
        if resp is None or resp.status_code != 200:
            return
        self.states = {row["name"]: row["state"] for row in resp.json()}
        for name, accepted_at in self.accepted.items():
            job = self.by_name[name]
            if job.kind != "stop" or name in self.stop_sent:
                continue
            if self.states.get(name) == "RUNNING":
                self.running_since.setdefault(name, now)
            # Stopped after 10 s of running (so a node lost meanwhile has work
            # on it), or after 40 s whatever its state.
            if now - self.running_since.get(name, now) >= 10 or now - accepted_at > 40:
                resp = api.call("PUT", f"/api/v1/user/{USER[0]}/jobs/{name}/executionType",
                                json={"value": "STOP"})
                if resp is not None and resp.status_code in (200, 202):
                    self.stop_sent.add(name)

    def settled(self) -> bool:
        return len(self.accepted) == len(self.jobs) and all(
            self.states.get(j.name) in FINAL for j in self.jobs) and all(
            j.name in self.stop_sent for j in self.jobs if j.kind == "stop")


def run_chaos(seed: int, *, jobs: int, seconds: float, docker_client: docker.DockerClient,
              image: str, work_dir: Path, drain_seconds: float = 240.0,
              gpus_per_node: int = 8, lost_seconds: float = 8.0) -> Summary:
    """One chaos run; its summary (the caller asserts on it)."""
    started = time.monotonic()
    chosen = workload(seed, jobs, image, gpus_per_node)
    summary = Summary(seed, len(chosen))
    cluster = ChaosCluster(work_dir, gpus_per_node=gpus_per_node, lost_seconds=lost_seconds,
                           docker_client=docker_client)
    try:
        cluster.start_all({"n0": PORT_BASES[0], "n1": PORT_BASES[1]})
        admin, api = cluster.sign_in()
        run = Run(cluster, chosen, fault_plan(seed, seconds), summary, seconds)
        begin = time.monotonic()
        last_poll = 0.0
        deadline = seconds + drain_seconds
        while (now := time.monotonic() - begin) < deadline:
            if now >= seconds and (cluster.down or run.restarts):
                run.restarts.clear()
                run.plan.clear()
                cluster.restart_down()
            run.tick(api, now, submit_until=seconds * 0.6)
            if now - last_poll >= 1.0:
                last_poll = now
                run.poll(api, now)
                if now >= seconds and run.settled():
                    break
            summary.died += [f"{s} exited on its own:\n{cluster.tail(s)}"
                             for s in cluster.died() if s not in summary.died]
            if summary.died:
                break
            time.sleep(TICK_S)
        cluster.restart_down()
        _check(run, cluster, admin, api, summary)
    finally:
        summary.statuses = dict(cluster.calls.statuses)
        summary.refused = cluster.calls.refused
        summary.server_errors = list(cluster.calls.forbidden)
        summary.seconds = time.monotonic() - started
        cluster.shutdown()
    return summary


def _check(run: Run, cluster: ChaosCluster, admin: Api, api: Api, summary: Summary) -> None:
    """The invariants, on the platform as it stands after the run."""
    store = Store.from_url(cluster.redis.operator_url)
    details: dict[str, dict[str, Any]] = {}
    for job in run.jobs:
        if job.name not in run.accepted:
            summary.lost.append(f"{job.name}: never accepted")
            continue
        resp = api.until("GET", f"/api/v1/user/{USER[0]}/jobs/{job.name}", (200, 404))
        if resp.status_code == 404:
            summary.lost.append(f"{job.name}: accepted, then gone")
            continue
        detail = details[job.name] = resp.json()
        summary.platform_retries += detail["jobStatus"]["platformRetries"]
        state = detail["jobStatus"]["state"]
        if state != job.expected_state:
            summary.lost.append(f"{job.name}: {state}, expected {job.expected_state}")
            continue
        wrong = audit.charged_mismatch(job.charged_retries, detail["jobStatus"]["retries"],
                                       detail.get("attempts", []))
        if wrong:
            summary.charged.append(f"{job.name}: {wrong}")

    # No task ran twice within one attempt.
    runs: dict[str, int] = {}
    for marker in cluster.storage.rglob(f"{RUNS}/*"):
        if marker.name != "failed":
            runs[f"{marker.parent.parent.parent.name}/{marker.name}"] = len(
                marker.read_text().splitlines())
    summary.duplicated += audit.duplicated_runs(runs)
    summary.runs = sum(runs.values())

    # No GPU or port held twice at once; every placed task settled.
    held = []
    for job_id in store.r.zrange(keys.JOBS, 0, -1):
        held += audit.holdings(job_id, store.get_events(job_id))
        summary.compacted += bool(store.r.exists(keys.job_archive(job_id)))
    if summary.compacted:  # the harness's settings say otherwise: the audit would be blind
        raise AssertionError(f"{summary.compacted} jobs were compacted during the run: their "
                             "placed events are summarised, and the audit would miss them")
    summary.overlaps += audit.overlaps(held)
    summary.spans = len(held)
    summary.leaked += [f"never settled: {t}" for t in audit.unsettled(held)]

    # Everything released, no container left behind.
    nodes = admin.until("GET", "/api/v1/nodes", (200,)).json()
    for name in run.live_nodes():
        free, total = free_and_total(nodes, name)
        if free != total:
            summary.leaked.append(f"node {name}: {free} of {total} GPUs free")
        left = cluster.containers(name)
        summary.leaked += [f"container {c.name} on {name}" for c in left]

    # Every log is readable.
    for name, detail in details.items():
        for role, status in (detail.get("taskRoles") or {}).items():
            for task in status["taskStatuses"]:
                if not task.get("startedTime"):
                    continue  # never ran: it has no log
                resp = api.until(
                    "GET", f"/api/v1/user/{USER[0]}/jobs/{name}/tasks/{role}/"
                           f"{task['taskIndex']}/log", (200, 404))
                if resp.status_code != 200:
                    summary.unreadable.append(f"{name} {role}[{task['taskIndex']}]: "
                                              f"{resp.status_code}")
    store.r.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run")
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(10**6))
    parser.add_argument("--jobs", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--image", default="pai-test/busybox:latest")
    parser.add_argument("--keep", type=Path, help="an empty folder to keep the services' "
                        "logs, Redis' files and the jobs' storage in")
    args = parser.parse_args(argv)
    client = docker.from_env(timeout=120)
    with tempfile.TemporaryDirectory(prefix="pai-chaos-") as work_dir:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
        summary = run_chaos(args.seed, jobs=args.jobs, seconds=args.seconds,
                            docker_client=client, image=args.image,
                            work_dir=args.keep or Path(work_dir))
    print(summary.line())
    if not summary.ok:
        print(summary.details(), file=sys.stderr)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
