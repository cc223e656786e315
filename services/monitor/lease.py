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

PEERS_REFRESH_SECONDS = 30.0


@dataclass
class Contact:
    """The keeper's view of its contact with the control plane (monotonic s)."""

    last_ok: float
    fenced: bool = False
    holding: bool = False
    away: bool = False  # silent past the lease: reconcile before READY again


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

    # -------------------------------------------------------------- loop

    def run(self, stop: threading.Event) -> None:
        """Renew every heartbeat until `stop`; act on silence."""
        while not stop.is_set():
            self.round()
            stop.wait(self.settings.heartbeat_seconds)

    def round(self) -> None:
        try:
            self._renew()
        except NameLost as error:
            self._name_lost(error)
        except redis.RedisError as error:
            self._silent(error)

    def _renew(self) -> None:
        away = self.contact.away
        with self._lock:
            if away:  # back from silence: reconcile (a new round of it) before READY
                self._phase = Phase.RECONCILING
                self._generation += 1
            phase = self._phase
        leases.renew(self.store, self.holder, live_ms=live_ms(self.settings), phase=phase,
                     problem=self.problem(), back=away)
        now = time.monotonic()
        if away:
            log.warning("node %s: the control plane answers again after %.0f s%s; "
                        "reconciling before taking work", self.holder.node,
                        now - self.contact.last_ok,
                        " (its job containers were fenced)" if self.contact.fenced else "")
            self.reconcile_requested.set()
        self.contact = Contact(now)
        if now - self._peers_read >= PEERS_REFRESH_SECONDS:
            self._peers = leases.peers(self.store, self.holder.node)
            self._peers_read = now

    def _silent(self, error: Exception) -> None:
        silence = int((time.monotonic() - self.contact.last_ok) * 1000)
        if silence < self.terms.lease_ms:
            log.warning("node %s: lease renewal failed (%s); silent for %.0f s of its %.0f s "
                        "lease", self.holder.node, error, silence / 1000,
                        self.terms.lease_ms / 1000)
            return
        self.contact.away = True
        reports = ask_all(self.peer_key, self._peers)
        action = fence_action(silence, self.terms, len(self._peers) + 1, reports)
        if action == FenceAction.HOLD:
            if not self.contact.holding:
                log.error("node %s: the control plane is unreachable for %d of %d nodes "
                          "alike: holding, jobs run on", self.holder.node,
                          1 + sum(r.silence_ms is not None for r in reports),
                          len(self._peers) + 1)
            self.contact.holding = True
            return
        self.contact.holding = False
        answered = sum(r.in_contact for r in reports)
        reason = (f"node {self.holder.node} lost the control plane for {silence // 1000} s "
                  f"({answered} of {len(reports)} peer(s) still reach it)")
        if not self.contact.fenced:
            log.error("%s: fencing: stopping its job containers", reason)
        self.fencer.fence(reason)  # again each round: one that failed to stop is retried
        self.contact.fenced = True

    def _name_lost(self, error: NameLost) -> None:
        """Another holds the name now. Another machine's agent took it after
        this one's lease expired: its containers are stale, stop them. A
        process of this role on this machine took it: just leave."""
        lease = leases.read_lease(self.store.r, self.holder.node)
        if lease is not None and lease.engine != self.holder.engine:
            self.fencer.fence(f"node {self.holder.node}'s name was taken by another "
                              f"machine's agent")
        self.exit_process(str(error))
