"""Lightweight node agents: a node's control-plane traffic without Docker.

Each agent does to the control plane what a node's agent does: its
monitor's lease, claimed and then renewed every PAI_HEARTBEAT_SECONDS by the
real `LeaseKeeper` (which reads its peers again when the nodes change), and
its launcher's lease, renewed as often with the node's whole record once a
minute. It runs no containers, so the scheduler's placements on it are
never started. `bench agents` runs them in its own process;

    python -m bench.lightagent --prefix a1- --count 10 --ip 10.213.77.3

runs `count` of them in a process of their own (the multi-host tier starts
one such process on each test host), from the PAI_* environment, until
SIGTERM. Their turns are spread over the heartbeat, as independent machines'
are; a renewal that fails (the host cut off) is counted and retried on the
agent's next turn, as a node agent does.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from typing import cast

from services.monitor.fence import Fencer
from services.monitor.lease import LeaseKeeper
from shared.domain.models import Gpu, Node
from shared.infra.config import Settings, load_settings
from shared.state import leases
from shared.state.leases import Claim, Holder, Role
from shared.state.nodeagent import lease_terms, live_ms, new_holder
from shared.state.store import Store

GPUS_PER_NODE = 8
RECORD_SECONDS = 60.0  # the launcher's whole record, as `heartbeat_loop` sends it
ENGINE = "light-agent"  # what the agents give as their engine's identity


class NotClaimed(RuntimeError):
    """An agent's node name was not free (another agent holds it)."""


class Agent:
    """One node's two leases, renewed as its launcher and monitor renew them."""

    def __init__(self, settings: Settings, store: Store, name: str, ip: str) -> None:
        self.node = Node(name, ip, cpus=64, memory_mb=512_000,
                         gpus=[Gpu(g) for g in range(GPUS_PER_NODE)])
        self.settings, self.store = settings, store
        self.launcher = new_holder(name, ENGINE, Role.LAUNCHER)
        monitor = new_holder(name, ENGINE, Role.MONITOR)
        for holder in (self.launcher, monitor):
            self._claim(holder)
        # The fencer acts only from the node agent's own watch, which this
        # agent does not run: it has no containers to fence.
        self.keeper = LeaseKeeper(settings, store, monitor, cast(Fencer, None), b"light",
                                  lambda: "", lambda reason: None)
        self.keeper.reconciled(0)
        self.record_at = 0.0

    def _claim(self, holder: Holder) -> None:
        terms = lease_terms(self.settings)
        answer = leases.claim(self.store, holder, ip=self.node.ip,
                              peer=f"{self.node.ip}:7071", lease_ms=terms.lease_ms,
                              grace_ms=terms.grace_ms, renew_ms=terms.renew_ms,
                              live_ms=live_ms(self.settings))
        if answer.claim != Claim.TAKEN:
            raise NotClaimed(f"{holder.node}: not claimed: {answer.claim}")

    def turn(self, now: float) -> bool:
        """One heartbeat: the monitor's renewal, then the launcher's; False
        when the control plane did not take them."""
        if not self.keeper.renew_once():
            return False
        record = now - self.record_at >= RECORD_SECONDS
        try:
            leases.renew(self.store, self.launcher, live_ms=live_ms(self.settings),
                         inventory=self.node.to_dict() if record else None)
        except Exception as error:  # the monitor's renewal went through; try again next turn
            logging.getLogger(__name__).warning("%s: launcher renewal failed: %s",
                                                self.node.name, error)
            return False
        if record:
            self.record_at = now
        return True


class Tally:
    """Renewal turns made and failed, across the driver's thread."""

    def __init__(self) -> None:
        self.made = 0
        self.failed = 0


def drive_agents(agents: list[Agent], heartbeat: float, stop: threading.Event,
                 tally: Tally) -> None:
    """Each agent's turn once a heartbeat, the turns spread evenly over it."""
    gap = heartbeat / len(agents)
    started = time.monotonic()
    turn = 0
    while not stop.is_set():
        due = started + turn * gap
        if stop.wait(max(0.0, due - time.monotonic())):
            return
        if agents[turn % len(agents)].turn(time.monotonic()):
            tally.made += 1
        else:
            tally.failed += 1
        turn += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lightagent", description=__doc__)
    parser.add_argument("--prefix", default="agent-", help="of the node names")
    parser.add_argument("--count", type=int, required=True, help="agents in this process")
    parser.add_argument("--ip", required=True, help="the address the nodes give")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    settings = load_settings()
    store = Store.from_url(settings.redis_url)
    agents = [Agent(settings, store, f"{args.prefix}{i:03d}", args.ip) for i in range(args.count)]
    print(f"{len(agents)} agents claimed their leases", flush=True)
    stop, tally = threading.Event(), Tally()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    driver = threading.Thread(target=drive_agents, daemon=True,
                              args=(agents, settings.heartbeat_seconds, stop, tally))
    driver.start()
    while not stop.wait(10):
        print(f"renewal turns: {tally.made} made, {tally.failed} failed", flush=True)
    driver.join(10)
    print(f"stopped after {tally.made} renewal turns ({tally.failed} failed)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
