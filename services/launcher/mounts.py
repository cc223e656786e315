"""The storage a task's container sees: dataDir, codeDir and outputDir.

The API already accepted these paths (their form, and that the user may name
them: shared/domain/storage.py); this is defence in depth on the node that mounts
them, and the only place that looks at the storage itself: a path must
resolve (symlinks too) under a storage root and be reached from the root
without passing a link, the root must be there (an unmounted NFS share must
not become a local folder), dataDir and codeDir must exist, and outputDir is
created for the job by a walk that follows no link (shared/infra/safefs.py).
`hdfs://` URIs are the job's business: they are only in its environment.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from shared.domain import storage
from shared.domain.models import JobSpec
from shared.domain.storage import StoragePath, StoragePathError
from shared.infra import safefs

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


def host_path(field: str, value: str, roots: Sequence[str],
              unmounted: Sequence[str] = ()) -> StoragePath | None:
    """Where a dir lies (normalised path and root); None if it is not mounted:
    an hdfs:// URI, or a dir the API found outside every root (`unmounted`:
    even if this node's roots hold it, no one checked the user may mount it)."""
    if field in unmounted:
        return None
    try:
        return storage.resolve(value, roots)
    except StoragePathError as error:
        if not roots:
            raise TaskSetupError(f"{field} {value!r} cannot be mounted: no storage roots "
                                 f"are configured on this node") from None
        raise TaskSetupError(f"{field} {error}") from None


def checked_source(field: str, where: StoragePath, node: str, *, create: bool,
             reserved: Sequence[str]) -> str:
    """The host path to mount, after two checks on the node: the path resolves
    (symbolic links too) under the root's real path, and a walk from the root
    that follows no link reaches it, so a link planted anywhere below the root
    (by this job or another) can neither lead out of the root nor widen the
    mount to a folder the API did not grant. With `create`, missing folders
    are made by that walk (outputDir), never through a link."""
    clash = storage.reserved_clash(where.path, reserved)
    if clash:
        raise TaskSetupError(f"{field} {clash}")
    root = where.root
    if not os.path.isdir(root):
        raise TaskSetupError(f"storage root {root} for {field} is not mounted on node {node}")
    real, real_root = os.path.realpath(where.path), os.path.realpath(root)
    if not storage.is_under(real, real_root):
        raise TaskSetupError(f"{field} {where.path} leads outside its storage root {root} "
                             f"(a symbolic link to {real})")
    try:
        if create and where.parts:
            safefs.real_dir(root, where.parts[:-1], create=True)
            return safefs.real_dir(root, where.parts, create=True, mode=OUTPUT_DIR_MODE)
        return safefs.real_dir(root, where.parts)
    except safefs.UnsafePath:
        raise TaskSetupError(f"{field} {where.path} passes through a symbolic link or a "
                             f"file on node {node}; mount its real folder instead") from None
    except FileNotFoundError:
        raise TaskSetupError(f"{field} {where.path} does not exist on node {node}") from None
    except OSError as error:
        verb = "cannot be created" if create else "cannot be opened"
        raise TaskSetupError(
            f"{field} {where.path} {verb} on node {node}: {error.strerror}") from None


def plan_storage(spec: JobSpec, roots: Sequence[str], node: str,
                 reserved: Sequence[str] = ()) -> StoragePlan:
    """The bind mounts of a task (creating outputDir), or TaskSetupError.
    dataDir and codeDir (own or shared folders) are always read-only; no
    mount overlaps `reserved` (the platform's log tree)."""
    wanted: list[BindMount] = []
    working_dir = None
    data = host_path("dataDir", spec.data_dir, roots, spec.unmounted_dirs)
    if data:
        source = checked_source("dataDir", data, node, create=False, reserved=reserved)
        wanted.append(BindMount(source, data.path, True))
    code = host_path("codeDir", spec.code_dir, roots, spec.unmounted_dirs)
    if code:
        source = checked_source("codeDir", code, node, create=False, reserved=reserved)
        wanted.append(BindMount(source, code.path, True))
        wanted.append(BindMount(source, CODE_MOUNT, True))
        working_dir = CODE_MOUNT
    output = host_path("outputDir", spec.output_dir, roots, spec.unmounted_dirs)
    if output:
        wanted.append(BindMount(checked_source("outputDir", output, node, create=True,
                                         reserved=reserved),
                                output.path, False))
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
