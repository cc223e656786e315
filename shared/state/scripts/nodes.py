"""Scripts on nodes and their allocations: a node set up by hand, the
release of an allocation, and the leases of node agents
(shared/state/leases.py).
"""

from __future__ import annotations

from shared.state.scripts import Script

# Scripts that stamp with Redis's TIME (the one clock every host's renewals
# are compared on) start with this: Redis 7 replicates a script's effects,
# so a non-deterministic call is fine in it.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# A node set up by hand: its record (unless ARGV[2] is "") and its renewal.
# Returns the stamp.
REGISTER_NODE = Script(
    "register_node",
    keys=("node record", "nodes"),
    args=("name", "record JSON ('' keeps the record)"),
    source=_NOW + """if ARGV[2] ~= '' then redis.call('SET', KEYS[1], ARGV[2]) end
redis.call('ZADD', KEYS[2], now, ARGV[1])
return now
""")

# Release an allocation if its task is settled (a final state) or gone.
# Returns 1 if it freed the allocation, else 0.
RELEASE_ALLOCATION = Script(
    "release_allocation",
    keys=("the attempt's tasks", "the node's allocations"),
    args=("the task's field", "the allocation's field", "the final task states..."),
    source="""
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if raw then
  local state = cjson.decode(raw).state
  local final = false
  for i = 3, #ARGV do
    if state == ARGV[i] then final = true end
  end
  if not final then return 0 end
end
return redis.call('HDEL', KEYS[2], ARGV[2])
""")

# Claim the node's name for an agent's process (shared/state/leases.py).
# A new holder, a new peer address or a node back from lost counts as a
# change of the nodes (their version, read back by every renewal).
# Answers {"TAKEN", now} | {"HELD_ELSEWHERE", engine, ip, age_ms} |
#         {"ROLE_HELD", instance, pid}
CLAIM_NODE = Script(
    "claim_node",
    keys=("lease", "nodes", "nodes lost", "nodes version"),
    args=("name", "engine", "role", "instance", "pid", "ip", "peer ('' keeps it)",
          "lease ms", "grace ms", "renew ms",
          "live ms (how long the lease stays live after a renewal)", "force",
          "the phase a new holder starts in (Phase.RECONCILING)"),
    source=_NOW + """
local h = redis.call('HMGET', KEYS[1], 'engine', 'renewed', 'live_until', 'ip',
                     ARGV[3], ARGV[3] .. '_pid', 'lost', 'peer')
local engine, renewed, live_until = h[1], tonumber(h[2] or '0'), tonumber(h[3] or '0')
if engine and engine ~= ARGV[2] then
  if now < live_until then
    return {'HELD_ELSEWHERE', engine, h[4] or '', tostring(now - renewed)}
  end
  redis.call('DEL', KEYS[1])
  engine = false
end
if engine and h[5] and h[5] ~= ARGV[4] and ARGV[12] ~= '1' then
  return {'ROLE_HELD', h[5], h[6] or ''}
end
local changed = not engine or (ARGV[7] ~= '' and ARGV[7] ~= h[8])
if not engine then
  redis.call('HSET', KEYS[1], 'engine', ARGV[2], 'claimed', now, 'phase', ARGV[13],
             'healthy_since', 0, 'served', 0)
elseif tonumber(h[7] or '0') > 0 and tonumber(h[7] or '0') >= renewed then
  redis.call('HSET', KEYS[1], 'healthy_since', now)  -- back after it was declared lost
end
redis.call('HSET', KEYS[1], 'ip', ARGV[6], 'lease_ms', ARGV[8], 'grace_ms', ARGV[9],
           'renew_ms', ARGV[10], ARGV[3], ARGV[4], ARGV[3] .. '_pid', ARGV[5],
           'renewed', now, ARGV[3] .. '_renewed', now, 'live_until', now + ARGV[11])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'peer', ARGV[7]) end
if ARGV[3] == 'monitor' then
  redis.call('HSET', KEYS[1], 'phase', ARGV[13])
end
redis.call('ZADD', KEYS[2], now, ARGV[1])
if redis.call('SREM', KEYS[3], ARGV[1]) == 1 then changed = true end
if changed then redis.call('INCR', KEYS[4]) end
return {'TAKEN', tostring(now)}
""")

# Renew the lease, only for the holder's own process of its role. The node
# is back from a problem (its settling time starts) when its problem clears
# after it had served (been READY without a problem since its claim: a node
# whose first problem clears is joining, not flapping), when it was declared
# lost since its last renewal, or when it says so (a monitor back from
# silence).
# A node back from lost counts as a change of the nodes.
# Answers {"OK", now, nodes standing, the nodes' version} |
#         {"LOST", holder engine, holder instance}
RENEW_NODE = Script(
    "renew_node",
    keys=("lease", "nodes", "node record", "nodes lost", "nodes version"),
    args=("name", "engine", "role", "instance", "live ms", "phase ('' keeps it)",
          "problem ('-' keeps it)", "inventory JSON ('' writes none)",
          "'1' if back from silence", "the phase of a node that takes work (Phase.READY)"),
    source=_NOW + """
local h = redis.call('HMGET', KEYS[1], 'engine', ARGV[3], 'problem', 'renewed', 'lost',
                     'phase', 'served')
if h[1] ~= ARGV[2] or h[2] ~= ARGV[4] then
  return {'LOST', h[1] or '', h[2] or ''}
end
local problem, lost = h[3] or '', tonumber(h[5] or '0')
local phase = ARGV[6] ~= '' and ARGV[6] or (h[6] or '')
local back = ARGV[9] == '1' or (lost > 0 and lost >= tonumber(h[4] or '0'))
if ARGV[7] ~= '-' then
  if problem ~= '' and ARGV[7] == '' and h[7] == '1' then back = true end
  problem = ARGV[7]
end
redis.call('HSET', KEYS[1], 'renewed', now, ARGV[3] .. '_renewed', now,
           'live_until', now + ARGV[5], 'problem', problem)
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'phase', ARGV[6]) end
if phase == ARGV[10] and problem == '' then redis.call('HSET', KEYS[1], 'served', '1') end
if back then redis.call('HSET', KEYS[1], 'healthy_since', now) end
redis.call('ZADD', KEYS[2], now, ARGV[1])
if ARGV[8] ~= '' then redis.call('SET', KEYS[3], ARGV[8]) end
if redis.call('SREM', KEYS[4], ARGV[1]) == 1 then redis.call('INCR', KEYS[5]) end
return {'OK', tostring(now),
        tostring(redis.call('ZCARD', KEYS[2]) - redis.call('SCARD', KEYS[4])),
        redis.call('GET', KEYS[5]) or '0'}
""")

# The control plane declares a node lost, unless it renewed meanwhile; the
# nodes change (their version moves) only when it was not lost already.
MARK_NODE_LOST = Script(
    "mark_node_lost",
    keys=("lease", "nodes", "nodes lost", "nodes version"),
    args=("name", "the renewal the judgement saw"),
    source=_NOW + """
local renewed = redis.call('ZSCORE', KEYS[2], ARGV[1])
if renewed and tonumber(renewed) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'lost', now)
if redis.call('SADD', KEYS[3], ARGV[1]) == 1 then redis.call('INCR', KEYS[4]) end
return 1
""")

# A process that stops cleanly gives up its role in the lease.
RELEASE_NODE_ROLE = Script(
    "release_node_role",
    keys=("lease",),
    args=("role", "instance"),
    source="""
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1], ARGV[1] .. '_pid')
end
return 0
""")
