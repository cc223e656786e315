"""The platform's kombu channel: one redis-py client per pool, reused; and
the messages its senders make.

kombu made a new client (its table of some 170 reply callbacks set up anew)
for every publish, ack and restore; the platform's channel makes one per
connection pool and keeps it until kombu replaces the pool.
"""

from __future__ import annotations

import base64
import json

import pytest
import redis
from kombu import Connection

from shared.infra import links
from shared.infra.config import Settings
from shared.infra.messaging import (
    ATTEMPT_ENDED,
    SCHEDULER_QUEUE,
    STOP_JOB,
    TRANSPORT,
    Messenger,
    broker_queue_key,
    broker_settings,
    make_celery,
)
from shared.state.store import Store

pytestmark = pytest.mark.redis


def test_the_brokers_redis_connections_time_out_and_keep_alive(redis_server: str) -> None:
    """kombu hands the link options to every redis-py connection it makes: a
    call on a black-holed link fails within the timeout, an idle connection
    to a vanished peer is found by keepalive (shared/infra/links.py)."""
    url, options = broker_settings(redis_server)
    with Connection(url, transport=TRANSPORT, transport_options=options) as connection:
        kwargs = connection.default_channel.client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == links.SOCKET_TIMEOUT_SECONDS
        assert kwargs["socket_connect_timeout"] == links.CONNECT_TIMEOUT_SECONDS
        assert kwargs["socket_keepalive"] is True
        assert kwargs["socket_keepalive_options"] == links.keepalive_options()
        assert kwargs["health_check_interval"] == links.HEALTH_CHECK_SECONDS


def test_the_stores_redis_connections_time_out_and_keep_alive(redis_server: str) -> None:
    kwargs = Store.from_url(redis_server).r.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == links.SOCKET_TIMEOUT_SECONDS
    assert kwargs["socket_keepalive"] is True
    assert kwargs["socket_keepalive_options"] == links.keepalive_options()


def test_a_channel_reuses_one_client_per_pool(redis_server: str) -> None:
    with Connection(redis_server, transport=TRANSPORT) as connection:
        channel = connection.default_channel
        client = channel._create_client()
        assert channel._create_client() is client
        with channel.conn_or_acquire() as acquired:
            assert acquired is client
        reader = channel._create_client(asynchronous=True)
        assert reader is not client and reader.connection_pool is channel.async_pool
        assert channel._create_client(asynchronous=True) is reader

        channel._pool = None  # what kombu does after a reconnect: a new pool, a new client
        fresh = channel._create_client()
        assert fresh is not client and fresh.connection_pool is channel.pool


def test_messages_go_and_come_back_through_the_reused_clients(redis_server: str) -> None:
    with Connection(redis_server, transport=TRANSPORT) as connection:
        queue = connection.SimpleQueue("pai-test-broker-clients")
        try:
            for n in range(3):
                queue.put({"n": n})
            got = []
            for _ in range(3):
                message = queue.get(timeout=10)
                got.append(message.payload["n"])
                message.ack()
            assert got == [0, 1, 2]
        finally:
            queue.close()


def test_a_sent_message_names_its_arguments_without_celerys_saferepr(
        redis_server: str, redis_client: redis.Redis) -> None:
    """The senders give the message's argsrepr and kwargsrepr themselves (what
    `celery inspect` and the worker's logs show); the message is otherwise
    the one `send_task` makes, and its arguments arrive as sent."""
    messenger = Messenger(make_celery(Settings(redis_url=redis_server)))
    queue = broker_queue_key(SCHEDULER_QUEUE)
    redis_client.delete(queue)

    messenger.attempt_ended("alice~job-1", 3)
    messenger.stop_job("bob~job-2")

    sent = [json.loads(raw) for raw in reversed(redis_client.lrange(queue, 0, -1))]
    assert [m["headers"]["task"] for m in sent] == [ATTEMPT_ENDED, STOP_JOB]
    assert [(m["headers"]["argsrepr"], m["headers"]["kwargsrepr"]) for m in sent] == [
        ("['alice~job-1', 3]", "{}"), ("['bob~job-2']", "{}")]
    bodies = [json.loads(base64.b64decode(m["body"])) for m in sent]
    assert [body[:2] for body in bodies] == [[["alice~job-1", 3], {}], [["bob~job-2"], {}]]
