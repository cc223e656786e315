"""What both processes of a node agent (its launcher and its monitor) do to
hold the node's name: claim it at start-up, and the figures they renew it
with (shared/domain/lease.py has the rules, shared/state/leases.py the
records).
"""

from __future__ import annotations

import logging
import os
import threading
import uuid

import redis

from shared.domain.lease import Claim, ClaimAnswer, LeaseTerms
from shared.infra.config import Settings
from shared.state import leases
from shared.state.leases import Holder, Role
from shared.state.store import Store

log = logging.getLogger(__name__)

CLAIM_RETRY_SECONDS = 2.0


class NameRefused(RuntimeError):
    """Another agent holds this node's name: the service must not start."""


def lease_terms(settings: Settings) -> LeaseTerms:
    return LeaseTerms(lease_ms=int(settings.node_lease_seconds * 1000),
                      grace_ms=int(settings.node_fence_grace_seconds * 1000),
                      renew_ms=int(settings.heartbeat_seconds * 1000))


def live_ms(settings: Settings) -> int:
    """How long a renewal keeps the name from other machines' agents: until
    the control plane may declare the node lost."""
    return lease_terms(settings).lost_after_ms(int(settings.node_lost_seconds * 1000))


def new_holder(node: str, engine: str, role: Role) -> Holder:
    return Holder(node=node, engine=engine, role=role, instance=uuid.uuid4().hex,
                  pid=os.getpid())


def same_role_alive(pid: str, role: Role) -> bool:
    """Is process `pid` of this machine still a running pai `role`? A pid
    reused by another program is not."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as raw:
            words = raw.read().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return False
    return f"pai-{role.value}" in words or f"services.{role.value}" in words


def claim_name(store: Store, holder: Holder, settings: Settings, *, peer: str,
               stop: threading.Event) -> None:
    """Claim the node's name, waiting for Redis as long as it takes (a node
    does nothing before it holds its name). NameRefused when another
    machine's agent, or a live process of this role here, holds it."""
    terms = lease_terms(settings)
    force = False
    while not stop.is_set():
        try:
            answer: ClaimAnswer = leases.claim(
                store, holder, ip=settings.node_ip, peer=peer, lease_ms=terms.lease_ms,
                grace_ms=terms.grace_ms, renew_ms=terms.renew_ms, live_ms=live_ms(settings),
                force=force)
        except redis.RedisError as error:
            log.warning("cannot reach the control plane to claim node %s: %s", holder.node,
                        error)
            stop.wait(CLAIM_RETRY_SECONDS)
            continue
        if answer.claim == Claim.TAKEN:
            log.info("node %s: %s %s holds the name (engine %s)", holder.node,
                     holder.role.value, holder.instance[:12], holder.engine[:20])
            return
        if answer.claim == Claim.ROLE_HELD and not same_role_alive(
                str(answer.holder.get("pid", "")), holder.role):
            force = True  # its process is gone (killed, restarted): take its place
            continue
        raise NameRefused(answer.refusal(holder.node, holder.role.value))

