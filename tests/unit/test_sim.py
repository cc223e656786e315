"""The trace simulator (bench/sim.py): deterministic traces, conservation,
and small hand-made traces whose outcome is worked out exactly."""

from __future__ import annotations

import pytest

from bench import sim
from services.scheduler.decisions import DEFAULT_LAS
from shared.domain.cluster import VcPolicy
from shared.domain.priority import PriorityClass

TEST, OPPO = PriorityClass.TEST, PriorityClass.OPPO


def job(job_id: str, at: float, gpus: int, duration: float, vc: str = "default",
        priority: PriorityClass = TEST, tasks: int = 1) -> sim.TraceJob:
    return sim.TraceJob(job_id, at, vc, priority, gpus, tasks, duration)


def test_a_trace_is_the_same_for_a_seed_and_differs_for_another() -> None:
    assert sim.generate(300, seed=7) == sim.generate(300, seed=7)
    assert sim.generate(300, seed=7) != sim.generate(300, seed=8)


@pytest.mark.parametrize("policy", list(sim.POLICIES))
def test_every_job_ends_once_and_no_more_gpus_are_held_than_exist(policy: str) -> None:
    trace = sim.generate(200, seed=3, nodes=8)
    result = sim.simulate(trace, policy, nodes=8)
    assert set(result.ends) == {j.job_id for j in trace}
    assert set(result.ends.values()) == {1}
    assert 0 < result.max_busy <= 8 * sim.GPUS_PER_NODE
    line = sim.summary(result, nodes=8)
    assert 0 < line["gpu_utilisation"] <= 1


def test_a_preempted_job_restarts_from_scratch_and_ends() -> None:
    # One 8-GPU node; research is guaranteed 4. The oppo job borrows all 8;
    # research's job preempts it, runs once the grace period is over, and the
    # oppo job runs again from the start.
    trace = [job("oppo", 0, 8, 1000, priority=OPPO), job("owner", 10, 4, 100, vc="research")]
    vcs = {"research": VcPolicy(4), "default": VcPolicy(4)}
    result = sim.simulate(trace, "pai", nodes=1, vcs=vcs, grace_s=30)
    assert result.preemptions == 1
    assert result.jct == {"owner": 40 + 100 - 10, "oppo": 140 + 1000}
    assert result.ends == {"owner": 1, "oppo": 1}


def test_fifo_holds_a_small_job_behind_a_big_one_that_pai_lets_backfill() -> None:
    # Three 8-GPU nodes, busy with a (8 GPUs), b (4) and e (6). c needs a
    # whole node: FIFO keeps d (2 GPUs) behind it until e ends at 50; pai
    # reserves a node for c and runs d at once on e's node's two free GPUs.
    trace = [job("a", 0, 8, 100), job("b", 0, 4, 1000), job("e", 0, 6, 50),
             job("c", 1, 8, 100), job("d", 2, 2, 10)]
    fifo = sim.simulate(trace, "fifo", nodes=3, vcs={"default": VcPolicy(24)})
    pai = sim.simulate(trace, "pai", nodes=3, vcs={"default": VcPolicy(24)})
    assert fifo.jct == {"a": 100, "b": 1000, "e": 50, "c": 149, "d": 58}
    assert pai.jct == {"a": 100, "b": 1000, "e": 50, "c": 149, "d": 10}
    assert sim.summary(pai, 3)["mean_jct_s"] < sim.summary(fifo, 3)["mean_jct_s"]


def test_the_report_has_one_line_per_policy_with_ratios_against_fifo() -> None:
    lines = sim.report(sim.generate(150, seed=5, nodes=8), nodes=8)
    assert [line["policy"] for line in lines] == list(sim.POLICIES)
    assert lines[0]["ratio"]["mean_jct_s"] == 1.0
    assert lines[1]["ratio"]["mean_jct_s"] == lines[1]["mean_jct_s"] / lines[0]["mean_jct_s"]


def test_a_preempted_job_that_had_much_gpu_time_goes_after_a_new_one() -> None:
    # One 8-GPU node, research and default guaranteed 4 each. "long" borrows
    # all 8 GPUs; research's "owner" preempts it at 1000, and it stops at
    # 1030 having had 8 x 1030 GPU-seconds, past the first LAS threshold.
    # When "owner" ends, "fresh" (submitted after "long", never run) goes
    # first: least attained service; "long" starts again from scratch after it.
    assert DEFAULT_LAS.thresholds_gpu_ms[0] <= 8 * 1030 * 1000
    trace = [job("long", 0, 8, 10_000), job("owner", 1000, 4, 100, vc="research"),
             job("fresh", 1010, 8, 100)]
    vcs = {"research": VcPolicy(4), "default": VcPolicy(4)}
    result = sim.simulate(trace, "pai", nodes=1, vcs=vcs, grace_s=30)
    assert result.preemptions == 1
    assert result.jct == {"owner": 1130 - 1000, "fresh": 1230 - 1010, "long": 11_230}
