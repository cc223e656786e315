"""Node leases: who holds a node's name, when a silent node is lost, when a
node stops its own containers, and when the control plane, not the nodes,
is at fault (docs/multi-node.md).

One clock for every comparison across hosts: a renewal is stamped by Redis's
TIME, so the control plane compares stamps of its own clock; a node measures
its own silence as a duration on its own monotonic clock. No host's wall
clock is ever compared with another's.

The rules, each a function below:

1. A node agent holds its name while it renews the lease (`Lease`); a second
   agent (another Docker engine) is refused while the lease is live.
2. A node that has not renewed for its lease (`LeaseTerms.lease_ms`) stops
   its job containers itself, SIGTERM then SIGKILL after the grace
   (`fence_action`), unless the control plane is down for most nodes alike
   (rule 4): then it holds and its jobs run on.
3. The control plane declares a node lost (and hands its tasks, GPUs and
   ports to others) only once the node has certainly stopped them: silent
   for lease + grace + LOST_MARGIN_MS (`LeaseTerms.lost_after_ms`), never less
   than the operator's floor (PAI_NODE_LOST_SECONDS).
4. Most nodes silent at once is the control plane's outage, not theirs
   (`judge_nodes`): none is lost while it lasts, and when it ends every node's
   silence counts from that moment (a grace to renew).
5. A node is given work only when it says it is healthy (no problem with its
   engine, launcher or storage), has reconciled its containers, renews, and
   has stayed healthy for the settling time (`condition_of`), so a flapping
   node is not handed work between two failures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

# A renewal's reply may come this long after Redis stamped it (the socket
# timeout of the call), and stopping a container takes a moment beyond its
# grace: the control plane waits this much more than lease + grace.
LOST_MARGIN_MS = 10_000
# A node that missed this many renewals is quiet: counted towards an outage
# of the control plane, and shown UNREACHABLE.
QUIET_RENEWALS = 3


def _int_field(raw: Mapping[str, str], name: str) -> int:
    """A whole number field of a Redis hash (a time, a duration); 0 when it is
    absent or unreadable, as if never set."""
    try:
        return int(raw.get(name) or 0)
    except ValueError:
        return 0


class Phase(StrEnum):
    """What a node agent says of itself in its lease."""

    RECONCILING = "RECONCILING"  # claimed, or back from silence: settling its containers
    READY = "READY"


class Condition(StrEnum):
    """A node as the control plane judges it; only READY takes work."""

    READY = "READY"
    SETTLING = "SETTLING"  # healthy again, for less than the settling time
    NOT_READY = "NOT_READY"  # the node reports a problem (engine, launcher, storage)
    RECONCILING = "RECONCILING"
    UNREACHABLE = "UNREACHABLE"  # missed renewals; not lost yet
    LOST = "LOST"


@dataclass(frozen=True)
class LeaseTerms:
    """A node's promise, published in its lease so that the control plane
    holds it to the node's own figures, whatever its own settings say."""

    lease_ms: int = 30_000
    grace_ms: int = 10_000
    renew_ms: int = 5_000

    def lost_after_ms(self, floor_ms: int) -> int:
        """How long the node must be silent before its work goes elsewhere."""
        return max(floor_ms, self.lease_ms + self.grace_ms + LOST_MARGIN_MS)

    @property
    def quiet_after_ms(self) -> int:
        return min(self.lease_ms, QUIET_RENEWALS * self.renew_ms)


@dataclass(frozen=True)
class Lease:
    """A node's lease record (keys.node_lease) as read back.

    `engine` is the identity of the agent: the id of the Docker engine it
    runs its containers on, the same for the node's launcher and monitor and
    different on every machine. `renewed_ms` is the last renewal by either
    process, stamped by Redis; `claimed_ms` the first renewal of this holder.
    """

    engine: str = ""
    ip: str = ""
    peer: str = ""  # host:port where the node answers its peers (fencing)
    terms: LeaseTerms = field(default_factory=LeaseTerms)
    phase: Phase = Phase.READY
    problem: str = ""  # what the node's own checks found ("": healthy)
    # When it last came back from a problem (lost, fenced, unhealthy); 0:
    # never had one, so no settling time
    healthy_since_ms: int = 0
    claimed_ms: int = 0
    renewed_ms: int = 0
    launcher_renewed_ms: int = 0
    lost_ms: int = 0  # when the control plane declared it lost (0: never)
    # What the control plane itself saw of the node (launches overdue), and
    # until when it keeps the node from new work
    marked: str = ""
    marked_until_ms: int = 0

    @classmethod
    def from_fields(cls, raw: Mapping[str, str]) -> Lease:
        def number(name: str) -> int:
            return _int_field(raw, name)

        defaults = LeaseTerms()
        terms = LeaseTerms(lease_ms=number("lease_ms") or defaults.lease_ms,
                           grace_ms=number("grace_ms") or defaults.grace_ms,
                           renew_ms=number("renew_ms") or defaults.renew_ms)
        phase = raw.get("phase") or Phase.READY
        return cls(engine=raw.get("engine") or "", ip=raw.get("ip") or "",
                   peer=raw.get("peer") or "", terms=terms,
                   phase=Phase(phase) if phase in Phase.__members__ else Phase.RECONCILING,
                   problem=raw.get("problem") or "",
                   healthy_since_ms=number("healthy_since"), claimed_ms=number("claimed"),
                   renewed_ms=number("renewed"),
                   launcher_renewed_ms=number("launcher_renewed"), lost_ms=number("lost"),
                   marked=raw.get("marked") or "", marked_until_ms=number("marked_until"))


# ----------------------------------------------------------- control plane


@dataclass(frozen=True)
class Outage:
    """The control plane's own outage as it last judged it (keys.CONTROL_PLANE):
    in progress since `since_ms` (0: none), the last one ended at `ended_ms`."""

    since_ms: int = 0
    ended_ms: int = 0
    checked_ms: int = 0  # the last judgement: a long gap means nobody was judging

    @property
    def in_progress(self) -> bool:
        return self.since_ms > 0

    @classmethod
    def from_fields(cls, raw: Mapping[str, str]) -> Outage:
        return cls(since_ms=_int_field(raw, "since"), ended_ms=_int_field(raw, "ended"),
                   checked_ms=_int_field(raw, "checked"))


@dataclass(frozen=True)
class NodeSilence:
    """What the control plane knows of one node's renewals."""

    renewed_ms: int
    lease: Lease | None  # None: a node record without a lease (registered by hand)

    @property
    def terms(self) -> LeaseTerms:
        return self.lease.terms if self.lease is not None else LeaseTerms()

    @property
    def declared_lost(self) -> bool:
        return self.lease is not None and self.lease.lost_ms > self.renewed_ms


@dataclass(frozen=True)
class ClusterView:
    """Every node's last renewal and lease, the control plane's outage
    record, and Redis's time: what the repair round, each scheduling pass
    and the API judge the nodes on, read alike."""

    silences: dict[str, NodeSilence]
    outage: Outage
    now_ms: int


@dataclass(frozen=True)
class Judgement:
    lost: tuple[str, ...]
    outage: Outage
    quiet: tuple[str, ...]
    outage_began: bool = False
    outage_ended: bool = False


def silence_ms(renewed_ms: int, now_ms: int, outage: Outage) -> int:
    """How long a node has been silent, counted from the end of the last
    outage of the control plane if it renewed before it."""
    return now_ms - max(renewed_ms, outage.ended_ms)


def judge_nodes(nodes: Mapping[str, NodeSilence], now_ms: int, outage: Outage,
                lost_floor_ms: int, round_ms: int = 5_000) -> Judgement:
    """Which nodes are lost now, and is the control plane itself out?

    A gap since the last judgement (the judge runs every `round_ms`) longer
    than both three rounds and the shortest lease means nobody judged
    meanwhile (Redis down, the scheduler down or cut off): it ends as an
    outage would, every node's silence counting from now. Then,
    among the nodes not yet declared lost that were already holding their
    lease when the quiet ones went quiet (a node that joined since cannot
    outvote them), a strict majority quiet is an outage of the control
    plane: nobody is lost while it lasts.
    """
    gap_after = max(3 * round_ms, min((n.terms.lease_ms for n in nodes.values()),
                                      default=LeaseTerms().lease_ms))
    ended_now = outage.checked_ms > 0 and now_ms - outage.checked_ms > gap_after \
        and not outage.in_progress
    if ended_now:
        outage = replace(outage, ended_ms=now_ms)
    standing = {name: n for name, n in nodes.items() if not n.declared_lost}
    quiet = sorted(name for name, n in standing.items()
                   if silence_ms(n.renewed_ms, now_ms, outage) >= n.terms.quiet_after_ms)
    went_quiet = min((standing[name].renewed_ms for name in quiet), default=now_ms)
    voters = [name for name, n in standing.items()
              if n.lease is None or n.lease.claimed_ms <= went_quiet or name in quiet]
    if quiet and 2 * len(quiet) > len(voters):
        began = not outage.in_progress
        return Judgement((), Outage(outage.since_ms or now_ms, outage.ended_ms, now_ms),
                         tuple(quiet), outage_began=began)
    ended = outage.in_progress or ended_now
    if outage.in_progress:
        outage = Outage(0, now_ms, now_ms)
    outage = replace(outage, checked_ms=now_ms)
    lost = tuple(name for name in quiet
                 if silence_ms(standing[name].renewed_ms, now_ms, outage)
                 >= standing[name].terms.lost_after_ms(lost_floor_ms))
    return Judgement(lost, outage, tuple(quiet), outage_ended=ended)


def condition_of(silence: NodeSilence, now_ms: int, outage: Outage, lost_floor_ms: int,
                 settle_ms: int) -> tuple[Condition, str]:
    """A node's condition and why, as the scheduler and `GET /nodes` see it.
    A node registered without a lease (by hand) has only its renewals."""
    lease = silence.lease
    quiet = silence_ms(silence.renewed_ms, now_ms, outage)
    if silence.declared_lost:
        return Condition.LOST, "declared lost: its lease was not renewed"
    if quiet >= silence.terms.lost_after_ms(lost_floor_ms) and not outage.in_progress:
        return Condition.LOST, f"its lease was not renewed for {quiet // 1000} s"
    if quiet >= silence.terms.quiet_after_ms:
        return Condition.UNREACHABLE, f"its lease was not renewed for {quiet // 1000} s"
    if lease is None:
        return Condition.READY, ""
    trouble = _trouble(lease, now_ms, outage)
    if trouble:
        return Condition.NOT_READY, trouble
    if lease.phase != Phase.READY:
        return Condition.RECONCILING, "reconciling its containers after joining or returning"
    healthy_for = now_ms - lease.healthy_since_ms
    if lease.healthy_since_ms and healthy_for < settle_ms:
        return Condition.SETTLING, (f"healthy again for {max(healthy_for, 0) // 1000} s of "
                                    f"{settle_ms // 1000} s")
    return Condition.READY, ""


def _trouble(lease: Lease, now_ms: int, outage: Outage) -> str:
    """What keeps a renewing node from work: its own problem, the control
    plane's mark, or a launcher that stopped renewing."""
    if lease.problem:
        return lease.problem
    if lease.marked and now_ms < lease.marked_until_ms:
        return lease.marked
    if not lease.launcher_renewed_ms:
        return "its launcher has not started"
    launcher_quiet = silence_ms(lease.launcher_renewed_ms, now_ms, outage)
    if launcher_quiet >= lease.terms.quiet_after_ms:
        return f"its launcher has not renewed the lease for {launcher_quiet // 1000} s"
    return ""


# ------------------------------------------------------------------- node


class FenceAction(StrEnum):
    """What a node agent does about its silence, each round."""

    RUN = "RUN"  # in contact, or silent for less than its lease
    HOLD = "HOLD"  # the control plane is out for most nodes: jobs run on
    FENCE = "FENCE"  # cut off alone (or with a minority): stop the job containers


@dataclass(frozen=True)
class PeerReport:
    """What a peer node answered about its own contact with the control
    plane; `silence_ms` None when it did not answer (or not credibly)."""

    node: str
    silence_ms: int | None
    quiet_after_ms: int = LeaseTerms().quiet_after_ms

    @property
    def in_contact(self) -> bool:
        return self.silence_ms is not None and self.silence_ms < self.quiet_after_ms


def fence_action(silence: int, terms: LeaseTerms, known_nodes: int,
                 peers: Sequence[PeerReport]) -> FenceAction:
    """The node's decision after `silence` ms without a renewal.

    Within the lease it runs on. Past it, it asks its peers: if any is in
    contact with the control plane, the fault is this node's: fence. If
    this node and the peers that answered, all cut off alike, are a strict
    majority of the nodes it knew, the control plane is out for most of the
    cluster: hold, as the control plane (which counts the same majority in
    `judge_nodes`) will not declare them lost either. Otherwise (alone, or a
    minority) fence.
    """
    if silence < terms.lease_ms:
        return FenceAction.RUN
    answered = [p for p in peers if p.silence_ms is not None]
    if any(p.in_contact for p in answered):
        return FenceAction.FENCE
    if 2 * (1 + len(answered)) > max(known_nodes, 1):
        return FenceAction.HOLD
    return FenceAction.FENCE


# ---------------------------------------------------------------- identity


class Claim(StrEnum):
    """What a claim of a node's name came to."""

    TAKEN = "TAKEN"  # this agent holds it now
    HELD_ELSEWHERE = "HELD_ELSEWHERE"  # another machine's agent holds a live lease
    ROLE_HELD = "ROLE_HELD"  # the same machine runs another process of this role


@dataclass(frozen=True)
class ClaimAnswer:
    claim: Claim
    holder: dict[str, Any] = field(default_factory=dict)

    def refusal(self, node: str, role: str) -> str:
        """The error an agent refused its name stops with."""
        if self.claim == Claim.HELD_ELSEWHERE:
            return (f"node name {node!r} is held by another machine's agent (Docker engine "
                    f"{self.holder.get('engine', '?')}, IP {self.holder.get('ip', '?')}, "
                    f"renewed {self.holder.get('age_ms', '?')} ms ago): give this machine "
                    f"another PAI_NODE_NAME, or stop that agent and wait for its lease to "
                    f"expire")
        return (f"another {role} of node {node!r} runs on this machine (pid "
                f"{self.holder.get('pid', '?')}): stop it first")


def conditions_of(view: ClusterView, lost_floor_ms: int,
                  settle_ms: int) -> dict[str, tuple[Condition, str]]:
    """Every node's condition and why (`condition_of` for each): the one
    judgement the pass, the repair round and the API share, so a node the
    API shows NOT_READY is one no pass places on."""
    return {name: condition_of(silence, view.now_ms, view.outage, lost_floor_ms, settle_ms)
            for name, silence in view.silences.items()}


def unready_of(view: ClusterView, lost_floor_ms: int, settle_ms: int) -> dict[str, str]:
    """The nodes that may not take new work, each with its reason."""
    return {name: reason for name, (condition, reason)
            in conditions_of(view, lost_floor_ms, settle_ms).items()
            if condition != Condition.READY}
