"""How gunicorn serves the API, so that no client can hold its workers.

The worker is gevent's (docs/design.md, "Reliability and security": log follows and slow clients
do not hold request workers). Every connection is a greenlet, not a thread:
a log follow waiting on Redis (redis-py over gevent's patched sockets) or a
client that sends slowly costs memory, not one of a few threads. What is
bounded instead:

- connections per process (`worker_connections`, PAI_API_WORKER_CONNECTIONS);
  half of them at most serve log follows (services/api/follows.py), which
  are also capped per user across processes;
- the request line and headers must arrive within PAI_API_READ_TIMEOUT_SECONDS
  of the connection (or of the previous answer on a kept-alive one): the
  gevent worker reads them under `keepalive` seconds and closes the
  connection when they run out;
- the body must arrive within the same number of seconds after the headers
  (`BodyDeadline`), else 408; a view that takes uploads of any size (WebHDFS)
  gives each read those seconds instead (`allow_long_body`);
- gunicorn's own limits on the request line and header sizes and counts.

The stdlib must be patched before anything imports it, so `run.main` patches
first and imports this module after.
"""

from __future__ import annotations

import contextlib
import math
import re
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import gevent
from gunicorn.glogging import Logger
from werkzeug.exceptions import RequestTimeout

from shared.infra.config import Settings
from shared.infra.logs import logging_config

# A worker that does not check in for this long (a request stuck in pure
# computation) is restarted; follows and slow clients never block check-in.
WORKER_TIMEOUT_SECONDS = 60
StartResponse = Callable[..., Any]
Wsgi = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def gunicorn_options(settings: Settings) -> dict[str, Any]:
    """The gunicorn settings the API runs with."""
    return {
        "bind": f"{settings.api_host}:{settings.api_port}",
        # One process per core: a gevent worker uses one core however many
        # connections it serves (docs/performance-log.md, "API submit").
        "workers": settings.api_workers,
        # Each worker listens on a socket of its own (SO_REUSEPORT) and the
        # kernel spreads new connections over them; on one shared socket the
        # worker that is awake takes them all, and with keep-alive clients one
        # worker served 92 % of the requests while the other idled.
        "reuse_port": True,
        "worker_class": "gevent",
        "worker_connections": settings.api_worker_connections,
        # The gevent worker reads each request's line and headers under a
        # timeout of `keepalive` seconds (a whole number): the header deadline.
        "keepalive": max(1, math.ceil(settings.api_read_timeout_seconds)),
        "timeout": WORKER_TIMEOUT_SECONDS,
        "graceful_timeout": 5,
        "accesslog": "-",
        "loglevel": settings.log_level.lower(),
        # gunicorn's error and access lines through the services' one setup.
        "logconfig_dict": logging_config("api", settings.log_level, settings.log_format),
        # gunicorn's control socket would live under $HOME, which a service
        # user often lacks; nothing here uses it.
        "control_socket_disable": True,
        "logger_class": RedactingLogger,
    }


# A login in a query string: WebHDFS clients send theirs as `delegation=`.
_TOKEN_IN_QUERY = re.compile(r"(?i)(?<=[?&]delegation=)[^&\s]+|(?<=^delegation=)[^&\s]+")


def redact_query(text: str) -> str:
    """`text` (a request line or a query) with any `delegation=` token hidden."""
    return _TOKEN_IN_QUERY.sub("REDACTED", text)


class RedactingLogger(Logger):
    """gunicorn's access log, without the login tokens WebHDFS clients put in
    URLs (`delegation=`): a log line must not be a way into an account."""

    def atoms(self, resp: Any, req: Any, environ: dict[str, Any],
              request_time: Any) -> dict[str, Any]:
        found: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        for key in ("r", "q"):
            if isinstance(found.get(key), str):
                found[key] = redact_query(found[key])
        return found


class BodyTooSlow(RequestTimeout):
    description = "the request body did not arrive in time"


class _DeadlineInput:
    """`wsgi.input` whose reads must all finish by one deadline.

    A read that waits past it is interrupted (gevent.Timeout fires in the
    waiting greenlet), so a body trickled a byte at a time ends with 408
    instead of holding its connection for as long as the client likes. The
    connection stops reading then, so the 408 is the last answer on it
    (gunicorn would otherwise read out the rest of the body first).
    """

    def __init__(self, raw: Any, seconds: float, sock: socket.socket | None) -> None:
        self._raw, self._sock, self._seconds = raw, sock, seconds
        self._deadline = time.monotonic() + seconds
        self._per_read = False

    def per_read(self) -> None:
        """From now on each read has the seconds to itself (see allow_long_body)."""
        self._per_read = True

    def _within(self, read: Callable[..., Any], *args: Any) -> Any:
        if self._per_read:
            self._deadline = time.monotonic() + self._seconds
        try:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise BodyTooSlow()
            with gevent.Timeout(remaining, BodyTooSlow):
                return read(*args)
        except BodyTooSlow:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RD)
            raise

    def read(self, size: int | None = -1) -> bytes:
        data: bytes = self._within(self._raw.read, size)
        return data

    def readline(self, size: int | None = -1) -> bytes:
        line: bytes = self._within(self._raw.readline, size)
        return line

    def readlines(self, hint: int | None = -1) -> list[bytes]:
        lines: list[bytes] = self._within(self._raw.readlines, hint)
        return lines

    def __iter__(self) -> Iterator[bytes]:
        while True:
            line = self.readline()
            if not line:
                return
            yield line


def allow_long_body(environ: dict[str, Any]) -> None:
    """For a view that takes a body of any length (a WebHDFS upload): no
    deadline for the whole body, which may be gigabytes, but each read must
    still bring bytes within the same seconds, so a client that stops
    sending is cut off as before. A no-op outside gunicorn."""
    stream = environ.get("wsgi.input")
    if isinstance(stream, _DeadlineInput):
        stream.per_read()


class BodyDeadline:
    """WSGI middleware: the body must arrive within `seconds` of the headers."""

    def __init__(self, app: Wsgi, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        environ["wsgi.input"] = _DeadlineInput(environ["wsgi.input"], self.seconds,
                                               environ.get("gunicorn.socket"))
        return self.app(environ, start_response)
