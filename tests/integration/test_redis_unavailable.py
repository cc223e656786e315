"""A primary switch as the API and the store meet it, on real Redis servers
(docs/high-availability.md): a primary without replicas in step is a 503, a
stored job whose scheduler nudge failed is still accepted, and a submit
replayed after its lost reply is not refused as a duplicate of itself."""

from __future__ import annotations

import dataclasses

import pytest
import redis
from flask.testing import FlaskClient

from bench import free_port
from services.api.platform import Platform
from shared.domain.models import Attempt, Job, JobSpec, job_id_of
from shared.infra.clock import now_ms
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state.lifecycle import initial_tasks
from shared.state.store import JobConflict, Store
from tests.support.api import AuthedClient, config, error_of
from tests.support.redis_server import operator_url

pytestmark = pytest.mark.redis


def test_a_stored_job_is_accepted_when_the_scheduler_cannot_be_told(
        flask_client: FlaskClient, alice: AuthedClient, settings: Settings) -> None:
    """Threat: the broker is out of reach just after the job was stored (a
    primary switch); a 503 would send the client to submit again and get 409
    for its own job. The job is queued; the scheduler's periodic pass places it."""
    platform: Platform = flask_client.application.extensions["pai"]
    dead = dataclasses.replace(settings, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    platform.messenger = Messenger(make_celery(dead))  # a broker nobody listens for
    resp = alice.post("/api/v1/user/alice/jobs", json=config("nudge-lost"))
    assert resp.status_code == 202, resp.get_data(as_text=True)
    assert platform.store.get_job("alice~nudge-lost") is not None
    assert "alice~nudge-lost" in platform.store.queued_job_ids()


def test_a_primary_without_replicas_in_step_is_a_503(
        flask_client: FlaskClient, alice: AuthedClient, redis_server: str) -> None:
    """Threat: the primary refuses writes no replica would hold
    (min-replicas-to-write); the refusal means "come back", not a server bug."""
    with redis.Redis.from_url(operator_url(redis_server)) as operator:
        operator.config_set("min-replicas-to-write", 1)
        try:
            resp = alice.post("/api/v1/user/alice/jobs", json=config("refused"))
        finally:
            operator.config_set("min-replicas-to-write", 0)
    assert error_of(resp, 503) == "ServiceUnavailableError"
    assert alice.post("/api/v1/user/alice/jobs", json=config("refused")).status_code == 202


def _job_for(username: str, cfg: dict[str, object]) -> tuple[Job, Attempt]:
    spec = JobSpec.from_config(cfg)
    created = now_ms()
    job = Job(id=job_id_of(username, spec.name), username=username, name=spec.name,
              virtual_cluster=spec.virtual_cluster, created_ms=created, version=1)
    return job, Attempt(index=0, created_ms=created)


def test_a_submit_replayed_after_its_lost_reply_gets_its_own_job(
        redis_client: redis.Redis) -> None:
    """Threat: EXEC committed on the primary but its reply was lost in the
    switch, so the transaction runs again; it must find its own job, not
    answer 409 to the caller who just created it."""
    store = Store(redis_client)
    cfg = config("replayed")
    job, attempt = _job_for("alice", cfg)
    spec = JobSpec.from_config(cfg)
    first = store.create_job(dataclasses.replace(job), cfg, initial_tasks(spec), attempt)
    again = store.create_job(dataclasses.replace(job), cfg, initial_tasks(spec), attempt)
    assert again.id == first.id and again.queue_seq == first.queue_seq


@pytest.mark.parametrize("change", ["another config", "another submit time"])
def test_another_submit_of_the_same_name_is_still_a_conflict(
        redis_client: redis.Redis, change: str) -> None:
    store = Store(redis_client)
    cfg = config("taken")
    job, attempt = _job_for("alice", cfg)
    spec = JobSpec.from_config(cfg)
    store.create_job(dataclasses.replace(job), cfg, initial_tasks(spec), attempt)
    other_cfg = config("taken", jobEnvs={"X": "1"}) if change == "another config" else cfg
    other = dataclasses.replace(job, created_ms=job.created_ms +
                                (1 if change == "another submit time" else 0))
    with pytest.raises(JobConflict):
        store.create_job(other, other_cfg, initial_tasks(spec), attempt)
