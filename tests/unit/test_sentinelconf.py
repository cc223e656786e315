"""The Sentinel group's configuration files (shared/infra/sentinelconf.py)."""

from __future__ import annotations

import stat
from pathlib import Path

from shared.infra.redisacl import PASSWORD_FILE
from shared.infra.sentinelconf import (
    REPLICATION_FILE,
    SENTINEL_FILE,
    main,
    replication_text,
    sentinel_text,
)


def test_servers_replicate_as_the_operator_and_guard_writes() -> None:
    text = replication_text("op-pw")
    assert "masteruser default\nmasterauth op-pw\n" in text
    assert "min-replicas-to-write 1\n" in text
    assert "min-replicas-max-lag 10\n" in text


def test_the_platform_may_only_ask_a_sentinel_where_the_primary_is() -> None:
    lines = sentinel_text("pai-pw", "op-pw", "redis", 6379).splitlines()
    pai = next(line for line in lines if line.startswith("user pai "))
    assert ">pai-pw" in pai and "-@all" in pai and "+sentinel|masters" in pai
    assert "failover" not in pai and "sentinel|set" not in pai and "+@all" not in pai
    assert "sentinel monitor pai redis 6379 2" in lines
    assert "sentinel auth-pass pai op-pw" in lines


def test_hostnames_are_resolved_before_the_monitor_line_names_one() -> None:
    lines = sentinel_text("a", "b", "redis-0.redis", 6379, hostnames=True).splitlines()
    assert lines.index("sentinel resolve-hostnames yes") < \
        next(n for n, line in enumerate(lines) if line.startswith("sentinel monitor"))


def test_the_command_writes_private_files_beside_the_acl(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--primary", "redis:6380"]) == 0
    password = (tmp_path / PASSWORD_FILE).read_text().strip()
    assert f">{password} " in (tmp_path / SENTINEL_FILE).read_text()
    assert "sentinel monitor pai redis 6380 2" in (tmp_path / SENTINEL_FILE).read_text()
    for name in (SENTINEL_FILE, REPLICATION_FILE):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert main([str(tmp_path), "--primary", "redis:port"]) == 2
