"""Scripts of exec requests and terminal sessions (shared/state/execs.py,
shared/state/execsessions.py): each checks the request or session still
exists before it writes.
"""

from __future__ import annotations

from shared.state.scripts import Script

# Take an exec request or terminal session for this node: it must exist (it
# expires), name this node, and be unclaimed; then its fields (false if not).
CLAIM_EXEC = Script(
    "claim_exec",
    keys=("the request or session",),
    args=("this node", "who claims", "the field a claim sets"),
    source="""
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
if redis.call('HGET', KEYS[1], 'node') ~= ARGV[1] then return false end
if redis.call('HSETNX', KEYS[1], ARGV[3], ARGV[2]) == 0 then return false end
return redis.call('HGETALL', KEYS[1])
""")


def _bounded_add(name: str, holder: str, length: str, add: str, entry: str) -> Script:
    """A terminal's input and its output are added to alike: only while the
    session exists (-1: it is gone), only below a bound (0: full; try again
    once the reader caught up), each add renewing the holder's TTL (1: added).
    `length` and `add` are the Lua that count and add to a list or a stream."""
    return Script(
        name,
        keys=("the session", holder),
        args=("most entries", "ttl ms", entry),
        source=f"""
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('{length}', KEYS[2]) >= tonumber(ARGV[1]) then return 0 end
{add}
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
""")


PUSH_TERMINAL_INPUT = _bounded_add("push_terminal_input", "its input list", "LLEN",
                                   "redis.call('RPUSH', KEYS[2], ARGV[3])", "the entry")
PUT_TERMINAL_OUTPUT = _bounded_add("put_terminal_output", "its output stream", "XLEN",
                                   "redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))",
                                   "the entry's field/value pairs...")

# A session's end: the end entry only for a session someone still holds;
# every other key goes.
END_TERMINAL = Script(
    "end_terminal",
    keys=("the session", "its input", "its output"),
    args=("ttl ms", "the end entry's field/value pairs..."),
    source="""
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('XADD', KEYS[3], '*', unpack(ARGV, 2))
  redis.call('PEXPIRE', KEYS[3], ARGV[1])
end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
""")
