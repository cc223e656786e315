"""Writes held to conditions: the Lua that checks what a write was decided
on (shared/state/store `Expect`), and the script that runs a batch of
plain writes only when its conditions hold and a lease is taken
(shared/state/gated.py).
"""

from __future__ import annotations

from shared.state.scripts import Script
from shared.state.scripts.follows import LEASES

# Lua, for every script that holds its write to expectations (this one,
# CREATE_JOB): `holds(kind, key, field, value)`, whether one Expect holds now.
HOLDS = """
local function holds(kind, key, field, value)
  if kind == 'equal' then return redis.call('HGET', key, field) == value end
  if kind == 'absent' then return redis.call('EXISTS', key) == 0 end
  return tonumber(redis.call('GET', key) or '0') < tonumber(value)  -- 'below'
end
"""

# The writes, each [command, argument...] of a command whose one key is its
# first argument (KEYS[1 + i] is the i-th item's key, an expectation's or a
# write's), run in order only when every expectation holds and the user's
# lease is taken. The items come as one JSON array (as CREATE_JOB's do).
# `#!lua`: a write up front (CREATE_JOB says why).
# Returns 'written', 'changed' (an expectation failed) or 'capped' (the user
# holds `cap` live leases); only 'written' wrote anything.
LEASED_WRITE = Script(
    "leased_write",
    keys=("the user's leases", "each expectation's key, then each write's key..."),
    args=("lease", "now ms", "new expiry ms", "cap", "number of expectations",
          "JSON array: each expectation's [kind, field, value], then each write's "
          "[command, argument...] without its key"),
    source="#!lua" + HOLDS + LEASES + """
local expected = tonumber(ARGV[5])
local items = cjson.decode(ARGV[6])
for i = 1, expected do
  local expect = items[i]
  if not holds(expect[1], KEYS[1 + i], expect[2], expect[3]) then return 'changed' end
end
if not take_lease(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 'capped' end
for i = expected + 1, #items do
  local write = items[i]
  redis.call(write[1], KEYS[1 + i], unpack(write, 2))
end
return 'written'
""")
