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
# A job entry is an array: the positions in KEYS of the job's record, its
# tasks, its events and its VC's queue; the job's id, version, queue_seq,
# attempt and VC as the pass read them; how many tasks it has; the tasks to
# write (flat: field, position in ARGV of the record); the job's fields to
# write (flat); its event's fields (flat); and one array per node: its name,
# the positions in KEYS of its record and its allocations, the GPUs, ports,
# CPUs and memory taken, and the allocations to write (flat: field, position
# in ARGV of the record; each field is also a task's launch entry, due at the
# batch's one deadline). Arrays, not objects: no names to encode and decode
# for every job. The records the entries point at come after the fixed
# arguments: passed as they are, not as strings inside the JSON, they are
# neither escaped by the caller nor decoded by the script.
COMMIT_PLACEMENTS = Script(
    "commit_placements",
    keys=("node flags", "launching", "queue", "GPU faults",
          "the keys the entries name by position..."),
    args=("the entries (JSON)", "the events' bound",
          "the state a job waits in (JobState.WAITING)", "the launch deadline (ms)",
          "the records the entries name..."),
    source="""
local flags_key, launching_key, queue_key, faults_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local jobs = cjson.decode(ARGV[1])
-- an entry's items, and a node part's (see placing.py `_placement_entry`)
local JOB, TASKS, EVENTS, VC_QUEUE, ID, VERSION, SEQ, ATTEMPT, VC, TASK_COUNT, NEW, FIELDS,
      EVENT, PARTS = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14
local NAME, NODE, ALLOCS, GPUS, PORTS, CPUS, MEMORY, WRITES = 1, 2, 3, 4, 5, 6, 7, 8
local deadline = ARGV[4]
local CHUNK = 1000  -- arguments unpacked into one call at most
local nodes = {}
-- most of the time no GPU is marked: then no GPU needs looking up
local any_faults = redis.call('EXISTS', faults_key) == 1

-- whether an admin holds each node the batch names, in one call
local held, names = {}, {}
for _, job in ipairs(jobs) do
  for _, part in ipairs(job[PARTS]) do
    local name = part[NAME]
    if held[name] == nil then
      held[name] = false
      names[#names + 1] = name
    end
  end
end
for at = 1, #names, CHUNK do
  local flags = redis.call('HMGET', flags_key, unpack(names, at, math.min(at + CHUNK - 1, #names)))
  for i, flag in ipairs(flags) do
    held[names[at + i - 1]] = flag ~= false and flag ~= ''
  end
end

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
    local used = cjson.decode(value)
    for _, g in ipairs(used.gpus) do
      if view.used_gpus[g] or not view.gpus[g] then view.ok = false end
      view.used_gpus[g] = true
    end
    for _, p in ipairs(used.ports) do
      if view.used_ports[p] then view.ok = false end
      view.used_ports[p] = true
    end
    view.used_cpus = view.used_cpus + used.cpus
    view.used_memory = view.used_memory + used.memory_mb
  end
  return view
end

local function fits(view, part)
  if not view.ok then return false end
  local gpus, ports = {}, {}
  for _, g in ipairs(part[GPUS]) do
    if gpus[g] or view.used_gpus[g] or not view.gpus[g] then return false end
    -- marked unhealthy since the pass read the faults (shared/domain/gpuhealth.py)
    if any_faults and redis.call('HEXISTS', faults_key, part[NAME] .. ':' .. g) == 1 then
      return false
    end
    gpus[g] = true
  end
  for _, p in ipairs(part[PORTS]) do
    if ports[p] or view.used_ports[p] then return false end
    ports[p] = true
  end
  return view.used_cpus + part[CPUS] <= view.cpus
     and view.used_memory + part[MEMORY] <= view.memory
end

local function still_decidable(job)
  local now = redis.call('HMGET', KEYS[job[JOB]], 'version', 'state', 'attempt', 'queue_seq',
                        'virtual_cluster')
  if now[1] ~= job[VERSION] or now[2] ~= ARGV[3] or now[3] ~= job[ATTEMPT]
      or now[4] ~= job[SEQ] or now[5] ~= job[VC] then
    return false
  end
  if redis.call('HLEN', KEYS[job[TASKS]]) ~= job[TASK_COUNT] then return false end
  for _, part in ipairs(job[PARTS]) do
    local name = part[NAME]
    if held[name] then return false end
    if not fits(node_view(name, KEYS[part[NODE]], KEYS[part[ALLOCS]]), part) then
      return false
    end
  end
  return true
end

-- A bound job's writes to keys other jobs of the batch write too (the
-- nodes' allocations, the launch deadlines, the queues) are gathered, and
-- made once per key after the last job: the script runs
-- alone, so what any later read sees is the same, in fewer calls. Each of
-- these holds, per key, the values gathered for it, and the keys in order.
local hashes = {lists = {}, keys = {}}  -- field, value, ...
local launches = {lists = {}, keys = {}}  -- deadline, member, ...
local dequeued = {lists = {}, keys = {}}  -- job ids

local function gather(into, key, first, second)
  local list = into.lists[key]
  if not list then
    list = {}
    into.lists[key] = list
    into.keys[#into.keys + 1] = key
  end
  list[#list + 1] = first
  if second ~= nil then list[#list + 1] = second end
end

local function flush(from, command)
  for _, key in ipairs(from.keys) do
    local list = from.lists[key]
    for at = 1, #list, CHUNK do
      redis.call(command, key, unpack(list, at, math.min(at + CHUNK - 1, #list)))
    end
  end
end

local function bind(job)
  for _, part in ipairs(job[PARTS]) do
    local view, allocs, writes = nodes[part[NAME]], KEYS[part[ALLOCS]], part[WRITES]
    for _, g in ipairs(part[GPUS]) do view.used_gpus[g] = true end
    for _, p in ipairs(part[PORTS]) do view.used_ports[p] = true end
    view.used_cpus = view.used_cpus + part[CPUS]
    view.used_memory = view.used_memory + part[MEMORY]
    for i = 1, #writes, 2 do
      gather(hashes, allocs, writes[i], ARGV[writes[i + 1]])
      gather(launches, launching_key, deadline, writes[i])
    end
  end
  local new, records = job[NEW], {}  -- the job's own: written at once
  for i = 1, #new, 2 do
    records[i], records[i + 1] = new[i], ARGV[new[i + 1]]
  end
  for at = 1, #records, CHUNK do
    redis.call('HSET', KEYS[job[TASKS]], unpack(records, at, math.min(at + CHUNK - 1, #records)))
  end
  gather(dequeued, queue_key, job[ID])
  gather(dequeued, KEYS[job[VC_QUEUE]], job[ID])
  redis.call('HSET', KEYS[job[JOB]], unpack(job[FIELDS]))
  redis.call('XADD', KEYS[job[EVENTS]], 'MAXLEN', '~', ARGV[2], '*', unpack(job[EVENT]))
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

flush(hashes, 'HSET')
flush(launches, 'ZADD')
flush(dequeued, 'ZREM')
return bound
""")

# A pass request, in one step: the pass-request flag is taken (the pass reads
# the queue after this: the next submit must ask again, see
# lifecycle.take_pass_request); with ARGV[3] = "1" and messages waiting in the
# scheduler's broker queue, the work is only marked (2: deferred); else the
# lock is taken (1: begun, the dirty flag and the doorbell cleared: this pass
# sees it all, each ring having been made after its ringer's write) or,
# held by another, the work marked for its holder (0: held). With ARGV[4] =
# "1" it does nothing unless the dirty flag is set.
BEGIN_PASS = Script(
    "begin_pass",
    keys=("scheduler lock", "dirty flag", "pass-request flag", "scheduler's broker queue",
          "doorbell"),
    args=("token", "lock ms", "'1' to defer while messages wait", "'1' only if dirty"),
    source="""
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('DEL', KEYS[3])
if ARGV[3] == '1' and redis.call('LLEN', KEYS[4]) > 0 then
  redis.call('SET', KEYS[2], '1')
  return 2
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('DEL', KEYS[2], KEYS[5])
  return 1
end
redis.call('SET', KEYS[2], '1')
return 0
""")

# After a pass, in one step: asked again meanwhile (the dirty flag) -> clear
# it and the doorbell, keep (or retake) the lock, pass again (1); else let
# the lock go (0).
# With ARGV[2] = "0" the lock is let go whatever the flag (which stays). A
# lock that expired during the pass and that another took is left to that
# holder, which sees the flag (-1). Atomic with BEGIN_PASS, so a request is
# either seen here or takes the free lock itself: none is lost.
END_PASS = Script(
    "end_pass",
    keys=("scheduler lock", "dirty flag", "pass-request flag", "doorbell"),
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
  redis.call('DEL', KEYS[3], KEYS[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
return 0
""")
