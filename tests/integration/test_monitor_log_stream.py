"""The monitor's log stream on the real engine: one request per container life.

`LogStream` opens `docker logs --follow` without the SDK's inspect (the
stream's first byte says whether the container has a TTY) and tells a
stream Docker ended (the container stopped) from one that broke. A shipper
whose stream ended with the container, once the monitor saw the stop, asks
Docker nothing more: no inspect, no second read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import docker
import pytest
import redis
import requests
from docker.errors import NotFound

from services.monitor.logs import LogShipping, LogStream
from shared.containers import TaskRef
from tests.integration.test_monitor_lifecycle import GATE, Rig, release, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.redis]

DRAIN_SECONDS = 30.0


@pytest.fixture
def rig(redis_server: str, redis_client: redis.Redis, docker_client: docker.DockerClient,
        test_image: str, test_labels: dict[str, str]) -> Iterator[Rig]:
    rig = Rig(redis_server, redis_client, docker_client, test_image, test_labels)
    try:
        yield rig
    finally:
        rig.close()


class EngineCalls:
    """The paths of the requests a Docker client makes (a requests response hook)."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.paths: list[str] = []
        self._lock = threading.Lock()
        self._hooks = client.api.hooks["response"]
        self._hooks.append(self._seen)

    def _seen(self, response: requests.Response, *args: object, **kwargs: object) -> None:
        with self._lock:
            self.paths.append(requests.utils.urlparse(response.url).path)

    def ending(self, suffix: str) -> list[str]:
        with self._lock:
            return [p for p in self.paths if p.endswith(suffix)]

    def close(self) -> None:
        self._hooks.remove(self._seen)


def _text(chunks: Iterator[bytes]) -> list[str]:
    """The messages of a timestamped log, without the stamps."""
    return [line.split(b" ", 1)[1].decode() for line in b"".join(chunks).splitlines()]


def test_a_stream_that_docker_ends_with_its_container_has_ended(rig: Rig) -> None:
    container = rig.exited(rig.run(rig.place(), "echo out; echo err >&2; echo more"))
    stream = LogStream(rig.docker.api, str(container.id), None)
    lines = _text(iter(stream))
    assert sorted(lines) == ["err", "more", "out"]
    assert stream.ended


def test_a_stream_closed_under_its_reader_has_not_ended(rig: Rig) -> None:
    container = rig.run(rig.place(), f"echo first; {GATE}")
    try:
        stream = LogStream(rig.docker.api, str(container.id), None)
        chunks = iter(stream)
        assert b"first" in next(chunks)
        stream.close()  # as an engine restart or a shipper's stop would
        assert list(chunks) == []
        assert not stream.ended
    finally:
        release(container)


def test_a_tty_container_streams_raw_output(rig: Rig, test_image: str,
                                            test_labels: dict[str, str]) -> None:
    container = rig.docker.containers.run(test_image, ["sh", "-c", "echo on-a-tty"], tty=True,
                                          detach=True, labels=test_labels,
                                          network_mode="host")
    try:
        assert rig.docker.api.wait(container.id, timeout=60)["StatusCode"] == 0
        stream = LogStream(rig.docker.api, str(container.id), None)
        output = b"".join(c if isinstance(c, bytes) else c.encode() for c in stream)
        assert output.rstrip().endswith(b"on-a-tty")
        assert stream.ended
    finally:
        container.remove(force=True)


def test_the_log_of_a_missing_container_is_not_found(rig: Rig) -> None:
    with pytest.raises(NotFound):
        LogStream(rig.docker.api, "0" * 64, None)


def test_a_drained_exit_reads_the_log_once_and_inspects_nothing(rig: Rig) -> None:
    job_id = rig.place()
    container = rig.run(job_id, f"seq 1 5; {GATE}; seq 6 10")
    ref = TaskRef(job_id, 0, "main", 0)
    shipping = LogShipping(rig.store, max_lines=1000)
    calls = EngineCalls(rig.docker)
    try:
        shipper = shipping.ensure(container, ref)
        wait_for(lambda: rig.log(job_id) == [str(n) for n in range(1, 6)], "the first lines")
        shipper.container_exited()  # the die event is seen before the stream ends: no wait
        release(container)
        rig.docker.api.wait(container.id, timeout=60)
        before = len(calls.ending("/json"))  # the test's own wait and inspects
        assert shipping.drain(container, ref, DRAIN_SECONDS)
        assert rig.log(job_id) == [str(n) for n in range(1, 11)]
        assert len(calls.ending("/logs")) == 1
        assert len(calls.ending("/json")) == before
    finally:
        calls.close()
        shipping.close()
