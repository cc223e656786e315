"""The Celery broker the platform's Redis setting gives (shared/infra/messaging.py)."""

from __future__ import annotations

from kombu import Connection

from shared.infra import links
from shared.infra.config import Settings
from shared.infra.messaging import (
    SENTINEL_TRANSPORT,
    TRANSPORT,
    VISIBILITY_TIMEOUT_SECONDS,
    SentinelTransport,
    broker_settings,
    make_celery,
    publish_retry_policy,
)

SENTINEL_URL = "redis+sentinel://pai:p%40ss@s1:26379,s2:26380/pai/2"


def test_a_single_redis_is_its_own_broker() -> None:
    url, options = broker_settings("redis://pai:pw@r:6379/0")
    assert url == "redis://pai:pw@r:6379/0"
    assert options == {"visibility_timeout": VISIBILITY_TIMEOUT_SECONDS,
                       **links.kombu_options()}


def test_a_sentinel_setting_becomes_kombus_sentinel_urls_and_options() -> None:
    url, options = broker_settings(SENTINEL_URL)
    assert url == "sentinel://pai:p%40ss@s1:26379/2;sentinel://pai:p%40ss@s2:26380/2"
    assert options["master_name"] == "pai"
    assert options["visibility_timeout"] == VISIBILITY_TIMEOUT_SECONDS
    assert options["sentinel_kwargs"]["username"] == "pai"
    assert options["sentinel_kwargs"]["password"] == "p@ss"


def test_kombu_reads_back_the_login_database_and_every_sentinel() -> None:
    url, options = broker_settings(SENTINEL_URL)
    connection = Connection(url, transport=SENTINEL_TRANSPORT, transport_options=options)
    assert type(connection.transport) is SentinelTransport
    assert (connection.userid, connection.password) == ("pai", "p@ss")
    assert connection.virtual_host == "2"
    assert [a.split("@")[1] for a in connection.alt] == ["s1:26379/2", "s2:26380/2"]


def test_the_celery_app_takes_the_sentinel_transport_only_behind_sentinel() -> None:
    single = make_celery(Settings(redis_url="redis://r:6379/0"))
    assert single.conf.broker_transport == TRANSPORT
    assert single.conf.task_publish_retry_policy == publish_retry_policy("redis://r:6379/0")
    sentinel = make_celery(Settings(redis_url=SENTINEL_URL))
    assert sentinel.conf.broker_transport == SENTINEL_TRANSPORT
    assert sentinel.conf.broker_transport_options["master_name"] == "pai"
    policy = sentinel.conf.task_publish_retry_policy
    assert policy["max_retries"] * policy["interval_max"] >= 10, "sends outlast a switch"

