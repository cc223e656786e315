"""One pass at a time, and no request lost: the scheduler's pass lock and
its dirty flag, each step one script.

A pass request either takes the free lock (and passes) or marks the work for
the holder, which passes again before it lets go; a request from a worker
with more scheduler messages queued behind it may only mark the work, left
to the last of them. `begin` and `end` are atomic with each other, so every
request is seen by some pass. A pass that begins (or goes again) also takes
the doorbell's ring (shared/state/passwake.py): every ring is made after its
ringer's write, so what rang before the pass is in what it reads, and no
second pass follows for it.
"""

from __future__ import annotations

from shared.infra import messaging
from shared.state import keys, lifecycle, scripts
from shared.state.store import Store

DIRTY = keys.SCHEDULER_DIRTY
LOCK_SECONDS = 60
PASS_BEGUN, PASS_HELD, PASS_DEFERRED = 1, 0, 2  # what scripts.BEGIN_PASS answers
PASS_AGAIN = 1  # what scripts.END_PASS answers when asked again during the pass


class PassGate:
    """The lock and flag scripts, run against the cluster's store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def begin(self, token: str, *, defer: bool, if_dirty: bool) -> int:
        """PASS_BEGUN (this caller holds the lock: it passes), PASS_HELD
        (another does, and will pass again) or PASS_DEFERRED (left to the
        messages queued behind this one)."""
        return int(self.store.run_script(scripts.BEGIN_PASS, [
            keys.SCHEDULER_LOCK, DIRTY, keys.PASS_REQUESTED,
            messaging.broker_queue_key(messaging.SCHEDULER_QUEUE), keys.SCHEDULER_WAKE],
            [token, str(LOCK_SECONDS * 1000), "1" if defer else "0", "1" if if_dirty else "0"]))

    def end(self, token: str, *, let_go: bool = False) -> int:
        """PASS_AGAIN when asked again meanwhile (the lock kept); else the
        lock let go (with `let_go`, whatever was asked: the flag stays)."""
        return int(self.store.run_script(
            scripts.END_PASS, [keys.SCHEDULER_LOCK, DIRTY, keys.PASS_REQUESTED,
                               keys.SCHEDULER_WAKE],
            [token, "0" if let_go else str(LOCK_SECONDS * 1000)]))

    def look_again(self) -> None:
        """What a pass read moved under it: the next request passes."""
        lifecycle.ask_pass_again(self.store)
