"""One pass at a time, and no request lost: the scheduler's pass lock and
its dirty flag, each step one script.

A pass request either takes the free lock (and passes) or marks the work for
the holder, which passes again before it lets go; a request from a worker
with more scheduler messages queued behind it may only mark the work, left
to the last of them. `begin` and `end` are atomic with each other, so every
request is seen by some pass.
"""

from __future__ import annotations

from shared.infra import messaging
from shared.state import keys
from shared.state.store import Store

DIRTY = keys.PREFIX + "scheduler:dirty"
LOCK_SECONDS = 60
PASS_BEGUN, PASS_HELD, PASS_DEFERRED = 1, 0, 2  # what _BEGIN_PASS answers
PASS_AGAIN = 1  # what _END_PASS answers when asked again during the pass

# A pass request, in one step: the pass-request flag is taken (the pass reads
# the queue after this: the next submit must ask again, see
# lifecycle.take_pass_request); with ARGV[3] = "1" and messages waiting in the
# scheduler's broker queue (KEYS[4]), the work is only marked (DEFERRED);
# else the lock is taken (BEGUN, the dirty flag cleared: this pass sees it
# all) or, held by another, the work marked for its holder (HELD).
# With ARGV[4] = "1" it does nothing unless the dirty flag is set.
# KEYS: lock, dirty flag, pass-request flag, broker queue
# ARGV: token, lock ms, "1" to defer while messages wait, "1" only if dirty
_BEGIN_PASS = """
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
"""
# After a pass, in one step: asked again meanwhile (the dirty flag) -> clear
# it, keep (or retake) the lock, pass again (1); else let the lock go (0).
# With ARGV[2] = "0" the lock is let go whatever the flag (which stays). A
# lock that expired during the pass and that another took is left to that
# holder, which sees the flag (-1). Atomic with _BEGIN_PASS, so a request is
# either seen here or takes the free lock itself: none is lost.
# KEYS: lock, dirty flag, pass-request flag; ARGV: token, lock ms (or "0")
_END_PASS = """
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
"""


class PassGate:
    """The lock and flag scripts, run against the cluster's store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def begin(self, token: str, *, defer: bool, if_dirty: bool) -> int:
        """PASS_BEGUN (this caller holds the lock: it passes), PASS_HELD
        (another does, and will pass again) or PASS_DEFERRED (left to the
        messages queued behind this one)."""
        return int(self.store.run_script(_BEGIN_PASS, [
            keys.SCHEDULER_LOCK, DIRTY, keys.PASS_REQUESTED,
            messaging.broker_queue_key(messaging.SCHEDULER_QUEUE)],
            [token, str(LOCK_SECONDS * 1000), "1" if defer else "0", "1" if if_dirty else "0"]))

    def end(self, token: str, *, let_go: bool = False) -> int:
        """PASS_AGAIN when asked again meanwhile (the lock kept); else the
        lock let go (with `let_go`, whatever was asked: the flag stays)."""
        return int(self.store.run_script(
            _END_PASS, [keys.SCHEDULER_LOCK, DIRTY, keys.PASS_REQUESTED],
            [token, "0" if let_go else str(LOCK_SECONDS * 1000)]))

    def look_again(self) -> None:
        """What a pass read moved under it: the next request passes."""
        self.store.r.set(DIRTY, "1")
