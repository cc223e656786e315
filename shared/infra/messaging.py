"""The Celery app, its routing, and every message the services send.

Messages carry ids only; each handler re-reads state from Redis. Task names
are `pai.<service>.<verb>`; the scheduler listens on queue `scheduler`, each
node's launcher on `launcher.<node>`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import redis
from celery import Celery
from kombu.transport import redis as kombu_redis

from shared.infra import links
from shared.infra.config import Settings
from shared.infra.failover import FAILOVER_WAIT_SECONDS, SENTINEL_TIMEOUT_SECONDS
from shared.infra.redisurl import SentinelTarget, parse_sentinel_url

SCHEDULER_QUEUE = "scheduler"

# A pass request: the services ring the doorbell instead (shared/state/passwake.py);
# the scheduler still takes the message from services of an earlier version.
SCHEDULE = "pai.scheduler.schedule"
TASK_ENDED = "pai.scheduler.task_ended"
ATTEMPT_ENDED = "pai.scheduler.attempt_ended"
# A task its role's taskRetryCount relaunched: the scheduler, the one sender
# of starts, sends its node the start.
TASK_RELAUNCHED = "pai.scheduler.task_relaunched"
STOP_JOB = "pai.scheduler.stop_job"
RECONCILE = "pai.scheduler.reconcile"
STOP_TASK = "pai.launcher.stop_task"
PREEMPT_TASK = "pai.launcher.preempt_task"


NO_KWARGS_REPR = "{}"  # every platform task takes its arguments by position


def launcher_queue(node: str) -> str:
    return f"launcher.{node}"


def broker_queue_key(queue: str) -> str:
    """The Redis list in which kombu's Redis transport keeps the messages of
    `queue` not yet taken by a worker (the default priority's; pai sends
    none other): its length is how many wait."""
    return queue


# An unacknowledged message (its worker was killed) comes back after this
# long; the periodic reconcile repairs sooner than that.
VISIBILITY_TIMEOUT_SECONDS = 300


def broker_settings(redis_url: str) -> tuple[str, dict[str, Any]]:
    """The broker URL and transport options for the platform's Redis setting.

    A single Redis is its own broker URL. A `redis+sentinel://` setting
    becomes kombu's form: one `sentinel://` URL per sentinel joined by `;`,
    each with the login (kombu takes it for the primary from the first) and
    the database, and the primary's name and the sentinels' login as
    transport options, so the workers follow the same primary as the store.
    """
    options: dict[str, Any] = {"visibility_timeout": VISIBILITY_TIMEOUT_SECONDS,
                               **links.kombu_options()}
    target = parse_sentinel_url(redis_url)
    if target is None:
        return redis_url, options
    options["master_name"] = target.master
    options["sentinel_kwargs"] = {
        "username": target.username, "password": target.password,
        "socket_timeout": SENTINEL_TIMEOUT_SECONDS,
        "socket_connect_timeout": SENTINEL_TIMEOUT_SECONDS,
    }
    return ";".join(_kombu_sentinel_url(target, host, port)
                    for host, port in target.sentinels), options


def _kombu_sentinel_url(target: SentinelTarget, host: str, port: int) -> str:
    login = ""
    if target.password is not None:
        login = f"{quote(target.username or '', safe='')}:{quote(target.password, safe='')}@"
    elif target.username is not None:
        login = f"{quote(target.username, safe='')}@"
    address = f"[{host}]" if ":" in host else host
    return f"sentinel://{login}{address}:{port}/{target.db}"


class ReusedClients:
    """A kombu Redis channel that makes one redis-py client per connection
    pool and reuses it, where kombu makes a new one for every publish, ack
    and restore.

    A redis-py client holds no connection of its own (each command borrows
    one from the pool), so one client serves every thread; but making one
    builds its table of some 170 reply callbacks, which was a tenth of the
    scheduler's CPU per message (docs/performance-log.md). A new pool (kombu
    makes one after a reconnect) gets a new client.
    """

    _reused: tuple[Any, Any] | None = None
    _reused_async: tuple[Any, Any] | None = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        pool = self.async_pool if asynchronous else self.pool  # type: ignore[attr-defined]
        kept = self._reused_async if asynchronous else self._reused
        if kept is not None and kept[0] is pool:
            return kept[1]
        client = super()._create_client(asynchronous)  # type: ignore[misc]
        if asynchronous:
            self._reused_async = (pool, client)
        else:
            self._reused = (pool, client)
        return client


class Channel(ReusedClients, kombu_redis.Channel):
    pass


class Transport(kombu_redis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"


class SentinelChannel(ReusedClients, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel, but a channel whose connection is already
    closed raises a connection error when asked for a new pool.

    When the primary dies, Celery closes the broken connection and then the
    channel, which tries to put the worker's unacknowledged messages back
    through a pool made from that closed connection; kombu 5.7 fails there
    with an AttributeError, which Celery takes as unrecoverable and the
    worker exits. As a connection error it is ignored like the rest of the
    broken connection, the worker reconnects through the sentinels, and the
    messages come back after the visibility timeout (the scheduler's
    periodic pass resends an overdue launch sooner).
    """

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise redis.ConnectionError("the broker connection is closed")
        params: dict[str, Any] = super()._connparams(asynchronous)
        return params


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"


def publish_retry_policy(redis_url: str) -> dict[str, float]:
    """How long a send keeps trying: Celery's default (about a second) on a
    single Redis; through a primary switch behind Sentinel. A send repeated
    after a lost reply may arrive twice, which every handler allows."""
    if parse_sentinel_url(redis_url) is None:
        return {"max_retries": 3, "interval_start": 0, "interval_step": 0.2,
                "interval_max": 1.0}
    return {"max_retries": int(FAILOVER_WAIT_SECONDS), "interval_start": 0,
            "interval_step": 0.5, "interval_max": 1.0}


def make_celery(settings: Settings, name: str = "pai") -> Celery:
    broker_url, transport_options = broker_settings(settings.redis_url)
    app = Celery(name, broker=broker_url, set_as_current=False)
    app.conf.broker_transport = SENTINEL_TRANSPORT \
        if parse_sentinel_url(settings.redis_url) is not None else TRANSPORT
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
        broker_transport_options=transport_options,
        task_publish_retry_policy=publish_retry_policy(settings.redis_url),
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

    def _send(self, name: str, args: list[Any], queue: str) -> None:
        """`send_task` with the message's argsrepr and kwargsrepr given: the
        arguments are ids and numbers, and Celery's own `saferepr` of them
        (pure Python, to be safe for any object) was a twentieth of the
        monitor's CPU on a short job."""
        self.app.send_task(name, args=args, queue=queue, argsrepr=repr(args),
                           kwargsrepr=NO_KWARGS_REPR)

    def task_ended(self, job_id: str, attempt: int, role: str, index: int) -> None:
        self._send(TASK_ENDED, [job_id, attempt, role, index], SCHEDULER_QUEUE)

    def attempt_ended(self, job_id: str, attempt: int) -> None:
        self._send(ATTEMPT_ENDED, [job_id, attempt], SCHEDULER_QUEUE)

    def task_relaunched(self, job_id: str, attempt: int, role: str, index: int) -> None:
        self._send(TASK_RELAUNCHED, [job_id, attempt, role, index], SCHEDULER_QUEUE)

    def stop_job(self, job_id: str) -> None:
        self._send(STOP_JOB, [job_id], SCHEDULER_QUEUE)

    def stop_task(self, node: str, job_id: str, attempt: int, role: str, index: int) -> None:
        self._send(STOP_TASK, [job_id, attempt, role, index], launcher_queue(node))

    def preempt_task(self, node: str, job_id: str, attempt: int, role: str, index: int) -> None:
        self._send(PREEMPT_TASK, [job_id, attempt, role, index], launcher_queue(node))
