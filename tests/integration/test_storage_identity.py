"""The control plane's part of the shared storage (shared/state/storageid.py):
the cluster's identity written where every node agent looks for it, and
nothing made in the place of storage that is not there."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import redis

from shared.infra.sharedstorage import IDENTITY_FILE, read_identity
from shared.state import storageid
from shared.state.store import Store

pytestmark = pytest.mark.redis


def test_the_identity_goes_into_every_root_and_the_log_tree_keeps_its_modes(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    """The log tree is made by its own rule (root's, not world-readable),
    not as a side effect of writing the identity into it."""
    root = tmp_path / "storage"
    root.mkdir()
    tree = root / ".pai-logs"
    store = Store(redis_client)

    assert storageid.ensure_storage(store, [str(root)], str(tree), None) == []

    identity = storageid.cluster_id(store)
    assert read_identity(str(root)) == identity
    assert read_identity(str(tree)) == identity
    assert stat.S_IMODE(tree.stat().st_mode) == 0o750


def test_a_storage_root_that_is_not_there_is_reported_and_not_made(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    """An API whose NFS mount is missing must not write the identity into a
    local folder of the same name: nodes would then trust that folder."""
    missing = tmp_path / "nfs" / "storage"
    problems = storageid.ensure_storage(Store(redis_client), [str(missing)],
                                        str(missing / ".pai-logs"), None)
    assert problems and all("does not exist" in p for p in problems)
    assert not missing.exists()
    assert not (missing / IDENTITY_FILE).exists()


def test_another_clusters_storage_is_reported_and_left_alone(
        redis_client: redis.Redis, tmp_path: Path) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    (root / IDENTITY_FILE).write_text("another-cluster\n")

    problems = storageid.ensure_storage(Store(redis_client), [str(root)], None, None)

    assert len(problems) == 1 and "another cluster's identity" in problems[0]
    assert read_identity(str(root)) == "another-cluster"
