"""Task log files in the platform's log tree: reading them, and making one whole.

The monitor appends each task attempt's lines to
`<log tree>/<job id>/<attempt>/<role>-<index>.log` (services/monitor/logfile.py),
batch by batch, right after the same batch reached the task's Redis stream.
Once a job has finished, the retention sweep moves its logs out of Redis
(shared/state/retention.py) and the API serves them from these files. Every walk
goes through shared/infra/safefs.py: the tree is the platform's, but a file is
reached without following any link.

A file can miss lines the stream has: a monitor killed between the two
writes loses that batch from the file, and a file whose write failed stays
short. `plan_repair` decides, from counts alone, how to make the file whole
before its stream goes; `make_whole` does it.

Who may read and write the tree: the node agent writes it as root, the api
and scheduler run unprivileged (uid 10001 in the image). Without
PAI_LOG_GROUP the tree is root's own (folders 0750, files 0640); with it,
every folder is made group-owned by that group with mode 2770 (setgid:
what is made inside keeps the group) and every file 0660, by every writer
alike (`TreeModes`). Nothing is ever readable by others: users' logs are
theirs. `ensure_tree` makes the tree's own folder, and brings a tree made
by an earlier version (or without the setting) over to the group once.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from shared.domain.storage import task_log_parts
from shared.infra import safefs

log = logging.getLogger(__name__)

CHUNK = 1 << 20
CUT_PREFIX = "[pai: log cut at "


def cut_marker(max_bytes: int) -> str:
    """The one line that ends a log file cut at its cap (PAI_LOG_MAX_BYTES_PER_TASK)."""
    return (f"{CUT_PREFIX}{max_bytes} bytes (PAI_LOG_MAX_BYTES_PER_TASK); "
            f"later lines are not kept]")


def dropped_marker(count: int) -> str:
    return f"[pai: {count} earlier lines dropped; they were lost before the log was filed]"


def _encode(lines: Sequence[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode("utf-8", errors="replace")


# ---------------------------------------------------------------- the tree's access


@dataclass(frozen=True)
class TreeModes:
    """How the log tree's folders and files are made: root's own without a
    group, shared with the group `group` (PAI_LOG_GROUP) with one."""

    group: int | None = None

    @property
    def dir_mode(self) -> int:
        return 0o750 if self.group is None else 0o2770

    @property
    def file_mode(self) -> int:
        return 0o640 if self.group is None else 0o660


def ensure_tree(log_dir: str, group: int | None) -> None:
    """Make the tree's own folder, never its parents (under a storage root
    that is not mounted, a local folder must not appear in its place). With
    a group, a tree whose own folder is not yet the group's (made by an
    earlier version, or before the setting) is brought over whole: every
    folder and file in it, then its own folder last, so a run cut short is
    done again by the next. Only root or the tree's owner can; anyone else
    leaves it as it is (and a write that needs it fails, loudly, later)."""
    modes = TreeModes(group)
    try:
        os.mkdir(log_dir, modes.dir_mode)
    except FileExistsError:
        if group is None:
            return
    fd = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if group is None:
            safefs.own(fd, modes.dir_mode, None)  # just made: undo the umask
            return
        if info.st_gid == group and stat.S_IMODE(info.st_mode) & 0o777 == modes.dir_mode & 0o777:
            return  # (setgid aside: root without CAP_FSETID outside the group loses it)
        if os.geteuid() not in (0, info.st_uid):
            return
        _bring_over(log_dir, modes)
        safefs.own(fd, modes.dir_mode, group)
    finally:
        os.close(fd)


def _bring_over(log_dir: str, modes: TreeModes) -> None:
    """Give every folder and plain file below `log_dir` the tree's group and
    modes, following no link (fwalk holds each folder open; a file is opened
    without following a link and changed through its descriptor)."""
    count = 0
    for path, _dirs, files, dir_fd in os.fwalk(log_dir, follow_symlinks=False):
        if path != log_dir:
            safefs.own(dir_fd, modes.dir_mode, modes.group)
        for name in files:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                             dir_fd=dir_fd)
            except OSError:
                continue  # a link, or gone
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                    safefs.own(fd, modes.file_mode, modes.group)
                    count += 1
            finally:
                os.close(fd)
    log.info("the log tree %s now belongs to group %s (%d files)", log_dir, modes.group, count)


# ---------------------------------------------------------------- deciding


@dataclass(frozen=True)
class Repair:
    """What the file needs before its stream may go: nothing (`keep`), or to be
    written anew from its first `prefix` lines, then `dropped` (a marker saying
    how many lines are gone, when not 0), then the stream's lines."""

    keep: bool
    prefix: int = 0
    dropped: int = 0


KEEP = Repair(keep=True)


def plan_repair(*, file_lines: int, cut: bool, kept: int, added: int,
                tail_matches: bool) -> Repair:
    """How to make a file whole, knowing the stream kept its last `kept` of
    the `added` lines ever shipped.

    A file cut at its cap is as whole as it will get. A file with every line
    is whole. The lines lost by a monitor's death are one batch, so if the
    file's last `kept` lines are the stream's, the gap (if any) lies before
    what Redis still has and nothing can fill it. Otherwise the gap lies in
    the stream's window, so the file's lines before the window are right:
    keep them, and take the rest from the stream.
    """
    if cut or file_lines >= added or (kept and tail_matches):
        return KEEP
    before = added - kept  # the lines only the file can have had
    prefix = min(file_lines, before)
    return Repair(keep=False, prefix=prefix, dropped=before - prefix)


# ---------------------------------------------------------------- reading


def _read_all(fd: int) -> Iterator[bytes]:
    while True:
        chunk = os.read(fd, CHUNK)
        if not chunk:
            return
        yield chunk


def count_lines(log_dir: str, parts: Sequence[str]) -> tuple[int, bool]:
    """(lines, whether the file was cut at its cap); (0, False) without a file."""
    try:
        with safefs.open_file(log_dir, parts) as fd:
            lines = sum(chunk.count(b"\n") for chunk in _read_all(fd))
            last = _tail_bytes(fd, 1)
    except FileNotFoundError:
        return 0, False
    return lines, bool(last) and last[-1].startswith(CUT_PREFIX)


def _tail_bytes(fd: int, count: int) -> list[str]:
    """The last `count` lines of an open file, reading backwards a chunk at a time."""
    if count <= 0:
        return []
    end = os.fstat(fd).st_size
    data = b""
    while end > 0 and data.count(b"\n") <= count:
        start = max(0, end - CHUNK)
        data = os.pread(fd, end - start, start) + data
        end = start
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file ends with a newline
    return lines[-count:]


def tail(log_dir: str, parts: Sequence[str], count: int) -> list[str]:
    """The last `count` lines of a task's log file ([] without one)."""
    try:
        with safefs.open_file(log_dir, parts) as fd:
            return _tail_bytes(fd, count)
    except FileNotFoundError:
        return []


def numbered_tail(log_dir: str, parts: Sequence[str], count: int,
                  after: int | None = None) -> Iterator[tuple[int, str]]:
    """(line number from 1, line): the last `count` lines, or every line
    after number `after`. A follow of a filed log sends these numbers as its
    event ids, so a client resumes where it stopped."""
    try:
        with safefs.open_file(log_dir, parts) as fd:
            if after is None:
                total = sum(chunk.count(b"\n") for chunk in _read_all(fd))
                lines = _tail_bytes(fd, count)
                yield from enumerate(lines, start=total - len(lines) + 1)
                return
            os.lseek(fd, 0, os.SEEK_SET)
            number, rest = 0, b""
            for chunk in _read_all(fd):
                *whole, rest = (rest + chunk).split(b"\n")
                for raw in whole:
                    number += 1
                    if number > after:
                        yield number, raw.decode("utf-8", errors="replace")
            if rest:
                yield number + 1, rest.decode("utf-8", errors="replace")
    except FileNotFoundError:
        return


# ---------------------------------------------------------------- repairing


def _first_lines(log_dir: str, parts: Sequence[str], count: int) -> Iterator[bytes]:
    """The file's first `count` lines, as bytes, a chunk at a time."""
    if count <= 0:
        return
    with safefs.open_file(log_dir, parts) as fd:
        left = count
        for chunk in _read_all(fd):
            newlines = chunk.count(b"\n")
            if newlines < left:
                left -= newlines
                yield chunk
                continue
            cut = -1
            for _ in range(left):
                cut = chunk.index(b"\n", cut + 1)
            yield chunk[:cut + 1]
            return


def make_whole(log_dir: str, job_id: str, attempt: int, role: str, index: int,
               stream_lines: Sequence[str], added: int, group: int | None = None) -> Repair:
    """Make a task's log file hold its whole log before the stream goes:
    `stream_lines` are the lines the stream keeps, of `added` ever shipped;
    what it makes belongs to `group` (TreeModes). Idempotent: a file made
    whole is kept as it is the next time."""
    parts = task_log_parts(job_id, attempt, role, index)
    last = tail(log_dir, parts, 1)
    if last and last[0].startswith(CUT_PREFIX):
        return KEEP  # cut at its cap: as whole as it gets, and no need to read it all
    file_lines, cut = count_lines(log_dir, parts)
    kept = len(stream_lines)
    matches = bool(kept) and file_lines >= kept and tail(log_dir, parts, kept) == list(stream_lines)
    repair = plan_repair(file_lines=file_lines, cut=cut, kept=kept, added=added,
                         tail_matches=matches)
    if repair.keep:
        return repair
    ensure_tree(log_dir, group)
    modes = TreeModes(group)
    prefix = list(_first_lines(log_dir, parts, repair.prefix)) if repair.prefix else []
    marker = [_encode([dropped_marker(repair.dropped)])] if repair.dropped else []
    safefs.replace(log_dir, parts, [*prefix, *marker, _encode(stream_lines)],
                   dir_mode=modes.dir_mode, file_mode=modes.file_mode, group=group)
    return repair


def remove_job_logs(log_dir: str, job_id: str) -> bool:
    """Remove every log file of a job (its folder in the log tree): a deleted
    or expired job's name may be used again, and the new job's logs must not
    follow the old one's."""
    return safefs.remove_tree(log_dir, (job_id,))
