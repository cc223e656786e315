"""Scripts of a task's log stream (services/monitor/logs.py)."""

from __future__ import annotations

from shared.state.scripts import Script

# A batch of shipped lines, sent as one text with a newline between two
# lines (a line holds none: it was cut at them); each line becomes its own
# entry, the last with the shipping cursor after it (none where the cursor is
# empty); then the stream is cut back to about its bound. One command and one
# argument for the batch: as 500 XADDs the monitor spent more time encoding
# commands than Redis spent running them, and as an argument a line it still
# spent a third of its shipping time encoding them.
APPEND_LOG_LINES = Script(
    "append_log_lines",
    keys=("the task's log stream",),
    args=("max lines", "line field", "cursor field", "the last line's cursor, or ''",
          "the lines, joined by newlines"),
    source="""
local key, line_field, cursor_field, cursor, text = KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local at, added = 1, 1
while true do
  local newline = string.find(text, '\\n', at, true)
  if newline == nil then
    break
  end
  redis.call('XADD', key, '*', line_field, string.sub(text, at, newline - 1))
  at, added = newline + 1, added + 1
end
if cursor == '' then
  redis.call('XADD', key, '*', line_field, string.sub(text, at))
else
  redis.call('XADD', key, '*', line_field, string.sub(text, at), cursor_field, cursor)
end
redis.call('XTRIM', key, 'MAXLEN', '~', ARGV[1])
return added
""")
