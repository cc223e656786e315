"""The monitor's log stream on the real engine: no inspect around it.

`LogStream` opens `docker logs --follow` without the SDK's inspect (the
stream's first byte says whether the container has a TTY) and tells a
stream Docker ended (the container stopped) from one that broke. A shipper
whose stream ended with the container, once the monitor saw the stop, reads
once more to the log's end (this engine may end a follow before the last
lines of a container that exits at once) but inspects nothing.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import docker
import pytest
from docker.errors import NotFound

from services.monitor.enginefiles import AUTO, OFF, EngineLogFiles
from services.monitor.loglines import LogCursor
from services.monitor.logs import LogShipping, LogStream
from shared.domain.states import TaskState
from shared.node.containers import TaskRef
from shared.node.engine import EngineCalls
from tests.support.monitor_rig import GATE, Rig, release, rig
from tests.support.polling import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.redis]
__all__ = ["rig"]  # the fixture, used by name

DRAIN_SECONDS = 30.0


class CountingRelay:
    """A unix socket in front of the engine's that passes every byte through
    and notes the path of each request a client sends over it."""

    REQUEST_LINE = re.compile(rb"(?:GET|POST|PUT|DELETE|HEAD) (\S+) HTTP/1\.[01]\r\n")

    def __init__(self, path: Path, engine_socket: str) -> None:
        self.path, self.engine_socket = str(path), engine_socket
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            engine.connect(self.engine_socket)
            threading.Thread(target=self._pump, args=(client, engine, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(engine, client, False),
                             daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, requests: bool) -> None:
        pending = b""
        try:
            while chunk := source.recv(65536):
                if requests:
                    pending += chunk
                    with self._lock:
                        self.paths.extend(
                            urlparse(m.group(1).decode()).path
                            for m in self.REQUEST_LINE.finditer(pending))
                    pending = pending[pending.rfind(b"\r\n") + 2:]
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def ending(self, suffix: str) -> list[str]:
        with self._lock:
            return [p for p in self.paths if p.endswith(suffix)]

    def close(self) -> None:
        self._server.close()


def _lines(stream: LogStream) -> list[tuple[int | None, str]]:
    return [line for lines in stream for line in lines.pairs()]


def _text(stream: LogStream) -> list[str]:
    """The lines' texts, without their stamps (which every line has)."""
    lines = _lines(stream)
    assert all(stamp is not None for stamp, _text in lines)
    return [text for _stamp, text in lines]


@pytest.fixture(params=[True, False], ids=["direct", "through-the-sdk"])
def engine(request: pytest.FixtureRequest, docker_client: docker.DockerClient
           ) -> Iterator[EngineCalls]:
    calls = EngineCalls(docker_client, direct=request.param)
    assert calls.direct == request.param
    yield calls
    calls.close()


def test_a_stream_that_docker_ends_with_its_container_has_ended(
        rig: Rig, engine: EngineCalls) -> None:
    container = rig.exited(rig.run(rig.place(), "echo out; echo err >&2; echo more"))
    stream = LogStream(engine, str(container.id), None)
    lines = _text(stream)
    assert sorted(lines) == ["err", "more", "out"]
    assert stream.ended


def test_a_stream_closed_under_its_reader_has_not_ended(rig: Rig, engine: EngineCalls) -> None:
    container = rig.run(rig.place(), f"echo first; {GATE}")
    try:
        stream = LogStream(engine, str(container.id), None)
        chunks = iter(stream)
        assert next(chunks).texts == ["first"]
        stream.close()  # as an engine restart or a shipper's stop would
        assert list(chunks) == []
        assert not stream.ended
    finally:
        release(container)


def test_a_tty_container_streams_raw_output(rig: Rig, engine: EngineCalls, test_image: str,
                                            test_labels: dict[str, str]) -> None:
    container = rig.docker.containers.run(test_image, ["sh", "-c", "echo on-a-tty"], tty=True,
                                          detach=True, labels=test_labels,
                                          network_mode="host")
    try:
        assert rig.docker.api.wait(container.id, timeout=60)["StatusCode"] == 0
        stream = LogStream(engine, str(container.id), None)
        assert _text(stream) == ["on-a-tty"]
        assert stream.ended
    finally:
        container.remove(force=True)


def test_the_log_of_a_missing_container_is_not_found(engine: EngineCalls) -> None:
    with pytest.raises(NotFound):
        LogStream(engine, "0" * 64, None)


def test_a_follow_resumes_from_a_second(rig: Rig, engine: EngineCalls) -> None:
    container = rig.exited(rig.run(rig.place(), "echo early"))
    stream = LogStream(engine, str(container.id), str(2**31 - 1))  # long after the exit
    assert list(stream) == []
    assert stream.ended


def test_a_follow_resumes_from_a_cursors_own_nanosecond(rig: Rig, engine: EngineCalls) -> None:
    """What the shipper's resume relies on: Docker takes `since` to the
    nanosecond, inclusive, so the resumed read starts at the cursor's line
    rather than at the start of its second."""
    container = rig.exited(rig.run(rig.place(), "seq 1 200"))
    stamp, text = _lines(LogStream(engine, str(container.id), None))[149]
    assert (text, stamp is not None) == ("150", True)
    cursor = LogCursor(stamp, 1)
    stream = LogStream(engine, str(container.id), cursor.since)
    assert _text(stream) == [str(n) for n in range(150, 201)]
    assert stream.ended


def test_a_drained_exit_reads_the_log_to_its_end_and_inspects_nothing(
        rig: Rig, tmp_path: Path) -> None:
    job_id = rig.place()
    container = rig.run(job_id, f"seq 1 5; {GATE}; seq 6 10")
    engine_socket = rig.docker.api._custom_adapter.socket_path
    relay = CountingRelay(tmp_path / "relay.sock", engine_socket)
    watched = docker.DockerClient(base_url=f"unix://{relay.path}", version="1.41")
    seen = watched.containers.prepare_model({"Id": container.id})
    ref = TaskRef(job_id, 0, "main", 0)
    shipping = LogShipping(rig.store, max_lines=1000)
    try:
        shipper = shipping.ensure(seen, ref)
        wait_for(lambda: rig.log(job_id) == [str(n) for n in range(1, 6)], "the first lines")
        shipper.container_exited()  # the die event is seen before the stream ends: no wait
        release(container)
        rig.docker.api.wait(container.id, timeout=60)
        assert shipping.drain(seen, ref, DRAIN_SECONDS)
        assert rig.log(job_id) == [str(n) for n in range(1, 11)]
        assert len(relay.ending("/logs")) == 2  # the follow, and the read to the end
        assert relay.ending("/json") == []  # no inspect
    finally:
        shipping.close()
        watched.close()
        relay.close()


def test_a_log_read_from_the_engines_file_asks_the_engine_for_nothing(
        rig: Rig, tmp_path: Path) -> None:
    """Where the monitor reads the engine's json-file logs, a container's whole
    log, running and after its exit, costs the engine no call at all."""
    job_id = rig.place()
    container = rig.run(job_id, f"seq 1 5; {GATE}; seq 6 10")
    files = EngineLogFiles.discover(rig.docker, AUTO)
    assert files is not None, "the test engine's log files are readable"
    relay = CountingRelay(tmp_path / "relay.sock", rig.docker.api._custom_adapter.socket_path)
    watched = docker.DockerClient(base_url=f"unix://{relay.path}", version="1.41")
    seen = watched.containers.prepare_model({"Id": container.id})
    ref = TaskRef(job_id, 0, "main", 0)
    shipping = LogShipping(rig.store, max_lines=1000, files=files)
    try:
        shipping.ensure(seen, ref)
        wait_for(lambda: rig.log(job_id) == [str(n) for n in range(1, 6)], "the first lines")
        release(container)
        rig.docker.api.wait(container.id, timeout=60)
        assert shipping.drain(seen, ref, DRAIN_SECONDS)
        assert rig.log(job_id) == [str(n) for n in range(1, 11)]
        assert relay.ending("/logs") == []
        assert relay.ending("/json") == []
    finally:
        shipping.close()
        watched.close()
        relay.close()


def test_a_reconcile_pass_inspects_only_what_exited(rig: Rig, tmp_path: Path) -> None:
    """Reconcile lists the node's containers in one call: a running one is
    not inspected, pass after pass; an exited one once, for how it ended."""
    job_id = rig.place(tasks=2)
    running = rig.run(job_id, GATE, index=0)
    ended = rig.exited(rig.run(job_id, "echo done", index=1))
    wait_for(lambda: running.reload() or running.status == "running", "the container to run")
    relay = CountingRelay(tmp_path / "relay.sock", rig.docker.api._custom_adapter.socket_path)
    watched = docker.DockerClient(base_url=f"unix://{relay.path}", version="1.41")
    try:
        monitor = rig.monitor(watched)
        first = monitor.reconcile()
        second = monitor.reconcile()

        assert (first.running, first.exited, second.running, second.exited) == (1, 1, 1, 0)
        assert rig.task(job_id, 0).state == TaskState.RUNNING
        assert rig.task(job_id, 1).state == TaskState.SUCCEEDED
        assert rig.log(job_id, 1) == ["done"]
        inspected = [p for p in relay.ending("/json") if not p.endswith("/containers/json")]
        assert [path.split("/")[-2] for path in inspected] == [ended.id]
        assert len(relay.ending("/containers/json")) == 2  # one list a pass
    finally:
        release(running)
        watched.close()
        relay.close()


@pytest.mark.parametrize("setting", [OFF, AUTO])
def test_a_loud_container_that_exits_at_once_is_shipped_to_its_last_line(
        rig: Rig, setting: str) -> None:
    """This engine may end a follow before the last lines of a container that
    exits right after writing them: the read after the exit gets them. Read
    from the engine's file, the file after the exit holds them all."""
    lines = 100_000
    job_id = rig.place()
    ref = TaskRef(job_id, 0, "main", 0)
    files = EngineLogFiles.discover(rig.docker, setting)
    assert (files is not None) == (setting == AUTO)
    shipping = LogShipping(rig.store, max_lines=2 * lines, files=files)
    try:
        container = rig.run(job_id, f"seq 1 {lines}")
        shipper = shipping.ensure(container, ref)
        # Told as soon as it exited, as the die event tells the monitor; not
        # before: the engine's file holds the whole log only once it exited.
        rig.exited(container)
        shipper.container_exited()
        assert shipping.drain(container, ref, DRAIN_SECONDS)
    finally:
        shipping.close()
    assert rig.log(job_id) == [str(n) for n in range(1, lines + 1)]
