"""One multi-host cluster for the tier's tests (tests/cluster/platform.py):
the faults, then training across two of its hosts.

`make test` runs every fault with short durations (PAI_CLUSTER_FAULT_SECONDS,
default 30); `make test-cluster` holds the outages for minutes. Each test
leaves the cluster healed, its jobs stopped. The figures each fault measured
are printed at the end (run with -s to see them) and kept in
`<work>/figures.json`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.hosts import can_make_hosts
from tests.cluster.platform import Cluster

FAULT_SECONDS = float(os.environ.get("PAI_CLUSTER_FAULT_SECONDS", "30"))
OUTAGE_SECONDS = float(os.environ.get("PAI_CLUSTER_OUTAGE_SECONDS", str(FAULT_SECONDS)))


@pytest.fixture(scope="package")
def figures() -> Iterator[dict[str, Any]]:
    found: dict[str, Any] = {}
    yield found
    print("\ncluster figures:", json.dumps(found, indent=1, sort_keys=True))


# Package scope: one cluster for this folder's modules, torn down after its
# last test, before the rest of a `make test` run (a session-scoped cluster
# would keep three engines and their agents busy through every later test).
@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory,
            figures: dict[str, Any]) -> Iterator[Cluster]:
    reason = can_make_hosts()
    if reason:
        pytest.fail(f"the multi-host tier needs test hosts: {reason}")
    work: Path = tmp_path_factory.mktemp("cluster")
    cluster = Cluster(work)
    if cluster.hosts.swept:
        print(f"\nswept what killed runs left: {', '.join(cluster.hosts.swept)}")
    try:
        cluster.start()
        yield cluster
    finally:
        left = cluster.close()
        (work / "figures.json").write_text(json.dumps(figures, indent=1, sort_keys=True))
        assert left == [], left  # every namespace, link and rule torn down
