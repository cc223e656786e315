"""Time per training step on the platform, beside the same container run by hand.

examples/pytorch-digits.json (pai-test/pytorch:latest, scripts/build-pytorch-
image.sh) trains for 1,500 steps on one CPU; the script times its own steps
and prints `(<ms> ms/step)`. Alternating, one at a time:

- platform: the example submitted as it is, on a platform of processes
  (bench/live_platform.py): its container has the launcher's limits (one
  CPU, 2 GiB, no swap), confinement and PAI_* environment;
- reference: `docker run` of the same image and command on the host
  network with the same CPU and memory limits and the two variables the
  script reads (PAI_TASK_CPU_NUM=1, PAI_OUTPUT_DIR), through the Docker SDK.

The figure is the script's own ms/step, so start-up (Python, importing
PyTorch) is not in it. PAI_BENCH_ROUNDS overrides the 5 rounds of each.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
from pathlib import Path

import docker
from docker.errors import ImageNotFound
from docker.types import Mount

from bench import BenchError, Figures, throwaway_redis
from bench.live_platform import BENCH_LABEL, reference_engine, running_platform

ROUNDS = 5
IMAGE = "pai-test/pytorch:latest"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pytorch-digits.json"
STEP_TIME = re.compile(r"\(([\d.]+) ms/step\)")


def steps_of(command: str) -> str:
    found = re.search(r"--steps (\d+)", command)
    return found[1] if found else "?"


def step_ms(log: str) -> float:
    found = STEP_TIME.search(log)
    if not found:
        raise BenchError(f"no ms/step in the training's log:\n{log[-1500:]}")
    return float(found[1])


def by_hand(client: docker.DockerClient, run: str, command: str, output: Path,
            memory_mb: int) -> float:
    """`docker run` of the example's command, as a user would try it first."""
    container = client.containers.run(
        IMAGE, ["/bin/sh", "-c", command], detach=True, network_mode="host",
        nano_cpus=10**9, mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m",
        environment={"PAI_TASK_CPU_NUM": "1", "PAI_OUTPUT_DIR": str(output)},
        labels={BENCH_LABEL: run}, init=True,
        mounts=[Mount(str(output), str(output), type="bind")])
    try:
        if container.wait(timeout=900)["StatusCode"] != 0:
            raise BenchError(f"the hand-run training failed:\n{container.logs().decode()[-1500:]}")
        return step_ms(container.logs().decode())
    finally:
        container.remove(force=True)


def run() -> Figures:
    rounds = int(os.environ.get("PAI_BENCH_ROUNDS", ROUNDS))
    config = json.loads(EXAMPLE.read_text())
    role = config["taskRoles"][0]
    platform_ms, hand_ms = [], []
    with throwaway_redis() as url, running_platform(url) as pai, \
            reference_engine() as (client, run), tempfile.TemporaryDirectory() as scratch:
        try:
            client.images.get(IMAGE)
        except ImageNotFound:
            raise BenchError(f"{IMAGE} is missing: run scripts/build-pytorch-image.sh") from None
        Path(scratch).chmod(0o777)
        for number in range(rounds):
            name = f"train-bench-{number}"
            pai.submit_accepted({**config, "jobName": name})
            detail = pai.wait_state(name, timeout=900)
            log = pai.log(name, "main")
            if detail["jobStatus"]["state"] != "SUCCEEDED":
                raise BenchError(f"{name} ended {detail['jobStatus']['state']}:\n{log[-1500:]}")
            platform_ms.append(step_ms(log))
            output = Path(scratch) / str(number)
            output.mkdir()
            hand_ms.append(by_hand(client, run, role["command"], output, role["memoryMB"]))
    return {
        "rounds": f"{rounds} of each, alternating; {steps_of(role['command'])} steps, 1 CPU",
        "ms per training step": {
            "on pai (the script's own timing)": {
                "median": statistics.median(platform_ms), "each": " ".join(
                    f"{m:.2f}" for m in platform_ms)},
            "docker run by hand (reference)": {
                "median": statistics.median(hand_ms), "each": " ".join(
                    f"{m:.2f}" for m in hand_ms)}},
        "ratio median pai vs by hand": statistics.median(platform_ms) / statistics.median(hand_ms),
    }
