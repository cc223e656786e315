"""The scheduling policy: one table-driven case per rule, then properties
over random clusters, running work and queues."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scheduler.core import Cluster, JobRequest, PortRequest
from services.scheduler.decisions import (
    DEFAULT_LAS,
    NO_GPU_TYPE,
    PREEMPTING,
    QUOTA,
    RESERVED,
    UNSCHEDULABLE,
    Attained,
    Las,
    Placed,
)
from services.scheduler.policy import fifo_plan, plan
from shared.domain.cluster import BORROWED, GUARANTEED, VcPolicy, gpu_type_matches, vc_policies
from shared.domain.priority import queue_order
from shared.infra.config import ConfigError, load_settings
from tests.support.policy import (
    HOUR,
    NOW,
    OPPO,
    PROD,
    TEST,
    Run,
    World,
    placed,
    preempted,
    req,
    run_plan,
    scenario,
    worlds,
)

# --------------------------------------------------------------- guarantees

QUOTA_CASES = [
    pytest.param({"a": 8}, [req("j", 4, vc="research")], [],
                 {"research": VcPolicy(4), "default": VcPolicy(4)},
                 {"j": GUARANTEED}, id="a job within its VC's guarantee runs guaranteed"),
    pytest.param({"a": 8}, [req("j", 6, vc="research")], [],
                 {"research": VcPolicy(4), "default": VcPolicy(4)},
                 {"j": BORROWED}, id="a job beyond its guarantee borrows idle GPUs"),
    pytest.param({"a": 8}, [req("j", 6, vc="research")], [],
                 {"research": VcPolicy(4, borrowing=False), "default": VcPolicy(4)},
                 {}, id="a VC that does not borrow keeps to its guarantee"),
    pytest.param({"a": 8}, [req("j", 2, vc="research")],
                 [Run("r1", "research", {"a": 4})],
                 {"research": VcPolicy(4), "default": VcPolicy(4)},
                 {"j": BORROWED}, id="the guarantee used up, the next job borrows"),
    pytest.param({"a": 8}, [req("j", 2, vc="research", cls=OPPO)], [],
                 {"research": VcPolicy(4), "default": VcPolicy(4)},
                 {"j": BORROWED}, id="an oppo job never runs guaranteed"),
    pytest.param({"a": 8}, [req("j", 2, vc="nowhere")], [],
                 {"default": VcPolicy(8)},
                 {"j": BORROWED}, id="a VC nobody configured has no guarantee"),
]


@pytest.mark.parametrize(("nodes", "queue", "runs", "vcs", "expected"), QUOTA_CASES)
def test_guarantees_and_borrowing(nodes: dict[str, int], queue: list[JobRequest],
                                  runs: list[Run], vcs: dict[str, VcPolicy],
                                  expected: dict[str, str]) -> None:
    assert placed(run_plan(nodes, queue, runs, vcs)) == expected


def test_a_vc_that_does_not_borrow_says_so() -> None:
    result = run_plan({"a": 8}, [req("j", 6, vc="research")], [],
                      {"research": VcPolicy(4, borrowing=False), "default": VcPolicy(4)})
    assert result.waiting["j"].reason == QUOTA
    assert "does not borrow" in result.waiting["j"].message


@pytest.mark.parametrize(("quotas", "total", "expected"), [
    pytest.param({"default": None, "a": 4, "b": 2}, 16, {"default": 10, "a": 4, "b": 2},
                 id="default is guaranteed what the others leave"),
    pytest.param({"default": None, "a": 20}, 16, {"default": 0, "a": 20},
                 id="an overcommitted cluster leaves default nothing"),
    pytest.param({"default": 3, "a": 4}, 16, {"default": 3, "a": 4},
                 id="a quota given to default is its guarantee"),
    pytest.param({"default": None, "a": None}, 8, {"default": 8, "a": 0},
                 id="a VC without a quota has no guarantee"),
])
def test_vc_policies(quotas: dict[str, int | None], total: int,
                     expected: dict[str, int]) -> None:
    assert {n: p.guarantee for n, p in vc_policies(quotas, {}, total).items()} == expected


def test_running_work_is_promoted_into_a_guarantee_that_freed_up() -> None:
    result = run_plan({"a": 8}, [], [Run("old", "research", {"a": 2}, mode=BORROWED)],
                      {"research": VcPolicy(4), "default": VcPolicy(4)})
    assert result.modes == {"old": GUARANTEED}


def test_a_prod_job_pushes_its_vcs_test_work_out_of_the_guarantee() -> None:
    result = run_plan({"a": 8}, [req("p", 4, vc="research", cls=PROD)],
                      [Run("t", "research", {"a": 4}, cls=TEST)],
                      {"research": VcPolicy(4), "default": VcPolicy(4)})
    assert placed(result) == {"p": GUARANTEED}
    assert result.modes == {"t": BORROWED}
    assert not result.preempt  # it fitted beside it: no one had to stop


# --------------------------------------------------------------- order

def test_within_a_vc_a_higher_class_goes_first() -> None:
    result = run_plan({"a": 4}, [req("test-first", 4, seq=1), req("prod-later", 4, seq=2,
                                                                   cls=PROD)])
    assert placed(result) == {"prod-later": GUARANTEED}
    assert result.positions["test-first"] == 1


def test_the_vc_furthest_below_its_guarantee_goes_first() -> None:
    # both VCs are guaranteed 4; "busy" already uses 3, "idle" nothing: one slot of 4 left
    result = run_plan({"a": 8}, [req("busy-job", 1, vc="busy", seq=1),
                                 req("idle-job", 4, vc="idle", seq=2)],
                      [Run("r", "busy", {"a": 3})],
                      {"busy": VcPolicy(4), "idle": VcPolicy(4), "default": VcPolicy(0)})
    assert "idle-job" in placed(result)


def test_positions_count_within_each_vc() -> None:
    queue = [req(f"x{i}", 8, vc="x", seq=i) for i in range(3)] + [req("y0", 8, vc="y", seq=9)]
    result = run_plan({"a": 4}, queue, [], {"x": VcPolicy(2), "y": VcPolicy(2)})
    assert [result.positions[f"x{i}"] for i in range(3)] == [1, 2, 3]
    assert result.positions["y0"] == 1


def test_queue_order_puts_class_before_submit_time() -> None:
    assert queue_order(PROD, 99) < queue_order(TEST, 1) < queue_order(OPPO, 0)
    assert queue_order(TEST, 1) < queue_order(TEST, 2)


# --------------------------------------------------------------- preemption

SPLIT = {"research": VcPolicy(4), "default": VcPolicy(4)}
OVERCOMMITTED = {"research": VcPolicy(4), "default": VcPolicy(8)}

PREEMPTION_CASES = [
    pytest.param(
        [req("owner", 4, vc="research", seq=5)],
        [Run("lender", "default", {"a": 8}, mode=BORROWED)],
        SPLIT,
        {"lender": "owner"},
        id="guaranteed work preempts borrowed work"),
    pytest.param(
        [req("borrower", 4, vc="default", seq=5)],
        [Run("guaranteed", "research", {"a": 4}), Run("b2", "default", {"a": 4},
                                                      mode=BORROWED)],
        SPLIT,
        {},
        id="borrowed work never preempts"),
    pytest.param(
        [req("owner", 4, vc="research", seq=5)],
        [Run("g", "default", {"a": 8}, mode=GUARANTEED)],
        OVERCOMMITTED,
        {},
        id="guaranteed work of another VC is never a victim"),
    pytest.param(
        [req("owner", 2, vc="research", seq=5)],
        [Run("old", "default", {"a": 2}, mode=BORROWED, started=1),
         Run("young", "default", {"a": 2}, mode=BORROWED, started=9),
         Run("g", "default", {"a": 4}, mode=GUARANTEED)],
        SPLIT,
        {"young": "owner"},
        id="the youngest borrowed job goes first"),
    pytest.param(
        [req("owner", 2, vc="research", seq=5)],
        [Run("test-b", "default", {"a": 2}, mode=BORROWED, cls=TEST, started=9),
         Run("oppo-b", "default", {"a": 2}, mode=BORROWED, cls=OPPO, started=1),
         Run("g", "default", {"a": 4}, mode=GUARANTEED)],
        SPLIT,
        {"oppo-b": "owner"},
        id="the lowest class goes before the youngest"),
    pytest.param(
        [req("owner", 4, vc="research", seq=5)],
        [Run("b1", "default", {"a": 1}, mode=BORROWED, started=9),
         Run("b4", "default", {"a": 4}, mode=BORROWED, started=1),
         Run("g", "default", {"a": 3}, mode=GUARANTEED)],
        {"research": VcPolicy(5), "default": VcPolicy(3)},
        {"b4": "owner"},
        id="the fewest victims: a victim the others make unneeded is spared"),
    pytest.param(
        [req("prod", 4, vc="research", cls=PROD, seq=5)],
        [Run("test", "research", {"a": 4}, cls=TEST),
         Run("g", "default", {"a": 4}, mode=GUARANTEED)],
        SPLIT,
        {"test": "prod"},
        id="a VC's prod job preempts its own test job"),
    pytest.param(
        [req("owner", 4, vc="research", seq=5)],
        [Run("leaving", "default", {"a": 4}, mode=BORROWED, preempted_by="owner"),
         Run("other", "default", {"a": 4}, mode=BORROWED)],
        SPLIT,
        {},
        id="no new victims while the chosen ones are leaving"),
]


@pytest.mark.parametrize(("queue", "runs", "vcs", "expected"), PREEMPTION_CASES)
def test_preemption(queue: list[JobRequest], runs: list[Run], vcs: dict[str, VcPolicy],
                    expected: dict[str, str]) -> None:
    result = run_plan({"a": 8}, queue, runs, vcs)
    assert preempted(result) == expected
    for job_id in expected.values():
        why = result.waiting[job_id]
        assert why.reason == PREEMPTING
        assert why.estimated_start_ms == NOW + 30_000  # the victims' grace period


@pytest.mark.parametrize("lender_vc", ["default", "aardvark"])
def test_a_requeued_victim_is_not_placed_again_ahead_of_its_preemptor(lender_vc: str) -> None:
    """No preemption loop: the victim's VC comes first by name and by share,
    but guaranteed work is placed before any that borrows."""
    queue = [req("lender", 8, vc=lender_vc, cls=OPPO, seq=1),
             req("owner", 4, vc="research", seq=2)]
    result = run_plan({"a": 8}, queue, [],
                      {"research": VcPolicy(4), lender_vc: VcPolicy(4)})
    assert placed(result) == {"owner": GUARANTEED}
    assert "lender" in result.waiting


def test_a_preempting_job_waits_on_its_victims_and_nobody_takes_their_nodes() -> None:
    queue = [req("owner", 8, vc="research", seq=1), req("small", 1, vc="default", seq=2)]
    runs = [Run("lender", "default", {"a": 8}, mode=BORROWED, preempted_by="owner")]
    result = run_plan({"a": 8, "b": 1}, queue, runs,
                      {"research": VcPolicy(8), "default": VcPolicy(1)})
    assert result.waiting["owner"].reason == PREEMPTING
    assert result.waiting["owner"].estimated_start_ms == NOW + 5000
    assert result.reservations["owner"] == ("a",)
    assert placed(result) == {"small": GUARANTEED}
    assert result.placed[0].placements[0].node == "b"


# --------------------------------------------------------------- starvation

def test_the_head_reserves_its_nodes_and_small_jobs_backfill_elsewhere() -> None:
    # "a" is busy with 6 of 8 GPUs; "b" has 2 free of 4. The 8-GPU head can
    # only ever run on "a": it reserves it; the 1-GPU jobs after it go to "b".
    queue = [req("big", 8, seq=1)] + [req(f"small{i}", 1, seq=2 + i) for i in range(4)]
    result = run_plan({"a": 8, "b": 4}, queue, [Run("r", "default", {"a": 6, "b": 2})])
    assert result.reservations == {"big": ("a",)}
    assert set(placed(result)) == {"small0", "small1"}
    assert all(p.placements[0].node == "b" for p in result.placed)
    assert result.waiting["small2"].reason == RESERVED  # "a" has room, kept for "big"


def test_a_job_beyond_the_guarantee_is_not_overtaken_by_its_vcs_later_jobs() -> None:
    # default is guaranteed 4 and uses 3; "big" can only borrow; the small
    # jobs after it would fit the guarantee, but wait behind it (and off its node)
    queue = [req("big", 8, seq=1), req("small", 1, seq=2)]
    result = run_plan({"a": 8}, queue, [Run("r", "default", {"a": 3})],
                      {"default": VcPolicy(4), "research": VcPolicy(4)})
    assert not result.placed
    assert result.reservations == {"big": ("a",)}
    assert result.waiting["small"].reason == RESERVED


def test_a_job_that_fits_only_in_a_reservation_is_told_so() -> None:
    queue = [req("big", 8, seq=1), req("small", 2, seq=2)]
    result = run_plan({"a": 8}, queue, [Run("r", "default", {"a": 6})])
    assert result.waiting["small"].reason == RESERVED
    assert [b.name for b in result.waiting["small"].blocked_by] == ["big"]


def test_without_reservations_fifo_holds_everything_behind_the_head() -> None:
    cluster, _ = scenario({"a": 4})
    result = fifo_plan(cluster, [req("big", 8, seq=1), req("small", 1, seq=2)])
    assert not result.placed


# ----------------------------------------- least attained service (Tiresias)

LAS = Las((HOUR, 10 * HOUR), starve_ms=2 * HOUR, preempt=True)


def served(gpu_hours: float, waited_hours: float = 0) -> Attained:
    """A queued job that ran `gpu_hours` GPU-hours in ended attempts and has
    waited `waited_hours` since its last one ended."""
    return Attained(int(gpu_hours * HOUR), NOW - int(waited_hours * HOUR))


LAS_ORDER_CASES = [
    pytest.param([req("served", 4, seq=1), req("new", 4, seq=2)], {"served": served(2)},
                 ["new"], id="within a class, the job with less GPU time goes first"),
    pytest.param([req("served", 4, seq=1), req("new", 4, seq=2)], {"served": served(0.5)},
                 ["served"], id="below the first threshold, submit order"),
    pytest.param([req("much", 4, seq=1), req("some", 4, seq=2)],
                 {"much": served(20), "some": served(2)},
                 ["some"], id="the lower of two served queues goes first"),
    pytest.param([req("served", 4, seq=1, cls=PROD), req("new", 4, seq=2)],
                 {"served": served(20)},
                 ["served"], id="the class still comes before attained service"),
    pytest.param([req("served", 4, seq=1), req("new", 4, seq=2)], {"served": served(2, 2)},
                 ["served"], id="a wait of starve_ms lifts it one queue, to its submit place"),
    pytest.param([req("served", 4, seq=1), req("new", 4, seq=2)], {"served": served(20, 2)},
                 ["new"], id="one queue per starve_ms: the second is still above"),
    pytest.param([req("served", 4, seq=1), req("new", 4, seq=2)], {"served": served(20, 4)},
                 ["served"], id="after starve_ms per threshold, back at its submit place"),
]


@pytest.mark.parametrize(("queue", "attained", "expected"), LAS_ORDER_CASES)
def test_least_attained_service_orders_a_class(queue: list[JobRequest],
                                                attained: dict[str, Attained],
                                                expected: list[str]) -> None:
    # one 4-GPU node: only the first job in the order starts
    result = run_plan({"a": 4}, queue, attained=attained, las=LAS)
    assert list(placed(result)) == expected
    assert [j for j, _ in sorted(result.positions.items(), key=lambda kv: kv[1])] == \
        [r.job_id for r in queue if r.job_id not in expected]


LAS_PREEMPT_CASES = [
    pytest.param([Run("long", "default", {"a": 8}, started=NOW - 2 * HOUR // 8)], {},
                 {"long": "new"},
                 id="a new job preempts its VC's work of its class that had more GPU time"),
    pytest.param([Run("long", "default", {"a": 8}, started=NOW - 2 * HOUR // 8, attempt=1)],
                 {}, {}, id="but only in the victim's first attempt: once per job"),
    pytest.param([Run("short", "default", {"a": 8}, started=NOW - HOUR // 16)], {}, {},
                 id="not work still in the first queue"),
    pytest.param([Run("long", "default", {"a": 8}, started=NOW - 2 * HOUR // 8)],
                 {"new": served(1.5)}, {}, id="not for a job at the same level"),
    pytest.param([Run("long", "research", {"a": 8}, started=NOW - 2 * HOUR // 8)], {}, {},
                 id="not another VC's guaranteed work"),
    pytest.param([Run("long", "default", {"a": 8}, started=NOW - 2 * HOUR // 8, cls=PROD)],
                 {}, {}, id="not a higher class"),
]


@pytest.mark.parametrize(("runs", "attained", "expected"), LAS_PREEMPT_CASES)
def test_least_attained_service_preemption(runs: list[Run], attained: dict[str, Attained],
                                           expected: dict[str, str]) -> None:
    # default is guaranteed 16 on one 8-GPU node: "new" fits its guarantee, not the node
    vcs = {"default": VcPolicy(16), "research": VcPolicy(8)}
    result = run_plan({"a": 8}, [req("new", 8, seq=9)], runs, vcs, attained=attained, las=LAS)
    assert preempted(result) == expected
    assert not result.placed
    if expected:
        assert result.waiting["new"].reason == PREEMPTING


def test_the_first_job_in_the_las_order_is_the_one_that_reserves() -> None:
    # "served" was submitted first but had 2 GPU-hours: "new" is the VC's
    # first job and reserves the busy node; "small", never run either, comes
    # next and may not take the node's free GPUs; "served" is last.
    queue = [req("served", 8, seq=1), req("new", 8, seq=2), req("small", 2, seq=3)]
    result = run_plan({"a": 8}, queue, [Run("r", "default", {"a": 6}, cls=PROD)],
                      attained={"served": served(2)}, las=LAS)
    assert result.reservations == {"new": ("a",)}
    assert result.positions == {"new": 1, "small": 2, "served": 3}
    assert result.waiting["small"].reason == RESERVED


def test_least_attained_service_can_be_switched_off() -> None:
    queue = [req("served", 4, seq=1), req("new", 4, seq=2)]
    assert list(placed(run_plan({"a": 4}, queue, attained={"served": served(20)},
                                las=Las()))) == ["served"]
    runs = [Run("long", "default", {"a": 8}, started=NOW - 2 * HOUR // 8)]
    off = Las(LAS.thresholds_gpu_ms, LAS.starve_ms, preempt=False)
    assert not run_plan({"a": 8}, [req("new", 8)], runs, {"default": VcPolicy(16)},
                        las=off).preempt


def test_the_order_comes_from_the_settings() -> None:
    settings = load_settings({"PAI_SCHEDULER_LAS_THRESHOLDS": "60,600",
                              "PAI_SCHEDULER_LAS_STARVE_SECONDS": "30",
                              "PAI_SCHEDULER_LAS_PREEMPT": "no"})
    assert Las.from_settings(settings) == Las((60_000, 600_000), 30_000, False)
    assert Las.from_settings(load_settings({})) == DEFAULT_LAS
    assert DEFAULT_LAS.thresholds_gpu_ms and DEFAULT_LAS.preempt
    for bad in ("600,60", "-1", "1h", "60,60"):
        with pytest.raises(ConfigError, match="PAI_SCHEDULER_LAS_THRESHOLDS"):
            load_settings({"PAI_SCHEDULER_LAS_THRESHOLDS": bad})


@settings(max_examples=200, deadline=None)
@given(gpu_ms=st.integers(0, 100 * HOUR), since=st.integers(0, NOW),
       waits=st.lists(st.integers(0, 20 * HOUR), min_size=2, max_size=6))
def test_a_queued_jobs_queue_only_improves_with_its_wait(gpu_ms: int, since: int,
                                                         waits: list[int]) -> None:
    seen = Attained(gpu_ms, since)
    queues = [LAS.queue_of(seen, since + w) for w in sorted(waits)]
    assert queues == sorted(queues, reverse=True)
    assert queues[0] <= LAS.level(gpu_ms)
    bound = since + len(LAS.thresholds_gpu_ms) * LAS.starve_ms
    assert LAS.queue_of(seen, bound) == 0


@settings(max_examples=100, deadline=None)
@given(served_ms=st.integers(0, 30 * HOUR), late=st.integers(0, 10 * HOUR),
       later=st.integers(0, 10 * HOUR))
def test_nothing_starves_a_waiting_jobs_position_only_improves(
        served_ms: int, late: int, later: int) -> None:
    # Nothing can start (a prod job of another VC holds the only node); "x",
    # served some, waits among jobs that never ran, submitted before and after it.
    queue = [req(f"q{i}", 1, seq=2 * i) for i in range(4)] + [req("x", 1, seq=3)]
    attained = {"x": Attained(served_ms, NOW)}
    vcs = {"default": VcPolicy(8), "other": VcPolicy(8)}
    runs = [Run("prod", "other", {"a": 8}, cls=PROD)]
    positions = []
    for wait in sorted((0, late, late + later, 2 * LAS.starve_ms)):
        cluster, running = scenario({"a": 8}, runs)
        result = plan(cluster, queue, running, vcs, NOW + wait, attained, LAS)
        assert not result.placed and not result.preempt
        positions.append(result.positions["x"])
    assert positions == sorted(positions, reverse=True)
    # waited long enough, only the jobs submitted before it are ahead of it
    assert positions[-1] <= 1 + sum(1 for r in queue if r.seq < 3)


# --------------------------------------------------------------- placement

def test_a_failed_fit_does_not_hold_back_a_job_alike_but_for_its_ports() -> None:
    late = req("late-ports", 0, seq=1, ports=(PortRequest("p", 2, begin_at=15099),))
    early = req("early-ports", 0, seq=2, ports=(PortRequest("p", 2, begin_at=15000),))
    result = run_plan({"a": 1}, [late, early])
    assert "early-ports" in placed(result)
    assert result.waiting["late-ports"].reason == UNSCHEDULABLE


@pytest.mark.parametrize(("model", "gpu_type", "matches"), [
    pytest.param("Tesla V100-SXM2-32GB", "V100", True, id="a word of the model"),
    pytest.param("Tesla V100-SXM2-32GB", "v100", True, id="case does not matter"),
    pytest.param("Tesla V100-SXM2-32GB", "V10", False, id="part of a word does not"),
    pytest.param("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe", True, id="the whole model"),
    pytest.param("virtual", "", False, id="empty asks for nothing"),
])
def test_gpu_type_matches(model: str, gpu_type: str, matches: bool) -> None:
    assert gpu_type_matches(model, gpu_type) is matches


def test_gpu_type_restricts_the_nodes() -> None:
    cluster, _ = scenario({"k80": 8}, model="Tesla K80")
    other, _ = scenario({"v100": 8}, model="Tesla V100")
    nodes = list(cluster.nodes.values()) + list(other.nodes.values())
    result = plan(Cluster(nodes), [req("j", 2, gpu_type="V100")], [],
                  {"default": VcPolicy(16)}, NOW)
    assert result.placed[0].placements[0].node == "v100"


def test_a_gpu_type_no_node_has_is_named() -> None:
    result = run_plan({"a": 8}, [req("j", 1, gpu_type="H100")], model="Tesla V100")
    assert result.waiting["j"].reason == NO_GPU_TYPE


def test_multi_gpu_tasks_get_gpus_of_one_topology_group() -> None:
    # GPUs 0-3 and 4-7 are two NVLink islands; GPU 0 and 1 are taken.
    groups = {g: g // 4 for g in range(8)}
    result = run_plan({"a": 8}, [req("j", 4)], [Run("r", "default", {"a": 2})],
                      groups=groups)
    assert result.placed[0].placements[0].gpus == (4, 5, 6, 7)


def test_a_gang_lands_on_as_few_nodes_as_it_can() -> None:
    result = run_plan({"a": 8, "b": 8, "c": 8}, [req("j", 2, tasks=4)])
    assert {p.node for p in result.placed[0].placements} == {"a"}


# ----------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(world=worlds())
def test_properties_of_a_pass(world: World) -> None:
    nodes, runs, queue, vcs, attained = world
    cluster, running = scenario(nodes, runs)
    free = {name: set(n.free_gpus) for name, n in cluster.nodes.items()}
    handed: list[Placed] = []
    result = plan(cluster, queue, running, vcs, NOW, attained, LAS, on_placed=handed.append)

    # each placement is handed over as it is made, in order, and never taken back
    assert handed == result.placed
    # every job is decided once: placed or waiting
    ids = [p.request.job_id for p in result.placed]
    assert len(ids) == len(set(ids))
    assert set(ids).isdisjoint(result.waiting)
    assert set(ids) | set(result.waiting) == {r.job_id for r in queue}
    # gangs are whole, and no GPU is given twice or given while held
    given_gpus: Counter[tuple[str, int]] = Counter()
    for p in result.placed:
        assert sorted((t.role, t.index) for t in p.placements) == \
            sorted((t.role, t.index) for t in p.request.tasks)
        for t in p.placements:
            given_gpus.update((t.node, g) for g in t.gpus)
            assert set(t.gpus) <= free[t.node], "a held GPU was given"
    assert all(count == 1 for count in given_gpus.values()), "a GPU was given twice"
    # a reservation is never taken by a later job in the same pass
    for job_id, names in result.reservations.items():
        for p in result.placed[result.reserved_after[job_id]:]:
            assert not {t.node for t in p.placements} & set(names), "a reservation was taken"
    # preemption: only for guaranteed-eligible work, only of borrowed or the
    # same VC's lower classes (or, least attained service, of its class at a
    # higher level, in a first attempt), each victim once, never one already leaving
    by_id = {r.job_id: r for r in running}
    victims = [p.victim.job_id for p in result.preempt]
    assert len(victims) == len(set(victims)), "a job was preempted twice"
    requests = {r.job_id: r for r in queue}
    for p in result.preempt:
        victim, winner = by_id[p.victim.job_id], requests[p.by]
        assert not victim.preempted_by
        assert winner.priority != OPPO, "opportunistic work preempted someone"
        mode = result.modes.get(victim.job_id, victim.mode)
        level = LAS.level(attained.get(winner.job_id, Attained()).gpu_ms)
        las_victim = (victim.vc == winner.vc and victim.priority == winner.priority
                      and victim.attempt == 0
                      and LAS.level(victim.served_ms(NOW)) > level)
        assert mode == BORROWED or las_victim or (victim.vc == winner.vc
                                                  and victim.priority < winner.priority), \
            "guaranteed work was preempted for borrowed or equal work"
        assert result.waiting[p.by].reason == PREEMPTING
    # borrowed placements never ask anyone to leave; guaranteed ones fit the guarantee
    for vc, policy in vcs.items():
        guaranteed = sum(p.request.gpus for p in result.placed
                         if p.request.vc == vc and p.mode == GUARANTEED)
        kept = sum(r.gpus for r in running if r.vc == vc and not r.preempted_by
                   and result.modes.get(r.job_id, r.mode) == GUARANTEED)
        assert guaranteed + kept <= policy.guarantee or guaranteed == 0
