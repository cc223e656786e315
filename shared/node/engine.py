"""The Docker calls on every short job's path, over plain keep-alive connections.

A short job costs the launcher a create and a start and the monitor a log
follow and a remove; an exec costs the launcher an exec's create, its start
(the connection its output comes on) and, once its output ends, an inspect
for its exit code. Through the SDK each is a
`requests` call: session merging, cookie jars, hooks, adapters and urllib3
on top of the HTTP itself, about 0.5 ms of CPU a call against 0.12 ms for
the same request over `http.client` (docs/performance-log.md).
`EngineCalls` sends exactly the requests the SDK sends (the container config
is still built by the SDK) and raises exactly the SDK's errors
(`docker.errors.create_api_error_from_http_exception`), so
callers handle NotFound, ImageNotFound and conflicts as before.

The monitor's passes over its node (reconcile, samples) list containers
without the SDK's inspect of each one (`list_containers`), and its follow
of the engine's events (`follow_events`, two a job) reads each event as a
line parsed by orjson, not through the SDK's stream helpers.

An exec's start (`exec_attach`) is the SDK's upgrade request on a
connection of its own, which becomes the exec's stream: through the SDK it
cost 3.4-3.7 ms of CPU (a new urllib3 connection and requests' machinery
for one request) against 0.2 ms this way.

Only an engine on a unix socket is spoken to this way; any other (TCP, TLS,
ssh) goes through the SDK unchanged. Everything else (pulls) stays with the
SDK.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, cast
from urllib.parse import quote, urlencode

import docker
import orjson
import requests
from docker.errors import create_api_error_from_http_exception
from docker.models.containers import Container
from docker.transport.unixconn import UnixHTTPAdapter
from docker.types.daemon import CancellableStream
from docker.utils.utils import convert_filters, format_environment
from requests.structures import CaseInsensitiveDict
from urllib3.exceptions import ProtocolError

# Idle connections kept for reuse (more may be open at once; the extra ones
# are closed when they come back).
IDLE_CONNECTIONS = 8
# The most an exec start's answer head may take (the engine's is ~120 bytes).
MAX_HEAD_BYTES = 65536


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixConnection10(_UnixConnection):
    """A request in HTTP/1.0, for a long response read as it comes: the
    engine then sends the body as it writes it, closing the connection at
    its end, rather than as HTTP/1.1 chunks. A log follow flushes every
    message as its own chunk, so a chunked read returns one line at a time;
    this one returns every line that has arrived. (`_http_vsn` is how
    http.client chooses the request's version.)"""

    _http_vsn = 10
    _http_vsn_str = "HTTP/1.0"


class EngineCalls:
    """Create, start and remove a container, as the SDK's low-level calls do."""

    def __init__(self, client: docker.DockerClient, *, direct: bool = True) -> None:
        """`direct=False`: every call through the SDK, whatever the engine."""
        self.client, self.api = client, client.api
        adapter = getattr(self.api, "_custom_adapter", None)
        self._socket: str | None = (adapter.socket_path
                                    if direct and isinstance(adapter, UnixHTTPAdapter) else None)
        self._timeout = float(getattr(adapter, "timeout", None) or 60)
        self._prefix = f"/v{self.api._version}"
        self._idle: list[_UnixConnection] = []
        self._lock = threading.Lock()

    @property
    def direct(self) -> bool:
        """Whether calls bypass the SDK (a local engine on a unix socket)."""
        return self._socket is not None

    def create_container(self, image: str, command: Any = None, **options: Any) -> str:
        """`APIClient.create_container`: the new container's id."""
        if self._socket is None:
            return str(self.api.create_container(image, command, **options)["Id"])
        query = {"name": options.pop("name", None)}
        platform = options.pop("platform", None)
        if platform:
            query["platform"] = platform
        # What APIClient.create_container does before building the config.
        if isinstance(options.get("volumes"), str):
            options["volumes"] = [options["volumes"]]
        environment = options.get("environment")
        if isinstance(environment, dict):
            environment = format_environment(environment)
        if options.pop("use_config_proxy", True):
            environment = self.api._proxy_configs.inject_proxy_environment(environment) or None
        options["environment"] = environment
        config = self.api.create_container_config(image, command, **options)
        body = {key: value for key, value in config.items() if value is not None}
        reply = self._call("POST", "/containers/create", query, body)
        return str(json.loads(reply)["Id"])

    def start(self, container_id: str) -> None:
        """`APIClient.start`: an already running container is no error."""
        if self._socket is None:
            self.api.start(container_id)
            return
        self._call("POST", f"/containers/{quote(container_id, safe='')}/start")

    def remove_container(self, container_id: str, *, force: bool = False) -> None:
        """`APIClient.remove_container`."""
        if self._socket is None:
            self.api.remove_container(container_id, force=force)
            return
        self._call("DELETE", f"/containers/{quote(container_id, safe='')}",
                   {"v": False, "link": False, "force": force})

    def exec_create(self, container_id: str, cmd: list[str], *, stdout: bool = True,
                    stderr: bool = True, stdin: bool = False, tty: bool = False) -> str:
        """`APIClient.exec_create` (as its caller's user, environment and
        folder): the new exec's id."""
        if self._socket is None:
            return str(self.api.exec_create(container_id, cmd, stdout=stdout, stderr=stderr,
                                            stdin=stdin, tty=tty)["Id"])
        body = {"Container": container_id, "User": "", "Privileged": False, "Tty": tty,
                "AttachStdin": stdin, "AttachStdout": stdout, "AttachStderr": stderr,
                "Cmd": cmd, "Env": None}
        reply = self._call("POST", f"/containers/{quote(container_id, safe='')}/exec", None,
                           body)
        return str(json.loads(reply)["Id"])

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        """`APIClient.exec_inspect`."""
        if self._socket is None:
            return dict(self.api.exec_inspect(exec_id))
        found: dict[str, Any] = json.loads(
            self._call("GET", f"/exec/{quote(exec_id, safe='')}/json"))
        return found

    def exec_attach(self, exec_id: str, *, tty: bool = False) -> tuple[Any, bytes]:
        """`APIClient.exec_start(exec_id, tty=tty, socket=True)`: the socket the
        exec's output comes on (and its input goes to), and what of that
        output came with the engine's answer (to be read before the socket).
        The socket keeps the engine client's timeout, as the SDK's does. The
        caller closes it."""
        if self._socket is None:
            return self.api.exec_start(exec_id, tty=tty, socket=True), b""
        url = f"{self._prefix}/exec/{quote(exec_id, safe='')}/start"
        body = json.dumps({"Tty": tty, "Detach": False}).encode()
        # What the SDK sends: an upgrade, so the connection becomes the stream.
        request = (f"POST {url} HTTP/1.1\r\nHost: docker\r\n"
                   "Content-Type: application/json\r\nConnection: Upgrade\r\n"
                   f"Upgrade: tcp\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        conn = _UnixConnection(self._socket, self._timeout)  # its own: it becomes the stream
        failed: tuple[http.client.HTTPResponse, bytes] | None = None
        try:
            conn.connect()
            sock = conn.sock
            assert sock is not None
            sock.sendall(request)
            head, rest = _read_head(sock)
            if _status_of(head) >= 400:  # an ordinary answer, parsed whole
                reply = http.client.HTTPResponse(_Replayed(head + rest, sock))  # type: ignore[arg-type]
                reply.begin()
                failed = reply, reply.read()
        except (http.client.HTTPException, OSError) as error:
            conn.close()
            raise requests.exceptions.ConnectionError(error) from None
        except BaseException:
            conn.close()
            raise
        if failed is not None:
            conn.close()
            _raise_api_error(*failed, url)  # as the SDK raises it
        return sock, rest

    def list_containers(self, **query: Any) -> list[Container]:
        """`containers.list(sparse=True)` as models whose `id`, `name`, `labels`
        and `status` read as after an inspect (`listed_attrs`). The SDK's list
        inspects each container it lists: a pass over a node's containers
        costs one call this way, not one per container."""
        return [self.client.containers.prepare_model(listed_attrs(row))
                for row in self.api.containers(**query)]

    def follow_log(self, container_id: str, since: str | None = None) -> LogResponse:
        """`docker logs --follow --timestamps` (stdout and stderr, from `since`,
        `<seconds>[.<nanoseconds>]` since the epoch, inclusive):
        the open response, its body as the engine sends it (framed, unless the
        container has a TTY). It has a connection of its own, with no read
        timeout: a follow waits for output for as long as the container runs."""
        params: dict[str, Any] = {"stdout": 1, "stderr": 1, "timestamps": 1, "follow": 1,
                                  "tail": "all"}
        if since is not None:
            params["since"] = since
        path = f"/containers/{quote(container_id, safe='')}/logs"
        if self._socket is None:
            response = self.api._get(self.api._url(path), params=params, stream=True)
            self.api._raise_for_status(response)
            self.api._disable_socket_timeout(self.api._get_raw_response_socket(response))
            return _SdkLogResponse(response)
        return self._open_stream(f"{self._prefix}{path}?{urlencode(params)}")

    def follow_events(self, filters: Mapping[str, list[str]], since: int) -> EventStream:
        """`docker events --since --filter`: each event (a dict) as the engine
        sends it, until the stream is closed (from any thread) or ends. Its
        connection is its own, with no read timeout."""
        if self._socket is None:
            return cast(EventStream, self.api.events(decode=True, filters=dict(filters),
                                                     since=since))
        url = f"{self._prefix}/events?" + urlencode({"since": since,
                                                     "filters": convert_filters(filters)})
        return _DirectEvents(self._open_stream(url))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -------------------------------------------------------------- the wire

    def _call(self, method: str, path: str, query: Mapping[str, Any] | None = None,
              body: Any = None) -> bytes:
        params = {k: v for k, v in (query or {}).items() if v is not None}
        url = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        for last_try in (False, True):
            conn, reused = self._take()
            try:
                conn.request(method, url, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (http.client.HTTPException, OSError) as error:
                conn.close()
                if reused and not last_try and not isinstance(error, TimeoutError):
                    continue  # a kept connection the engine had closed: once more, afresh
                raise requests.exceptions.ConnectionError(error) from None
            if response.will_close:
                conn.close()
            else:
                self._give(conn)
            if response.status >= 400:
                _raise_api_error(response, data, url)
            return data
        raise AssertionError("unreachable")  # pragma: no cover

    def _open_stream(self, url: str) -> _DirectResponse:
        """GET `url` in HTTP/1.0 on a connection of its own: the open response,
        with no read timeout."""
        assert self._socket is not None
        conn = _UnixConnection10(self._socket, self._timeout)
        try:
            conn.request("GET", url)
            sock = conn.sock  # the reply keeps it; the connection lets go (HTTP/1.0 closes)
            reply = conn.getresponse()
            failed = reply.read() if reply.status >= 400 else None
        except (http.client.HTTPException, OSError) as error:
            conn.close()
            raise requests.exceptions.ConnectionError(error) from None
        if failed is not None:
            conn.close()
            _raise_api_error(reply, failed, url)
        assert sock is not None
        sock.settimeout(None)
        return _DirectResponse(sock, reply)

    def _take(self) -> tuple[_UnixConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        assert self._socket is not None
        return _UnixConnection(self._socket, self._timeout), False

    def _give(self, conn: _UnixConnection) -> None:
        with self._lock:
            if len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """An answer's status line and headers, read from `sock` to their blank
    line, and what came after them."""
    data = b""
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            return data[:end + 4], data[end + 4:]
        if len(data) > MAX_HEAD_BYTES:
            raise http.client.HTTPException("the engine's answer head has no end")
        chunk = sock.recv(65536)
        if not chunk:
            raise http.client.RemoteDisconnected("the engine closed the connection "
                                                 "before it answered")
        data += chunk


def _status_of(head: bytes) -> int:
    """The status code of an answer's head (`HTTP/1.1 101 UPGRADED`)."""
    parts = head.split(b"\r\n", 1)[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise http.client.BadStatusLine(head[:80].decode("latin-1"))
    return int(parts[1])


class _Replayed:
    """What `http.client.HTTPResponse` reads an answer from: the bytes already
    read, then the socket."""

    def __init__(self, first: bytes, sock: socket.socket) -> None:
        self._first, self._sock = first, sock

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_ReplayIO(self._first, self._sock))


class _ReplayIO(io.RawIOBase):
    def __init__(self, first: bytes, sock: socket.socket) -> None:
        self._first, self._sock = first, sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._first:
            taken = min(len(buffer), len(self._first))
            buffer[:taken] = self._first[:taken]
            self._first = self._first[taken:]
            return taken
        return self._sock.recv_into(buffer)


def listed_attrs(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of Docker's container list in the shape of an inspect, as far as
    the list tells: id, name, labels and phase. How a container exited (its
    code, whether memory killed it) takes an inspect."""
    names = row.get("Names") or []
    return {"Id": row["Id"], "Name": names[0] if names else "",
            "Config": {"Labels": dict(row.get("Labels") or {})},
            "State": {"Status": row.get("State") or ""}}


class LogResponse(Protocol):
    """An open log response: its body, and `close` from any thread, which ends
    a blocked read (it then raises or returns what it had)."""

    def read(self, amount: int) -> bytes: ...

    def read1(self, amount: int) -> bytes: ...

    def close(self) -> None: ...


# What reading a log response raises when its connection broke.
BROKEN_STREAM_ERRORS: tuple[type[BaseException], ...] = (
    http.client.HTTPException, ProtocolError, OSError)


class _DirectResponse:
    """A long HTTP/1.0 response read as it comes (a log follow, the events)."""

    def __init__(self, sock: socket.socket, reply: http.client.HTTPResponse) -> None:
        self._sock, self._reply = sock, reply
        self._closed = False

    def read(self, amount: int) -> bytes:
        return self._checked(self._reply.read(amount))

    def read1(self, amount: int) -> bytes:
        return self._checked(self._reply.read1(amount))

    def _checked(self, data: bytes) -> bytes:
        if self._closed:  # what a closed response reads is no end of the log
            raise ConnectionAbortedError("the log response was closed")
        return data

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):  # closed or broken already
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked on it
        # The descriptor goes once the response's file lets go of it too;
        # the reply is not closed here, under a read that may be running.
        self._sock.close()


class EventStream(Protocol):
    """The engine's events as they come (each a dict), and `close` from any
    thread, which ends the iteration (it then raises or stops)."""

    def __iter__(self) -> Iterator[dict[str, Any]]: ...

    def close(self) -> None: ...


# the most a read of the event stream takes at once
EVENTS_READ_BYTES = 65536


class _DirectEvents:
    """Events over HTTP/1.0: the engine writes each as one line of JSON and
    flushes it, so a read returns every event that has arrived."""

    def __init__(self, response: _DirectResponse) -> None:
        self._response = response

    def __iter__(self) -> Iterator[dict[str, Any]]:
        pending = b""
        while True:
            try:
                data = self._response.read1(EVENTS_READ_BYTES)
            except http.client.HTTPException as error:
                raise requests.exceptions.ConnectionError(error) from None
            if not data:
                return
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                if line.strip():
                    yield orjson.loads(line)

    def close(self) -> None:
        self._response.close()


class _SdkLogResponse:
    def __init__(self, response: requests.Response) -> None:
        self._raw = response.raw
        self._closer = CancellableStream(iter(()), response)

    def read(self, amount: int) -> bytes:
        return bytes(self._raw.read(amount))

    def read1(self, amount: int) -> bytes:
        return bytes(self._raw.read1(amount))

    def close(self) -> None:
        self._closer.close()


def _raise_api_error(response: http.client.HTTPResponse, data: bytes, url: str) -> None:
    """Raise what the SDK raises for this answer (NotFound, ImageNotFound, APIError...)."""
    reply = requests.Response()
    reply.status_code, reply.reason, reply.url = response.status, response.reason, url
    reply.headers = CaseInsensitiveDict(response.getheaders())
    reply._content = data
    try:
        reply.raise_for_status()
    except requests.exceptions.HTTPError as error:
        create_api_error_from_http_exception(error)  # always raises
