"""The scheduler's scripts: binding a pass's gangs, and the pass lock and
its dirty flag (services/scheduler/gate.py).
"""

from __future__ import annotations

from shared.state.scripts import Script

# Bind a pass's gangs (shared/state/placing.py `commit_placements`), each
# all or nothing: a job is bound only if its record is as the pass read it
# (version, waiting, attempt, queue_seq, VC: every write of a job's tasks
# bumps its version, so its tasks are as read, all waiting) and it has as
# many tasks as were read (the gang whole), no admin holds any of its nodes,
# and every node still has room (the same rules as shared/domain/cluster.py
# `placement_fits`, against what the node holds now, this batch's earlier
# jobs included). A job passing all of them gets its writes, rendered by the
# caller; one that fails gets none. The reply holds 1 or 0 per job.
#
# A job entry: j, t, e, q (job, tasks, events, VC queue key positions in
# KEYS), id, v, s, a, vc (version, queue_seq, attempt, VC as the pass read
# them), nt (how many tasks), new (task field -> position in ARGV of the
# record to write), f (job fields to write), ev (event fields, flat), l
# (launch entries, flat: member, deadline), n (per node: k, h = node and
# allocation key positions, name, g = GPUs, p = ports, c = CPUs, m = memory,
# w = allocation field and ARGV position of its record, flat). The records
# the entries point at come after the fixed arguments: passed as they are,
# not as strings inside the JSON, they are neither escaped by the caller nor
# decoded by the script.
COMMIT_PLACEMENTS = Script(
    "commit_placements",
    keys=("node flags", "launching", "queue", "GPU faults",
          "the keys the entries name by position..."),
    args=("the entries (JSON)", "the events' bound",
          "the state a job waits in (JobState.WAITING)", "the records the entries name..."),
    source="""
local flags_key, launching_key, queue_key, faults_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local jobs = cjson.decode(ARGV[1])
local nodes = {}
-- most of the time no GPU is marked: then no GPU needs looking up
local any_faults = redis.call('EXISTS', faults_key) == 1

local function node_view(name, node_key, alloc_key)
  local view = nodes[name]
  if view then return view end
  view = {ok = false}
  nodes[name] = view
  local raw = redis.call('GET', node_key)
  if not raw then return view end
  local node = cjson.decode(raw)
  view.gpus, view.used_gpus, view.used_ports = {}, {}, {}
  for _, gpu in ipairs(node.gpus or {}) do
    view.gpus[type(gpu) == 'table' and gpu.index or gpu] = true
  end
  view.cpus, view.memory = node.cpus or 0, node.memory_mb or 0
  view.used_cpus, view.used_memory = 0, 0
  view.ok = true
  for _, value in ipairs(redis.call('HVALS', alloc_key)) do
    local held = cjson.decode(value)
    for _, g in ipairs(held.gpus) do
      if view.used_gpus[g] or not view.gpus[g] then view.ok = false end
      view.used_gpus[g] = true
    end
    for _, p in ipairs(held.ports) do
      if view.used_ports[p] then view.ok = false end
      view.used_ports[p] = true
    end
    view.used_cpus = view.used_cpus + held.cpus
    view.used_memory = view.used_memory + held.memory_mb
  end
  return view
end

local function fits(view, part)
  if not view.ok then return false end
  local gpus, ports = {}, {}
  for _, g in ipairs(part.g) do
    if gpus[g] or view.used_gpus[g] or not view.gpus[g] then return false end
    -- marked unhealthy since the pass read the faults (shared/domain/gpuhealth.py)
    if any_faults and redis.call('HEXISTS', faults_key, part.name .. ':' .. g) == 1 then
      return false
    end
    gpus[g] = true
  end
  for _, p in ipairs(part.p) do
    if ports[p] or view.used_ports[p] then return false end
    ports[p] = true
  end
  return view.used_cpus + part.c <= view.cpus and view.used_memory + part.m <= view.memory
end

local function still_decidable(job)
  local key = KEYS[job.j]
  local now = redis.call('HMGET', key, 'version', 'state', 'attempt', 'queue_seq',
                        'virtual_cluster')
  if now[1] ~= job.v or now[2] ~= ARGV[3] or now[3] ~= job.a or now[4] ~= job.s
      or now[5] ~= job.vc then
    return false
  end
  if redis.call('HLEN', KEYS[job.t]) ~= job.nt then return false end
  for _, part in ipairs(job.n) do
    local flag = redis.call('HGET', flags_key, part.name)
    if flag and flag ~= '' then return false end
    if not fits(node_view(part.name, KEYS[part.k], KEYS[part.h]), part) then return false end
  end
  return true
end

local function bind(job)
  for _, part in ipairs(job.n) do
    local view = nodes[part.name]
    for _, g in ipairs(part.g) do view.used_gpus[g] = true end
    for _, p in ipairs(part.p) do view.used_ports[p] = true end
    view.used_cpus = view.used_cpus + part.c
    view.used_memory = view.used_memory + part.m
    for i = 1, #part.w, 2 do
      redis.call('HSET', KEYS[part.h], part.w[i], ARGV[part.w[i + 1]])
    end
  end
  for i = 1, #job.l, 2 do
    redis.call('ZADD', launching_key, job.l[i + 1], job.l[i])
  end
  for field, at in pairs(job.new) do  -- one by one: a gang may be too big to unpack
    redis.call('HSET', KEYS[job.t], field, ARGV[at])
  end
  redis.call('ZREM', queue_key, job.id)
  redis.call('ZREM', KEYS[job.q], job.id)
  redis.call('HSET', KEYS[job.j], unpack(job.f))
  redis.call('XADD', KEYS[job.e], 'MAXLEN', '~', ARGV[2], '*', unpack(job.ev))
end

local bound = {}
for i, job in ipairs(jobs) do
  if still_decidable(job) then
    bind(job)
    bound[i] = 1
  else
    bound[i] = 0
  end
end
return bound
""")

# A pass request, in one step: the pass-request flag is taken (the pass reads
# the queue after this: the next submit must ask again, see
# lifecycle.take_pass_request); with ARGV[3] = "1" and messages waiting in the
# scheduler's broker queue, the work is only marked (2: deferred); else the
# lock is taken (1: begun, the dirty flag cleared: this pass sees it all) or,
# held by another, the work marked for its holder (0: held). With ARGV[4] =
# "1" it does nothing unless the dirty flag is set.
BEGIN_PASS = Script(
    "begin_pass",
    keys=("scheduler lock", "dirty flag", "pass-request flag", "scheduler's broker queue"),
    args=("token", "lock ms", "'1' to defer while messages wait", "'1' only if dirty"),
    source="""
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('DEL', KEYS[3])
if ARGV[3] == '1' and redis.call('LLEN', KEYS[4]) > 0 then
  redis.call('SET', KEYS[2], '1')
  return 2
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('DEL', KEYS[2])
  return 1
end
redis.call('SET', KEYS[2], '1')
return 0
""")

# After a pass, in one step: asked again meanwhile (the dirty flag) -> clear
# it, keep (or retake) the lock, pass again (1); else let the lock go (0).
# With ARGV[2] = "0" the lock is let go whatever the flag (which stays). A
# lock that expired during the pass and that another took is left to that
# holder, which sees the flag (-1). Atomic with BEGIN_PASS, so a request is
# either seen here or takes the free lock itself: none is lost.
END_PASS = Script(
    "end_pass",
    keys=("scheduler lock", "dirty flag", "pass-request flag"),
    args=("token", "lock ms ('0': let go)"),
    source="""
local mine = redis.call('GET', KEYS[1]) == ARGV[1]
if ARGV[2] == '0' then
  if mine then redis.call('DEL', KEYS[1]) end
  return 0
end
if not mine and not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -1
end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('DEL', KEYS[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
return 0
""")
