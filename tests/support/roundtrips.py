"""Counting a client's round trips to Redis.

`RoundTrips` wraps a client: each command sent on its own counts one, and
each pipeline executed one (its queued commands go together). A WATCH
transaction's commands go through its pipeline one by one, out of the
wrapper's sight: `counting_client` counts at the connection instead, every
write to the socket (a command, a pipeline, a MULTI/EXEC block) one.
"""

from __future__ import annotations

from typing import Any

import redis


class RoundTrips:
    """A client counting its round trips: each command sent on its own, and
    each pipeline executed (its queued commands go together)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self.count = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name == "pipeline":
            def pipeline(*args: Any, **kwargs: Any) -> Any:
                pipe = attr(*args, **kwargs)
                execute = pipe.execute

                def counted(*a: Any, **kw: Any) -> Any:
                    self.count += 1
                    return execute(*a, **kw)

                pipe.execute = counted
                return pipe
            return pipeline
        if not callable(attr):
            return attr

        def command(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return attr(*args, **kwargs)

        return command


class _CountingConnection(redis.Connection):
    sent = 0  # set per client by `counting_client`'s subclass

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sent += 1
        super().send_packed_command(command, check_health)


def counting_client(url: str) -> tuple[redis.Redis, type[_CountingConnection]]:
    """A client (str responses) on `url`, and the class whose `sent` counts
    the round trips of its connections."""
    counter = type("Counting", (_CountingConnection,), {"sent": 0})
    pool = redis.ConnectionPool.from_url(url, decode_responses=True,
                                         connection_class=counter)
    return redis.Redis(connection_pool=pool), counter
