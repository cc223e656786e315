"""Scripts of a task's log stream (services/monitor/logs.py); its format is
shared/state/logstream.py's."""

from __future__ import annotations

from shared.state.scripts import Script

# A batch of lines, sent as one text with a newline between two lines (a line
# holds none: it was cut at them), becomes one entry numbered by its last
# line, the shipping cursor after it where there is one; then the entries
# whose lines are all older than the newest `max lines` go (exactly: with few
# entries a stream node, a node at a time would keep many more lines). A
# stream begun in the format before (its newest id not `0-...`) goes on with
# an entry a line, under the legacy field, cut back to about `max lines`
# entries. Returns how many lines the batch held, as the caller counted them:
# Lua's count of a batch's newlines cost Redis more than the rest of the script.
APPEND_LOG_LINES = Script(
    "append_log_lines",
    keys=("the task's log stream",),
    args=("max lines", "lines field", "legacy line field", "cursor field",
          "the last line's cursor, or ''", "the lines, joined by newlines",
          "how many lines the text holds (its newlines and one)"),
    source="""
local key, max_lines = KEYS[1], tonumber(ARGV[1])
local lines_field, legacy_field, cursor_field = ARGV[2], ARGV[3], ARGV[4]
local cursor, text, added = ARGV[5], ARGV[6], tonumber(ARGV[7])
local newest = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
local extra = {}
if cursor ~= '' then
  extra = {cursor_field, cursor}
end
if newest ~= nil and string.sub(newest[1], 1, 2) ~= '0-' then
  local at = 1
  while true do
    local newline = string.find(text, '\\n', at, true)
    if newline == nil then
      break
    end
    redis.call('XADD', key, '*', legacy_field, string.sub(text, at, newline - 1))
    at = newline + 1
  end
  redis.call('XADD', key, '*', legacy_field, string.sub(text, at), unpack(extra))
  redis.call('XTRIM', key, 'MAXLEN', '~', max_lines)
  return added
end
local last = 0
if newest ~= nil then
  last = tonumber(string.sub(newest[1], 3))
end
last = last + added
redis.call('XADD', key, string.format('0-%d', last), lines_field, text, unpack(extra))
if last > max_lines then
  redis.call('XTRIM', key, 'MINID', string.format('0-%d', last - max_lines + 1))
end
return added
""")
