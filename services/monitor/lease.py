"""The node's hold on its name, kept by its monitor (shared/domain/lease.py).

`LeaseKeeper.claim` takes the node's name at start-up (refused while another
machine's agent holds it); `run` renews it every PAI_HEARTBEAT_SECONDS with
how the node stands (reconciling or ready, and any problem its probes
found), and acts on silence: past the lease, it asks its peers and fences or
holds (`fence_action`). When the control plane answers again after such a
silence, the node goes back to RECONCILING until its monitor has reconciled
its containers once more, and only then says READY.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from services.monitor.fence import Fencer
from services.monitor.peers import ask_all
from shared.domain.lease import FenceAction, Phase, fence_action
from shared.infra.config import Settings
from shared.state import leases
from shared.state.leases import Holder, NameLost
from shared.state.nodeagent import lease_terms, live_ms
from shared.state.store import Store

log = logging.getLogger(__name__)

# A node reads its peers (every lease: O(nodes)) again when a renewal says
# the nodes changed (a claim, a new peer address, a node lost or back: the
# nodes' version), and at least this often besides
PEERS_REFRESH_SECONDS = 600.0
WATCH_SECONDS = 1.0  # how often the watchdog looks at the silence


@dataclass
class Contact:
    """The keeper's view of its contact with the control plane (monotonic s)."""

    last_ok: float
    fenced: bool = False
    holding: bool = False
    away: bool = False  # silent past the lease: reconcile before READY again
    # When an outage this node held through ended for others: its silence
    # counts from here, as the control plane counts it from the outage's end
    grace_from: float = 0.0


class LeaseKeeper:
    def __init__(self, settings: Settings, store: Store, holder: Holder, fencer: Fencer,
                 peer_key: bytes, problem: Callable[[], str],
                 exit_process: Callable[[str], None]) -> None:
        self.settings, self.store, self.holder = settings, store, holder
        self.fencer, self.peer_key, self.problem = fencer, peer_key, problem
        self.exit_process = exit_process
        self.terms = lease_terms(settings)
        self.contact = Contact(time.monotonic())
        self.reconcile_requested = threading.Event()
        self._phase = Phase.RECONCILING
        self._generation = 0  # returns from silence; a reconcile clears only its own
        self._peers: list[tuple[str, str]] = []
        self._peers_read = 0.0
        self._peers_version = -1  # the nodes' version the peers were read at
        # The nodes standing at the last renewal, this one included: the
        # cluster this node counts a majority of when it is cut off, however
        # few of them it knows the address of
        self._standing = 1
        self._lock = threading.Lock()

    # ----------------------------------------------------------- queries

    def silence(self) -> tuple[int, int]:
        """(ms since the last renewal, when this node counts as quiet), for peers."""
        return int((time.monotonic() - self.contact.last_ok) * 1000), \
            self.terms.quiet_after_ms

    def reconcile_generation(self) -> int:
        with self._lock:
            return self._generation

    def reconciled(self, generation: int) -> None:
        """The monitor reconciled every container, having started after the
        return numbered `generation`: the node may say READY."""
        with self._lock:
            if generation == self._generation:
                self._phase = Phase.READY

    # ------------------------------------------------------------- loops

    def run(self, stop: threading.Event) -> None:
        """Renew every heartbeat until `stop`, and watch the silence on a
        thread of its own: a renewal blocked on a dead link (up to its
        socket timeout) must not delay the fence."""
        watchdog = threading.Thread(target=self.watch, args=(stop,), daemon=True,
                                    name="pai-monitor-fence-watch")
        watchdog.start()
        while not stop.is_set():
            self.renew_once()
            stop.wait(self.settings.heartbeat_seconds)
        watchdog.join(WATCH_SECONDS * 2)

    def watch(self, stop: threading.Event) -> None:
        while not stop.wait(WATCH_SECONDS):
            self.check_silence()

    def renew_once(self) -> bool:
        """One renewal; True when the control plane took it."""
        sent = time.monotonic()
        try:
            self._renew(sent)
            return True
        except NameLost as error:
            self._name_lost(error)
        except redis.RedisError as error:
            silence = time.monotonic() - self.contact.last_ok
            if silence * 1000 < self.terms.lease_ms:
                log.warning("node %s: lease renewal failed (%s); silent for %.0f s of its "
                            "%.0f s lease", self.holder.node, error, silence,
                            self.terms.lease_ms / 1000)
        return False

    def _renew(self, sent: float) -> None:
        """Renew; the contact counts from `sent`, when the renewal left (Redis
        stamped it later), so this node never believes in a lease longer
        than the one the control plane counts."""
        with self._lock:
            away = self.contact.away
            if away:  # back from silence: reconcile (a new round of it) before READY
                self._phase = Phase.RECONCILING
                self._generation += 1
            phase = self._phase
        renewal = leases.renew(self.store, self.holder, live_ms=live_ms(self.settings),
                               phase=phase, problem=self.problem(), back=away)
        with self._lock:
            if away:
                log.warning("node %s: the control plane answers again after %.0f s%s; "
                            "reconciling before taking work", self.holder.node,
                            sent - self.contact.last_ok,
                            " (its job containers were fenced)" if self.contact.fenced else "")
                self.reconcile_requested.set()
            self.contact = Contact(max(sent, self.contact.last_ok))
        self._standing = renewal.standing
        if renewal.nodes_version != self._peers_version \
                or sent - self._peers_read >= PEERS_REFRESH_SECONDS:
            self._peers = leases.peers(self.store, self.holder.node)
            self._peers_read, self._peers_version = sent, renewal.nodes_version

    @property
    def known_nodes(self) -> int:
        """The cluster as this node last knew it: the standing nodes the
        control plane counted at its last renewal, or the peers it knows if
        more. A peer whose address it lacks counts as one that did not
        answer, so a stale list can only make it fence, never hold."""
        return max(self._standing, len(self._peers) + 1)

    def check_silence(self) -> FenceAction:
        """Past the lease without a renewal: ask the peers, then hold or fence.

        A node that held through the control plane's outage and then sees a
        peer in contact again does not fence at once: the outage is over for
        that peer, and this node gets its lease's time again to renew, as the
        control plane gives every node its time again when an outage ends
        (shared/domain/lease.py, `judge_nodes`)."""
        now = time.monotonic()
        silence = int((now - max(self.contact.last_ok, self.contact.grace_from)) * 1000)
        if silence < self.terms.lease_ms:
            return FenceAction.RUN
        with self._lock:
            self.contact.away = True
        reports = ask_all(self.peer_key, self._peers)
        action = fence_action(silence, self.terms, self.known_nodes, reports)
        if action == FenceAction.HOLD:
            if not self.contact.holding:
                log.error("node %s: the control plane is unreachable for %d of %d nodes "
                          "alike: holding, jobs run on", self.holder.node,
                          1 + sum(r.silence_ms is not None for r in reports),
                          self.known_nodes)
            self.contact.holding = True
            return action
        if self.contact.holding:
            self.contact.holding = False
            self.contact.grace_from = now
            log.warning("node %s: the control plane answers other nodes again: this node has "
                        "its lease's time to renew before it fences", self.holder.node)
            return FenceAction.RUN
        if action == FenceAction.FENCE:
            answered = sum(r.in_contact for r in reports)
            reason = (f"node {self.holder.node} lost the control plane for "
                      f"{silence // 1000} s ({answered} of {len(reports)} peer(s) still "
                      f"reach it)")
            if not self.contact.fenced:
                log.error("%s: fencing: stopping its job containers", reason)
            # Fenced from the decision on: the containers may stop (and be
            # seen stopped) before `fence` returns.
            self.contact.fenced = True
            self.fencer.fence(reason)  # each round: a container that failed to stop again
        return action

    def _name_lost(self, error: NameLost) -> None:
        """Another holds the name now. Another machine's agent took it after
        this one's lease expired: its containers are stale, stop them. A
        process of this role on this machine took it: just leave."""
        lease = leases.read_lease(self.store.r, self.holder.node)
        if lease is not None and lease.engine != self.holder.engine:
            self.fencer.fence(f"node {self.holder.node}'s name was taken by another "
                              f"machine's agent")
        self.exit_process(str(error))
