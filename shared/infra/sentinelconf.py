"""Configuration files of a Sentinel-watched Redis (docs/high-availability.md).

One primary, replicas, three sentinels; credentials as shared/infra/redisacl.py
makes them, so nothing answers without a password:

- every Redis server loads the same ACL file; replicas sync, and sentinels
  watch and reconfigure the servers, as the operator (`default`), whose
  rights they need (REPLICAOF, CONFIG REWRITE, PSYNC);
- each sentinel knows `default` (the operator, and the other sentinels) and
  `pai`, the platform's services, which may only ask where the primary and
  replicas are: a stolen platform password cannot order a failover or point
  the sentinels at a server of its own;
- replication is asynchronous; the primary refuses writes while fewer than
  MIN_REPLICAS_TO_WRITE replicas acknowledged within MIN_REPLICAS_MAX_LAG
  seconds, which bounds what a primary cut off from its replicas can accept
  and later lose.

Passwords go into files (mode 0600 by default), never on a command line
where `ps` would show them. Stdlib only, like shared/infra/redisacl.py, so the
Compose and Kubernetes init steps can run it:

    python3 -m shared.infra.sentinelconf DIR --primary HOST[:PORT] [--name pai]
                                   [--min-replicas-to-write N]
        # writes DIR/replication.conf and DIR/sentinel.conf beside
        # DIR/users.acl (made by `python3 -m shared.infra.redisacl DIR` first)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from shared.infra.redisacl import ACL_FILE, OPERATOR_USER, PLATFORM_USER, ensure_credentials

MASTER_NAME = "pai"
QUORUM = 2
DOWN_AFTER_MS = 5000
FAILOVER_TIMEOUT_MS = 60000
MIN_REPLICAS_TO_WRITE = 1
MIN_REPLICAS_MAX_LAG = 10
REPLICATION_FILE = "replication.conf"
SENTINEL_FILE = "sentinel.conf"
# What the platform's services may ask a sentinel: log in, and where the
# primary and replicas are (redis-py's and kombu's discovery).
SENTINEL_PLATFORM_RULES = ("-@all +auth +hello +ping +client|setname "
                           "+sentinel|masters +sentinel|master +sentinel|get-master-addr-by-name "
                           "+sentinel|replicas +sentinel|slaves +sentinel|sentinels")


def replication_text(operator_password: str, *,
                     min_replicas_to_write: int = MIN_REPLICAS_TO_WRITE) -> str:
    """Lines every Redis server of the group includes: how a replica logs in
    to its primary (any server may become one), and the write guard."""
    return (f"masteruser {OPERATOR_USER}\n"
            f"masterauth {operator_password}\n"
            f"min-replicas-to-write {min_replicas_to_write}\n"
            f"min-replicas-max-lag {MIN_REPLICAS_MAX_LAG}\n")


def sentinel_text(password: str, operator_password: str, primary_host: str,
                  primary_port: int, *, name: str = MASTER_NAME,
                  down_after_ms: int = DOWN_AFTER_MS, hostnames: bool = False) -> str:
    """A sentinel's starting configuration (it rewrites the file as it
    learns; passwords come back as hashes). `hostnames`: the servers are
    known by DNS names (Compose, Kubernetes), not addresses."""
    names = ("sentinel resolve-hostnames yes\nsentinel announce-hostnames yes\n"
             if hostnames else "")
    return (f"user {OPERATOR_USER} on >{operator_password} ~* &* +@all\n"
            f"user {PLATFORM_USER} on >{password} {SENTINEL_PLATFORM_RULES}\n"
            f"sentinel sentinel-user {OPERATOR_USER}\n"
            f"sentinel sentinel-pass {operator_password}\n"
            f"{names}"
            f"sentinel monitor {name} {primary_host} {primary_port} {QUORUM}\n"
            f"sentinel auth-user {name} {OPERATOR_USER}\n"
            f"sentinel auth-pass {name} {operator_password}\n"
            f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
            f"sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {name} 1\n")


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` to `path` (not through a link) with `mode`."""
    if path.is_symlink():
        raise OSError(f"{path} is a symbolic link: refusing to write a password there")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, mode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m shared.infra.sentinelconf")
    parser.add_argument("directory", type=Path, help=f"holds {ACL_FILE} and its passwords")
    parser.add_argument("--primary", required=True, help="the first primary, HOST[:PORT]")
    parser.add_argument("--name", default=MASTER_NAME, help="the name sentinels know it by")
    parser.add_argument("--min-replicas-to-write", type=int, default=MIN_REPLICAS_TO_WRITE,
                        help="0 for a single Redis, which has no replica to wait for")
    parser.add_argument("--shared-volume", action="store_true",
                        help="files readable by all (a volume only the platform mounts)")
    args = parser.parse_args(argv)
    host, _, port = args.primary.partition(":")
    if not host or (port and not port.isdigit()):
        print(f"--primary must be HOST[:PORT], not {args.primary!r}", file=sys.stderr)
        return 2
    mode = 0o644 if args.shared_volume else 0o600
    credentials = ensure_credentials(args.directory, mode=mode)
    write_private(args.directory / REPLICATION_FILE,
                  replication_text(credentials.operator_password,
                                   min_replicas_to_write=args.min_replicas_to_write), mode)
    write_private(args.directory / SENTINEL_FILE,
                  sentinel_text(credentials.password, credentials.operator_password, host,
                                int(port or 6379), name=args.name, hostnames=True), mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
