"""The node agent's side of the monitor: its identity, lease, health checks,
fence and peer answers, started before any container is touched.

`NodeAgent.start` finds the node's identity (the Docker engine's id: the
same for this machine's launcher and monitor, another on every machine),
opens the peer port, claims the node's name (refused, with the reason,
while another machine's agent holds it) and returns the parts the monitor
runs. Until the claim succeeds nothing else of the monitor starts: an agent
that was refused has touched no container and no record.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import docker

from services.monitor.fence import FenceJournal, Fencer
from services.monitor.lease import LeaseKeeper
from services.monitor.peers import PeerServer, peer_key
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.node.containers import docker_client
from shared.node.health import Check, NodeHealth, engine_check, storage_check
from shared.node.identity import engine_identity
from shared.state import clock, storageid
from shared.state.leases import Holder, Role, release
from shared.state.nodeagent import NameRefused, claim_name, new_holder
from shared.state.store import Store

log = logging.getLogger(__name__)

@dataclass
class NodeAgent:
    settings: Settings
    store: Store
    holder: Holder
    journal: FenceJournal
    keeper: LeaseKeeper
    health: NodeHealth
    peers: PeerServer | None
    probe_client: docker.DockerClient

    @classmethod
    def start(cls, settings: Settings, store: Store, client: docker.DockerClient,
              stop: threading.Event, exit_process: Callable[[str], None]) -> NodeAgent | None:
        """The agent holding the node's name; None when refused (the reason
        given to `exit_process`) or stopped before."""
        engine = engine_identity(client, settings.node_ip, stop)
        if engine is None:
            return None
        holder = new_holder(settings.node_name, engine, Role.MONITOR)
        journal = FenceJournal(settings.node_state_dir, settings.node_name)
        journal.prune(now_ms())
        key = peer_key(settings.redis_url)
        fencer = Fencer(client, settings.node_name, journal, settings.node_fence_grace_seconds)
        probe_client = docker_client(settings, timeout=10)
        health = NodeHealth(_checks(settings, store, probe_client))
        keeper = LeaseKeeper(settings, store, holder, fencer, key, health.problem, exit_process)
        peers = _serve_peers(settings, key, keeper)
        try:
            claim_name(store, holder, settings, peer=peers.address if peers else "", stop=stop)
        except NameRefused as error:
            exit_process(str(error))
            if peers is not None:
                peers.close()
            return None
        clock.sync_quietly(store.r)
        for check in health.checks:
            check.run_once()  # the first renewals carry what they found
        return cls(settings, store, holder, journal, keeper, health, peers, probe_client)

    def threads(self, stop: threading.Event) -> list[threading.Thread]:
        return [*self.health.threads(stop),
                threading.Thread(target=clock.keep_in_sync, args=(self.store.r, stop),
                                 name="pai-monitor-clock", daemon=True)]

    def close(self) -> None:
        if self.peers is not None:
            self.peers.close()
        self.health.close()
        try:
            release(self.store, self.holder)
        except Exception as error:  # Redis gone: the next monitor takes over by its pid
            log.warning("could not give up the monitor's role in the lease: %s", error)
        self.probe_client.close()


def _checks(settings: Settings, store: Store, probe_client: docker.DockerClient
            ) -> list[Check]:
    checks = [engine_check(probe_client.ping, settings.heartbeat_seconds)]
    folders = list(dict.fromkeys((*settings.storage_roots, *settings.platform_dirs)))
    if folders:
        checks.append(storage_check(folders, lambda: storageid.cluster_id(store)))
    return checks


def _serve_peers(settings: Settings, key: bytes, keeper: LeaseKeeper) -> PeerServer | None:
    # Where the exporter listens (the node's IP, or every address in a
    # container), told to peers as the node's IP.
    try:
        return PeerServer(settings.monitor_host, settings.node_peer_port, settings.node_name,
                          key, keeper.silence, advertised=settings.node_ip)
    except OSError as error:
        log.error("cannot answer peers on %s:%d (%s): this node's peers will not count it "
                  "when the control plane is out", settings.monitor_host,
                  settings.node_peer_port, error)
        return None
