"""File-system walks that no symbolic link can redirect.

The launcher and the monitor run as root on the node, and a job can write
into its outputDir (and a user's other jobs into the rest of their folder):
any component of a path there may be a link the job planted, pointing at a
host file. `os.makedirs` and `open` follow such links. These helpers start
from a trusted folder (a storage root, the platform's log tree) and open
each component relative to the previous one with `O_NOFOLLOW | O_DIRECTORY`,
creating missing ones with `mkdir(dir_fd=...)`, so a link anywhere below the
start makes the walk fail (ELOOP or ENOTDIR) instead of leading elsewhere.
The file at the end is opened the same way and must be a regular file.

A `group` given to the writers makes every folder and file they create
belong to that group, with exactly the mode asked for: the log tree is
written by root on the nodes and by the unprivileged api and scheduler
(PAI_LOG_GROUP, shared/state/logfiles.py `TreeModes`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                 | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))


class UnsafePath(OSError):
    """A component is a link or not a folder, or a name is not one component."""


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\x00" in name:
        raise UnsafePath(errno.EINVAL, f"{name!r} is not a single path component")


@contextmanager
def open_dir(start: str, parts: Sequence[str], *, create: bool = False,
             mode: int = 0o755, group: int | None = None) -> Iterator[int]:
    """A descriptor of `start/parts...`, reached without following a link
    below `start` (`start` itself is trusted and may be one). With `create`,
    missing components are made with `mode` (exactly: the umask is undone)
    and, with `group`, owned by that group.
    Raises UnsafePath for a link or a non-folder on the way, FileNotFoundError
    for a missing component without `create`, and OSError otherwise."""
    for part in parts:
        _check_name(part)
    fd = os.open(start, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            parent, fd = fd, -1
            fd = _step(parent, part, create, mode, group)  # closes parent, even on failure
        yield fd
    finally:
        if fd >= 0:
            os.close(fd)


def own(fd: int, mode: int, group: int | None) -> None:
    """Give what `fd` opens exactly `mode` and, when given, the group `group`.
    The group first: a change of group may clear a setgid bit, the mode then
    sets it again (and the umask, which cut the mode at creation, is undone)."""
    if group is not None and os.fstat(fd).st_gid != group:
        os.fchown(fd, -1, group)
    os.fchmod(fd, mode)


def _step(parent: int, name: str, create: bool, mode: int, group: int | None) -> int:
    """Open `name` in `parent` (closing `parent`), creating it if asked."""
    try:
        for _ in range(2):  # a second try only if someone made it between our calls
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise
            try:
                os.mkdir(name, mode, dir_fd=parent)
            except FileExistsError:
                continue
            child = os.open(name, _DIR_FLAGS, dir_fd=parent)
            try:
                own(child, mode, group)  # mkdir's mode is cut by the umask
            except BaseException:
                os.close(child)
                raise
            return child
        raise FileExistsError(errno.EEXIST, f"{name} keeps changing")
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(error.errno, f"{name} is a symbolic link or not a folder") \
                from None
        raise
    finally:
        os.close(parent)


def append(start: str, parts: Sequence[str], data: bytes, *, dir_mode: int = 0o750,
           file_mode: int = 0o640, group: int | None = None) -> None:
    """Append `data` to the file `start/parts...`, creating it (with
    `file_mode` and `group`) and its folders (`dir_mode`, `group`), without
    following a link anywhere below `start`. A planted FIFO, device or
    hard-linked file is refused, never written through."""
    *folders, name = parts
    _check_name(name)
    with open_dir(start, folders, create=True, mode=dir_mode, group=group) as parent:
        fd, created = _open_append(parent, name, file_mode)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise UnsafePath(errno.EPERM, f"{name} is not a plain file of its own")
        if created:
            own(fd, file_mode, group)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _open_append(parent: int, name: str, mode: int) -> tuple[int, bool]:
    """(descriptor, whether this call created the file) of `name` in `parent`,
    opened for appending without following a link."""
    try:
        for _ in range(2):  # a second try only if it went between our calls
            try:
                return os.open(name, _APPEND_FLAGS | os.O_EXCL, mode, dir_fd=parent), True
            except FileExistsError:
                pass
            try:
                return os.open(name, _APPEND_FLAGS & ~os.O_CREAT, dir_fd=parent), False
            except FileNotFoundError:
                continue
        raise FileExistsError(errno.EEXIST, f"{name} keeps changing")
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENXIO):
            raise UnsafePath(error.errno, f"{name} is a symbolic link or a pipe") from None
        raise


def real_dir(start: str, parts: Sequence[str], *, create: bool = False,
             mode: int = 0o755) -> str:
    """The path of `start/parts...` after a link-free walk (see open_dir): the
    caller may hand this path on (to Docker) knowing no component below
    `start` was a link when it was checked."""
    with open_dir(start, parts, create=create, mode=mode):
        return os.path.join(os.path.realpath(start), *parts)


@contextmanager
def open_file(start: str, parts: Sequence[str]) -> Iterator[int]:
    """A read-only descriptor of the plain file `start/parts...`, reached
    without following a link below `start` (FileNotFoundError when absent):
    the API reads task logs this way, so nothing planted there redirects it."""
    *folders, name = parts
    _check_name(name)
    with open_dir(start, folders) as parent:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=parent)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise UnsafePath(error.errno, f"{name} is a symbolic link") from None
            raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(errno.EPERM, f"{name} is not a plain file")
        yield fd
    finally:
        os.close(fd)


def replace(start: str, parts: Sequence[str], chunks: Iterable[bytes], *,
            dir_mode: int = 0o750, file_mode: int = 0o640, group: int | None = None) -> None:
    """Write `start/parts...` anew from `chunks`: into a fresh file beside it,
    renamed over it at the end, so a reader (or a crash) sees the old file or
    the new one, never half of one. No link below `start` is followed."""
    *folders, name = parts
    _check_name(name)
    temp = f".{name}.{os.getpid()}.tmp"
    with open_dir(start, folders, create=True, mode=dir_mode, group=group) as parent:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=parent)  # left by a writer that died
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     file_mode, dir_fd=parent)
        try:
            own(fd, file_mode, group)
            for chunk in chunks:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(temp, dir_fd=parent)
            raise
        os.close(fd)
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)


def remove_tree(start: str, parts: Sequence[str]) -> bool:
    """Remove the folder `start/parts...` and all it holds, following no link
    (shutil.rmtree's descriptor-based walk); False when it was not there."""
    *folders, name = parts
    _check_name(name)
    try:
        with open_dir(start, folders) as parent:
            shutil.rmtree(name, dir_fd=parent)
    except FileNotFoundError:
        return False
    return True
