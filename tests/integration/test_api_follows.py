"""Log follows through the API: framing of what a job prints, the per-user cap,
and the Last-Event-ID a client sends back.

Real Redis, Flask's test client; log lines are appended the way the monitor
ships them (services.monitor.logs.append_log_entries).
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from pai_cli.sse import Event, parse_events
from services.api.app import create_app
from services.api.follows import (
    LEASE_SECONDS,
    FollowLeases,
    FollowRefused,
    Follows,
    _ProcessSlots,
)
from services.monitor.logs import append_log_entries
from shared.infra.config import Settings
from shared.node.containers import TaskRef
from shared.state.store import Store
from tests.support.api import AuthedClient, config, error_of, new_user, signed_in

pytestmark = pytest.mark.redis

CAP = 2


@pytest.fixture
def client(redis_server: str, redis_client: redis.Redis, tmp_path: Path) -> FlaskClient:
    settings = Settings(redis_url=redis_server, storage_roots=(str(tmp_path),),
                        admin_user="root", admin_password="root-password",
                        api_follows_per_user=CAP)
    return create_app(settings).test_client()


@pytest.fixture
def alice(client: FlaskClient) -> AuthedClient:
    alice = new_user(client, signed_in(client, "root"), "alice")
    assert alice.post("/api/v1/user/alice/jobs", json=config("loud")).status_code == 202
    return alice


@pytest.fixture
def bob(client: FlaskClient) -> AuthedClient:
    bob = new_user(client, signed_in(client, "root"), "bob")
    assert bob.post("/api/v1/user/bob/jobs", json=config("quiet")).status_code == 202
    return bob


def log_of(user: str, job: str) -> str:
    return f"/api/v1/user/{user}/jobs/{job}/tasks/main/0/log"


def events_of(body: str) -> list[Event]:
    """Events as a standard client sees them: lines end at CRLF, CR or LF."""
    return list(parse_events(re.split(r"\r\n|\r|\n", body)))


def test_a_line_with_a_bare_cr_is_one_event_with_that_text(
        alice: AuthedClient, redis_client: redis.Redis) -> None:
    """Threat: a job prints `hello\\rdata: forged\\r\\revent: x` to inject a
    server-sent event (a forged line or a forged end) into its follower's view."""
    append_log_entries(redis_client, TaskRef("alice~loud", 0, "main", 0),
                       ["hello\rdata: forged\r\revent: x"], 100)
    assert alice.put("/api/v1/user/alice/jobs/loud/executionType",
                     json={"value": "STOP"}).status_code == 202  # settled: the follow ends

    resp = alice.get(log_of("alice", "loud"), query_string={"follow": "1"})

    assert resp.status_code == 200
    assert events_of(resp.get_data(as_text=True)) == [
        Event("message", "hello\ndata: forged\n\nevent: x"), Event("end", "")]


@pytest.mark.parametrize("last_event_id", [
    pytest.param("99999999999999999999-0", id="past 64 bits"),
    pytest.param("1" * 8000 + "-0", id="huge"),
    pytest.param("1-0 ; DROP", id="malformed"),
    pytest.param("\u0661-\u0660", id="non-ascii digits"),
])
def test_a_last_event_id_redis_would_refuse_is_a_400(alice: AuthedClient,
                                                     last_event_id: str) -> None:
    """Threat: a huge or malformed Last-Event-ID reaches Redis and fails the
    follow with a 500 (or after its 200)."""
    resp = alice.get(log_of("alice", "loud"), query_string={"follow": "1"},
                     headers={"Last-Event-ID": last_event_id})

    assert error_of(resp, 400) == "BadRequestError"


def settle(user: AuthedClient, username: str, job: str, redis_client: redis.Redis) -> None:
    """A line in the job's log, then stop it: a follow of it ends after that line."""
    append_log_entries(redis_client, TaskRef(f"{username}~{job}", 0, "main", 0),
                       ["a line"], 100)
    assert user.put(f"/api/v1/user/{username}/jobs/{job}/executionType",
                    json={"value": "STOP"}).status_code == 202


def test_follows_beyond_the_cap_get_429_with_retry_after(
        client: FlaskClient, alice: AuthedClient, bob: AuthedClient,
        redis_client: redis.Redis) -> None:
    """Threat: one user opens follow after follow (through any number of API
    processes) until the API has no connection left for anyone."""
    settle(alice, "alice", "loud", redis_client)
    settle(bob, "bob", "quiet", redis_client)
    elsewhere = FollowLeases(Store(redis_client), per_user=CAP)  # another API process
    held = [elsewhere.acquire("alice") for _ in range(CAP)]
    assert None not in held

    refused = alice.get(log_of("alice", "loud"), query_string={"follow": "1"})
    assert error_of(refused, 429) == "TooManyRequestsError"
    assert int(refused.headers["Retry-After"]) > 0
    other = bob.get(log_of("bob", "quiet"), query_string={"follow": "1"})
    assert other.status_code == 200  # the cap is per user
    assert redis_client.zcard("pai:follows:bob") == 1
    other.close()  # as the server does when the stream ends or the client is gone
    assert redis_client.zcard("pai:follows:bob") == 0

    elsewhere.release("alice", str(held.pop()))
    again = alice.get(log_of("alice", "loud"), query_string={"follow": "1"})
    assert again.status_code == 200
    assert [e.data for e in events_of(again.get_data(as_text=True))] == ["a line", ""]
    again.close()
    assert redis_client.zcard("pai:follows:alice") == 1  # only the one held elsewhere


def test_a_follow_gives_its_lease_back_before_its_end_event(
        alice: AuthedClient, redis_client: redis.Redis) -> None:
    """A client that saw its follow end may follow the next log at once, even
    at its cap: the lease is back before the end event is sent."""
    settle(alice, "alice", "loud", redis_client)
    resp = alice.get(log_of("alice", "loud"), query_string={"follow": "1"})
    held_at_end = [redis_client.zcard("pai:follows:alice")
                   for chunk in resp.response if b"event: end" in chunk]
    resp.close()
    assert held_at_end == [0]


def test_a_process_serves_follows_on_at_most_its_share_of_connections(
        redis_client: redis.Redis) -> None:
    """Threat: many users' follows fill a process's connections, leaving none
    for ordinary requests."""
    follows = Follows(FollowLeases(Store(redis_client), per_user=10), _ProcessSlots(limit=2))
    first, second = follows.open("alice"), follows.open("bob")

    with pytest.raises(FollowRefused) as refused:
        follows.open("carol")
    assert refused.value.status == 503

    follows.close("alice", first)
    follows.close("bob", follows.open("carol"))
    follows.close("bob", second)
    assert follows.slots.used == 0


def test_a_lease_whose_process_died_stops_counting_when_it_expires(
        redis_client: redis.Redis) -> None:
    """Threat: follows of a killed API process keep the user at the cap forever."""
    # Times an hour ahead: the leases' key expires at real times, not test ones.
    leases, start = FollowLeases(Store(redis_client), per_user=1), time.time() + 3600
    dead = leases.acquire("alice", now=start)
    assert dead is not None
    assert leases.acquire("alice", now=start + LEASE_SECONDS - 1) is None

    later = start + LEASE_SECONDS + 1
    assert leases.renew("alice", dead, now=later) is False
    fresh = leases.acquire("alice", now=later)
    assert fresh is not None and fresh != dead
    assert leases.renew("alice", fresh, now=later + 1) is True
    assert redis_client.zcard("pai:follows:alice") == 1  # the dead lease is gone


def test_a_renewed_lease_outlives_its_first_expiry(redis_client: redis.Redis) -> None:
    leases, start = FollowLeases(Store(redis_client), per_user=1), time.time() + 3600
    lease = leases.acquire("alice", now=start)
    assert lease is not None
    assert leases.renew("alice", lease, now=start + LEASE_SECONDS / 2)

    assert leases.acquire("alice", now=start + LEASE_SECONDS + 1) is None


def test_follows_starting_at_once_never_exceed_the_cap(redis_server: str,
                                                       redis_client: redis.Redis) -> None:
    """Threat: a user opens many follows at the same instant, through several
    API processes, so that each sees room under the cap before any lease lands."""
    cap, tries = 5, 40
    start = threading.Barrier(tries)
    got: list[str | None] = []
    lock = threading.Lock()

    def open_one() -> None:
        leases = FollowLeases(Store(redis.Redis.from_url(redis_server, decode_responses=True)),
                              cap)  # a connection of its own, as another API process has
        start.wait(timeout=30)
        lease = leases.acquire("alice")
        with lock:
            got.append(lease)

    threads = [threading.Thread(target=open_one) for _ in range(tries)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(got) == tries
    assert sum(lease is not None for lease in got) == cap
    assert redis_client.zcard("pai:follows:alice") == cap
