"""Checkpoint reports travel with the log lines that carry them: the
monitor's log write records each attempt's last step (real Redis)."""

from __future__ import annotations

import redis

from services.monitor.logs import append_log_entries
from shared.node.containers import TaskRef
from shared.state import checkpoints, keys
from shared.state.store import Store

JOB = "alice~digits"


def ship(client: redis.Redis, attempt: int, *lines: str, index: int = 0) -> None:
    append_log_entries(client, TaskRef(JOB, attempt, "main", index, 0),
                       lines, max_lines=1000)


def test_the_newest_report_of_each_attempt_is_kept(redis_client: redis.Redis) -> None:
    ship(redis_client, 0, "step 100", "PAI_CHECKPOINT_STEP=100", "step 200")
    ship(redis_client, 0, "PAI_CHECKPOINT_STEP=200", "PAI_CHECKPOINT_STEP=300")
    ship(redis_client, 1, "attempt 1: resuming from step 300", "PAI_CHECKPOINT_STEP=400")

    assert checkpoints.read_steps(redis_client, JOB) == {0: 300, 1: 400}
    assert Store(redis_client).log_extent(JOB, 0, "main", 0) == (5, 5)  # every line still logged


def test_lines_that_only_look_like_reports_change_nothing(redis_client: redis.Redis) -> None:
    ship(redis_client, 0, "PAI_CHECKPOINT_STEP=50")
    ship(redis_client, 0, "PAI_CHECKPOINT_STEP=-1", "PAI_CHECKPOINT_STEP=" + "9" * 40,
         "echo PAI_CHECKPOINT_STEP=999", "PAI_CHECKPOINT_STEP=7; rm -rf /")

    assert checkpoints.read_steps(redis_client, JOB) == {0: 50}


def test_a_batch_shipped_twice_records_the_same_step(redis_client: redis.Redis) -> None:
    for _ in range(2):
        ship(redis_client, 2, "PAI_CHECKPOINT_STEP=120")

    assert checkpoints.read_steps(redis_client, JOB) == {2: 120}


def test_a_job_without_reports_has_no_steps(redis_client: redis.Redis) -> None:
    ship(redis_client, 0, "hello")

    assert checkpoints.read_steps(redis_client, JOB) == {}
    assert not redis_client.exists(keys.job_checkpoints(JOB))


def test_a_batch_arriving_late_does_not_take_the_step_back(redis_client: redis.Redis) -> None:
    """A shipper replaced while it still held lines may write them after its
    successor wrote later ones: the newer step stays."""
    ship(redis_client, 0, "PAI_CHECKPOINT_STEP=200", "stopping at step 218",
         "PAI_CHECKPOINT_STEP=218")
    ship(redis_client, 0, "step 200", "PAI_CHECKPOINT_STEP=200")  # the late one

    assert checkpoints.read_steps(redis_client, JOB) == {0: 218}
