"""What the tests read of a thread's life from Linux."""

from __future__ import annotations

from pathlib import Path


def wakeups(thread_id: int) -> int:
    """How many times the thread (a native id in this process) has given up
    the CPU and been woken since it started: its voluntary context switches.
    A thread that polls wakes on every poll; one that blocks, only when woken."""
    status = Path(f"/proc/self/task/{thread_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("voluntary_ctxt_switches")))
