"""A real HTTP and WebSocket server on a task's port, for the proxy's tests.

Jobs share the host's network, so a server this process starts on a port
the platform gave a task is what the task port proxy reaches there, as it
would reach a notebook the task started. It answers:

- a WebSocket upgrade (RFC 6455, by wsproto): every message echoed back;
- any other request: 200 with a JSON body saying what arrived (method,
  path with its query, headers, the body's length), and a cookie or two
  (`Set-Cookie`) when the path asks for them (`/set-cookies`).

Every request's head is also kept in `seen`, so a test can say what crossed.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    Request,
    TextMessage,
)

READ_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024


class TaskServer:
    """The server, listening on 127.0.0.1:`port` until `close()`."""

    def __init__(self, port: int) -> None:
        self.seen: list[dict[str, Any]] = []
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner._serve(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(30)
        data = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(READ_BYTES)
                if not chunk:
                    return
                data += chunk
            head, rest = data.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = [tuple(p.strip() for p in line.split(":", 1)) for line in lines[1:]]
            self.seen.append({"method": method, "target": target, "headers": headers})
            upgrade = any(n.lower() == "upgrade" and v.lower() == "websocket"
                          for n, v in headers)
            if upgrade:
                self._echo(sock, data)
            else:
                self._answer(sock, method, target, headers, rest)

    def _answer(self, sock: socket.socket, method: str, target: str,
                headers: list[tuple[str, ...]], rest: bytes) -> None:
        length = next((int(v) for n, v in headers if n.lower() == "content-length"), 0)
        body = rest
        while len(body) < min(length, MAX_BODY_BYTES):
            chunk = sock.recv(READ_BYTES)
            if not chunk:
                break
            body += chunk
        answer = json.dumps({"method": method, "target": target,
                             "headers": [list(h) for h in headers],
                             "bodyLength": len(body), "body": body[:64].decode("latin-1")})
        cookies = ["Set-Cookie: pai_portal=planted; Path=/", "Set-Cookie: app=1; Path=/"] \
            if target.split("?")[0].endswith("/set-cookies") else []
        sock.sendall("\r\n".join([
            "HTTP/1.1 200 OK", "Content-Type: application/json",
            f"Content-Length: {len(answer)}", "Connection: close", *cookies, "", answer,
        ]).encode("latin-1"))

    def _echo(self, sock: socket.socket, handshake: bytes) -> None:
        ws = WSConnection(ConnectionType.SERVER)
        ws.receive_data(handshake)
        for message in _frames(ws, sock):
            sock.sendall(message)


def _frames(ws: WSConnection, sock: socket.socket) -> Iterator[bytes]:
    """What to send back for each event, until the client closes."""
    while True:
        for event in ws.events():
            if isinstance(event, Request):
                yield ws.send(AcceptConnection())
            elif isinstance(event, Message):
                yield ws.send(TextMessage(data=event.data) if isinstance(event, TextMessage)
                              else BytesMessage(data=event.data))
            elif isinstance(event, Ping):
                yield ws.send(event.response())
            elif isinstance(event, CloseConnection):
                yield ws.send(event.response())
                return
        chunk = sock.recv(READ_BYTES)
        if not chunk:
            return
        ws.receive_data(chunk)
