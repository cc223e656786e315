"""What job containers lose and what an admin may give back (shared/domain/capabilities.py),
and the pids limit setting: pure rules, no engine."""

from __future__ import annotations

from typing import Any

import pytest

from shared.domain.capabilities import (
    DROPPED,
    EXTRA_GRANTABLE,
    GRANTABLE,
    KEPT,
    capability_list_errors,
    dropped_capabilities,
    refused_capabilities,
)
from shared.infra.config import ConfigError, load_settings

# Docker's default capability set (moby's oci/caps/defaults.go).
DOCKER_DEFAULTS = {"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID",
                   "SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL",
                   "AUDIT_WRITE"}


def test_every_default_capability_is_either_dropped_or_kept_with_a_reason() -> None:
    assert set(DROPPED) | set(KEPT) == DOCKER_DEFAULTS
    assert not set(DROPPED) & set(KEPT)
    assert all(reason.strip() for reason in {**DROPPED, **KEPT, **EXTRA_GRANTABLE}.values())


def test_nothing_that_reaches_the_host_is_grantable() -> None:
    host_reaching = {"SYS_ADMIN", "NET_ADMIN", "SYS_MODULE", "SYS_RAWIO", "DAC_READ_SEARCH",
                     "SYS_TIME", "SYS_BOOT", "BPF", "PERFMON", "MAC_ADMIN", "SYSLOG",
                     "SYS_RESOURCE", "SYS_NICE", "ALL"}
    assert not GRANTABLE & host_reaching


@pytest.mark.parametrize(("port_range", "net_bind_dropped"), [
    pytest.param((15000, 40000), True, id="ports from 15000: NET_BIND_SERVICE dropped"),
    pytest.param((1024, 2000), True, id="ports from 1024 (not privileged): dropped"),
    pytest.param((1023, 2000), False, id="a range reaching 1023 keeps NET_BIND_SERVICE"),
    pytest.param((80, 90), False, id="ports 80-90 keep NET_BIND_SERVICE"),
])
def test_net_bind_service_follows_the_port_range(port_range: tuple[int, int],
                                                 net_bind_dropped: bool) -> None:
    dropped = dropped_capabilities(port_range)
    assert ("NET_BIND_SERVICE" in dropped) == net_bind_dropped
    assert set(dropped) | {"NET_BIND_SERVICE"} == set(DROPPED)
    assert dropped == sorted(dropped)


@pytest.mark.parametrize(("value", "ok"), [
    pytest.param([], True, id="nothing asked"),
    pytest.param(["IPC_LOCK"], True, id="IPC_LOCK for RDMA"),
    pytest.param(["NET_RAW", "SYS_PTRACE"], True, id="two grantable"),
    pytest.param(["SYS_ADMIN"], False, id="SYS_ADMIN never"),
    pytest.param(["CAP_IPC_LOCK"], False, id="CAP_ prefix is not Docker's name here"),
    pytest.param(["ipc_lock"], False, id="lowercase"),
    pytest.param(["ALL"], False, id="ALL"),
    pytest.param("IPC_LOCK", False, id="a string, not a list"),
    pytest.param({"IPC_LOCK": True}, False, id="an object"),
    pytest.param([1], False, id="a number"),
    pytest.param(["IPC_LOCK"] * 100, False, id="too many"),
])
def test_capability_lists(value: Any, ok: bool) -> None:
    assert (capability_list_errors(value) == []) == ok


@pytest.mark.parametrize(("requested", "allowed", "refused"), [
    pytest.param(["IPC_LOCK"], ["IPC_LOCK"], [], id="allowed"),
    pytest.param(["IPC_LOCK"], [], ["IPC_LOCK"], id="empty allow-list"),
    pytest.param(["SYS_PTRACE", "IPC_LOCK"], ["IPC_LOCK"], ["SYS_PTRACE"], id="one of two"),
    pytest.param(["IPC_LOCK", "IPC_LOCK"], [], ["IPC_LOCK"], id="named once"),
])
def test_refused_capabilities(requested: list[str], allowed: list[str],
                              refused: list[str]) -> None:
    assert refused_capabilities(requested, allowed) == refused


def test_the_pids_limit_defaults_to_4096_and_is_configurable() -> None:
    assert load_settings({}).container_pids_limit == 4096
    assert load_settings({"PAI_CONTAINER_PIDS_LIMIT": "64"}).container_pids_limit == 64


@pytest.mark.parametrize("raw", ["0", "-1", "many"])
def test_a_pids_limit_that_bounds_nothing_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="PAI_CONTAINER_PIDS_LIMIT"):
        load_settings({"PAI_CONTAINER_PIDS_LIMIT": raw})
