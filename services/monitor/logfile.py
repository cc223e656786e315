"""A task's full log, written into the platform's log tree as it is shipped.

The Redis stream keeps only the last PAI_LOG_MAX_LINES lines of a task; the
file keeps all of them, at `<PAI_LOG_DIR>/<job id>/<attempt>/<role>-<index>.log`
(shared/domain/storage.py `task_log_parts` is the one place that says so). Lines
are appended batch by batch right after the same batch reached the stream,
so the file is complete when the task exits and a restarted monitor (which
resumes shipping after the last line in Redis) never writes a line twice. A
monitor killed between the two writes loses that one batch (at most about
4,000 lines: logs.BACKLOG_BATCHES of 500 and one read) from the file, never
from the stream.

The log tree is the platform's: no container mounts it (the API refuses any
job path that overlaps it, admins' too), so no job can plant a link in it.
The monitor runs as root on the node, so it still writes by a walk that
follows no link (shared/infra/safefs.py): a job's output never lands in a file the
job chose. It used to go to `<outputDir>/logs/`, which the job can write,
so a planted `logs` link made the monitor append to any host file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from shared.domain.storage import task_log_parts
from shared.infra import safefs
from shared.node.containers import TaskRef
from shared.state.logfiles import TreeModes, cut_marker, ensure_tree

log = logging.getLogger(__name__)


def log_file_parts(ref: TaskRef) -> tuple[str, ...]:
    """The file of one task attempt, below the log tree."""
    return task_log_parts(ref.job_id, ref.attempt, ref.role, ref.index)


def within_cap(lines: Sequence[str], size: int, max_bytes: int) -> tuple[bytes, bool]:
    """What to append to a file of `size` bytes capped at `max_bytes` (0: no
    cap): the lines that fit, and whether the cap was reached (then the cut
    marker follows them, once: one task cannot fill the log tree)."""
    data = ("\n".join(lines) + "\n" if lines else "").encode("utf-8", errors="replace")
    if not max_bytes or size + len(data) <= max_bytes:
        return data, False
    room = max(0, max_bytes - size)
    kept = data[:room]
    kept = kept[:kept.rfind(b"\n") + 1]  # whole lines only
    return kept + (cut_marker(max_bytes) + "\n").encode(), True


class TaskLogFile:
    """Appends shipped lines to one task's log file; gives up (once, loudly) on an
    error, since the stream in Redis still has the lines. Past `max_bytes`
    (PAI_LOG_MAX_BYTES_PER_TASK) it stops, after one line saying so."""

    def __init__(self, log_dir: str, ref: TaskRef, max_bytes: int = 0,
                 group: int | None = None) -> None:
        self.log_dir = log_dir
        self.modes = TreeModes(group)  # PAI_LOG_GROUP: the api and scheduler read it too
        self.parts = log_file_parts(ref)
        self.path = os.path.join(log_dir, *self.parts)
        self.max_bytes = max_bytes
        self.size: int | None = None  # the file's size, once looked at
        self.failed = False
        self.cut = False

    def append(self, lines: Sequence[str]) -> None:
        if self.failed or self.cut or not lines:
            return
        try:
            ensure_tree(self.log_dir, self.modes.group)
            if self.size is None:  # a restarted monitor goes on from what the file has
                self.size = _size(self.log_dir, self.parts)
                self.cut = bool(self.max_bytes) and self.size >= self.max_bytes
                if self.cut:
                    return
            data, self.cut = within_cap(lines, self.size, self.max_bytes)
            safefs.append(self.log_dir, self.parts, data, dir_mode=self.modes.dir_mode,
                          file_mode=self.modes.file_mode, group=self.modes.group)
            self.size += len(data)
        except OSError as error:
            self.failed = True
            log.warning("cannot write the task log file %s (%s): the log stays in Redis only",
                        self.path, error)


def _size(log_dir: str, parts: Sequence[str]) -> int:
    try:
        with safefs.open_file(log_dir, parts) as fd:
            return os.fstat(fd).st_size
    except FileNotFoundError:
        return 0

