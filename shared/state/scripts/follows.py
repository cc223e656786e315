"""Scripts of a user's leases of long-held requests (services/api/follows.py).
"""

from __future__ import annotations

from shared.state.scripts import Script

# A user's leases of long-held requests (log follows, execs, terminals,
# proxied connections: services/api/follows.py). As WATCH/MULTI transactions
# these writes took four or five round trips, and 500 followers of one user
# renewing one key retried each other's conflicts.

# Lua, for every script that takes or keeps a lease (these, scripts/gated.py's):
# `extend_leases(key, expiry ms)` keeps the user's set at least that long;
# `take_lease(key, lease, now ms, new expiry ms, cap)` takes a new lease
# unless the set holds `cap` live ones (expired ones dropped): true if taken.
LEASES = """
local function extend_leases(key, expiry)
  if redis.call('PEXPIRETIME', key) < tonumber(expiry) then
    redis.call('PEXPIREAT', key, expiry)
  end
end
local function take_lease(key, lease, now, expiry, cap)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if redis.call('ZCARD', key) >= tonumber(cap) then return false end
  redis.call('ZADD', key, expiry, lease)
  extend_leases(key, expiry)
  return true
end
"""

# A new lease unless the user holds `cap` live ones: 1 taken, 0 refused.
ACQUIRE_FOLLOW = Script(
    "acquire_follow",
    keys=("the user's leases",),
    args=("lease", "now ms", "new expiry ms", "cap"),
    source=LEASES + """
if take_lease(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 1 end
return 0
""")

# Extend a live lease: 1, or 0 when it is gone (expired or released).
RENEW_FOLLOW = Script(
    "renew_follow",
    keys=("the user's leases",),
    args=("lease", "now ms", "new expiry ms"),
    source=LEASES + """
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
extend_leases(KEYS[1], ARGV[3])
return 1
""")
