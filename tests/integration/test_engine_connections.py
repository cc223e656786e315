"""The platform's Docker client reuses one connection to a local engine.

The SDK pools connections by URL, and a container's URLs name its id, so
without `reuse_engine_connections` every call about a new container opened a
new connection. These run on the real engine: calls about many containers go
over one connection, and what hijacks or streams a connection (exec, a log
follow) still works beside it.
"""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest

from shared.infra.config import load_settings
from shared.node import execs
from shared.node.containers import EngineAdapter, docker_client, reuse_engine_connections

pytestmark = pytest.mark.docker


@pytest.fixture
def client(docker_client: docker.DockerClient) -> Iterator[docker.DockerClient]:
    # `docker_client` (the suite's) proves the engine answers first.
    reused = docker_client_of_platform()
    yield reused
    reused.close()


def docker_client_of_platform() -> docker.DockerClient:
    return docker_client(load_settings())


def _engine_pools(client: docker.DockerClient) -> list[object]:
    adapter = client.api._custom_adapter
    assert isinstance(adapter, EngineAdapter)
    keys = adapter.pools.keys()  # the container refuses plain iteration
    return [adapter.pools[key] for key in keys]


def test_calls_about_many_containers_go_over_one_connection(
        client: docker.DockerClient, test_image: str, test_labels: dict[str, str]) -> None:
    ids = [client.api.create_container(test_image, ["true"], labels=test_labels)["Id"]
           for _ in range(30)]  # more than the SDK's 25 pools
    try:
        for container_id in ids:
            assert client.api.inspect_container(container_id)["State"]["Status"] == "created"
    finally:
        for container_id in ids:
            client.api.remove_container(container_id, force=True)
    pools = _engine_pools(client)
    assert len(pools) == 1
    opened = [conn for conn in pools[0].pool.queue if conn is not None]  # type: ignore[attr-defined]
    assert len(opened) == 1


def test_exec_and_a_log_follow_work_beside_reused_connections(
        client: docker.DockerClient, test_image: str, test_labels: dict[str, str]) -> None:
    container = client.containers.run(
        test_image, ["sh", "-c", "echo first; read line; echo second"], detach=True,
        stdin_open=True, labels=test_labels, network_mode="host")
    try:
        # An exec's connection is hijacked: it must never be handed out again.
        exec_id = client.api.exec_create(container.id, ["sh", "-c", "echo from-exec"])["Id"]
        assert client.api.exec_start(exec_id) == b"from-exec\n"
        assert execs.exit_code(client.api, exec_id) == 0
        assert client.api.inspect_container(container.id)["State"]["Running"] is True
        socket = container.attach_socket(params={"stdin": 1, "stream": 1})
        socket._sock.sendall(b"go\n")
        socket.close()
        lines = b"".join(container.logs(stream=True, follow=True)).split()
        assert lines == [b"first", b"second"]
        assert client.api.wait(container.id, timeout=60)["StatusCode"] == 0
        assert client.api.inspect_container(container.id)["State"]["Status"] == "exited"
    finally:
        container.remove(force=True)


def test_an_engine_not_on_a_unix_socket_is_left_as_it_is() -> None:
    client = docker.DockerClient(base_url="tcp://127.0.0.1:9", version="1.45")
    adapter = getattr(client.api, "_custom_adapter", None)
    reuse_engine_connections(client)
    assert getattr(client.api, "_custom_adapter", None) is adapter
    assert client.api.trust_env is True
    client.close()
