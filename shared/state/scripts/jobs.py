"""Scripts that write a job and what hangs off it: its creation, its waiting
reason, its checkpoint steps, its SSH key, its usage records.
"""

from __future__ import annotations

from shared.state.jobfeed import MAX_LEN as FEED_MAX_LEN
from shared.state.scripts import Script
from shared.state.scripts.gated import HOLDS

# A new job: its record, config, tasks, first attempt, indexes, queue places,
# "submitted" event and feed entry (shared/state/jobfeed.py), written only if
# no job has its id, in one atomic step (the writes of `write_job`,
# `enqueue`, `add_event` as a WATCH/MULTI transaction made them, in one round
# trip instead of five). A record that is this very submission's (same
# creation time and config, byte for byte: its reply was lost in a primary
# switch and it was sent again) is answered with itself, not as a conflict.
# `#!lua` makes Redis treat it as a write up front: a primary refusing writes
# (min-replicas-to-write) refuses it whole. The expectations' keys sit
# between the fixed keys and the archive's (KEYS[13 + i] is the key of the
# i-th). The expectations' kind, field and value, then the task fields, then
# the job fields come as one JSON array of strings (ARGV[13]): a hundred
# arguments cost the client about 50 µs a submit to pack and send, one array
# about 15 with its dump; Redis decodes it for what parsing them cost
# (docs/performance-log.md, 2026-11-29).
# queue_seq is the script's: the job fields leave it out.
# Returns {"new", claimed, queue_seq} | {"own", claimed, field, value, ...} |
#   {"taken", 0} | {"changed", 0}; claimed is 1 when this call set the pass
#   flag, "changed" when an expectation did not hold (nothing written).
CREATE_JOB = Script(
    "create_job",
    keys=("job", "config", "tasks", "attempts", "state index", "all jobs", "user's jobs",
          "VC's jobs", "queue", "VC's queue", "events", "queue sequence", "pass flag",
          "each expectation's key, then the job's archive, then the feed of changes..."),
    args=("job id", "created ms", "config JSON", "attempt index", "attempt JSON",
          "VC queue score without the sequence", "event time", "events bound",
          "pass flag ms (0: leave it)", "number of task fields", "number of expectations",
          "the job's feed row (jobfeed.SortRow)",
          "JSON array: each expectation's kind, field, value; task field/value pairs; "
          "job field/value pairs"),
    source="#!lua" + HOLDS + """
local function claim()
  if ARGV[9] == '0' then return 0 end
  if redis.call('SET', KEYS[13], '1', 'NX', 'PX', ARGV[9]) then return 1 end
  return 0
end
local expected = tonumber(ARGV[11])
local rest = cjson.decode(ARGV[13])
for i = 1, expected do
  local kind, field, value = rest[3 * i - 2], rest[3 * i - 1], rest[3 * i]
  if not holds(kind, KEYS[13 + i], field, value) then return {'changed', 0} end
end
local id, created = ARGV[1], ARGV[2]
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'created_ms') == created
      and redis.call('GET', KEYS[2]) == ARGV[3] then
    local reply = {'own', claim()}
    for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do reply[#reply + 1] = v end
    return reply
  end
  return {'taken', 0}
end
if redis.call('EXISTS', KEYS[14 + expected]) == 1 then  -- compacted: its name is taken
  return {'taken', 0}
end
local seq = redis.call('INCR', KEYS[12])
local tasks_start = 1 + 3 * expected
local tasks_end = tasks_start - 1 + 2 * tonumber(ARGV[10])
redis.call('SET', KEYS[2], ARGV[3])
local at = tasks_start  -- in pieces: Lua unpacks at most about 8,000 values at once
while at <= tasks_end do
  local last = math.min(at + 1999, tasks_end)
  redis.call('HSET', KEYS[3], unpack(rest, at, last))
  at = last + 1
end
redis.call('HSET', KEYS[4], ARGV[4], ARGV[5])
redis.call('HSET', KEYS[1], 'queue_seq', seq, unpack(rest, tasks_end + 1, #rest))
redis.call('ZADD', KEYS[5], created, id)
redis.call('ZADD', KEYS[6], created, id)
redis.call('ZADD', KEYS[7], created, id)
redis.call('ZADD', KEYS[8], created, id)
redis.call('ZADD', KEYS[9], seq, id)
redis.call('ZADD', KEYS[10], string.format('%.17g', tonumber(ARGV[6]) + seq), id)
redis.call('XADD', KEYS[11], 'MAXLEN', '~', ARGV[8], '*', 'kind', 'submitted',
  'time', ARGV[7], 'attempt', ARGV[4])
redis.call('XADD', KEYS[15 + expected], 'MAXLEN', '~', '""" + str(FEED_MAX_LEN) + """', '*',
  'j', id, 'd', ARGV[12])
return {'new', claim(), seq}
""")

# Each KEYS[i] a job record: the waiting reason written where the job still
# waits at the version the pass read and the reason differs. ARGV[i + 1] is
# the job's [reason, explanation, version] (JSON). Returns how many it wrote.
SET_WAITING = Script(
    "set_waiting",
    keys=("job records...",),
    args=("the state a job waits in (JobState.WAITING)",
          "per job: [reason, explanation, version] JSON..."),
    source="""
local written = 0
for i, key in ipairs(KEYS) do
  local want = cjson.decode(ARGV[i + 1])
  local now = redis.call('HMGET', key, 'state', 'version', 'waiting_reason', 'waiting')
  if now[1] == ARGV[1] and now[2] == want[3]
      and ((now[3] or '') ~= want[1] or (now[4] or '') ~= want[2]) then
    redis.call('HSET', key, 'waiting_reason', want[1], 'waiting', want[2])
    written = written + 1
  end
end
return written
""")

# Each pair of KEYS a job record and its events: the job's placement mode
# (guaranteed or borrowed) set where the job still runs the attempt the pass
# saw, is still live, has a mode and a different one. ARGV[2] lists the live
# states (JSON); ARGV[i + 2] is the i-th job's [attempt, mode, event fields
# flattened] (JSON), its "mode" event made by the caller. Returns the
# 1-based positions of the jobs it changed.
SET_MODES = Script(
    "set_modes",
    keys=("a job record, then its events, per job...",),
    args=("the events' bound", "the live states (JSON)",
          "per job: [attempt, mode, event fields...] JSON..."),
    source="""
local live = {}
for _, state in ipairs(cjson.decode(ARGV[2])) do live[state] = true end
local changed = {}
for i = 1, #KEYS / 2 do
  local want = cjson.decode(ARGV[i + 2])
  local key = KEYS[2 * i - 1]
  local now = redis.call('HMGET', key, 'state', 'attempt', 'mode')
  if now[1] and live[now[1]] and (now[2] or '0') == want[1]
      and (now[3] or '') ~= '' and now[3] ~= want[2] then
    redis.call('HSET', key, 'mode', want[2])
    redis.call('XADD', KEYS[2 * i], 'MAXLEN', '~', ARGV[1], '*', unpack(want[3]))
    changed[#changed + 1] = i
  end
end
return changed
""")

# Keeps the higher of the stored step and ARGV[2]: the result does not
# depend on the order batches arrive in, nor on a batch arriving twice (log
# shipping is at least once, and a shipper replaced while it still held
# lines may write them after its successor wrote later ones).
KEEP_HIGHER_STEP = Script(
    "keep_higher_step",
    keys=("the job's checkpoint steps",),
    args=("attempt", "step"),
    source="""
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current or tonumber(current) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return 0
""")

# Deletes the key only while it holds this very value: a submit that lost
# its race (409) removes its own SSH key, never the key of the job that won.
DISCARD_SSH_KEY = Script(
    "discard_ssh_key",
    keys=("the job's SSH key",),
    args=("the private key this submit stored",),
    source="""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
""")

# Adds a usage record's roll-up increments only if the record was not added
# before: HSETNX on the day's record hash is the guard, so recording the same
# task twice (a redelivered exit, a repair re-running) counts it once. Per
# increment i: KEYS[i + 1] the hash; ARGV the field, the amount, and "i"
# (HINCRBY) or "f" (HINCRBYFLOAT); or, for a key's expiry, any field, the
# instant (ms) and "x" (PEXPIREAT: the retention, set by the write).
RECORD_USAGE_ONCE = Script(
    "record_usage_once",
    keys=("the day's record hash", "per increment: the hash it adds to..."),
    args=("the record's key", "the record's JSON",
          "per increment: field, amount, kind (i, f or x)..."),
    source="""
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
for i = 1, #KEYS - 1 do
  local field, amount, kind = ARGV[3 * i], ARGV[3 * i + 1], ARGV[3 * i + 2]
  if kind == 'f' then
    redis.call('HINCRBYFLOAT', KEYS[i + 1], field, amount)
  elseif kind == 'x' then
    redis.call('PEXPIREAT', KEYS[i + 1], amount)
  else
    redis.call('HINCRBY', KEYS[i + 1], field, amount)
  end
end
return 1
""")
