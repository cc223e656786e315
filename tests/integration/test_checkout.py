"""A pooled connection's check-out check (shared/infra/checkout.py) on a real
Redis: the same answer as redis-py's for a clean, a dirty and a closed
connection, and under gevent no turn of the event loop for a clean one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import redis

from shared.infra.checkout import quick_checkout
from tests.conftest import REPO_ROOT
from tests.support.redis_server import operator_url

pytestmark = [pytest.mark.redis]


@pytest.fixture
def pools(redis_server: str) -> Iterator[tuple[redis.ConnectionPool, redis.ConnectionPool]]:
    """redis-py's pool, and one with the quick check, on the same server."""
    plain = redis.ConnectionPool.from_url(redis_server, decode_responses=True)
    quick = redis.ConnectionPool.from_url(redis_server, decode_responses=True)
    quick_checkout(quick)
    try:
        yield plain, quick
    finally:
        plain.disconnect()
        quick.disconnect()


def connected(pool: redis.ConnectionPool) -> redis.connection.AbstractConnection:
    connection = pool.make_connection()
    connection.connect()
    return connection


def test_a_clean_connection_has_nothing_to_read(pools: tuple[redis.ConnectionPool, ...]) -> None:
    for pool in pools:
        connection = connected(pool)
        connection.send_command("PING")
        assert connection.read_response() == "PONG"
        assert connection.can_read() is False


def test_a_reply_left_unread_is_seen(pools: tuple[redis.ConnectionPool, ...]) -> None:
    for pool in pools:
        connection = connected(pool)
        connection.send_command("PING")  # its reply never read
        assert connection.can_read(timeout=1) is True  # once it arrived: both wait alike
        assert connection.can_read() is True


def test_a_reply_buffered_in_the_parser_is_seen(pools: tuple[redis.ConnectionPool, ...]) -> None:
    """Two replies in one read: the second waits in the parser, not the socket."""
    for pool in pools:
        connection = connected(pool)
        connection.send_packed_command(connection.pack_commands([("PING",), ("PING",)]))
        assert connection.read_response() == "PONG"
        assert connection.can_read() is True


def test_a_connection_the_server_closed_is_never_clean(
        pools: tuple[redis.ConnectionPool, ...], redis_server: str) -> None:
    with redis.Redis.from_url(operator_url(redis_server)) as operator:
        for pool in pools:
            connection = connected(pool)
            connection.send_command("CLIENT", "ID")
            client_id = connection.read_response()
            operator.client_kill_filter(_id=client_id)
            with pytest.raises(redis.ConnectionError):
                connection.can_read(timeout=1)


# Under gevent's monkey-patching, how many times the current greenlet
# switches away while a pool checks out a clean connection.
UNDER_GEVENT = textwrap.dedent("""
    from gevent import monkey; monkey.patch_all()
    import sys, greenlet, redis
    from shared.infra.checkout import quick_checkout
    pool = redis.ConnectionPool.from_url(sys.argv[1])
    if sys.argv[2] == "quick":
        quick_checkout(pool)
    redis.Redis(connection_pool=pool).ping()  # one connection, clean, in the pool
    switches = []
    greenlet.settrace(lambda event, args: switches.append(event))
    for _ in range(10):
        pool.release(pool.get_connection())
    greenlet.settrace(None)
    print(len(switches))
""")


def switches_under_gevent(redis_server: str, kind: str) -> int:
    done = subprocess.run([sys.executable, "-c", UNDER_GEVENT, redis_server, kind],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_under_gevent_a_clean_check_out_does_not_turn_the_event_loop(
        redis_server: str) -> None:
    assert switches_under_gevent(redis_server, "plain") >= 10  # redis-py's: a turn each
    assert switches_under_gevent(redis_server, "quick") == 0
