"""Node leases in Redis: claims, renewals and the control plane's outage
record, every stamp from Redis's TIME (the rules are shared/domain/lease.py).

A lease lives in keys.node_lease(name) (a hash) and, for the readers that
only want "when did each node last renew", in the NODES sorted set, both
written by the same script so they never disagree. The node record itself
(keys.node: GPUs, CPUs, memory) is written by a renewal that carries it,
only while the renewing agent holds the name: an impostor never overwrites
the node's IP.

Roles: a node agent is two processes, its launcher and its monitor, on one
Docker engine. Either renews; the monitor also says how the node stands
(its phase and any problem). Each role keeps its process's instance id in
the lease, so a second process of one role on the same machine is noticed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.domain.lease import (
    Claim,
    ClaimAnswer,
    ClusterView,
    Lease,
    NodeSilence,
    Outage,
    Phase,
)
from shared.state import keys, scripts
from shared.state.store import Store


class Role(StrEnum):
    LAUNCHER = "launcher"
    MONITOR = "monitor"


class NameLost(RuntimeError):
    """The agent no longer holds its node's name: another took it over."""


@dataclass(frozen=True)
class Holder:
    """One process of a node agent: what it claims and renews with."""

    node: str
    engine: str
    role: Role
    instance: str
    pid: int


def redis_now_ms(r: Any) -> int:
    """The control plane's clock: Redis's TIME, in epoch milliseconds."""
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def claim(store: Store, holder: Holder, *, ip: str, peer: str, lease_ms: int, grace_ms: int,
          renew_ms: int, live_ms: int, force: bool = False) -> ClaimAnswer:
    """Claim the node's name for `holder` (shared/domain/lease.py, rule 1)."""
    answer = store.run_script(
        scripts.CLAIM_NODE, [keys.node_lease(holder.node), keys.NODES, keys.NODES_LOST,
                             keys.NODES_VERSION],
        [holder.node, holder.engine, holder.role.value, holder.instance, str(holder.pid), ip,
         peer, str(lease_ms), str(grace_ms), str(renew_ms), str(live_ms),
         "1" if force else "0", Phase.RECONCILING.value])
    kind = Claim(answer[0])
    if kind == Claim.HELD_ELSEWHERE:
        return ClaimAnswer(kind, {"engine": answer[1], "ip": answer[2], "age_ms": answer[3]})
    if kind == Claim.ROLE_HELD:
        return ClaimAnswer(kind, {"instance": answer[1], "pid": answer[2]})
    return ClaimAnswer(kind)


@dataclass(frozen=True)
class Renewal:
    stamped_ms: int  # the Redis time the renewal was stamped with
    standing: int  # the cluster's nodes not declared lost, this node included
    nodes_version: int  # changes when who the nodes are does (their peers to read again)


def renew(store: Store, holder: Holder, *, live_ms: int, phase: Phase | None = None,
          problem: str | None = None, inventory: Mapping[str, Any] | None = None,
          back: bool = False) -> Renewal:
    """Renew `holder`'s lease. NameLost when another agent (or another
    process of this role) holds it now. `back`: the node returns from a
    silence (its settling time starts)."""
    answer = store.run_script(
        scripts.RENEW_NODE, [keys.node_lease(holder.node), keys.NODES, keys.node(holder.node),
                             keys.NODES_LOST, keys.NODES_VERSION],
        [holder.node, holder.engine, holder.role.value, holder.instance, str(live_ms),
         phase.value if phase is not None else "", "-" if problem is None else problem,
         json.dumps(inventory, separators=(",", ":")) if inventory is not None else "",
         "1" if back else "0", Phase.READY.value])
    if answer[0] != "OK":
        raise NameLost(f"node {holder.node}'s name is held by engine {answer[1] or '?'} "
                       f"(its {holder.role.value} instance {answer[2] or '?'})")
    return Renewal(int(answer[1]), int(answer[2]), int(answer[3]))


def release(store: Store, holder: Holder) -> None:
    """A process that stops cleanly gives up its role, so that its successor
    on this machine need not look for it."""
    store.run_script(scripts.RELEASE_NODE_ROLE, [keys.node_lease(holder.node)],
                     [holder.role.value, holder.instance])


def read_lease(reader: Any, node: str) -> Lease | None:
    raw: dict[str, str] = reader.hgetall(keys.node_lease(node))
    return Lease.from_fields(raw) if raw else None


def read_cluster(store: Store) -> ClusterView:
    """`ClusterView`, in two round trips whatever the cluster's size."""
    pipe = store.r.pipeline(transaction=False)
    pipe.zrange(keys.NODES, 0, -1, withscores=True)
    pipe.time()
    pipe.hgetall(keys.CONTROL_PLANE)
    beats, (seconds, micros), outage = pipe.execute()
    now = int(seconds) * 1000 + int(micros) // 1000
    names = [name for name, _ in beats]
    pipe = store.r.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.node_lease(name))
    leases = pipe.execute() if names else []
    return ClusterView({name: NodeSilence(int(score), Lease.from_fields(raw) if raw else None)
                        for (name, score), raw in zip(beats, leases, strict=True)},
                       Outage.from_fields(outage), now)


def mark_lost(store: Store, node: str, renewed_ms: int) -> bool:
    """Declare `node` lost, unless it renewed after `renewed_ms`."""
    return bool(store.run_script(scripts.MARK_NODE_LOST,
                                 [keys.node_lease(node), keys.NODES, keys.NODES_LOST,
                                  keys.NODES_VERSION],
                                 [node, str(renewed_ms)]))


def mark_node(store: Store, node: str, reason: str, until_ms: int) -> bool:
    """Keep `node` from new work until `until_ms`, saying why; False for a
    node without a lease (set up by hand: nothing to mark)."""
    return bool(store.run_script(scripts.HSET_IF_EXISTS, [keys.node_lease(node)],
                                 ["marked", reason, "marked_until", str(until_ms)]))


def read_outage(reader: Any) -> Outage:
    return Outage.from_fields(reader.hgetall(keys.CONTROL_PLANE))


def write_judgement(store: Store, outage: Outage, quiet: Sequence[str]) -> None:
    """The round's outage record (what every pass and the API judge the
    nodes' silences against)."""
    store.r.hset(keys.CONTROL_PLANE, mapping={
        "since": outage.since_ms, "ended": outage.ended_ms, "checked": outage.checked_ms,
        "quiet": ",".join(quiet)})


def peers(store: Store, own: str) -> list[tuple[str, str]]:
    """The other nodes a node can ask about the control plane (name, host:port):
    those not declared lost, with a peer address."""
    silences = read_cluster(store).silences
    return sorted((name, s.lease.peer) for name, s in silences.items()
                  if name != own and s.lease is not None and s.lease.peer
                  and not s.declared_lost)


def cluster_id(store: Store, proposed: str) -> str:
    """This cluster's id: `proposed` if none was set before."""
    store.r.set(keys.CLUSTER_ID, proposed, nx=True)
    value = store.r.get(keys.CLUSTER_ID)
    return str(value)
