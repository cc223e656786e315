"""`shared.node.engine.EngineCalls` on the real engine: the SDK's results and errors.

The launcher creates and starts containers and the monitor removes them
through these calls, so they must do what the SDK's calls did: the same
container (name, labels, environment, limits), the same error classes for
a missing image, a taken name or a missing container, and keep-alive
connections that survive the engine closing one.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import requests
from docker.errors import APIError, ImageNotFound, NotFound

from services.launcher.runtime import close_exec_socket
from shared.node import execs as node_execs
from shared.node.engine import MAX_HEAD_BYTES, EngineCalls
from shared.state import execs

pytestmark = pytest.mark.docker


@pytest.fixture
def engine(docker_client: docker.DockerClient) -> Iterator[EngineCalls]:
    calls = EngineCalls(docker_client)
    assert calls.direct  # the suite's engine is on a unix socket
    yield calls
    calls.close()


def _name(test_labels: dict[str, str], what: str) -> str:
    return f"pai-engine-calls-{next(iter(test_labels.values()))}-{what}"


def test_a_container_is_created_started_and_removed_as_by_the_sdk(
        engine: EngineCalls, docker_client: docker.DockerClient, test_image: str,
        test_labels: dict[str, str]) -> None:
    host_config = docker_client.api.create_host_config(network_mode="host", mem_limit="64m")
    name = _name(test_labels, "full")
    container_id = engine.create_container(
        test_image, ["echo $GREETING"], name=name, entrypoint=["/bin/sh", "-c"],
        labels={**test_labels, "pai.test.what": "engine"}, environment={"GREETING": "hello"},
        working_dir="/tmp", host_config=host_config)
    try:
        attrs = docker_client.api.inspect_container(container_id)
        assert attrs["Name"] == f"/{name}"
        assert attrs["Config"]["Labels"]["pai.test.what"] == "engine"
        assert "GREETING=hello" in attrs["Config"]["Env"]
        assert attrs["Config"]["WorkingDir"] == "/tmp"
        assert attrs["HostConfig"]["Memory"] == 64 * 1024 * 1024
        assert attrs["State"]["Status"] == "created"

        engine.start(container_id)
        assert docker_client.api.wait(container_id, timeout=60)["StatusCode"] == 0
        assert docker_client.api.logs(container_id) == b"hello\n"
    finally:
        engine.remove_container(container_id, force=True)
    with pytest.raises(NotFound):
        docker_client.api.inspect_container(container_id)


@contextlib.contextmanager
def sleeping(engine: EngineCalls, image: str, labels: dict[str, str]) -> Iterator[str]:
    """A running `sleep 60` container, made and started by `engine`, for the block."""
    container_id = engine.create_container(image, ["sleep", "60"], labels=labels)
    try:
        engine.start(container_id)
        yield container_id
    finally:
        engine.remove_container(container_id, force=True)


def test_starting_a_running_container_again_is_no_error(
        engine: EngineCalls, docker_client: docker.DockerClient, test_image: str,
        test_labels: dict[str, str]) -> None:
    with sleeping(engine, test_image, test_labels) as container_id:
        engine.start(container_id)  # Docker answers 304
        assert docker_client.api.inspect_container(container_id)["State"]["Running"] is True


def test_errors_are_the_sdks(engine: EngineCalls, test_image: str,
                             test_labels: dict[str, str]) -> None:
    with pytest.raises(ImageNotFound):
        engine.create_container("pai-test/no-such-image:never", ["true"], labels=test_labels)
    name = _name(test_labels, "taken")
    container_id = engine.create_container(test_image, ["true"], name=name, labels=test_labels)
    try:
        with pytest.raises(APIError) as taken:
            engine.create_container(test_image, ["true"], name=name, labels=test_labels)
        assert taken.value.status_code == 409
    finally:
        engine.remove_container(container_id, force=True)
    with pytest.raises(NotFound):
        engine.remove_container(container_id, force=True)
    with pytest.raises(NotFound):
        engine.start(container_id)


def test_an_exec_is_created_and_inspected_as_by_the_sdk(
        engine: EngineCalls, docker_client: docker.DockerClient, test_image: str,
        test_labels: dict[str, str]) -> None:
    with sleeping(engine, test_image, test_labels) as container_id:
        exec_id = engine.exec_create(container_id, ["sh", "-c", "echo out; exit 3"])
        by_sdk = docker_client.api.exec_create(container_id, ["sh", "-c", "echo out; exit 3"])
        ours, theirs = (docker_client.api.exec_inspect(e) for e in (exec_id, by_sdk["Id"]))
        for field in ("ProcessConfig", "OpenStdin", "OpenStdout", "OpenStderr", "ContainerID"):
            assert ours[field] == theirs[field]

        assert docker_client.api.exec_start(exec_id) == b"out\n"
        assert node_execs.exit_code(engine, exec_id) == 3
        assert engine.exec_inspect(exec_id)["Running"] is False
        with pytest.raises(NotFound):
            engine.exec_inspect("0" * 64)
    with pytest.raises(NotFound):
        engine.exec_create(container_id, ["true"])


def _drain(sock: Any, early: bytes) -> bytes:
    """Everything an exec's socket carries, after what came with its answer."""
    data, raw = early, getattr(sock, "_sock", sock)  # the SDK's is a SocketIO over it
    raw.settimeout(30)
    try:
        while chunk := raw.recv(65536):
            data += chunk
    finally:
        close_exec_socket(sock)
    return data


def test_an_exec_is_attached_as_by_the_sdk(
        engine: EngineCalls, docker_client: docker.DockerClient, test_image: str,
        test_labels: dict[str, str]) -> None:
    """The same multiplexed output, stdout and stderr apart, on a socket of
    its own; a TTY's raw output alike; the exit code after."""
    script = "echo out; echo err >&2; head -c 200000 /dev/zero; exit 3"
    with sleeping(engine, test_image, test_labels) as container_id:
        streams = []
        for attach in (engine.exec_attach,
                       lambda e, tty=False: (docker_client.api.exec_start(
                           e, tty=tty, socket=True), b"")):
            exec_id = engine.exec_create(container_id, ["sh", "-c", script])
            frames, rest = execs.demux(_drain(*attach(exec_id)))
            assert rest == b""
            streams.append(([(n, p) for n, p in frames if n == 1],
                            b"".join(p for n, p in frames if n == 2)))
            assert node_execs.exit_code(engine, exec_id) == 3
        ours, theirs = streams
        assert b"".join(p for _, p in ours[0]) == b"out\n" + b"\0" * 200000
        assert ours[1] == theirs[1] == b"err\n"
        assert b"".join(p for _, p in ours[0]) == b"".join(p for _, p in theirs[0])

        exec_id = engine.exec_create(container_id, ["sh", "-c", "printf 'a\\nb'"], tty=True)
        sock, early = engine.exec_attach(exec_id, tty=True)
        assert sock.gettimeout() == engine._timeout  # the client's, as the SDK's socket keeps
        assert _drain(sock, early) == b"a\r\nb"  # a terminal's


def test_an_exec_attach_answers_the_sdks_errors(
        engine: EngineCalls, docker_client: docker.DockerClient, test_image: str,
        test_labels: dict[str, str]) -> None:
    with pytest.raises(NotFound):
        engine.exec_attach("0" * 64)
    with sleeping(engine, test_image, test_labels) as container_id:
        ours, theirs = (engine.exec_create(container_id, ["true"]) for _ in range(2))
        docker_client.api.kill(container_id)
        docker_client.api.wait(container_id, timeout=30)
        with pytest.raises(APIError) as by_us:  # its container no longer runs
            engine.exec_attach(ours)
        with pytest.raises(APIError) as by_sdk:
            docker_client.api.exec_start(theirs, socket=True)
        assert type(by_us.value) is type(by_sdk.value)
        assert by_us.value.status_code == by_sdk.value.status_code
        assert by_us.value.explanation == by_sdk.value.explanation.replace(theirs, ours)


def test_an_exec_answer_that_never_ends_its_head_is_refused(tmp_path: Path) -> None:
    """An engine (or what took its socket's place) that answers without a
    blank line: refused once MAX_HEAD_BYTES came, not read forever."""
    path = tmp_path / "engine.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            with contextlib.suppress(OSError):
                conn.sendall(b"HTTP/1.1 101 UPGRADED\r\nX: " + b"y" * (2 * MAX_HEAD_BYTES))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    calls = EngineCalls(docker.DockerClient(base_url=f"unix://{path}", version="1.41"))
    try:
        with pytest.raises(requests.exceptions.ConnectionError, match="no end"):
            calls.exec_attach("0" * 64)
    finally:
        thread.join(10)
        server.close()


def test_calls_go_over_one_kept_connection(engine: EngineCalls, test_image: str,
                                           test_labels: dict[str, str]) -> None:
    ids = [engine.create_container(test_image, ["true"], labels=test_labels) for _ in range(5)]
    for container_id in ids:
        engine.remove_container(container_id, force=True)
    assert len(engine._idle) == 1  # white box: one connection, handed back after each call


class OneAnswerEngine:
    """A unix-socket HTTP server that answers one request per connection and
    then closes it without saying so, as an engine dropping an idle
    keep-alive connection does."""

    def __init__(self, path: Path) -> None:
        self.path, self.connections = str(path), 0
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            self.connections += 1
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    request += chunk
                conn.sendall(b"HTTP/1.1 204 No Content\r\nApi-Version: 1.41\r\n\r\n")

    def close(self) -> None:
        self._server.close()


def test_a_connection_the_engine_closed_is_replaced(tmp_path: Path) -> None:
    server = OneAnswerEngine(tmp_path / "engine.sock")
    client = docker.DockerClient(base_url=f"unix://{server.path}", version="1.41")
    engine = EngineCalls(client)
    try:
        for _ in range(3):
            engine.start("a" * 64)  # the second and third find their kept connection closed
        assert server.connections == 3
    finally:
        engine.close()
        client.close()
        server.close()


def test_an_engine_not_on_a_unix_socket_goes_through_the_sdk() -> None:
    client = docker.DockerClient(base_url="tcp://127.0.0.1:9", version="1.41")
    engine = EngineCalls(client)
    assert not engine.direct
    with pytest.raises(requests.exceptions.ConnectionError):
        engine.start("a" * 64)  # the SDK's own error: nobody listens there
    client.close()


def _follow(engine: EngineCalls, labels: dict[str, str], since: int,
            wanted: int) -> list[dict[str, Any]]:
    """The first `wanted` events of the test's containers since `since`."""
    stream = engine.follow_events({"type": ["container"], "event": ["start", "die"],
                                   "label": [f"{k}={v}" for k, v in labels.items()]}, since)
    seen: list[dict[str, Any]] = []
    try:
        for event in stream:
            seen.append(event)
            if len(seen) == wanted:
                break
    finally:
        stream.close()
    return seen


def test_events_are_followed_as_by_the_sdk(
        engine: EngineCalls, docker_client: docker.DockerClient, test_image: str,
        test_labels: dict[str, str]) -> None:
    since = int(time.time()) - 1
    labels = {**test_labels, "pai.test.events": uuid.uuid4().hex}  # this test's alone
    container = docker_client.containers.run(test_image, ["/bin/busybox", "true"],
                                             labels=labels, detach=True)
    try:
        container.wait(timeout=60)
        direct = _follow(engine, labels, since, 2)
        sdk = _follow(EngineCalls(docker_client, direct=False), labels, since, 2)
    finally:
        container.remove(force=True)
    assert [(e["status"], e["id"]) for e in direct] == [("start", container.id),
                                                         ("die", container.id)]
    assert direct == sdk
    assert direct[1]["Actor"]["Attributes"]["exitCode"] == "0"


def test_closing_the_event_stream_ends_a_waiting_read(engine: EngineCalls) -> None:
    stream = engine.follow_events({"label": ["pai.test.never=1"]}, int(time.time()))
    ended = threading.Event()

    def read() -> None:
        with contextlib.suppress(OSError, requests.exceptions.ConnectionError):
            for _ in stream:
                pass
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    stream.close()
    reader.join(30)
    assert ended.is_set()

