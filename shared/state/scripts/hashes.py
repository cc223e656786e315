"""Scripts on a hash of any concept (a node's lease, a terminal session)."""

from __future__ import annotations

from shared.state.scripts import Script

# Fields set on a hash only while it exists: a lease or a session expires or
# is deleted by its owner, and a late write must not bring it back as a stub
# without its TTL. 1 set; 0 the hash is gone.
HSET_IF_EXISTS = Script(
    "hset_if_exists",
    keys=("the hash",),
    args=("field, value, field, value...",),
    source="""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
""")
