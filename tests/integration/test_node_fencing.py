"""Fencing on a real Redis and a real Docker engine (services/monitor/lease.py).

A node cut off from the control plane while its peers still reach it stops
its job containers itself (notice, SIGTERM, SIGKILL after the grace), and
journals them so their exits are the platform's; when every node is cut off
alike (the control plane is down) they hold and the jobs run on. Links are
cut with a TCP relay in the test that can black-hole its traffic, or by
freezing Redis (SIGSTOP: its port stays open, nothing answers).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import docker
import pytest

from services.monitor.fence import FenceJournal, Fencer
from services.monitor.lease import LeaseKeeper
from services.monitor.peers import PeerServer, peer_key
from shared.domain.lease import FenceAction, Phase
from shared.infra.config import Settings
from shared.node.containers import LABEL_JOB, LABEL_NODE
from shared.state import leases
from shared.state.leases import Role
from shared.state.nodeagent import claim_name, new_holder
from shared.state.store import Store
from tests.support.redis_server import OwnRedis

pytestmark = [pytest.mark.docker, pytest.mark.redis]

WAIT_SECONDS = 60
TRAP = ("trap 'cat /pai/preempted 2>/dev/null; echo got-term; exit 0' TERM; "
        "while true; do sleep 0.2; done")


class Relay:
    """A TCP relay to Redis whose traffic the test can black-hole: once cut,
    bytes are read and dropped both ways (a link that went silent)."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._closing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                if not self.cut.is_set():
                    sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.close()

    def close(self) -> None:
        self._closing.set()
        self.listener.close()


@dataclass
class Agent:
    """One node's lease keeper, peer server and fence, as its monitor runs them."""

    name: str
    keeper: LeaseKeeper
    journal: FenceJournal
    peers: PeerServer
    exits: list[str]


def wait_for(check: Callable[[], Any], what: str, seconds: float = WAIT_SECONDS) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def cluster(docker_client: docker.DockerClient, test_image: str,
            test_labels: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    stop = threading.Event()
    made: list[Agent] = []
    run = f"fence-{uuid.uuid4().hex[:6]}"

    def agent(redis_url: str, name: str, *, with_peer_address: bool = True) -> Agent:
        settings = Settings(redis_url=redis_url, node_name=f"{run}-{name}", node_ip="127.0.0.1",
                            heartbeat_seconds=0.5, node_lease_seconds=2.0,
                            node_fence_grace_seconds=1.0, node_lost_seconds=5.0,
                            node_state_dir=str(tmp_path / "state"))
        store = Store.from_url(redis_url)
        holder = new_holder(settings.node_name, f"engine-{name}", Role.MONITOR)
        journal = FenceJournal(settings.node_state_dir, settings.node_name)
        key = peer_key("the cluster's shared secret")
        exits: list[str] = []
        keeper = LeaseKeeper(settings, store, holder,
                             Fencer(docker_client, settings.node_name, journal, 1.0), key,
                             lambda: "", exits.append)
        peers = PeerServer("127.0.0.1", 0, settings.node_name, key, keeper.silence)
        claim_name(store, holder, settings, peer=peers.address if with_peer_address else "",
                   stop=stop)
        made.append(Agent(settings.node_name, keeper, journal, peers, exits))
        return made[-1]

    yield agent
    stop.set()
    for made_agent in made:
        made_agent.peers.close()
    for container in docker_client.containers.list(
            all=True, filters={"label": f"{LABEL_JOB}={run}"}):
        container.remove(force=True)


def start(agents: list[Agent], stop: threading.Event) -> None:
    for agent in agents:
        agent.keeper.reconciled(0)
        assert agent.keeper.renew_once()  # READY, and knows its peers from here on
        threading.Thread(target=agent.keeper.run, args=(stop,), daemon=True).start()


def job_container(docker_client: docker.DockerClient, image: str, node: str,
                  labels: dict[str, str]) -> Any:
    return docker_client.containers.run(
        image, ["/bin/sh", "-c", TRAP], detach=True, init=True,
        labels={**labels, LABEL_JOB: node.rsplit("-", 1)[0], LABEL_NODE: node})


def test_a_node_cut_off_alone_stops_its_containers_and_journals_them(
        cluster: Callable[..., Agent], own_redis: OwnRedis, docker_client: docker.DockerClient,
        test_image: str, test_labels: dict[str, str]) -> None:
    redis_server = own_redis.url  # a cluster of its own: no other test's node is a peer
    relay = Relay(int(redis_server.rsplit(":", 1)[1].split("/")[0]))
    cut_off_url = redis_server.replace(f":{relay.target[1]}", f":{relay.port}")
    a, b = cluster(cut_off_url, "a"), cluster(redis_server, "b")
    container = job_container(docker_client, test_image, a.name, test_labels)
    stop = threading.Event()
    try:
        start([a, b], stop)
        store = Store.from_url(redis_server)
        relay.cut.set()
        cut_at = leases.redis_now_ms(store.r)
        wait_for(lambda: container.reload() or container.status == "exited",
                 "the cut-off node to stop its job container")
        log = container.logs().decode()
        assert "PAI_PREEMPTED=1" in log and f"PAI_PREEMPTED_BY=node:{a.name}" in log
        assert "got-term" in log  # SIGTERM first, within the grace
        reason = a.journal.reason_for(container.id)
        assert reason is not None and "lost the control plane" in reason
        assert "1 of 1 peer(s) still reach it" in reason
        assert a.keeper.contact.fenced and not b.keeper.contact.fenced
        assert FenceJournal(str(Path(a.journal.folder).parent), a.name).reason_for(
            container.id) == reason  # on disk: a restarted monitor reads it back

        relay.cut.clear()
        lease = wait_for(lambda: (found := leases.read_lease(store.r, a.name)) is not None
                         and found.renewed_ms > cut_at and found, "a's return")
        assert lease.phase == Phase.RECONCILING
        assert lease.healthy_since_ms > 0  # back from a problem: it settles first
        assert a.keeper.reconcile_requested.is_set()
    finally:
        stop.set()
        relay.close()


def test_a_node_that_knows_no_peer_address_fences_when_cut_off_alone(
        cluster: Callable[..., Agent], own_redis: OwnRedis) -> None:
    """Attack: a node knows no peer's address (the others joined without
    one it can use). Cut off alone, it must not take itself for the whole
    cluster and hold: the control plane counts three nodes, declares it
    lost and runs its work elsewhere. It counts the nodes standing at its
    last renewal, and a peer it cannot ask is one that did not answer."""
    port = int(own_redis.url.rsplit(":", 1)[1].split("/")[0])
    relay = Relay(port)
    a = cluster(own_redis.url.replace(f":{port}", f":{relay.port}"), "a")
    try:
        a.keeper.reconciled(0)
        assert a.keeper.renew_once()
        for name in ("b", "c"):
            other = cluster(own_redis.url, name, with_peer_address=False)
            other.keeper.reconciled(0)
            assert other.keeper.renew_once()
        assert a.keeper.renew_once()  # the nodes changed: it reads its peers again
        assert a.keeper.known_nodes == 3

        relay.cut.set()
        action = wait_for(lambda: (found := a.keeper.check_silence()) != FenceAction.RUN
                          and found, "a's silence to pass its lease")
        assert action == FenceAction.FENCE
        assert a.keeper.contact.fenced and not a.keeper.contact.holding
    finally:
        relay.close()


def test_when_every_node_is_cut_off_alike_they_hold_and_their_jobs_run_on(
        cluster: Callable[..., Agent], own_redis: OwnRedis,
        docker_client: docker.DockerClient, test_image: str,
        test_labels: dict[str, str]) -> None:
    a, b = cluster(own_redis.url, "a"), cluster(own_redis.url, "b")
    containers = [job_container(docker_client, test_image, agent.name, test_labels)
                  for agent in (a, b)]
    stop = threading.Event()
    try:
        start([a, b], stop)
        own_redis.freeze()
        wait_for(lambda: a.keeper.contact.holding and b.keeper.contact.holding,
                 "both nodes to hold")
        assert a.keeper.check_silence() == FenceAction.HOLD
        for container in containers:
            container.reload()
            assert container.status == "running"
        assert a.journal.reason_for(containers[0].id) is None
        own_redis.thaw()
        wait_for(lambda: not a.keeper.contact.away and not b.keeper.contact.away,
                 "both nodes to renew again")
        for container in containers:
            container.reload()
            assert container.status == "running"
    finally:
        stop.set()
        own_redis.thaw()


def test_a_node_whose_name_another_machine_took_fences_and_leaves(
        cluster: Callable[..., Agent], redis_server: str, docker_client: docker.DockerClient,
        test_image: str, test_labels: dict[str, str]) -> None:
    a = cluster(redis_server, "a")
    container = job_container(docker_client, test_image, a.name, test_labels)
    store = Store.from_url(redis_server)
    assert a.keeper.renew_once()
    # Its lease ran out (cut off, say) and another machine's agent took the name.
    store.r.hset(f"pai:node:{a.name}:lease", "live_until", 0)
    other = replace(new_holder(a.name, "engine-elsewhere", Role.MONITOR))
    assert leases.claim(store, other, ip="10.9.9.9", peer="", lease_ms=2000, grace_ms=1000,
                        renew_ms=500, live_ms=5000).claim.value == "TAKEN"

    assert not a.keeper.renew_once()

    container.reload()
    assert container.status == "exited"
    assert a.exits and "engine-elsewhere" in a.exits[0]


def test_after_an_outage_a_straggler_gets_its_lease_again_before_it_fences(
        cluster: Callable[..., Agent], own_redis: OwnRedis, docker_client: docker.DockerClient,
        test_image: str, test_labels: dict[str, str]) -> None:
    """Both nodes cut off alike: they hold. The control plane answers b again
    first: a must not fence the instant it sees b in contact (it would stop
    its jobs at the very end of an outage they rode out); it gets its lease's
    time again to renew, and fences only if it stays cut off that long."""
    port = own_redis.port  # a Redis of its own: no other test's nodes among the peers
    relays = {name: Relay(port) for name in "ab"}
    agents = {name: cluster(own_redis.url.replace(f":{port}", f":{relays[name].port}"), name)
              for name in "ab"}
    container = job_container(docker_client, test_image, agents["a"].name, test_labels)
    stop = threading.Event()
    try:
        start(list(agents.values()), stop)
        for relay in relays.values():
            relay.cut.set()
        wait_for(lambda: all(agent.keeper.contact.holding for agent in agents.values()),
                 "both nodes to hold")
        relays["b"].cut.clear()
        back = wait_for(lambda: not agents["b"].keeper.contact.away and time.monotonic(),
                        "b to reach the control plane again")
        wait_for(lambda: agents["a"].keeper.contact.grace_from > 0,
                 "a to see b in contact and give itself its lease again")
        container.reload()
        assert container.status == "running"
        wait_for(lambda: container.reload() or container.status == "exited",
                 "a, still cut off, to fence after its lease")
        assert time.monotonic() - back >= 2.0  # its whole lease (2 s) after b was back
        assert agents["a"].journal.reason_for(container.id) is not None
    finally:
        stop.set()
        for relay in relays.values():
            relay.close()
