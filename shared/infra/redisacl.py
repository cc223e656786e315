"""Redis credentials: the one place that says who may talk to Redis and how.

Job containers share the host network, so Redis's port is reachable by every
line of job code; an open Redis is an open platform (tokens, records, admin
rights, `CONFIG SET dir` onto the host). So Redis always runs from an ACL
file written here:

- `pai`, the platform's services, may run every command except Redis's
  `@dangerous` ones (CONFIG, DEBUG, MODULE, KEYS, FLUSHALL/FLUSHDB, SHUTDOWN,
  REPLICAOF, MONITOR, ACL, SAVE, MIGRATE, CLUSTER, INFO...): the services
  need none of them, and a stolen platform password still cannot
  reconfigure the server or write a file on the host;
- `default`, the operator (backups, flushes, `INFO`): every command, behind
  its own password, so a client that has not logged in gets NOAUTH for
  everything. Only the operator's tools get that password. (Not `default
  off`: Redis replays the append-only file as `default`, and since Redis 7
  it re-checks that user's rights at each replayed EXEC, so a disabled
  `default` silently drops every transaction at restart.)

Passwords are random, generated once into files only the platform reads;
none of it ever reaches a job container (the launcher passes no setting of
the platform to a job). Stdlib only: `scripts/runtime.sh` runs it with the
system Python before any virtualenv exists, and the Compose and Kubernetes
init steps run it in the platform image:

    python3 -m shared.infra.redisacl DIR      # writes DIR/redis-password,
                                        # DIR/redis-operator-password, DIR/users.acl
    python3 -m shared.infra.redisacl DIR --from-env   # passwords from the operator's secret
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

PLATFORM_USER = "pai"
OPERATOR_USER = "default"
# `~*` every key, `&*` every pub/sub channel (Celery's broadcasts); then all
# commands but the dangerous ones. Scripts stay allowed because kombu's Redis
# transport runs Lua (EVALSHA); a script cannot call a command its user may
# not run, so it is no way round the list.
PLATFORM_RULES = "~* &* +@all -@dangerous"
OPERATOR_RULES = "~* &* +@all"

PASSWORD_FILE = "redis-password"
OPERATOR_PASSWORD_FILE = "redis-operator-password"
ACL_FILE = "users.acl"


@dataclass(frozen=True)
class Credentials:
    """Where a Redis's ACL file is, and the two users' passwords."""

    acl_file: Path
    password: str
    operator_password: str

    def url(self, host: str, port: int, db: int = 0, *, operator: bool = False) -> str:
        """A redis:// URL that logs in as the platform (or the operator)."""
        user, password = ((OPERATOR_USER, self.operator_password) if operator
                          else (PLATFORM_USER, self.password))
        return f"redis://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/{db}"


def acl_text(password: str, operator_password: str) -> str:
    """The ACL file: the operator as `default` (with a password), the platform user."""
    for value in (password, operator_password):
        if not value or any(c.isspace() for c in value):
            raise ValueError("a Redis password must be non-empty and contain no whitespace")
    return (f"user {OPERATOR_USER} on >{operator_password} {OPERATOR_RULES}\n"
            f"user {PLATFORM_USER} on >{password} {PLATFORM_RULES}\n")


def _read_or_create(path: Path, mode: int, given: str | None = None) -> str:
    """The password in `path`, made (random, 256 bits) the first time, or
    `given` (an operator's secret) written there."""
    if path.is_symlink():
        raise OSError(f"{path} is a symbolic link: refusing to read or write a password there")
    if given is None and path.exists():
        value = path.read_text().strip()
        if value:
            return value
    value = given if given is not None else secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")
    os.chmod(path, mode)
    return value


def ensure_credentials(directory: Path, *, mode: int = 0o600, password: str | None = None,
                       operator_password: str | None = None) -> Credentials:
    """Passwords in `directory` (generated once, kept across restarts) and the
    ACL file that matches them, rewritten each time so a rules change lands.
    `mode` 0o644 is for a volume only the platform's containers mount, where
    Redis and the services run as different users. Passwords given (from an
    operator's secret, as on Kubernetes) replace the generated ones."""
    directory.mkdir(parents=True, exist_ok=True)
    password = _read_or_create(directory / PASSWORD_FILE, mode, password)
    operator_password = _read_or_create(directory / OPERATOR_PASSWORD_FILE, mode,
                                        operator_password)
    acl = directory / ACL_FILE
    tmp = directory / f".{ACL_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as out:
        out.write(acl_text(password, operator_password))
    os.chmod(tmp, mode)
    os.replace(tmp, acl)
    return Credentials(acl, password, operator_password)


USAGE = """usage: python3 -m shared.infra.redisacl DIR [--shared-volume] [--from-env]
  --shared-volume  files readable by all (a volume only the platform's containers mount)
  --from-env       take the platform's password from REDIS_PASSWORD (an operator's
                   secret) and the operator's from REDIS_OPERATOR_PASSWORD if set,
                   instead of generating them"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    flags = set(args[1:])
    if not args or args[0].startswith("-") or not flags <= {"--shared-volume", "--from-env"}:
        print(USAGE, file=sys.stderr)
        return 2
    given: dict[str, str | None] = {}
    if "--from-env" in flags:
        given = {"password": os.environ.get("REDIS_PASSWORD") or None,
                 "operator_password": os.environ.get("REDIS_OPERATOR_PASSWORD") or None}
        if given["password"] is None:
            print("--from-env: REDIS_PASSWORD is not set", file=sys.stderr)
            return 2
    ensure_credentials(Path(args[0]), mode=0o644 if "--shared-volume" in flags else 0o600,
                       **given)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
