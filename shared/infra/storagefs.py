"""Files and folders in the storage roots, for the doors users open on them.

WebHDFS (services/api/webhdfs.py), `pai fs` and the portal's storage browser
read and write users' folders, which their jobs (root, on the host) write
too: any name there may be a link a job planted, pointing at a host file or
at another user's folder. So every operation here starts from the storage
root (trusted) and reaches its target through shared/infra/safefs.py's walk,
which follows no link; the last name is then acted on relative to its
folder's descriptor with the no-follow form of each call (`lstat`,
`O_NOFOLLOW`, `unlinkat`, `renameat`), so a link is reported as a link and
never passed through. A file read or written must be a plain file: a FIFO a
job made would otherwise hang the reader or the writer.

Who may touch which path is decided before, by shared/domain/storage.py's
`access_to`; this module only does it safely.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from shared.domain.webhdfs import DEFAULT_DIR_MODE, FileInfo, Kind, Summary
from shared.infra import safefs
from shared.infra.safefs import UnsafePath

Parts = Sequence[str]
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Busy(OSError):
    """Another upload holds the file (its lock): two writers would interleave."""


def _kind(mode: int) -> Kind | None:
    if stat.S_ISDIR(mode):
        return Kind.DIRECTORY
    if stat.S_ISREG(mode):
        return Kind.FILE
    if stat.S_ISLNK(mode):
        return Kind.SYMLINK
    return None  # FIFOs, sockets, devices: not listed, never opened


def _info(name: str, st: os.stat_result, children: int | None = None) -> FileInfo | None:
    kind = _kind(st.st_mode)
    if kind is None:
        return None
    return FileInfo(name=name, kind=kind, length=st.st_size if kind == Kind.FILE else 0,
                    modified_ms=st.st_mtime_ns // 1_000_000,
                    accessed_ms=st.st_atime_ns // 1_000_000,
                    mode=stat.S_IMODE(st.st_mode), inode=st.st_ino, children=children)


def _special(name: str) -> UnsafePath:
    return UnsafePath(errno.EPERM, f"{name} is not a plain file or folder")


def status(root: str, parts: Parts) -> FileInfo:
    """What `root/parts...` is, without following a link (a link is a SYMLINK);
    a folder comes with its number of entries."""
    if not parts:
        with safefs.open_dir(root, ()) as fd:
            found = _info("", os.fstat(fd), len(os.listdir(fd)))
    else:
        with safefs.open_dir(root, parts[:-1]) as parent:
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            children = None
            if stat.S_ISDIR(st.st_mode):
                with safefs.open_dir(root, parts) as fd:
                    children = len(os.listdir(fd))
            found = _info(parts[-1], st, children)
    if found is None:
        raise _special(parts[-1] if parts else root)
    return found


def listing(root: str, parts: Parts) -> list[FileInfo]:
    """The entries of the folder `root/parts...`, by name (links as links;
    FIFOs, sockets and devices left out). A file lists as itself, named ""."""
    info = status(root, parts)
    if info.kind == Kind.FILE:
        return [FileInfo("", info.kind, info.length, info.modified_ms, info.accessed_ms,
                         info.mode, info.inode)]
    if info.kind != Kind.DIRECTORY:
        raise UnsafePath(errno.ELOOP, f"{parts[-1]} is a symbolic link")
    entries: list[FileInfo] = []
    with safefs.open_dir(root, parts) as fd, os.scandir(fd) as found:
        for entry in found:
            try:
                one = _info(entry.name, entry.stat(follow_symlinks=False))
            except FileNotFoundError:
                continue  # removed while we listed
            if one is not None:
                entries.append(one)
    return sorted(entries, key=lambda e: e.name)


def make_folders(root: str, parts: Parts, mode: int = DEFAULT_DIR_MODE) -> None:
    """`mkdir -p root/parts...`: missing folders made with `mode`, no link followed."""
    with safefs.open_dir(root, parts, create=True, mode=mode):
        pass


@contextmanager
def reader(root: str, parts: Parts) -> Iterator[int]:
    """A read-only descriptor of the plain file `root/parts...`."""
    with safefs.open_file(root, parts) as fd:
        yield fd


def _lock(fd: int, name: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise Busy(errno.EBUSY, f"{name} is being written by another upload") from None


@contextmanager
def creator(root: str, parts: Parts, *, mode: int, overwrite: bool) -> Iterator[int]:
    """A descriptor of a new, empty file `root/parts...` (its folders made as
    needed), locked against a second writer. With `overwrite` an existing
    file (or link) of that name is removed first, never written through:
    its other hard links and its readers keep the old bytes. An existing
    folder is never replaced (FileExistsError)."""
    *folders, name = parts
    with safefs.open_dir(root, folders, create=True, mode=DEFAULT_DIR_MODE) as parent:
        if overwrite:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise FileExistsError(errno.EEXIST, f"{name} is a folder")
                os.unlink(name, dir_fd=parent)
        fd = os.open(name, _CREATE_FLAGS, mode, dir_fd=parent)
    try:
        safefs.own(fd, mode, None)  # exactly `mode`: the umask cut it at creation
        _lock(fd, name)
        yield fd
    finally:
        os.close(fd)


@contextmanager
def appender(root: str, parts: Parts) -> Iterator[int]:
    """A descriptor appending to the existing plain file `root/parts...`
    (FileNotFoundError when there is none), locked against a second writer.
    A file with other hard links is refused: the bytes would land there too."""
    *folders, name = parts
    with safefs.open_dir(root, folders) as parent:
        try:
            fd = os.open(name, _APPEND_FLAGS, dir_fd=parent)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENXIO):
                raise UnsafePath(error.errno, f"{name} is a symbolic link or a pipe") from None
            raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise UnsafePath(errno.EPERM, f"{name} is not a plain file of its own")
        _lock(fd, name)
        yield fd
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def rename(root: str, source: Parts, target_root: str, target: Parts) -> bool:
    """Move `root/source...` to `target_root/target...`, as WebHDFS's RENAME:
    into `target` when it is a folder; False (nothing moved) when the source
    or the target's folder is missing, or the target exists."""
    if not source or not target:
        raise UnsafePath(errno.EPERM, "a storage root cannot be moved or replaced")
    try:
        with safefs.open_dir(root, source[:-1]) as src_parent:
            os.stat(source[-1], dir_fd=src_parent, follow_symlinks=False)
            with _target_folder(target_root, target, source[-1]) as (dst_parent, name):
                if dst_parent < 0:
                    return False
                os.rename(source[-1], name, src_dir_fd=src_parent, dst_dir_fd=dst_parent)
    except FileNotFoundError:
        return False
    return True


@contextmanager
def _target_folder(root: str, target: Parts, moved: str) -> Iterator[tuple[int, str]]:
    """The folder descriptor and name a rename lands at: inside `target` when
    it is a folder, else `target` itself; (-1, "") when that name is taken."""
    with safefs.open_dir(root, target[:-1]) as parent:
        try:
            st = os.stat(target[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            yield parent, target[-1]
            return
        if not stat.S_ISDIR(st.st_mode):
            yield -1, ""
            return
    with safefs.open_dir(root, target) as inside:
        try:
            os.stat(moved, dir_fd=inside, follow_symlinks=False)
        except FileNotFoundError:
            yield inside, moved
            return
        yield -1, ""


def delete(root: str, parts: Parts, *, recursive: bool) -> bool:
    """Remove `root/parts...` (a link itself, never what it points at); a
    folder with entries only when `recursive`. False when it was not there."""
    if not parts:
        raise UnsafePath(errno.EPERM, "a storage root cannot be deleted")
    *folders, name = parts
    try:
        with safefs.open_dir(root, folders) as parent:
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=parent)
            elif recursive:
                shutil.rmtree(name, dir_fd=parent)  # descriptor-based: follows no link
            else:
                os.rmdir(name, dir_fd=parent)
    except FileNotFoundError:
        return False
    return True


def summary(root: str, parts: Parts) -> Summary:
    """Folders (itself included), plain files and their bytes under
    `root/parts...`, walking by descriptors without entering a link."""
    info = status(root, parts)
    if info.kind == Kind.FILE:
        return Summary(0, 1, info.length)
    if info.kind != Kind.DIRECTORY:
        raise UnsafePath(errno.ELOOP, f"{parts[-1]} is a symbolic link")
    folders = files = length = 0
    with safefs.open_dir(root, parts) as top:
        for _, _, names, fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            folders += 1
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        files += 1
                        length += st.st_size
    return Summary(folders, files, length)
