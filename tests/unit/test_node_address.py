"""Which address a node gives the cluster (shared/domain/addresses.py,
shared/infra/nodeaddress.py): found from the route when unset, loopback
refused when the control plane is on another machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shared.domain.addresses import is_loopback, loopback_refusal
from shared.infra.config import ConfigError, load_settings
from shared.infra.nodeaddress import control_plane_endpoints, with_node_address
from shared.infra.supervise import EXIT_REFUSED

REMOTE = "redis://pai:pw@10.213.0.2:6379/0"


@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("localhost", True),
    ("10.0.0.5", False), ("fe80::1", False), ("gpu-01", False)])
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) == loopback


def test_loopback_is_refused_only_when_the_control_plane_is_elsewhere() -> None:
    assert loopback_refusal("127.0.0.1", ["127.0.0.1"]) is None
    assert loopback_refusal("10.0.0.5", ["10.0.0.2"]) is None
    refusal = loopback_refusal("127.0.0.1", ["10.0.0.2"])
    assert refusal is not None and "10.0.0.2" in refusal and "PAI_SINGLE_MACHINE" in refusal


def test_the_control_plane_is_redis_or_every_sentinel() -> None:
    assert control_plane_endpoints(REMOTE) == [("10.213.0.2", 6379)]
    assert control_plane_endpoints("redis+sentinel://s1:26379,s2/pai") == [
        ("s1", 26379), ("s2", 26379)]


def test_a_node_beside_its_control_plane_is_loopback() -> None:
    settings = with_node_address(load_settings({"PAI_REDIS_URL": "redis://127.0.0.1:6379/0"}))
    assert (settings.node_ip, settings.monitor_host) == ("127.0.0.1", "127.0.0.1")


def test_a_loopback_node_ip_with_a_remote_control_plane_stops_the_agent() -> None:
    with pytest.raises(ConfigError, match="loopback"):
        with_node_address(load_settings({"PAI_REDIS_URL": REMOTE, "PAI_NODE_IP": "127.0.0.1"}))


def test_the_compose_trial_says_the_whole_cluster_is_one_machine() -> None:
    settings = with_node_address(load_settings({
        "PAI_REDIS_URL": REMOTE, "PAI_NODE_IP": "127.0.0.1", "PAI_SINGLE_MACHINE": "1",
        "PAI_MONITOR_HOST": "0.0.0.0"}))
    assert (settings.node_ip, settings.monitor_host) == ("127.0.0.1", "0.0.0.0")


@pytest.mark.parametrize("service", ["launcher", "monitor"])
def test_a_node_service_refused_its_address_logs_why_and_exits_for_good(service: str) -> None:
    """In a process of its own: the service sets up logging as it starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAI_")}
    started = subprocess.run(
        [sys.executable, "-c", "from shared.infra.nodeaddress import node_service_settings; "
                               f"node_service_settings({service!r})"],
        env={**env, "PAI_REDIS_URL": REMOTE, "PAI_NODE_IP": "127.0.0.1"},
        capture_output=True, text=True, timeout=60, check=False)
    assert started.returncode == EXIT_REFUSED
    assert f"pai.{service}" in started.stderr and "loopback" in started.stderr
