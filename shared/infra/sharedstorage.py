"""Is a folder the cluster's shared storage? Its identity file says.

Storage roots and the log tree must be one filesystem seen by every node
(NFS or the like): a node whose mount is missing would write a job's output
to its local disk, where nobody finds it. The control plane writes the
cluster's id into each (shared/state/storageid.py); every node agent reads
it back here, never assuming.
"""

from __future__ import annotations

import os

from shared.infra import safefs

IDENTITY_FILE = ".pai-cluster"
MAX_BYTES = 256


def read_identity(folder: str) -> str | None:
    """The identity file's content in `folder`, None when there is none; a
    link or anything but a plain file is refused (UnsafePath)."""
    try:
        with safefs.open_file(folder, [IDENTITY_FILE]) as fd:
            return os.read(fd, MAX_BYTES).decode(errors="replace").strip()
    except FileNotFoundError:
        return None


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
