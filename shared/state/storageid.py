"""The shared storage's identity: one file per storage root and in the log
tree, holding this cluster's id (keys.CLUSTER_ID), written by the control
plane (`ensure`) for every node agent to check (shared/infra/sharedstorage.py).

The API does it at start where it may write the storage (`make up`, an
operator's own install). Where it runs unprivileged beside a root-owned
storage (Docker Compose, Kubernetes), `python -m shared.state.storageid`
does the same once, as root, before it: Compose's storage-init service, the
api Deployment's init container.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import uuid
from collections.abc import Iterable, Sequence

from shared.infra import safefs
from shared.infra.config import load_settings
from shared.infra.sharedstorage import IDENTITY_FILE, read_identity
from shared.state import leases
from shared.state.logfiles import ensure_tree
from shared.state.store import Store, connect

log = logging.getLogger(__name__)


def cluster_id(store: Store) -> str:
    return leases.cluster_id(store, uuid.uuid4().hex)


def ensure_storage(store: Store, storage_roots: Sequence[str], log_dir: str | None,
                   log_group: int | None) -> list[str]:
    """The control plane's part at its start: the log tree's own folder made
    with the tree's modes (logfiles.ensure_tree: never world-readable, never
    its parents), then the cluster's identity in every storage root and the
    tree. The problems found, one line each."""
    if log_dir:
        try:
            ensure_tree(log_dir, log_group)
        except OSError as error:
            log.warning("cannot make the log tree %s: %s", log_dir, error)
    return ensure(store, dict.fromkeys((*storage_roots, *([log_dir] if log_dir else []))))


def ensure(store: Store, folders: Iterable[str]) -> list[str]:
    """Write the cluster's identity into each folder that has none; the
    problems found, one line each (a folder missing: its storage is not
    mounted here, and a local folder must not stand in for it; another
    cluster's file; a folder that cannot be written)."""
    identity = cluster_id(store)
    problems = []
    for folder in folders:
        if not os.path.isdir(folder):
            problems.append(f"{folder} does not exist (is its storage mounted here?)")
            continue
        try:
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


def main() -> int:
    """The control plane's storage step alone, with the platform's settings;
    exit 1 when any folder is not this cluster's storage (each said why)."""
    logging.basicConfig(level=logging.INFO, format="storageid: %(message)s")
    settings = load_settings()
    store = Store(connect(settings.redis_url, pool_size=2))
    problems = ensure_storage(store, settings.storage_roots, settings.task_log_dir,
                              settings.log_group)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
