"""The Celery app, its routing, and every message the services send.

Messages carry ids only; each handler re-reads state from Redis. Task names
are `pai.<service>.<verb>`; the scheduler listens on queue `scheduler`, each
node's launcher on `launcher.<node>`.
"""

from __future__ import annotations

from celery import Celery

from shared.config import Settings

SCHEDULER_QUEUE = "scheduler"

SCHEDULE = "pai.scheduler.schedule"
TASK_ENDED = "pai.scheduler.task_ended"
ATTEMPT_ENDED = "pai.scheduler.attempt_ended"
STOP_JOB = "pai.scheduler.stop_job"
RECONCILE = "pai.scheduler.reconcile"
START_TASK = "pai.launcher.start_task"
STOP_TASK = "pai.launcher.stop_task"
PREEMPT_TASK = "pai.launcher.preempt_task"


def launcher_queue(node: str) -> str:
    return f"launcher.{node}"


def make_celery(settings: Settings, name: str = "pai") -> Celery:
    app = Celery(name, broker=settings.redis_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=SCHEDULER_QUEUE,
        task_routes={"pai.scheduler.*": {"queue": SCHEDULER_QUEUE}},
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        # An unacknowledged message (its worker was killed) comes back after
        # this long; the periodic reconcile repairs sooner than that.
        broker_transport_options={"visibility_timeout": 300},
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        broker_pool_limit=16,
    )
    return app


class Messenger:
    """Typed senders, so no service spells a task name or queue by hand."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def schedule(self) -> None:
        self.app.send_task(SCHEDULE, queue=SCHEDULER_QUEUE)

    def task_ended(self, job_id: str, attempt: int, role: str, index: int) -> None:
        self.app.send_task(TASK_ENDED, args=[job_id, attempt, role, index],
                           queue=SCHEDULER_QUEUE)

    def attempt_ended(self, job_id: str, attempt: int) -> None:
        self.app.send_task(ATTEMPT_ENDED, args=[job_id, attempt], queue=SCHEDULER_QUEUE)

    def stop_job(self, job_id: str) -> None:
        self.app.send_task(STOP_JOB, args=[job_id], queue=SCHEDULER_QUEUE)

    def start_task(self, node: str, job_id: str, attempt: int, role: str, index: int) -> None:
        self.app.send_task(START_TASK, args=[job_id, attempt, role, index],
                           queue=launcher_queue(node))

    def stop_task(self, node: str, job_id: str, attempt: int, role: str, index: int) -> None:
        self.app.send_task(STOP_TASK, args=[job_id, attempt, role, index],
                           queue=launcher_queue(node))

    def preempt_task(self, node: str, job_id: str, attempt: int, role: str, index: int) -> None:
        self.app.send_task(PREEMPT_TASK, args=[job_id, attempt, role, index],
                           queue=launcher_queue(node))
