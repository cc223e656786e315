"""How every Redis and broker connection of every service guards its link.

A node talks to the control plane across a network that can drop packets,
black-hole a route or cut a machine off. A call on such a link must not hang
for the kernel's TCP timeout (minutes): each connection has

- a connect timeout and a read/write timeout (SOCKET_TIMEOUT_SECONDS), so a
  call on a dead link fails within it; blocking reads (BLPOP, XREAD BLOCK)
  wait at most BLOCK_CHUNK_SECONDS per call, well inside it;
- TCP keepalive probes (idle 10 s, then every 5 s, 3 tries), so an idle
  pooled connection to a vanished peer is found dead in about 25 s;
- a health check (PING) before a connection idle for HEALTH_CHECK_SECONDS
  is used again.

So a black-holed link is noticed within 30 s, while a lossy one (a few
percent of packets dropped) only costs TCP retransmissions well inside the
timeouts.
"""

from __future__ import annotations

import socket
from typing import Any

SOCKET_TIMEOUT_SECONDS = 15.0
CONNECT_TIMEOUT_SECONDS = 5.0
HEALTH_CHECK_SECONDS = 30
BLOCK_CHUNK_SECONDS = 5.0
KEEPALIVE_IDLE_SECONDS = 10
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_PROBES = 3


def keepalive_options() -> dict[int, int]:
    """The TCP keepalive figures, where this platform's socket module has them."""
    options: dict[int, int] = {}
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_SECONDS),
                        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_SECONDS),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, name):
            options[getattr(socket, name)] = value
    return options


def redis_options() -> dict[str, Any]:
    """redis-py connection arguments (a client or a pool)."""
    return {"socket_timeout": SOCKET_TIMEOUT_SECONDS,
            "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS,
            "socket_keepalive": True, "socket_keepalive_options": keepalive_options(),
            "health_check_interval": HEALTH_CHECK_SECONDS}


def kombu_options() -> dict[str, Any]:
    """The same for kombu's Redis transport (its BRPOP waits 1 s a call)."""
    return {**redis_options(), "retry_on_timeout": False}
