"""The shared storage's identity: one file per storage root and in the log
tree, holding this cluster's id (keys.CLUSTER_ID), written by the control
plane (`ensure`) for every node agent to check (shared/infra/sharedstorage.py).
"""

from __future__ import annotations

import errno
import logging
import os
import uuid
from collections.abc import Iterable

from shared.infra import safefs
from shared.infra.sharedstorage import IDENTITY_FILE, read_identity
from shared.state import leases
from shared.state.store import Store

log = logging.getLogger(__name__)

def cluster_id(store: Store) -> str:
    return leases.cluster_id(store, uuid.uuid4().hex)


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
