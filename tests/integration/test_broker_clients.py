"""The platform's kombu channel: one redis-py client per pool, reused.

kombu made a new client (its table of some 170 reply callbacks set up anew)
for every publish, ack and restore; the platform's channel makes one per
connection pool and keeps it until kombu replaces the pool.
"""

from __future__ import annotations

import pytest
from kombu import Connection

from shared.messaging import TRANSPORT

pytestmark = pytest.mark.redis


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
