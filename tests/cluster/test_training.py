"""PyTorch DDP across two test hosts: examples/pytorch-ddp.json's two ranks on
two nodes, each in its own network namespace with its own engine, find each
other from the PAI_* environment alone (the master at PAI_HOST_IP_worker_0 and
its SynPort) and train one model over gloo on the hosts' network.

The image is the one scripts/build-pytorch-image.sh built in the engine
DOCKER_HOST names (CI builds it before the tests); it is copied into the two
nodes' engines (`docker save | docker load`, no registry). Where it was not
built the test is skipped with that reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.platform import ADMIN, Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.redis]

IMAGE = "pai-test/pytorch:latest"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytorch-ddp.json"
COPY_SECONDS = 600
TRAINING_SECONDS = 600
TRAINED = re.compile(r"trained steps (\d+)\.\.(\d+) \(([\d.]+) ms/step\); "
                     r"test accuracy ([\d.]+); parameter sum (-?[\d.]+)")
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


def _copy_image(engine_socket: str) -> None:
    """`docker save` from the test's engine into a node's engine."""
    save = subprocess.Popen(["docker", "save", IMAGE], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    load = subprocess.run(["docker", "load", "-q"], stdin=save.stdout, capture_output=True,
                          text=True, env={**os.environ, "DOCKER_HOST": engine_socket},
                          timeout=COPY_SECONDS, check=False)
    assert save.stdout is not None
    save.stdout.close()
    saved = save.wait(timeout=60)
    assert (saved, load.returncode) == (0, 0), load.stderr[-2000:]


@pytest.fixture(scope="module")
def trainers(cluster: Cluster, figures: dict[str, Any]) -> list[str]:
    """Two nodes whose engines hold the PyTorch image."""
    found = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True,
                           text=True, timeout=60, check=False)
    if found.returncode != 0:
        pytest.skip(f"{IMAGE} is not built in the test's engine "
                    f"(scripts/build-pytorch-image.sh): {found.stderr.strip()[:200]}")
    nodes = sorted(cluster.nodes)[:2]
    started = time.monotonic()
    with ThreadPoolExecutor(len(nodes)) as pool:  # side by side: mostly waiting on disks
        list(pool.map(_copy_image, [cluster.engines[node].socket for node in nodes]))
    figures["DDP across two hosts"] = {"image copied to 2 engines in s":
                                       round(time.monotonic() - started, 1)}
    return nodes


def test_ddp_trains_one_model_with_its_ranks_on_two_hosts(
        cluster: Cluster, trainers: list[str], figures: dict[str, Any]) -> None:
    name = "ddp-hosts"
    config = json.loads(EXAMPLE.read_text())
    config["jobName"] = name
    # A node's two GPUs to each rank: the two ranks cannot share a host.
    config["taskRoles"][0]["gpuNumber"] = 2
    others = [node for node in cluster.nodes if node not in trainers]
    for node in others:
        cluster.cordon(node, False)
    try:
        reply = cluster.http.post(f"{cluster.url}/api/v1/user/{ADMIN[0]}/jobs", json=config,
                                  timeout=10)
        assert reply.status_code == 202, reply.text
        detail = cluster.wait(
            lambda: (d := cluster.job(name))["jobStatus"]["state"] in ENDED and d,
            "the DDP job to end", TRAINING_SECONDS)
    finally:
        for node in others:
            cluster.cordon(node, True)

    logs = [cluster.task_log(name, "worker", index) for index in (0, 1)]
    assert detail["jobStatus"]["state"] == "SUCCEEDED", "\n---\n".join(logs)
    tasks = detail["taskRoles"]["worker"]["taskStatuses"]
    assert sorted(t["containerNodeName"] for t in tasks) == trainers
    master = f"{tasks[0]['containerIp']}:{tasks[0]['containerPorts']['SynPort']}"
    assert tasks[0]["containerIp"] != tasks[1]["containerIp"]  # two hosts' addresses
    lines = []
    for index, log in enumerate(logs):
        assert f"rank {index} of 2: master {master}" in log, log[-2000:]
        found = TRAINED.search(log)
        assert found, log[-2000:]
        lines.append(found)
    # Each rank trained on its half of every batch: only gradients averaged
    # across the hosts give both the same parameters.
    assert lines[0][5] == lines[1][5]
    metrics = json.loads((cluster.storage / ADMIN[0] / name / "output" / "metrics.json")
                         .read_text())
    assert (metrics["worldSize"], metrics["steps"]) == (2, 1000)
    assert metrics["accuracy"] >= 0.95
    figures["DDP across two hosts"].update({
        "ms per step": [float(line[3]) for line in lines],
        "test accuracy": metrics["accuracy"]})
