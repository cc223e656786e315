"""The control plane's judgement of its nodes, each repair round
(shared/domain/lease.py has the rules; docs/multi-node.md the story).

- Lost: a node silent past its lease + grace + margin (its agent has
  certainly stopped its containers by then) is declared lost; its live
  tasks fail as the platform's fault and their jobs are placed elsewhere.
- The control plane's own outage: most nodes silent at once, or nobody
  judging for a while (Redis or the scheduler down), declares nobody lost;
  when it ends, every node gets its lease's time again to renew.
- Conditions: whether a node may take work (or is unreachable,
  reconciling, settling, or not ready with the reason its agent or this
  control plane found) is not stored: each scheduling pass, this round and
  the API judge it from the leases they read, with one rule
  (shared/domain/lease.py `conditions_of`), so a node shown NOT_READY is
  one no pass places on.
- Gray failures: a node that renews but cannot start containers (its
  engine hangs, its launcher stopped answering) has its waiting launches
  given back to the queue, so its gangs are placed elsewhere, instead of
  waiting on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from shared.domain.lease import (
    Condition,
    Judgement,
    NodeSilence,
    Outage,
    conditions_of,
    judge_nodes,
)
from shared.domain.models import parse_attempt_task_key
from shared.domain.states import TaskState
from shared.infra.config import Settings
from shared.state import leases
from shared.state.store import Store

log = logging.getLogger("pai.scheduler")

# How often the scheduler's repair loop judges the nodes (services/scheduler/run.py).
REPAIR_SECONDS = 5.0
# A node with a gray failure keeps its running tasks; these conditions give
# its launches that have not started yet back to the queue.
REPLACE_LAUNCHES = (Condition.NOT_READY,)


@dataclass(frozen=True)
class NodeView:
    """What one repair round found: each node's condition, and the outage."""

    conditions: Mapping[str, tuple[Condition, str]]
    outage: Outage
    now_ms: int


FailTasks = Callable[[list[str], Callable[[str], str]], None]
FailLaunch = Callable[[str, int, str, int, str], None]


class NodeWarden:
    def __init__(self, settings: Settings, store: Store, fail_node_tasks: FailTasks,
                 fail_launch: FailLaunch) -> None:
        self.settings, self.store = settings, store
        self.fail_node_tasks, self.fail_launch = fail_node_tasks, fail_launch
        self.lost_floor_ms = int(settings.node_lost_seconds * 1000)
        self.settle_ms = int(settings.node_settle_seconds * 1000)

    def round(self) -> NodeView:
        """Judge every node: three round trips, plus what a lost or unready
        node costs."""
        view = leases.read_cluster(self.store)
        silences, now = view.silences, view.now_ms
        judgement = judge_nodes(silences, now, view.outage, self.lost_floor_ms,
                                int(REPAIR_SECONDS * 1000))
        leases.write_judgement(self.store, judgement.outage, judgement.quiet)
        conditions = conditions_of(replace(view, outage=judgement.outage), self.lost_floor_ms,
                                   self.settle_ms)
        self._tell(judgement, len(silences))
        lost = [name for name in judgement.lost
                if leases.mark_lost(self.store, name, silences[name].renewed_ms)]
        if lost:
            self.fail_node_tasks(lost, lambda name: self._lost_reason(silences[name], now,
                                                                      judgement.outage))
        self._give_back_launches(conditions)
        return NodeView(conditions, judgement.outage, now)

    def _tell(self, judgement: Judgement, nodes: int) -> None:
        if judgement.outage_began:
            log.error("control plane outage: %d of %d nodes stopped renewing at once (%s); "
                      "no node is declared lost while it lasts", len(judgement.quiet), nodes,
                      ", ".join(judgement.quiet[:10]))
        elif judgement.outage_ended:
            log.warning("control plane back: every node has its lease's time again to "
                        "renew before any is declared lost")

    def _lost_reason(self, silence: NodeSilence, now: int, outage: Outage) -> str:
        quiet = now - max(silence.renewed_ms, outage.ended_ms)
        return f"lost (its lease was not renewed for {quiet // 1000} s)"

    def _give_back_launches(self, conditions: Mapping[str, tuple[Condition, str]]) -> None:
        """Launches waiting on a node that cannot start them go back to the queue."""
        bad = {name: reason for name, (c, reason) in conditions.items()
               if c in REPLACE_LAUNCHES}
        if not bad:
            return
        for member in self.store.launching():
            job_id, attempt, role, index = parse_attempt_task_key(member)
            task = self.store.get_task(job_id, attempt, role, index)
            if task is None or task.state != TaskState.LAUNCHING or task.node not in bad:
                continue
            node = str(task.node)
            log.warning("node %s cannot start %s: %s; placing its job again elsewhere", node,
                        member, bad[node])
            self.fail_launch(job_id, attempt, role, index, f"node {node} not ready: {bad[node]}")

    def overdue(self, node: str, now: int) -> None:
        """A launch on `node` is overdue while the node renews: keep it from
        new work for the settling time (a launcher stuck on its engine)."""
        reason = (f"a launch was not started within "
                  f"{self.settings.launch_timeout_seconds:.0f} s")
        if leases.mark_node(self.store, node, reason, now + self.settle_ms):
            log.warning("node %s marked not ready for %.0f s: %s", node,
                        self.settle_ms / 1000, reason)
