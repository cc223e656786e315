"""A task's full log, written into its job's outputDir as it is shipped.

The Redis stream keeps only the last PAI_LOG_MAX_LINES lines of a task; the
file keeps all of them, at `<outputDir>/logs/<attempt>/<role>-<index>.log`.
Lines are appended batch by batch right after the same batch reached the
stream, so the file is complete when the task exits and a restarted monitor
(which resumes shipping after the last line in Redis) never writes a line
twice. A monitor killed between the two writes loses that one batch (at most
500 lines) from the file, never from the stream.

The file is written on the node, through the bind mount the launcher made
for the job's outputDir (its source is the real, checked path under a
storage root), so the monitor never builds a host path of its own.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from shared.containers import TaskRef

log = logging.getLogger(__name__)

LOGS_FOLDER = "logs"


def log_file_path(output_dir: str, ref: TaskRef) -> str:
    """`<outputDir>/logs/<attempt>/<role>-<index>.log` (role names are file-name safe)."""
    return os.path.join(output_dir, LOGS_FOLDER, str(ref.attempt), f"{ref.role}-{ref.index}.log")


def output_dir_on_host(config: Mapping[str, Any] | None,
                       mounts: Sequence[Mapping[str, Any]]) -> str | None:
    """The host folder behind the job's outputDir: the writable bind mount the
    container has at that path. None without an outputDir (or an hdfs:// one)."""
    wanted = (config or {}).get("outputDir") or ""
    if not wanted or wanted.startswith("hdfs://"):
        return None
    target = "/" + posixpath.normpath(wanted.removeprefix("file://")).lstrip("/")
    for mount in mounts:
        if mount.get("Type") == "bind" and mount.get("Destination") == target \
                and mount.get("RW", False):
            source = mount.get("Source")
            return str(source) if source else None
    return None


class TaskLogFile:
    """Appends shipped lines to one task's log file; gives up (once, loudly) on an
    error, since the stream in Redis still has the lines."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.failed = False

    def append(self, lines: Sequence[str]) -> None:
        if self.failed or not lines:
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "a", encoding="utf-8", errors="replace") as out:
                out.writelines(line + "\n" for line in lines)
        except OSError as error:
            self.failed = True
            log.warning("cannot write the task log file %s (%s): the log stays in Redis only",
                        self.path, error)
