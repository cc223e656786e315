"""The storage a task's container sees: dataDir, codeDir and outputDir.

The API already accepted these paths by their form; this is defence in depth
on the node that mounts them, and the only place that looks at the storage
itself: a path must resolve (symlinks too) under a storage root, the root
must be there (an unmounted NFS share must not become a local folder),
dataDir and codeDir must exist, and outputDir is created for the job.
`hdfs://` URIs are the job's business: they are only in its environment.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from shared.models import JobSpec

CODE_MOUNT = "/pai/code"
OUTPUT_DIR_MODE = 0o777  # the job's image may run as any user


class TaskSetupError(Exception):
    """The task cannot start on this node for a reason the user can fix."""


@dataclass(frozen=True)
class BindMount:
    source: str  # the real path on the host
    target: str  # where the container sees it
    read_only: bool


@dataclass(frozen=True)
class StoragePlan:
    mounts: tuple[BindMount, ...]
    working_dir: str | None


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def host_path(field: str, value: str, roots: Sequence[str]) -> tuple[str, str] | None:
    """(path as given, root it lies under) for a mountable dir; None if not mounted."""
    if not value or value.startswith("hdfs://"):
        return None
    path = value.removeprefix("file://")
    if not path.startswith("/") or ".." in path.split("/") or "\x00" in path:
        raise TaskSetupError(f"{field} {value!r} is not an absolute path without '..'")
    path = "/" + posixpath.normpath(path).lstrip("/")
    for root in roots:
        if _under(path, root):
            return path, root
    raise TaskSetupError(f"{field} {path} is outside the storage roots "
                         f"({', '.join(roots) or 'none configured on this node'})")


def _real_under_root(field: str, path: str, root: str, node: str) -> str:
    """The path with symlinks resolved, still under the root's real path."""
    if not os.path.isdir(root):
        raise TaskSetupError(f"storage root {root} for {field} is not mounted on node {node}")
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    if not _under(real, real_root):
        raise TaskSetupError(f"{field} {path} leads outside its storage root {root} "
                             f"(a symbolic link to {real})")
    return real


def _existing_dir(field: str, path: str, root: str, node: str) -> str:
    real = _real_under_root(field, path, root, node)
    if not os.path.isdir(real):
        raise TaskSetupError(f"{field} {path} does not exist on node {node}")
    return real


def _output_dir(path: str, root: str, node: str) -> str:
    real = _real_under_root("outputDir", path, root, node)
    if os.path.isdir(real):
        return real
    try:
        os.makedirs(real, exist_ok=True)
        os.chmod(real, OUTPUT_DIR_MODE)  # makedirs' mode is cut by the umask
    except OSError as error:
        raise TaskSetupError(
            f"outputDir {path} cannot be created on node {node}: {error.strerror}") from None
    # Created just now: make sure no link raced us out of the root.
    return _real_under_root("outputDir", path, root, node)


def plan_storage(spec: JobSpec, roots: Sequence[str], node: str) -> StoragePlan:
    """The bind mounts of a task (creating outputDir), or TaskSetupError."""
    wanted: list[BindMount] = []
    working_dir = None
    data = host_path("dataDir", spec.data_dir, roots)
    if data:
        wanted.append(BindMount(_existing_dir("dataDir", *data, node), data[0], True))
    code = host_path("codeDir", spec.code_dir, roots)
    if code:
        source = _existing_dir("codeDir", *code, node)
        wanted.append(BindMount(source, code[0], True))
        wanted.append(BindMount(source, CODE_MOUNT, True))
        working_dir = CODE_MOUNT
    output = host_path("outputDir", spec.output_dir, roots)
    if output:
        wanted.append(BindMount(_output_dir(*output, node), output[0], False))
    return StoragePlan(_one_per_target(wanted), working_dir)


def _one_per_target(mounts: list[BindMount]) -> tuple[BindMount, ...]:
    """Docker refuses two mounts at one path (dataDir == outputDir): keep one,
    writable if any of them is."""
    by_target: dict[str, BindMount] = {}
    for mount in mounts:
        seen = by_target.get(mount.target)
        if seen is None or (seen.read_only and not mount.read_only):
            by_target[mount.target] = mount
    return tuple(by_target.values())
