"""The node's own address, found from the route to the control plane when
the operator did not set PAI_NODE_IP (shared/domain/addresses.py says why
loopback is refused when the control plane is elsewhere)."""

from __future__ import annotations

import dataclasses
import logging
import socket
from urllib.parse import urlsplit

from shared.domain.addresses import is_loopback, loopback_refusal
from shared.infra.config import ConfigError, Settings, load_settings, parse_sentinel_url
from shared.infra.logs import setup_logging
from shared.infra.supervise import EXIT_REFUSED

log = logging.getLogger(__name__)

DEFAULT_REDIS_PORT = 6379


def control_plane_endpoints(redis_url: str) -> list[tuple[str, int]]:
    """(host, port) of Redis, or of each sentinel for a Sentinel URL."""
    target = parse_sentinel_url(redis_url)
    if target is not None:
        return [(host, int(port)) for host, port in target.sentinels]
    parts = urlsplit(redis_url)
    if parts.scheme == "unix":
        return [("127.0.0.1", 0)]
    return [(parts.hostname or "127.0.0.1", parts.port or DEFAULT_REDIS_PORT)]


def resolve(host: str) -> list[str]:
    try:
        return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None)})
    except OSError:
        return []


def route_source(address: str, port: int) -> str:
    """The local address the kernel would send from to `address` (a UDP
    connect sends nothing)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((address, port or DEFAULT_REDIS_PORT))
        return str(probe.getsockname()[0])


def with_node_address(settings: Settings) -> Settings:
    """`settings` with the node's IP found (when not given) and checked."""
    endpoints = control_plane_endpoints(settings.redis_url)
    addresses = [a for host, _ in endpoints for a in resolve(host)]
    ip = settings.node_ip
    if not ip:  # PAI_NODE_IP unset: the route to the control plane says
        remote = [a for a in addresses if not is_loopback(a)]
        ip = "127.0.0.1"
        if remote:
            port = next((p for h, p in endpoints if remote[0] in resolve(h)), 0)
            ip = route_source(remote[0], port)
            log.info("PAI_NODE_IP not set: this node is %s, the address of its route to "
                     "the control plane (%s)", ip, remote[0])
    refusal = None if settings.single_machine else loopback_refusal(ip, addresses)
    if refusal:
        raise ConfigError(refusal)
    return dataclasses.replace(settings, node_ip=ip, monitor_host=settings.monitor_host or ip)


def node_service_settings(service: str) -> Settings:
    """The settings of a node's service (`launcher`, `monitor`) with the node's
    address, its logging set up first so that a refused address is logged (as
    `pai.<service>`); the refusal exits with EXIT_REFUSED, since starting the
    service again would change nothing."""
    settings = load_settings()
    setup_logging(service, settings.log_level, settings.log_format)
    try:
        return with_node_address(settings)
    except ConfigError as error:
        logging.getLogger(f"pai.{service}").error("%s", error)
        raise SystemExit(EXIT_REFUSED) from None
