"""The notice a task gets before the platform stops it: preempted for
another job, or stopped by its own node when the node lost the control
plane (a fence, docs/multi-node.md).

The platform writes the notice at PREEMPTION_FILE inside the container,
then sends SIGTERM; a job that sources the file (or greps for
PAI_PREEMPTED=1) learns it must save its state before the deadline.
"""

from __future__ import annotations

# Where a task finds its notice, one VAR=value per line (PAI_PREEMPTION_FILE).
PREEMPTION_FILE = "/pai/preempted"


def preemption_notice(by: str, deadline_ms: int, reason: str = "") -> str:
    """The notice's text: who (or what) stops the task, and by when (epoch s)."""
    text = (f"PAI_PREEMPTED=1\nPAI_PREEMPTED_BY={by}\n"
            f"PAI_PREEMPTION_DEADLINE={deadline_ms // 1000}\n")
    if reason:
        text += f"PAI_PREEMPTION_REASON={' '.join(reason.split())}\n"
    return text
