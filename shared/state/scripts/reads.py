"""Read-only scripts: many hashes, or the feed of job changes, in one round
trip (`#!lua flags=no-writes` lets a replica answer them).
"""

from __future__ import annotations

from shared.state.scripts import Script

# The same fields of many job records as one string: the values joined by
# NUL (never in a field: numbers, states, names), "\1" for a field that is
# not there (a record that is not there: compacted, or gone). One reply a
# chunk, not one per value: the client parses 2,000 records at once.
HMGET_JOINED = Script(
    "hmget_joined",
    keys=("hashes...",),
    args=("fields...",),
    source=r"""#!lua flags=no-writes
local out = {}
for _, key in ipairs(KEYS) do
  local got = redis.call('HMGET', key, unpack(ARGV))
  for j = 1, #ARGV do out[#out + 1] = got[j] or '\1' end
end
return table.concat(out, '\0')
""")

# HMGET_JOINED for records the caller may hold already: per hash, the
# caller's stamp of it (ARGV[i], '': none) against its stamp now
# (`version:queue_seq:mode`, '' for a record without a version or a
# submission: gone, or written by an old version, so never matched); '\2'
# alone where they are equal, else the stamp now and the fields' values
# ('\1': not there). The fields follow the stamps in ARGV.
HMGET_STAMPED = Script(
    "hmget_stamped",
    keys=("hashes...",),
    args=("per hash: the stamp held ('' : none)...", "fields..."),
    source=r"""#!lua flags=no-writes
local n = #KEYS
local out = {}
for i, key in ipairs(KEYS) do
  local got = redis.call('HMGET', key, 'version', 'queue_seq', 'mode', unpack(ARGV, n + 1))
  local stamp = ''
  if got[1] and got[2] then stamp = got[1] .. ':' .. got[2] .. ':' .. (got[3] or '') end
  if stamp ~= '' and stamp == ARGV[i] then
    out[#out + 1] = '\2'
  else
    out[#out + 1] = stamp
    for j = 4, #ARGV - n + 3 do out[#out + 1] = got[j] or '\1' end
  end
end
return table.concat(out, '\0')
""")

# One string per field, each hash's value (or the default: missing, empty or
# "None") joined by spaces.
HMGET_COLUMNS = Script(
    "hmget_columns",
    keys=("hashes...",),
    args=("field, default, field, default...",),
    source=r"""#!lua flags=no-writes
local fields, defaults, columns = {}, {}, {}
for j = 1, #ARGV, 2 do
  fields[#fields + 1] = ARGV[j]
  defaults[#defaults + 1] = ARGV[j + 1]
  columns[#columns + 1] = {}
end
for i, key in ipairs(KEYS) do
  local got = redis.call('HMGET', key, unpack(fields))
  for j = 1, #fields do
    local value = got[j]
    if not value or value == '' or value == 'None' then value = defaults[j] end
    columns[j][i] = value
  end
end
for j = 1, #columns do columns[j] = table.concat(columns[j], ' ') end
return columns
""")

# Many hashes whole, each as HGETALL's flat field/value list.
HGETALL_MANY = Script(
    "hgetall_many",
    keys=("hashes...",),
    args=(),
    source="""
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HGETALL', key)
end
return out
""")

# Whether each key exists (1 or 0), in one call for many.
EXISTING = Script(
    "existing",
    keys=("keys...",),
    args=(),
    source="""#!lua flags=no-writes
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('EXISTS', key)
end
return out
""")

# What a compare-and-set on a job's attempt reads under WATCH, in one round
# trip instead of one a key: the job's record and the attempt's tasks (each
# HGETALL's flat list), the attempt's record (ARGV[1]: its index), when
# ARGV[2] is "1" the job's config, and given a node's allocations (KEYS[5])
# one task's allocation there (ARGV[3]: its field); false where a value is
# not there.
READ_JOB_VIEW = Script(
    "read_job_view",
    keys=("job record", "the attempt's tasks", "the job's attempts", "the job's config",
          "a node's allocations (optional)..."),
    args=("attempt index", "\"1\": read the config too",
          "a task's field in the node's allocations (with KEYS[5])..."),
    source="""#!lua flags=no-writes
local config = false
if ARGV[2] == '1' then config = redis.call('GET', KEYS[4]) end
local held = false
if KEYS[5] then held = redis.call('HGET', KEYS[5], ARGV[3]) end
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2]),
        redis.call('HGET', KEYS[3], ARGV[1]), config, held}
""")

# The fields named after the stamps of each queued job's record (HMGET's
# values: all nil for one that is gone) unless ARGV[i], "<version>:<queue_seq>"
# of the record the scheduler holds, still matches: then 0.
QUEUED_RECORDS = Script(
    "queued_records",
    keys=("job records...",),
    args=("per record, the stamp the scheduler holds ('': none); then the fields to send "
          "of a record that moved...",),
    source="""
local fields = {unpack(ARGV, #KEYS + 1)}
local out = {}
for i, key in ipairs(KEYS) do
  local now = redis.call('HMGET', key, 'version', 'queue_seq')
  if ARGV[i] ~= '' and now[1] and now[2] and now[1] .. ':' .. now[2] == ARGV[i] then
    out[i] = 0
  else
    out[i] = redis.call('HMGET', key, unpack(fields))
  end
end
return out
""")

# The feed's entries after ARGV[1] ("": none, only where the feed stands),
# with the feed's position and the number of jobs, in one atomic read.
READ_JOB_CHANGES = Script(
    "read_job_changes",
    keys=("the feed of job changes", "all jobs"),
    args=("entry id to read after", "most entries"),
    source="""#!lua flags=no-writes
local jobs = redis.call('ZCARD', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 0 then return {jobs, 0, '0-0', {}} end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local added, last = 0, '0-0'
for i = 1, #info, 2 do
  if info[i] == 'entries-added' then added = info[i + 1] end
  if info[i] == 'last-generated-id' then last = info[i + 1] end
end
local entries = {}
if ARGV[1] ~= '' then
  entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
end
return {jobs, added, last, entries}
""")
