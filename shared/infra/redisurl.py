"""PAI_REDIS_URL: the login put into it, and a `redis+sentinel://` URL read
into the sentinels, the primary's name and the database. Its own module so
that shared/infra/config.py stays a list of settings; config.py loads the
URL through these, and the Redis and broker clients read a Sentinel URL
with `parse_sentinel_url`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from shared.infra.settingtypes import ConfigError

SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379


def with_login(url: str, env: Mapping[str, str]) -> str:
    """PAI_REDIS_URL with the password of PAI_REDIS_PASSWORD (Kubernetes: from
    a Secret) or PAI_REDIS_PASSWORD_FILE (Compose: a generated file) put in it,
    user `pai` unless the URL names one: a URL with a password in it is easy
    to leak into a manifest or a shell history."""
    password = env.get("PAI_REDIS_PASSWORD") or ""
    password_file = env.get("PAI_REDIS_PASSWORD_FILE")
    if password:
        return _with_password(url, password)
    if not password_file:
        return url
    try:
        with open(password_file, encoding="utf-8") as f:
            password = f.read().strip()
    except OSError as error:
        raise ConfigError(f"PAI_REDIS_PASSWORD_FILE: cannot read {password_file}: "
                          f"{error.strerror}") from None
    if not password:
        raise ConfigError(f"PAI_REDIS_PASSWORD_FILE: {password_file} is empty")
    return _with_password(url, password)


def _with_password(url: str, password: str) -> str:
    """The URL with `password` (and user `pai` unless it names one) in it. The
    host part is kept as written: a Sentinel URL lists several hosts."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2] or "127.0.0.1"
    netloc = f"{quote(parts.username or 'pai', safe='')}:{quote(password, safe='')}@{hosts}"
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class SentinelTarget:
    """Where a Sentinel-watched Redis is: the sentinels to ask, the name they
    know the primary by, the database, and the login that both the sentinels
    and the Redis servers take (the platform's ACL user on each)."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)


def parse_sentinel_url(url: str) -> SentinelTarget | None:
    """PAI_REDIS_URL as `redis+sentinel://[user:password@]host[:port],host[:port]
    /<master>[/<db>]` (sentinel port 26379 unless given); None for any other
    URL, which redis-py reads as a single server. ConfigError names what is
    wrong, so a typo stops start-up instead of sending every service to the
    wrong server."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        return None
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    sentinels = tuple(_sentinel_address(entry) for entry in hosts.split(","))
    path = [unquote(p) for p in parts.path.split("/")[1:]]
    if not path or not path[0]:
        raise ConfigError(f"PAI_REDIS_URL: name the primary the sentinels watch, as in "
                          f"{SENTINEL_SCHEME}://h1:26379,h2:26379/mymaster/0")
    if len(path) > 2 or (len(path) == 2 and path[1] and not path[1].isdigit()):
        raise ConfigError(f"PAI_REDIS_URL: after the primary's name comes only the database "
                          f"number (/{path[0]}/0), not {'/'.join(path[1:])!r}")
    if parts.query or parts.fragment:
        raise ConfigError("PAI_REDIS_URL: a Sentinel URL takes no ?options or #fragment")
    return SentinelTarget(sentinels=sentinels, master=path[0],
                          db=int(path[1]) if len(path) == 2 and path[1] else 0,
                          username=unquote(username) or None,
                          password=unquote(password) or None)


def _sentinel_address(entry: str) -> tuple[str, int]:
    host, colon, port_text = entry.strip().rpartition(":")
    if not colon:
        host, port_text = port_text, str(DEFAULT_SENTINEL_PORT)
    host = host.strip("[]")
    if not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"PAI_REDIS_URL: {entry.strip()!r} is not a sentinel address "
                          f"(host or host:port, comma-separated)")
    return host, int(port_text)
