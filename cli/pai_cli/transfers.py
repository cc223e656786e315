"""What `pai fs put` and `get` move where, decided before a byte travels.

A folder is walked into a list of (local file, remote path, size) steps and
the folders to make, so the progress bar knows the whole size and nothing
is half-planned when a transfer starts. Whether a file is sent whole,
appended to (resuming an interrupted put) or skipped is `plan_put`'s
decision, from the sizes on both sides; the bytes already there are
compared with the local file's before anything is appended.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pai_cli.webhdfs import Entry

# How many bytes at the end of what a server already holds are compared
# with the local file before `--resume` appends the rest.
CHECKED_TAIL = 1024 * 1024


class TransferError(Exception):
    """A transfer that cannot go as asked; the message says what to do."""


@dataclass(frozen=True)
class Step:
    local: Path
    remote: str
    size: int


@dataclass(frozen=True)
class Plan:
    folders: tuple[str, ...]  # remote folders to make, parents first
    files: tuple[Step, ...]

    @property
    def total(self) -> int:
        return sum(step.size for step in self.files)


def upload_plan(local: Path, remote: str, *, recursive: bool) -> Plan:
    """A local file, or with `recursive` a local folder, as the remote `remote`.
    Links to folders are not entered (a loop would never end); every plain
    file below is sent."""
    if local.is_file():
        return Plan((), (Step(local, remote, local.stat().st_size),))
    if not local.is_dir():
        raise TransferError(f"{local} is not a file or a folder")
    if not recursive:
        raise TransferError(f"{local} is a folder: pass -r to send it and all it holds")
    folders, files = [remote], []
    for top, dirs, names in os.walk(local):
        dirs[:] = sorted(d for d in dirs if not (Path(top) / d).is_symlink())
        here = posixpath.join(remote, *Path(top).relative_to(local).parts)
        folders += [posixpath.join(here, d) for d in dirs]
        for name in sorted(names):
            path = Path(top) / name
            if path.is_file():
                files.append(Step(path, posixpath.join(here, name), path.stat().st_size))
    return Plan(tuple(folders), tuple(files))


def download_plan(remote: str, local: Path, entry: Entry,
                  listing: Callable[[str], list[Entry]], *, recursive: bool) -> Plan:
    """The remote file, or with `recursive` the remote folder, as `local`
    (links on the server are not followed, as the server follows none)."""
    if not entry.is_dir:
        return Plan((), (Step(local, remote, entry.length),))
    if not recursive:
        raise TransferError(f"{remote} is a folder: pass -r to fetch it and all it holds")
    folders: list[str] = [str(local)]
    files: list[Step] = []
    for folder, target in _walk_remote(remote, local, listing):
        for child in listing(folder):
            path, there = posixpath.join(folder, child.name), target / child.name
            if child.kind == "FILE":
                files.append(Step(there, path, child.length))
            elif child.is_dir:
                folders.append(str(there))
    return Plan(tuple(folders), tuple(files))


def _walk_remote(remote: str, local: Path,
                 listing: Callable[[str], list[Entry]]) -> Iterator[tuple[str, Path]]:
    pending = [(remote, local)]
    while pending:
        folder, target = pending.pop(0)
        yield folder, target
        pending += [(posixpath.join(folder, c.name), target / c.name)
                    for c in listing(folder) if c.is_dir]


class Action(Enum):
    CREATE = "create"
    APPEND = "append"  # the remote holds the first `offset` bytes already
    SKIP = "skip"  # the remote holds the whole file already


def plan_put(size: int, remote: Entry | None, *, overwrite: bool,
             resume: bool) -> tuple[Action, int]:
    """What to do with one file of `size` bytes whose remote is `remote`
    (None: absent), and from which offset."""
    if remote is None:
        return Action.CREATE, 0
    if remote.is_dir:
        raise TransferError("a folder of that name is there already")
    if overwrite:
        return Action.CREATE, 0
    if not resume:
        raise TransferError("it exists already: --overwrite replaces it, --resume goes on "
                            "with an interrupted put")
    if remote.length > size:
        raise TransferError(f"the remote file holds {remote.length} bytes, more than the "
                            f"{size} here: not an interrupted put of this file")
    if remote.length == size:
        return Action.SKIP, size
    return Action.APPEND, remote.length


def tail_range(offset: int) -> tuple[int, int]:
    """The (start, length) of the bytes compared before appending at `offset`."""
    length = min(offset, CHECKED_TAIL)
    return offset - length, length
