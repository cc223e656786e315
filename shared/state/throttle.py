"""Login throttling: failed logins counted per user name and per client
address in Redis, so the limit holds across every API worker and replica.

A fixed window per counter (INCR, and EXPIRE on the first failure, in one
transaction): simple, and an attacker gets at most `limit` guesses per
window per name and per address. A correct password while throttled is
refused too; otherwise throttling would only slow the guesses that fail.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.state import keys
from shared.state.store import Store


@dataclass(frozen=True)
class LoginLimits:
    per_user: int
    per_ip: int
    window_seconds: float


def _counters(username: str, client: str) -> tuple[str, str]:
    return keys.login_failures("user", username), keys.login_failures("ip", client)


def retry_after(store: Store, limits: LoginLimits, username: str, client: str) -> int:
    """Seconds until this name/address may try again; 0 when it may now."""
    user_key, ip_key = _counters(username, client)
    pipe = store.r.pipeline(transaction=False)
    pipe.get(user_key)
    pipe.pttl(user_key)
    pipe.get(ip_key)
    pipe.pttl(ip_key)
    user_count, user_ttl, ip_count, ip_ttl = pipe.execute()
    waits = [int(ttl) for count, ttl, limit in ((user_count, user_ttl, limits.per_user),
                                                 (ip_count, ip_ttl, limits.per_ip))
             if count is not None and int(count) >= limit and int(ttl) > 0]
    return -(-max(waits) // 1000) if waits else 0


def record_failure(store: Store, limits: LoginLimits, username: str, client: str) -> None:
    """Count one failed login against the name and the address."""
    window_ms = max(1, int(limits.window_seconds * 1000))
    pipe = store.r.pipeline(transaction=True)
    for key in _counters(username, client):
        pipe.incr(key)
        pipe.pexpire(key, window_ms, nx=True)  # the window starts at the first failure
    pipe.execute()
