"""The chaos run under pytest: kill -9 every kind of service, lose a node,
and every job still ends as its script says, nothing twice, nothing leaked.

`make test` runs one bounded seed (about three minutes); `make test-chaos`
runs three longer ones (CHAOS_SEEDS, CHAOS_JOBS, CHAOS_SECONDS). A failure
prints the summary line with its seed: `python -m tests.chaos.run --seed N`
replays the same jobs and fault schedule.
"""

from __future__ import annotations

import os
from pathlib import Path

import docker
import pytest

from tests.chaos.run import run_chaos

SEEDS = [int(s) for s in os.environ.get("CHAOS_SEEDS", "20261125").split()]
JOBS = int(os.environ.get("CHAOS_JOBS", "150"))
SECONDS = float(os.environ.get("CHAOS_SECONDS", "75"))

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.chaos]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", SEEDS)
def test_nothing_lost_duplicated_or_leaked_under_kill_9(
        seed: int, docker_client: docker.DockerClient, test_image: str,
        tmp_path: Path) -> None:
    summary = run_chaos(seed, jobs=JOBS, seconds=SECONDS, docker_client=docker_client,
                        image=test_image, work_dir=tmp_path)
    print(summary.line())
    assert summary.ok, summary.line() + "\n" + summary.details()
