"""A job's proxy secret (shared/state/proxytokens.py) on a real Redis: made
once, the same for every task that asks, in one round trip each."""

from __future__ import annotations

import threading

import pytest

from shared.state import keys, proxytokens
from tests.support.roundtrips import counting_client

pytestmark = pytest.mark.redis


def test_the_first_start_makes_the_secret_and_every_later_one_reads_it(
        redis_server: str) -> None:
    client, counter = counting_client(redis_server)
    client.ping()  # the connection's own setup (AUTH, its name) is not counted
    counter.sent = 0
    first = proxytokens.ensure_token(client, "alice~nb")
    assert counter.sent == 1
    assert len(first) >= proxytokens.TOKEN_BYTES
    assert proxytokens.ensure_token(client, "alice~nb") == first
    assert counter.sent == 2
    assert proxytokens.read_token(client, "alice~nb") == first
    assert client.get(keys.job_proxy_token("alice~nb")) == first
    client.close()


def test_tasks_starting_at_once_all_get_the_one_secret(redis_server: str) -> None:
    client, _ = counting_client(redis_server)
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(
        proxytokens.ensure_token(client, "alice~gang"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(got) == 8 and set(got) == {proxytokens.read_token(client, "alice~gang")}
    client.close()
