"""Which address a node gives the cluster for itself.

Other nodes reach a task at its node's IP (PAI_TASK_ROLE_*_HOST_LIST, the
peers a distributed job dials), so a node must never name a loopback address
when the control plane (and so the cluster) is on other machines: its tasks
would dial themselves. With the control plane on this very machine (`make
up`, the single-box trial) loopback is what everything uses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def loopback_refusal(node_ip: str, control_plane: Sequence[str]) -> str | None:
    """Why `node_ip` will not do, or None: loopback while the control plane
    (its resolved addresses) is elsewhere."""
    elsewhere = [a for a in control_plane if not is_loopback(a)]
    if is_loopback(node_ip) and elsewhere:
        return (f"PAI_NODE_IP is {node_ip}, a loopback address, but the control plane is "
                f"at {elsewhere[0]}: other nodes could not reach this node's tasks. Set "
                f"PAI_NODE_IP to this machine's address on the cluster network, or leave it "
                f"unset to take the address of the route to the control plane (or, when "
                f"the whole cluster is this one machine, set PAI_SINGLE_MACHINE=1)")
    return None
