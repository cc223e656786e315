"""Scripts of a user's leases of long-held requests (services/api/follows.py).
"""

from __future__ import annotations

from shared.state.scripts import Script

# A user's leases of long-held requests (log follows, execs, terminals,
# proxied connections: services/api/follows.py). As WATCH/MULTI transactions
# these writes took four or five round trips, and 500 followers of one user
# renewing one key retried each other's conflicts.
_EXTEND_LEASES = """
if redis.call('PEXPIRETIME', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIREAT', KEYS[1], ARGV[3])
end
"""

# A new lease unless the user holds `cap` live ones (expired ones dropped):
# 1 taken, 0 refused.
ACQUIRE_FOLLOW = Script(
    "acquire_follow",
    keys=("the user's leases",),
    args=("lease", "now ms", "new expiry ms", "cap"),
    source="""
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
""" + _EXTEND_LEASES + "return 1")

# Extend a live lease: 1, or 0 when it is gone (expired or released).
RENEW_FOLLOW = Script(
    "renew_follow",
    keys=("the user's leases",),
    args=("lease", "now ms", "new expiry ms"),
    source="""
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
""" + _EXTEND_LEASES + "return 1")
