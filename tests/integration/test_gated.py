"""A batch of writes held to expectations and a lease, in one script
(shared/state/gated.py): it writes what a pipeline would, byte for byte,
or nothing at all."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.infra.clock import now_ms
from shared.state import gated
from shared.state.followleases import Lease
from shared.state.store import Expect, ExpectationFailed, Store
from tests.support.roundtrips import counting_client
from tests.support.texts import AWKWARD_TEXTS

pytestmark = pytest.mark.redis

LEASES = "pai:test:leases"
_BATCHES = itertools.count()


def lease(cap: int = 2, now: int | None = None) -> Lease:
    """A new lease of a minute, asked for at `now` (by default now)."""
    now = now_ms() if now is None else now
    return Lease(LEASES, f"lease-{next(_BATCHES)}", now, now + 60_000, cap)


def queue_writes(pipe: Any, prefix: str, text: str) -> None:
    """One of each kind of write an exec's record makes (shared/state/execs.py,
    nodecalls.py, the job's events, telemetry), and a few more."""
    pipe.hset(f"{prefix}:hash", mapping={"text": text, "number": 7, "ratio": 0.25})
    pipe.expire(f"{prefix}:hash", 3600)
    pipe.xadd(f"{prefix}:stream", {"kind": "exec", "text": text}, maxlen=1000,
              approximate=True)
    pipe.hincrby(f"{prefix}:counters", text or "empty", 2)
    pipe.hincrbyfloat(f"{prefix}:counters", "seconds", 1.5)
    pipe.zadd(f"{prefix}:sorted", {text: 3})
    pipe.set(f"{prefix}:string", text)


KINDS = ("hash", "stream", "counters", "sorted", "string")  # of `queue_writes`' keys


def written(r: redis.Redis, prefix: str) -> dict[str, Any]:
    """Everything `queue_writes` left under `prefix`, as raw bytes (streams'
    entries without their ids)."""
    return {
        "hash": r.hgetall(f"{prefix}:hash"),
        "ttl": r.ttl(f"{prefix}:hash") > 3500,
        "stream": [fields for _, fields in r.xrange(f"{prefix}:stream")],
        "counters": r.hgetall(f"{prefix}:counters"),
        "sorted": r.zrange(f"{prefix}:sorted", 0, -1, withscores=True),
        "string": r.get(f"{prefix}:string"),
    }


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.sampled_from(AWKWARD_TEXTS) | st.text(st.characters(blacklist_categories=("Cs",))))
def test_a_batch_writes_what_a_pipeline_writes(redis_client: redis.Redis, redis_server: str,
                                               text: str) -> None:
    batch = next(_BATCHES)
    pipe = redis_client.pipeline(transaction=True)
    queue_writes(pipe, f"pai:test:piped:{batch}", text)
    pipe.execute()
    assert gated.write(Store(redis_client), lease(cap=10_000),
                       lambda writes: queue_writes(writes, f"pai:test:gated:{batch}", text))
    with redis.Redis.from_url(redis_server) as raw:
        assert written(raw, f"pai:test:gated:{batch}") == written(raw, f"pai:test:piped:{batch}")


def test_the_lease_the_expectations_and_the_writes_are_one_round_trip(
        redis_client: redis.Redis, redis_server: str) -> None:
    redis_client.hset("pai:test:user", "uid", "u1")
    client, counter = counting_client(redis_server)
    with client:
        store = Store(client)
        store.r.ping()  # the connection made
        sent = counter.sent
        assert gated.write(store, lease(), lambda writes: queue_writes(writes, "pai:test:one", "x"),
                           [Expect.field_equals("pai:test:user", "uid", "u1"),
                            Expect.key_absent("pai:test:revoked")])
        assert counter.sent == sent + 1
    assert redis_client.get("pai:test:one:string") == "x"


def test_the_lease_is_taken_with_its_expiry(redis_client: redis.Redis) -> None:
    taken = lease()
    assert gated.write(Store(redis_client), taken, lambda writes: writes.set("pai:test:k", "v"))
    assert redis_client.zscore(LEASES, taken.lease) == taken.expiry_ms
    assert redis_client.pexpiretime(LEASES) >= taken.expiry_ms


@pytest.mark.parametrize("expect", [
    Expect.field_equals("pai:test:user", "uid", "someone else"),
    Expect.key_absent("pai:test:revoked"),
    Expect.number_below("pai:test:epoch", 5),
], ids=["a field changed", "a key that must be absent exists", "a number not below"])
def test_an_expectation_that_fails_writes_nothing_and_takes_no_lease(
        redis_client: redis.Redis, expect: Expect) -> None:
    redis_client.hset("pai:test:user", "uid", "u1")
    redis_client.set("pai:test:revoked", "1")
    redis_client.set("pai:test:epoch", "5")
    holding = [Expect.field_equals("pai:test:user", "uid", "u1"),
               Expect.number_below("pai:test:epoch", 6)]
    with pytest.raises(ExpectationFailed):
        gated.write(Store(redis_client), lease(),
                    lambda writes: queue_writes(writes, "pai:test:failed", "x"),
                    [*holding, expect])
    assert not any(redis_client.exists(f"pai:test:failed:{kind}") for kind in KINDS)
    assert redis_client.zcard(LEASES) == 0


def test_past_the_cap_nothing_is_written(redis_client: redis.Redis) -> None:
    store, now = Store(redis_client), now_ms()
    for _ in range(2):
        assert gated.write(store, lease(cap=2, now=now), lambda writes: None)
    assert not gated.write(store, lease(cap=2, now=now),
                           lambda writes: queue_writes(writes, "pai:test:capped", "x"))
    assert not any(redis_client.exists(f"pai:test:capped:{kind}") for kind in KINDS)
    assert redis_client.zcard(LEASES) == 2
    # expired leases no longer count
    later = lease(cap=2, now=now + 60_001)
    assert gated.write(store, later, lambda writes: writes.set("pai:test:later", "1"))
    assert redis_client.zrange(LEASES, 0, -1) == [later.lease]


@pytest.mark.parametrize("queue", [
    lambda writes: writes.delete("pai:test:a", "pai:test:b"),
    lambda writes: writes.rename("pai:test:a", "pai:test:b"),
    lambda writes: writes.eval("return 1", 0),
    lambda writes: writes.hset("pai:test:h", mapping={str(i): i for i in range(3_000)}),
], ids=["two keys", "a second key", "a script", "too many arguments"])
def test_a_write_the_script_cannot_hold_is_refused_before_anything_is_sent(
        redis_client: redis.Redis, queue: Any) -> None:
    with pytest.raises(ValueError):
        gated.write(Store(redis_client), lease(), queue)
    assert redis_client.zcard(LEASES) == 0
