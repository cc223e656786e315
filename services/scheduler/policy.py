"""The scheduling policy: a snapshot in, decisions out. No IO, no clock.

What it decides each pass (docs/design.md, "Scheduling policy"; docs/scheduling.md):

- **Guarantees.** A VC's `gpuQuota` is guaranteed. A queued job that fits in
  what its VC's guarantee has left (counting only running work of its class
  or higher) is *guaranteed*; any other job, and every `oppo` job, may only
  *borrow* GPUs no guaranteed work wants, unless its VC forbids borrowing.
- **Order.** Guaranteed work is placed first, then work that borrows, so a
  job preempted to make room is never placed again ahead of the job it made
  room for. In each phase the VCs take turns, one job a turn, the VC using
  the least of its guarantee first; within a VC, class, then least attained
  service (`Las`: a job that already had much GPU time goes after those that
  had little, and waiting lifts it back), then submit order; once a VC's job
  waits to borrow, its later jobs wait behind it rather than take the
  guarantee ahead of it.
- **Preemption.** A guaranteed job that does not fit may take the place of
  borrowed work, or of its own VC's lower-class work: the fewest victims,
  borrowed first, lowest class, youngest; with `Las.preempt`, also its own
  VC's work of its class that has had more GPU time, in its first attempt
  (so a job loses at most one attempt that way). Victims get a grace
  period; the job waits for them on the nodes it will use (reserved
  meanwhile). No victim is chosen by lower-class or borrowed work.
- **Reservations.** The first job of each VC that does not fit reserves the
  nodes it will use, and the share of its VC's guarantee it needs: later
  jobs of the pass backfill only on other nodes, and only as borrowers, so
  a stream of small jobs cannot starve a big one.
- **Partial placement.** A job without gang allocation
  (`extras.gangAllocation: false`) asks only for its tasks still waiting, and
  starts as many of them as fit now; the rest stay in its queue at its place
  and go through the same rules in later passes. It counts against its VC's
  guarantee by what it holds, it reserves (and preempts) only for its
  largest waiting task, and while some of its tasks wait it is not chosen
  as a victim (it is still queued; preemption takes placed jobs only).
- **Budgets.** A VC that has spent its GPU-hour budget of the period
  (`spent`, read by the service) holds no guarantee: its running work is
  borrowed (preemptible), and its queued jobs either run only as `oppo`
  (borrowing) or wait (`BudgetExhausted`), as the VC's setting says. A
  user who has spent their own budget within a VC (`user_spent`) is held
  the same way (`UserBudgetExhausted`), their jobs only: the VC's other
  users keep its guarantee, and a job of theirs waiting on its budget is
  not its VC's head (it neither reserves nor holds the others back).
- **Explanations.** Every job left waiting gets a reason code, a message,
  what blocks it and, when it can be known, an estimated start.

The scheduler service feeds it Redis's records; bench/sim.py feeds it a
trace with simulated time. Both run exactly this code.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from services.scheduler.core import (
    Cluster,
    JobRequest,
    NodeFree,
    copy_node,
    place_gang,
    place_some,
)
from services.scheduler.decisions import (
    BUDGET,
    DEFAULT_LAS,
    INSUFFICIENT,
    NEVER,
    NO_GPU_TYPE,
    NO_NODES,
    PREEMPTING,
    QUOTA,
    RESERVED,
    UNSCHEDULABLE,
    USER_BUDGET,
    Attained,
    Blocker,
    Las,
    Placed,
    Plan,
    Preemption,
    RunningJob,
    Waiting,
)
from services.scheduler.heap import paused_gc
from services.scheduler.standing import VcStanding, could_hold
from shared.domain.cluster import BORROWED, GUARANTEED, VcPolicy, gpu_type_matches
from shared.domain.models import split_job_id
from shared.domain.priority import PriorityClass
from shared.state.usage import Spend

MAX_VICTIM_CANDIDATES = 256
def plan(cluster: Cluster, queue: Sequence[JobRequest], running: Sequence[RunningJob],
         vcs: Mapping[str, VcPolicy], now_ms: int,
         attained: Mapping[str, Attained] | None = None, las: Las = DEFAULT_LAS,
         spent: Mapping[str, Spend] | None = None,
         user_spent: Mapping[tuple[str, str], Spend] | None = None,
         on_placed: Callable[[Placed], None] | None = None) -> Plan:
    """One pass's decisions. `cluster` holds the free resources of the nodes
    that may take work (live, schedulable) and is used up as jobs are placed.
    `attained`: job id -> what a queued job has had (absent: a job that
    never ran, waiting since its submit). `spent`: VC -> its budget's spend
    this period (only those exhausted matter); `user_spent`: (VC, user) ->
    that user's own budget's spend in the VC, alike. `on_placed` gets each
    placement as it is made, in `Plan.placed`'s order: a placement is never
    taken back later in the pass, so the service binds it while the pass
    decides the rest."""
    exhausted = {vc: s for vc, s in (spent or {}).items() if s.exhausted}
    users = {owner: s for owner, s in (user_spent or {}).items() if s.exhausted}
    with paused_gc():
        return _Pass(cluster, queue, running, vcs, now_ms, attained or {}, las,
                     exhausted, users, on_placed).run()


class _Pass:
    def __init__(self, cluster: Cluster, queue: Sequence[JobRequest],
                 running: Sequence[RunningJob], vcs: Mapping[str, VcPolicy],
                 now_ms: int, attained: Mapping[str, Attained] | None = None,
                 las: Las = DEFAULT_LAS, exhausted: Mapping[str, Spend] | None = None,
                 users_exhausted: Mapping[tuple[str, str], Spend] | None = None,
                 on_placed: Callable[[Placed], None] | None = None) -> None:
        self.cluster = cluster
        self.on_placed = on_placed
        self.exhausted = exhausted or {}  # VCs that spent their budget: no guarantee
        self.users_exhausted = users_exhausted or {}  # (VC, user) alike, their jobs only
        self.attained = attained or {}
        self.las = las
        self.queue = queue
        self.running = running
        self.now_ms = now_ms
        self.standing = VcStanding(vcs)
        self.out = Plan()
        self.reserved: dict[str, NodeFree] = {}  # node -> as it was when reserved
        self.reserved_for: dict[str, str] = {}  # node -> job id
        self.never: dict[tuple[object, ...], Waiting | None] = {}
        self.failed: dict[tuple[object, ...], Waiting] = {}  # fit key -> why
        self.no_victims: set[tuple[object, ...]] = set()
        self.deferring: set[str] = set()  # VCs with a non-oppo job left to borrow
        # fit key -> (the situation it was worked out in, the answer): see _wait
        self.explained: dict[tuple[object, ...], tuple[tuple[bool, int, int], Waiting]] = {}
        self.nodes = list(cluster.nodes.values())  # every node that may take work
        # them all emptied, for "could it ever fit": made when first needed
        self.empty: Cluster | None = None
        self.held_by: dict[tuple[object, ...], list[str]] = {}
        # A job still queued (partly placed, without gang allocation) is not
        # a victim: preemption takes placed jobs back to their queue.
        queued = {request.job_id for request in queue}
        self.victim_pool = [r for r in running if not r.preempted_by and r.job_id not in queued]
        self.preempting_for: dict[str, list[RunningJob]] = {}
        for r in running:
            if r.preempted_by:
                self.preempting_for.setdefault(r.preempted_by, []).append(r)

    # ------------------------------------------------------------ standing

    def _settle_standing(self) -> None:
        """Guarantees as the running work stands: promote borrowed work that
        now fits its VC's guarantee, demote the lowest work that does not."""
        standing = self.standing
        by_vc: dict[str, list[RunningJob]] = {}
        for r in self.running:
            standing.used[r.vc] = standing.used.get(r.vc, 0) + r.gpus
            if not r.preempted_by:  # leaving: its guarantee is free for others
                by_vc.setdefault(r.vc, []).append(r)
        for vc, jobs in by_vc.items():
            guarantee = standing.policy(vc).guarantee
            kept: list[RunningJob] = []
            total = 0
            for r in sorted(jobs, key=lambda r: (-r.priority, r.mode != GUARANTEED,
                                                 r.started_ms, r.job_id)):
                fits = r.priority != PriorityClass.OPPO and total + r.gpus <= guarantee \
                    and self._spent_on(r.job_id, vc) is None
                if fits:
                    kept.append(r)
                    total += r.gpus
                    standing.count(vc, r.priority, r.gpus)
                mode = GUARANTEED if fits else BORROWED
                if mode != r.mode:
                    self.out.modes[r.job_id] = mode
            standing.demotable[vc] = kept

    def _mode(self, r: RunningJob) -> str:
        return self.out.modes.get(r.job_id, r.mode)

    def _admit(self, placed: Placed) -> None:
        """Count a placed job; guaranteed work pushes its VC's lowest
        guaranteed running work out to borrowed if the guarantee would
        overflow (it is then the first to make room for others)."""
        standing, request = self.standing, placed.request
        standing.used[request.vc] = standing.used.get(request.vc, 0) + placed.gpus
        if placed.mode != GUARANTEED:
            return
        standing.count(request.vc, request.priority, placed.gpus)
        guarantee = standing.policy(request.vc).guarantee
        kept = standing.demotable.get(request.vc, [])
        for work in sorted(kept, key=lambda r: (r.priority, -r.started_ms)):
            if standing.guaranteed_gpus(request.vc) <= guarantee:
                break
            kept.remove(work)
            standing.count(request.vc, work.priority, -work.gpus)
            self.out.modes[work.job_id] = BORROWED

    # ---------------------------------------------------------------- pass

    def run(self) -> Plan:
        self._settle_standing()
        by_vc: dict[str, list[JobRequest]] = {}
        for request in sorted(map(self._within_budget, self.queue), key=self._order):
            by_vc.setdefault(request.vc, []).append(request)
        # Guaranteed work first, then what borrows: a job preempted to make
        # room is never placed again ahead of the job it made room for.
        borrowing: dict[str, list[JobRequest]] = {}
        self._turns(by_vc, lambda request, first: self._guaranteed(request, first, borrowing))
        self._turns(borrowing, self._borrowing)
        self._positions(by_vc)
        return self.out

    def _within_budget(self, request: JobRequest) -> JobRequest:
        """The job as its VC's budget lets it run: a spent VC's job that is
        to run only as oppo is weighed as oppo (borrowing, preemptible)."""
        spent = self._spent_on(request.job_id, request.vc)
        if spent is None or spent.budget.on_exhausted != "oppo" \
                or request.priority == PriorityClass.OPPO:
            return request
        return replace(request, priority=PriorityClass.OPPO)

    def _spent_on(self, job_id: str, vc: str) -> Spend | None:
        """The spent budget that holds the job: its VC's, else its user's in the VC."""
        spent = self.exhausted.get(vc)
        if spent is None and self.users_exhausted:
            spent = self.users_exhausted.get((vc, split_job_id(job_id)[0]))
        return spent

    def _budget_wait(self, request: JobRequest, why: Waiting | None = None) -> Waiting:
        """Why a spent VC's (or user's) job waits: for the next period
        (`wait`, or a VC that does not borrow), or as oppo for GPUs to
        borrow (`why`)."""
        spent = self._spent_on(request.job_id, request.vc)
        assert spent is not None
        blocker = Blocker("userBudget", spent.user) if spent.user \
            else Blocker("budget", request.vc)
        if why is None:
            whose = "their" if spent.user else "its"
            rest = f"{whose} jobs wait" if spent.budget.on_exhausted != "oppo" else \
                (f"{whose} jobs run only as oppo, on borrowed GPUs, and virtual cluster "
                 f"{request.vc} does not borrow: they wait")
            return Waiting(USER_BUDGET if spent.user else BUDGET,
                           f"{spent.describe()}; {rest} for the next {spent.budget.period}",
                           (blocker,))
        return Waiting(why.reason, spent.describe() + ", so it runs only as oppo, on "
                       "borrowed GPUs: " + why.message, (*why.blocked_by, blocker),
                       why.estimated_start_ms)

    def _level(self, request: JobRequest) -> int:
        """The job's LAS level as its attained service stands (not lifted by
        waiting: that orders the queue, it does not make a job a preemptor)."""
        seen = self.attained.get(request.job_id)
        return self.las.level(seen.gpu_ms) if seen is not None else 0

    def _order(self, request: JobRequest) -> tuple[int, int, int]:
        """Class, then least attained service (lifted by waiting), then submit order."""
        seen = self.attained.get(request.job_id)
        level = self.las.queue_of(seen, self.now_ms) if seen is not None else 0
        return (PriorityClass.PROD - request.priority, level, request.seq)

    def _turns(self, by_vc: Mapping[str, list[JobRequest]],
               consider: Callable[[JobRequest, bool], bool]) -> None:
        """The VCs' queues in turns, one job a turn, the VC using the least of
        its guarantee first. `consider` places a job or not (False: the VC's
        later jobs are no longer its first)."""
        heap = [(self.standing.share(vc), vc, 0) for vc in by_vc]
        heapq.heapify(heap)
        held: set[str] = set()  # VCs whose first job in this phase did not start
        for _ in range(sum(len(q) for q in by_vc.values())):
            if not heap:
                break
            if len(heap) == 1:  # one VC left to take turns: the rest of its queue in order
                _, vc, at = heap[0]
                for request in by_vc[vc][at:]:
                    if not consider(request, vc not in held):
                        held.add(vc)
                return
            _, vc, at = heapq.heappop(heap)
            queue = by_vc[vc]
            if not consider(queue[at], vc not in held):
                held.add(vc)
            if at + 1 < len(queue):  # only this VC's share moved
                heapq.heappush(heap, (self.standing.share(vc), vc, at + 1))

    def _guaranteed(self, request: JobRequest, first: bool,
                    borrowing: dict[str, list[JobRequest]]) -> bool:
        """Place the job on its VC's guarantee if that holds it (preempting
        for it if need be); else leave it for the borrowing turns. A VC's
        first job that does not start keeps the share of the guarantee it
        needs, so the VC's later jobs borrow instead of using it up."""
        spent = self._spent_on(request.job_id, request.vc)
        if spent is not None and spent.budget.on_exhausted != "oppo":
            self.out.waiting[request.job_id] = self._budget_wait(request)
            # A user's budget holds back that user's jobs only: the VC's
            # next job is still its first (it may reserve, hold the guarantee).
            return bool(spent.user)
        vc = self.standing.policy(request.vc)
        if request.vc not in self.deferring and self.standing.fits_guarantee(request, vc):
            why = self._try_place(request, GUARANTEED)
            if why is None:
                return True
            why = self._wait(request, why, True, first)
            self.out.waiting[request.job_id] = why
        else:
            # It waits to borrow; its VC's later jobs (no higher class) wait
            # behind it, not on the guarantee ahead of it.
            borrowing.setdefault(request.vc, []).append(request)
            if request.priority != PriorityClass.OPPO:
                self.deferring.add(request.vc)
            why = None
        if first and request.priority != PriorityClass.OPPO \
                and request.gpus <= vc.guarantee and (why is None or why.reason not in NEVER):
            self.standing.count(request.vc, request.priority, request.gpus)
        return False

    def _borrowing(self, request: JobRequest, first: bool) -> bool:
        """Place the job on GPUs no guaranteed work took this pass, if its VC
        borrows; the VC's first that does not fit reserves its nodes."""
        spent = self._spent_on(request.job_id, request.vc) is not None
        if not self.standing.policy(request.vc).borrowing:
            self.out.waiting[request.job_id] = self._budget_wait(request) if spent \
                else self._quota_wait(request)
            return False
        why = self._try_place(request, BORROWED)
        if why is None:
            return True
        why = self._wait(request, why, False, first)
        self.out.waiting[request.job_id] = self._budget_wait(request, why) if spent else why
        return False

    # ------------------------------------------------------------ placing

    def _try_place(self, request: JobRequest, mode: str) -> Waiting | None:
        """Place the job on free, unreserved resources; else why not. A fit
        that failed once fails for every later job alike in this pass (the
        free resources only shrink)."""
        why = self.failed.get(request.fit_key)
        if why is not None:
            return why
        result = place_gang(self.cluster, request) if request.gang \
            else place_some(self.cluster, request)
        if not result.placements:
            assert result.shortfall is not None
            why = Waiting(INSUFFICIENT, result.shortfall.describe(),
                          (Blocker("resources", result.shortfall.resource),))
            self.failed[request.fit_key] = why
            return why
        # Partly placed (no gang allocation): the rest waits for a later pass.
        placed = Placed(request, result.placements, mode)
        self.out.placed.append(placed)
        if self.on_placed is not None:
            self.on_placed(placed)
        self._admit(placed)
        return None

    def _wait(self, request: JobRequest, why: Waiting, guaranteed: bool,
              head: bool) -> Waiting:
        """Why the job cannot start now, and what this pass does about it:
        preempt for it (guaranteed work), or reserve its nodes (a VC's head).

        Most of a long queue waits for the same few reasons: a job that is
        neither a head nor owed victims gets the answer worked out for the
        last job alike, while the reservations and victims are unchanged."""
        key = request.fit_key
        situation = (guaranteed, len(self.reserved), len(self.victim_pool))
        plain = not head and request.job_id not in self.preempting_for
        if plain:
            known = self.explained.get(key)
            if known is not None and known[0] == situation:
                return known[1]
        never = self._never(request)
        if never is not None:
            return never
        victims = self.preempting_for.get(request.job_id)
        if victims:
            return self._await_victims(request, victims)
        if guaranteed and key not in self.no_victims:
            chosen = self._choose_victims(_needed_now(request))
            if chosen:
                for victim in chosen:
                    self.out.preempt.append(Preemption(victim, request.job_id))
                    self.victim_pool.remove(victim)
                return self._await_victims(request, chosen)
            self.no_victims.add(key)
        reserved_by = self._held_by_reservation(request)
        if reserved_by:
            why = Waiting(RESERVED, "the resources it needs are reserved for "
                          + ", ".join(reserved_by) + ", ahead of it",
                          tuple(Blocker("reservation", j) for j in reserved_by))
        elif head:
            nodes = self._reserve(request)
            if nodes:
                return Waiting(why.reason, why.message + "; reserved "
                               + ", ".join(nodes) + " for it until they free up",
                               why.blocked_by + tuple(Blocker("nodes", n) for n in nodes))
        if plain:
            self.explained[key] = (situation, why)
        return why

    def _never(self, request: JobRequest) -> Waiting | None:
        """Why the job cannot run on these nodes even once they are empty."""
        key = request.fit_key
        if key not in self.never:
            self.never[key] = self._judge_never(request)
        return self.never[key]

    def _judge_never(self, request: JobRequest) -> Waiting | None:
        if not self.nodes:
            return Waiting(NO_NODES, "no node has reported in yet (or every node is "
                           "cordoned)", (Blocker("nodes", "none"),))
        if request.gpu_type and request.gpus and not any(
                gpu_type_matches(n.gpu_model, request.gpu_type) for n in self.nodes):
            return Waiting(NO_GPU_TYPE, f"no live node has GPUs of type {request.gpu_type}",
                           (Blocker("gpuType", request.gpu_type),))
        if not request.gang:  # each task on its own, one after another
            for task in {t.fit: t for t in request.tasks}.values():
                if not any(could_hold(n, task, request.gpu_type) for n in self.nodes):
                    if self.empty is None:
                        self.empty = Cluster(n.emptied() for n in self.nodes)
                    short = self.empty.shortfall(task, request.gpu_type)
                    return Waiting(UNSCHEDULABLE, "it cannot fit even on empty nodes: "
                                   + short.describe(), (Blocker("resources", short.resource),))
            return None
        # Cheap first: each task fits some empty node, and the GPUs add up.
        capacity = sum(len(n.all_gpus or n.free_gpus) for n in self.nodes)
        if request.gpus <= capacity and all(
                any(could_hold(n, task, request.gpu_type) for n in self.nodes)
                for task in {t.fit: t for t in request.tasks}.values()):
            return None
        # Then exactly, on every node emptied, for the reason to give.
        if self.empty is None:
            self.empty = Cluster(n.emptied() for n in self.nodes)
        result = place_gang(self.empty, request)
        if result.placed:  # put the nodes back as they were: empty
            touched = {p.node for p in result.placements}
            self.empty.restore({n.name: n.emptied() for n in self.nodes if n.name in touched})
            return None
        assert result.shortfall is not None
        return Waiting(UNSCHEDULABLE, "it cannot fit even on empty nodes: "
                       + result.shortfall.describe(),
                       (Blocker("resources", result.shortfall.resource),))

    def _quota_wait(self, request: JobRequest) -> Waiting:
        vc = request.vc
        guarantee = self.standing.policy(vc).guarantee
        used = self.standing.guaranteed_gpus(vc, request.priority)
        if request.priority == PriorityClass.OPPO:
            message = (f"oppo jobs run only on borrowed GPUs, and virtual cluster {vc} "
                       "does not borrow")
        else:
            message = (f"virtual cluster {vc} uses {used} of its {guarantee} guaranteed GPUs "
                       f"and does not borrow; the job needs {request.gpus}")
        return Waiting(QUOTA, message, (Blocker("quota", vc),))

    # ------------------------------------------------------- reservations

    def _reserve(self, request: JobRequest) -> tuple[str, ...]:
        """Set aside the nodes the job will use: those freest now that can
        hold it once their tasks end. Later jobs of the pass do not get them."""
        nodes = sorted(self.cluster.nodes.values(), key=lambda n: (-len(n.free_gpus), n.name))
        empty = Cluster((n.emptied() for n in nodes), by_name=False)
        result = place_gang(empty, _needed_now(request))
        if not result.placed:
            return ()
        names = tuple(sorted({p.node for p in result.placements}))
        self._take(names, request.job_id)
        return names

    def _take(self, names: Iterable[str], job_id: str) -> None:
        for name, node in self.cluster.remove(names).items():
            self.reserved[name] = node
            self.reserved_for[name] = job_id
        self.out.reserved_after.setdefault(job_id, len(self.out.placed))
        self.out.reservations[job_id] = tuple(sorted(
            n for n, j in self.reserved_for.items() if j == job_id))

    def _held_by_reservation(self, request: JobRequest) -> list[str]:
        """The jobs whose reserved nodes could take this one now."""
        if not self.reserved:
            return []
        key = (request.fit_key, len(self.reserved))
        if key not in self.held_by:
            result = place_gang(Cluster(copy_node(n) for n in self.reserved.values()),
                                _needed_now(request))
            self.held_by[key] = sorted({self.reserved_for[p.node]
                                        for p in result.placements})
        return self.held_by[key]

    # --------------------------------------------------------- preemption

    def _candidates(self, request: JobRequest) -> list[RunningJob]:
        """Who may make room for a guaranteed job: borrowed work anywhere,
        lower-class work of its own VC, and (`Las.preempt`) its own VC's work
        of its class at a higher level in its first attempt; borrowed first,
        then lowest class, then youngest."""
        las, now, level = self.las, self.now_ms, self._level(request)
        pool = [r for r in self.victim_pool
                if self._mode(r) == BORROWED
                or (r.vc == request.vc and r.priority < request.priority)
                or (las.preempt and r.vc == request.vc and r.priority == request.priority
                    and r.attempt == 0 and las.level(r.served_ms(now)) > level)]
        pool.sort(key=lambda r: (self._mode(r) != BORROWED, r.priority, -r.started_ms,
                                 r.job_id))
        return pool[:MAX_VICTIM_CANDIDATES]

    def _fits_without(self, request: JobRequest, victims: Sequence[RunningJob]) -> bool:
        nodes = {name: copy_node(n) for name, n in self.cluster.nodes.items()}
        for victim in victims:
            for alloc in victim.allocations:
                node = nodes.get(alloc.node)
                if node is None:
                    continue  # on a reserved or unschedulable node: no help
                node.free_gpus = sorted(set(node.free_gpus) | set(alloc.gpus))
                node.free_cpus += alloc.cpus
                node.free_memory_mb += alloc.memory_mb
                node.used_ports.difference_update(alloc.ports)
                node.port_hint = 0
        return place_gang(Cluster(nodes.values()), request).placed

    def _choose_victims(self, request: JobRequest) -> list[RunningJob]:
        """The fewest victims that make room, in preference order; none if
        even all of them would not."""
        pool = self._candidates(request)
        free = sum(len(n.free_gpus) for n in self.cluster.nodes.values())
        if free + sum(r.gpus for r in pool) < request.gpus:
            return []
        chosen: list[RunningJob] = []
        for victim in pool:
            chosen.append(victim)
            free += victim.gpus
            if free >= request.gpus and self._fits_without(request, chosen):
                break
        else:
            return []
        for victim in reversed(chosen[:-1]):  # drop any the rest make unneeded
            rest = [v for v in chosen if v is not victim]
            if self._fits_without(request, rest):
                chosen = rest
        return chosen

    def _await_victims(self, request: JobRequest, victims: Sequence[RunningJob]) -> Waiting:
        """The job waits for its victims to leave, on their nodes (reserved)."""
        self._take({a.node for v in victims for a in v.allocations}, request.job_id)
        deadlines = [v.preempt_deadline_ms or self.now_ms + v.grace_ms for v in victims]
        names = sorted(v.job_id for v in victims)
        return Waiting(PREEMPTING, "preempting " + ", ".join(names)
                       + " to make room; it starts when they have stopped",
                       tuple(Blocker("job", n) for n in names), max(deadlines))

    # ---------------------------------------------------------- positions

    def _positions(self, by_vc: Mapping[str, list[JobRequest]]) -> None:
        waiting, positions = self.out.waiting, self.out.positions
        for queue in by_vc.values():
            position = 0
            for request in queue:
                if request.job_id in waiting:
                    position += 1
                    positions[request.job_id] = position


def _needed_now(request: JobRequest) -> JobRequest:
    """What the job needs to make progress: all of it (a gang), else its
    largest waiting task (the one a partial placement tries first)."""
    if request.gang or len(request.tasks) <= 1:
        return request
    largest = min(request.tasks, key=lambda t: (-t.gpus, -t.cpus, -t.memory_mb, t.role, t.index))
    return JobRequest(request.job_id, request.version, request.attempt, (largest,), request.vc,
                      request.priority, request.seq, request.gpu_type, request.gang)


def fifo_plan(cluster: Cluster, queue: Sequence[JobRequest]) -> Plan:
    """The baseline the trace simulator compares with: strict submit order,
    no guarantees, no backfill (the first job that does not fit holds every
    job behind it)."""
    out = Plan()
    blocked = False
    with paused_gc():
        for request in sorted(queue, key=lambda r: r.seq):
            if not blocked:
                result = place_gang(cluster, request)
                if result.placed:
                    out.placed.append(Placed(request, result.placements, GUARANTEED))
                    continue
                blocked = True
            out.waiting[request.job_id] = Waiting(INSUFFICIENT, "waits its turn")
    return out
