"""shared/node/health.py: a node's checks, each on its own worker with a
deadline, and the shared storage's identity (shared/infra/sharedstorage.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from shared.infra.sharedstorage import IDENTITY_FILE, problem_with
from shared.node.health import Check, NodeHealth, storage_check


def test_a_check_that_hangs_is_a_problem_and_stalls_nothing_else() -> None:
    """A hung NFS mount or engine: the check's call never returns; the check
    says so after its deadline, starts no second call meanwhile, and is
    healthy again once the stuck call returns."""
    release, calls = threading.Event(), []

    def hung_probe() -> str:
        calls.append(1)
        release.wait(30)
        return ""

    check = Check("shared storage", hung_probe, interval=1, timeout=0.2)
    assert check.run_once() == "shared storage did not answer in 0 s"
    assert check.run_once().endswith("did not answer in 0 s")
    assert len(calls) == 1  # the stuck call is waited on, not stacked
    release.set()
    assert check.run_once() == ""
    check.close()


def test_a_check_that_raises_says_what_failed() -> None:
    def broken() -> str:
        raise OSError("Input/output error")

    check = Check("docker engine", broken, interval=1, timeout=1)
    assert check.run_once() == "docker engine failed: Input/output error"
    assert NodeHealth([check]).problem() == "docker engine failed: Input/output error"
    check.close()


def test_storage_is_the_clusters_only_with_its_identity(tmp_path: Path) -> None:
    mounted, missing, other = (tmp_path / name for name in ("nfs", "local", "other"))
    for folder in (mounted, missing, other):
        folder.mkdir()
    (mounted / IDENTITY_FILE).write_text("cluster-a\n")
    (other / IDENTITY_FILE).write_text("cluster-b\n")
    assert problem_with(str(mounted), "cluster-a") == ""
    assert "not mounted there" in problem_with(str(missing), "cluster-a")
    assert "belongs to another cluster" in problem_with(str(other), "cluster-a")
    (tmp_path / "planted").write_text("cluster-a\n")
    (missing / IDENTITY_FILE).symlink_to(tmp_path / "planted")  # a link is never followed
    assert "cannot be read" in problem_with(str(missing), "cluster-a")
    check = storage_check([str(mounted), str(missing)], lambda: "cluster-a")
    assert check.run_once().startswith(f"storage {missing} cannot be read")
    check.close()
