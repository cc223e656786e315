"""The shared storage's identity: one file per storage root and in the log
tree, holding this cluster's id (keys.CLUSTER_ID).

Storage roots and the log tree must be one filesystem seen by every node
(NFS or the like): a node whose mount is missing would write a job's output
to its local disk, where nobody finds it. The control plane writes the
identity (`ensure`); each node agent reads it back (`check`) and reports the
node NOT_READY when it is missing or another cluster's, never assuming.
"""

from __future__ import annotations

import errno
import logging
import os
import uuid
from collections.abc import Iterable

from shared.infra import safefs
from shared.state import leases
from shared.state.store import Store

log = logging.getLogger(__name__)

IDENTITY_FILE = ".pai-cluster"
MAX_BYTES = 256


def cluster_id(store: Store) -> str:
    return leases.cluster_id(store, uuid.uuid4().hex)


def read_identity(folder: str) -> str | None:
    """The identity file's content in `folder`, None when there is none; a
    link or anything but a plain file is refused (UnsafePath)."""
    try:
        with safefs.open_file(folder, [IDENTITY_FILE]) as fd:
            return os.read(fd, MAX_BYTES).decode(errors="replace").strip()
    except FileNotFoundError:
        return None


def ensure(store: Store, folders: Iterable[str]) -> list[str]:
    """Write the cluster's identity into each folder that has none (made if
    missing); the problems found, one line each (another cluster's file,
    a folder that cannot be written)."""
    identity = cluster_id(store)
    problems = []
    for folder in folders:
        try:
            os.makedirs(folder, exist_ok=True)
            found = read_identity(folder)
            if found is None:
                safefs.replace(folder, [IDENTITY_FILE], [identity.encode() + b"\n"],
                               file_mode=0o644)
                log.info("wrote this cluster's identity into %s", folder)
            elif found != identity:
                problems.append(f"{folder} holds another cluster's identity ({found[:40]})")
        except OSError as error:
            if error.errno not in (errno.EROFS, errno.EACCES):
                log.warning("cannot write the cluster identity into %s: %s", folder, error)
            problems.append(f"{folder}: {error.strerror or error}")
    for problem in problems:
        log.error("shared storage: %s", problem)
    return problems


def problem_with(folder: str, identity: str) -> str:
    """Why `folder` is not this cluster's shared storage ("" when it is)."""
    try:
        found = read_identity(folder)
    except OSError as error:
        return f"storage {folder} cannot be read: {error.strerror or error}"
    if found is None:
        return (f"storage {folder} has no {IDENTITY_FILE} file: the cluster's shared "
                f"storage is not mounted there")
    if found != identity:
        return f"storage {folder} belongs to another cluster (identity {found[:40]})"
    return ""
