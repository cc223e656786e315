"""Scripts of a task's log stream (services/monitor/logs.py)."""

from __future__ import annotations

from shared.state.scripts import MORE, Script

# A batch of shipped lines, each its own entry, with the shipping cursor on
# those that carry one (an empty cursor: none; the monitor gives it to a
# batch's last line), then the stream cut back to about its bound. One
# command for the batch: as 500 XADDs the monitor spent more time encoding
# commands than Redis spent running them.
APPEND_LOG_LINES = Script(
    "append_log_lines",
    keys=("the task's log stream",),
    args=("max lines", "line field", "cursor field", f"line, cursor, line, cursor{MORE}"),
    source="""
local key, line_field, cursor_field = KEYS[1], ARGV[2], ARGV[3]
for i = 4, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('XADD', key, '*', line_field, ARGV[i])
  else
    redis.call('XADD', key, '*', line_field, ARGV[i], cursor_field, ARGV[i + 1])
  end
end
redis.call('XTRIM', key, 'MAXLEN', '~', ARGV[1])
return (#ARGV - 3) / 2
""")
