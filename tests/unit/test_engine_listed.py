"""A row of Docker's container list read as an inspected container
(shared/node/engine.py `listed_attrs`): what a model's id, name, labels and status
say must be the same either way, so reconcile and the sampler need no
inspect per container."""

from __future__ import annotations

from typing import Any

import docker
import pytest

from shared.node.engine import listed_attrs

LABELS = {"pai.job": "alice~mnist", "pai.attempt": "0", "pai.role": "main", "pai.index": "0"}


@pytest.mark.parametrize(("row", "name", "labels", "status"), [
    pytest.param({"Id": "a1", "Names": ["/pai-x"], "Labels": LABELS, "State": "running"},
                 "pai-x", LABELS, "running", id="running"),
    pytest.param({"Id": "a1", "Names": ["/pai-x"], "Labels": LABELS, "State": "exited"},
                 "pai-x", LABELS, "exited", id="exited"),
    pytest.param({"Id": "a1", "Names": ["/pai-x"], "Labels": LABELS, "State": "created"},
                 "pai-x", LABELS, "created", id="created, never started"),
    pytest.param({"Id": "a1", "Names": ["/pai-x"], "Labels": None, "State": "running"},
                 "pai-x", {}, "running", id="no labels"),
    pytest.param({"Id": "a1", "Names": [], "State": "dead"}, "", {}, "dead",
                 id="no name, no labels"),
])
def test_a_listed_container_reads_as_an_inspected_one(
        row: dict[str, Any], name: str, labels: dict[str, str], status: str) -> None:
    client = docker.DockerClient(base_url="tcp://127.0.0.1:9", version="1.41")  # never called
    try:
        container = client.containers.prepare_model(listed_attrs(row))
        assert (container.id, container.name, container.labels, container.status) == \
            ("a1", name, labels, status)
    finally:
        client.close()


def test_the_row_is_not_shared_with_the_model() -> None:
    row = {"Id": "a1", "Names": ["/pai-x"], "Labels": dict(LABELS), "State": "running"}
    attrs = listed_attrs(row)
    attrs["Config"]["Labels"]["pai.job"] = "changed"
    assert row["Labels"]["pai.job"] == "alice~mnist"
