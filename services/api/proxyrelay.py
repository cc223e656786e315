"""The byte-level side of the task port proxy (services/api/proxy.py): which
headers cross it, and the WebSocket relay.

A WebSocket is relayed, not re-framed: the client's upgrade request goes to
the task's server as HTTP/1.1 on a connection of its own, the server's answer
comes back as it is (its hop-by-hop headers included: an upgrade needs them),
and after `101 Switching Protocols` bytes are copied both ways until either
side closes, the connection sits idle for the proxy's idle time, or a side
does not take what it is sent within the send time. The client's socket is
taken from the server (gunicorn's, or Werkzeug's in development), as
services/api/exectty.py takes it for terminals.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from flask import Response

from services.api.errors import ApiError

# RFC 9110 section 7.6.1, and the headers a hop adds for itself.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate",
                        "proxy-authorization", "proxy-connection", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade"})
# The platform's credentials and the forwarding headers the proxy writes itself.
DROPPED_FROM_CLIENT = frozenset({"authorization", "x-forwarded-for", "x-forwarded-proto",
                                 "x-forwarded-prefix", "x-forwarded-host"})
CONNECT_SECONDS = 5.0
HANDSHAKE_SECONDS = 30.0
MAX_HEAD_BYTES = 64 * 1024
CHUNK_BYTES = 64 * 1024


class Unreachable(Exception):
    """No connection to the task's server, or no valid answer to the upgrade."""


def is_upgrade(environ: dict[str, Any]) -> bool:
    connection = {t.strip().lower() for t in environ.get("HTTP_CONNECTION", "").split(",")}
    return environ.get("HTTP_UPGRADE", "").lower() == "websocket" and "upgrade" in connection


def _named_by_connection(headers: list[tuple[str, str]]) -> set[str]:
    """Headers the Connection header names are this hop's too."""
    return {token.strip().lower() for name, value in headers if name.lower() == "connection"
            for token in value.split(",") if token.strip()}


def without_cookie(header: str, name: str) -> str:
    """A Cookie header without the cookie `name` (the portal's session)."""
    kept = [part.strip() for part in header.split(";")
            if part.strip() and part.split("=", 1)[0].strip() != name]
    return "; ".join(kept)


def request_headers(items: Iterable[tuple[str, str]], session_cookie: str) -> list[tuple[str, str]]:
    """The client's headers fit for the task's server: no hop-by-hop header,
    no platform credential (bearer token, portal session cookie), none of
    the forwarding headers the proxy sets itself."""
    headers = list(items)
    dropped = HOP_BY_HOP | DROPPED_FROM_CLIENT | _named_by_connection(headers)
    kept: list[tuple[str, str]] = []
    for name, value in headers:
        lower = name.lower()
        if lower in dropped:
            continue
        if lower == "cookie":
            value = without_cookie(value, session_cookie)
            if not value:
                continue
        kept.append((name, value))
    return kept


def sets_cookie(value: str, name: str) -> bool:
    """Whether a Set-Cookie value sets (or clears) the cookie `name`."""
    return value.split(";", 1)[0].split("=", 1)[0].strip() == name


def response_headers(items: Iterable[tuple[str, str]], session_cookie: str, *,
                     keep_hop_by_hop: bool = False) -> list[tuple[str, str]]:
    """The task's answer's headers for the client: no hop-by-hop header
    (unless relaying an upgrade), never a cookie named as the portal's
    session: a job must not set or clear the platform's login."""
    headers = list(items)
    dropped = set() if keep_hop_by_hop else HOP_BY_HOP | _named_by_connection(headers)
    return [(name, value) for name, value in headers
            if name.lower() not in dropped
            and not (name.lower() == "set-cookie" and sets_cookie(value, session_cookie))]


def limit_sends(environ: dict[str, Any], seconds: float, response: Response) -> None:
    """While `response` streams, a send to the client that makes no progress
    for `seconds` fails, which ends the connection: a client that stops
    reading gives its slot and lease back instead of holding them."""
    sock = environ.get("gunicorn.socket")
    if sock is None:
        return
    previous = sock.gettimeout()
    sock.settimeout(seconds)
    response.call_on_close(lambda: _restore_timeout(sock, previous))


def _restore_timeout(sock: socket.socket, previous: float | None) -> None:
    with contextlib.suppress(OSError):
        sock.settimeout(previous)


def client_socket(environ: dict[str, Any]) -> tuple[socket.socket, str]:
    """The client's connection and the server it came through."""
    for key, mode in (("gunicorn.socket", "gunicorn"), ("werkzeug.socket", "werkzeug")):
        sock = environ.get(key)
        if sock is not None:
            return sock, mode
    raise ApiError("BadRequestError", "this server cannot relay WebSockets", 400)


def taken_over(mode: str) -> Response:
    """The view's return once it relayed the connection itself: nothing more
    is written on it (gunicorn closes it on StopIteration)."""

    class _Done(Response):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if mode == "gunicorn":
                raise StopIteration()
            return super().__call__(*args, **kwargs) if mode == "werkzeug" else []

    return _Done()


def relay_upgrade(environ: dict[str, Any], address: tuple[str, int], target: str,
                  headers: list[tuple[str, str]], renew: Callable[[], None], *,
                  session_cookie: str, idle_seconds: float, send_seconds: float) -> str:
    """Relay the client's WebSocket to `address`; the server mode (for
    `taken_over`). Unreachable when the task's server cannot be reached or
    does not answer the upgrade; nothing was sent to the client then."""
    client, mode = client_socket(environ)
    try:
        upstream = socket.create_connection(address, timeout=CONNECT_SECONDS)
    except OSError as error:
        raise Unreachable(str(error)) from None
    try:
        head = [f"{environ.get('REQUEST_METHOD', 'GET')} {target} HTTP/1.1", *(
            f"{name}: {value}" for name, value in headers), "Connection: Upgrade",
            "Upgrade: websocket"]
        upstream.settimeout(HANDSHAKE_SECONDS)
        upstream.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        status, answer, rest = _read_answer(upstream, session_cookie)
        client.settimeout(send_seconds)
        client.sendall(answer + rest)
        if status == 101:
            _pump(client, upstream, idle_seconds, send_seconds, renew)
    except OSError:
        pass  # either side went away: the relay ends
    finally:
        with contextlib.suppress(OSError):
            upstream.close()
    return mode


def _read_answer(upstream: socket.socket, session_cookie: str) -> tuple[int, bytes, bytes]:
    """The task's answer head (status, the head as the client gets it) and
    the bytes read past it."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise Unreachable("the task's server answered with an oversized head")
        try:
            chunk = upstream.recv(CHUNK_BYTES)
        except OSError as error:
            raise Unreachable(f"no answer to the upgrade: {error}") from None
        if not chunk:
            raise Unreachable("the task's server closed the connection")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        raise Unreachable(f"not an HTTP answer: {lines[0][:80]!r}") from None
    fields = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:]
              if ":" in line]
    kept = response_headers([(n, v) for n, v in fields], session_cookie,
                            keep_hop_by_hop=status == 101)
    answer = "\r\n".join([lines[0], *(f"{n}: {v}" for n, v in kept)]) + "\r\n\r\n"
    return status, answer.encode("latin-1"), rest


def _pump(client: socket.socket, upstream: socket.socket, idle_seconds: float,
          send_seconds: float, renew: Callable[[], None]) -> None:
    """Copy bytes both ways until a side closes or the connection idles."""
    peers = {client: upstream, upstream: client}
    for sock in peers:
        sock.settimeout(send_seconds)
    last = time.monotonic()
    while True:
        left = idle_seconds - (time.monotonic() - last)
        if left <= 0:
            return
        readable, _, _ = select.select(list(peers), [], [], min(left, 5.0))
        for sock in readable:
            data = sock.recv(CHUNK_BYTES)
            if not data:
                return
            peers[sock].sendall(data)
            last = time.monotonic()
        renew()
