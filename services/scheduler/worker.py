"""The scheduler's Celery tasks: thin wrappers that parse ids and call Scheduler.

Each message's pass request is deferrable: while more scheduler messages wait
behind it, it only marks the work, and the pass runs after the last of them
(`Scheduler.message`), so a burst of exits costs one pass.
"""

from __future__ import annotations

from celery import Celery

from services.scheduler.service import Scheduler
from shared.infra import messaging
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state.store import Store


def create_scheduler_app(settings: Settings) -> tuple[Celery, Scheduler]:
    app = make_celery(settings, "pai-scheduler")
    scheduler = Scheduler(settings, Store.from_url(settings.redis_url), Messenger(app))

    # Sent by services of an earlier version; today's ring the doorbell
    # (shared/state/passwake.py), which the wake thread answers (run.py).
    @app.task(name=messaging.SCHEDULE, shared=False)
    def schedule() -> None:
        with scheduler.message():
            scheduler.request_pass(deferrable=True)

    @app.task(name=messaging.TASK_ENDED, shared=False)
    def task_ended(job_id: str, attempt: int, role: str, index: int) -> None:
        with scheduler.message():
            scheduler.task_ended(job_id, int(attempt), role, int(index), deferrable=True)

    @app.task(name=messaging.TASK_RELAUNCHED, shared=False)
    def task_relaunched(job_id: str, attempt: int, role: str, index: int) -> None:
        with scheduler.message():
            scheduler.send_relaunch(job_id, int(attempt), role, int(index))

    @app.task(name=messaging.ATTEMPT_ENDED, shared=False)
    def attempt_ended(job_id: str, attempt: int) -> None:
        with scheduler.message():
            scheduler.stop_attempt(job_id, int(attempt), deferrable=True)

    @app.task(name=messaging.STOP_JOB, shared=False)
    def stop_job(job_id: str) -> None:
        with scheduler.message():
            scheduler.stop_job(job_id, deferrable=True)

    @app.task(name=messaging.RECONCILE, shared=False)
    def reconcile() -> None:
        with scheduler.message():
            scheduler.reconcile()

    return app, scheduler
