"""Session fixtures shared by every test: a throwaway Redis and the Docker engine.

Both are real (docs/design.md, "Running and testing"). `make test` makes sure `redis-server` is
installed, that a Docker engine answers (DOCKER_HOST) and that the test image
exists; run bare `pytest` and these fixtures still start Redis themselves and
build the image, but they fail, never skip, when Docker does not answer.

Containers a test creates must carry `test_labels` (or at least
`pai.test.session=<test_session_label>`) so the session removes them at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator

import docker
import pytest
import redis
from docker.errors import DockerException, ImageNotFound
from docker.models.containers import Container

from bench import free_port
from tests.support import REPO_ROOT
from tests.support.redis_server import (
    OwnRedis,
    operator_url,
    redis_credentials,
    remember_operator,
    start_redis,
    stop_redis,
)

TEST_IMAGE = "pai-test/busybox:latest"
BUILD_TEST_IMAGE = REPO_ROOT / "scripts" / "build-test-image.sh"
SSH_TEST_IMAGE = "pai-test/sshd:latest"
BUILD_SSH_TEST_IMAGE = REPO_ROOT / "scripts" / "build-ssh-test-image.sh"
PYTORCH_IMAGE = "pai-test/pytorch:latest"
BUILD_PYTORCH_IMAGE = REPO_ROOT / "scripts" / "build-pytorch-image.sh"
# Within the first PyTorch test's time limit (pytest-timeout counts its fixtures).
PYTORCH_BUILD_SECONDS = 200
SESSION_LABEL = "pai.test.session"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a throwaway redis-server for this session (or PAI_TEST_REDIS_URL)."""
    url = os.environ.get("PAI_TEST_REDIS_URL")
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail(
            "redis-server is not on PATH: run `make test` (it installs Debian's redis-server "
            "when root) or install it yourself, or set PAI_TEST_REDIS_URL."
        )
    datadir = tmp_path_factory.mktemp("redis")
    for _ in range(5):
        port = free_port()
        proc = start_redis(binary, datadir, port)
        if proc is not None:
            break
    else:
        log = (datadir / "redis.log").read_text(errors="replace")[-2000:]
        pytest.fail(f"redis-server did not start; the end of its log:\n{log}")
    assert proc is not None
    credentials = redis_credentials(datadir)
    url = credentials.url("127.0.0.1", port)
    remember_operator(url, credentials.url("127.0.0.1", port, operator=True))
    try:
        yield url
    finally:
        stop_redis(proc)


@pytest.fixture
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRedis]:
    """A redis-server of this test's own, to stop, freeze or restart."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not on PATH: run `make test`"
    datadir = tmp_path_factory.mktemp("own-redis")
    proc = None
    for _ in range(5):
        port = free_port()
        proc = start_redis(binary, datadir, port)
        if proc is not None:
            break
    assert proc is not None, "redis-server did not start"
    server = OwnRedis(redis_credentials(datadir).url("127.0.0.1", port), proc, datadir, port)
    try:
        yield server
    finally:
        server.thaw()
        stop_redis(server.proc)


@pytest.fixture
def redis_client(redis_server: str) -> Iterator[redis.Redis]:
    """A client (str responses) on a database flushed before the test."""
    with redis.Redis.from_url(operator_url(redis_server)) as operator:
        operator.flushdb()
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def test_session_label() -> str:
    """This session's id: label containers `pai.test.session=<id>` to have them removed."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def test_labels(test_session_label: str) -> dict[str, str]:
    """The labels every container a test starts should carry."""
    return {"pai.test": "1", SESSION_LABEL: test_session_label}


def _remove_test_containers(client: docker.DockerClient, session: str) -> None:
    """This session's containers, and test containers that carry no session at all."""
    for container in client.containers.list(all=True, filters={"label": "pai.test=1"}):
        if container.labels.get(SESSION_LABEL, session) != session:
            continue  # another session's, maybe still running on a shared engine
        _remove(container)
    for container in client.containers.list(
        all=True, filters={"label": f"{SESSION_LABEL}={session}"}
    ):
        _remove(container)


def _remove(container: Container) -> None:
    # It may be gone already, or being removed by the engine itself.
    with contextlib.suppress(DockerException):
        container.remove(force=True)


@pytest.fixture(scope="session")
def docker_client(test_session_label: str) -> Iterator[docker.DockerClient]:
    """The engine DOCKER_HOST names; fails the test, never skips, when it does not answer."""
    where = os.environ.get("DOCKER_HOST") or "the default socket /var/run/docker.sock"
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except DockerException as exc:
        pytest.fail(
            f"no Docker engine answers at {where} ({exc}); `make test` starts one "
            "(scripts/runtime.sh docker) and exports DOCKER_HOST.",
            pytrace=False,
        )
    try:
        yield client
    finally:
        _remove_test_containers(client, test_session_label)
        client.close()


@pytest.fixture(scope="session")
def test_image(docker_client: docker.DockerClient) -> str:
    """`pai-test/busybox:latest`, built from Debian's busybox-static when missing."""
    try:
        docker_client.images.get(TEST_IMAGE)
    except ImageNotFound:
        result = subprocess.run(
            ["bash", str(BUILD_TEST_IMAGE), TEST_IMAGE],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            pytest.fail(f"could not build {TEST_IMAGE}:\n{result.stderr}", pytrace=False)
        docker_client.images.get(TEST_IMAGE)
    return TEST_IMAGE


@pytest.fixture(scope="session")
def ssh_test_image(docker_client: docker.DockerClient) -> str:
    """`pai-test/sshd:latest` (Debian with openssh-server), built when missing:
    a debootstrap the first time (about a minute), then from its cached tarball."""
    try:
        docker_client.images.get(SSH_TEST_IMAGE)
    except ImageNotFound:
        result = subprocess.run(["bash", str(BUILD_SSH_TEST_IMAGE), SSH_TEST_IMAGE],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            pytest.fail(f"could not build {SSH_TEST_IMAGE}:\n{result.stderr}", pytrace=False)
        docker_client.images.get(SSH_TEST_IMAGE)
    return SSH_TEST_IMAGE


@pytest.fixture(scope="session")
def pytorch_image(docker_client: docker.DockerClient) -> str:
    """`pai-test/pytorch:latest` (Debian, the CPU PyTorch, scikit-learn,
    Jupyter, examples/pytorch/), built or brought up to date by its script:
    seconds when it is current, minutes the first time. Where it cannot be
    built (no local PyTorch wheel and no package index, no Debian mirror),
    or not within PYTORCH_BUILD_SECONDS, the tests that train are skipped
    with the reason."""
    build = subprocess.Popen(["bash", str(BUILD_PYTORCH_IMAGE), PYTORCH_IMAGE],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        _, errors = build.communicate(timeout=PYTORCH_BUILD_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(build.pid, signal.SIGTERM)
        build.communicate()
        pytest.skip(f"{PYTORCH_IMAGE} takes longer to build than a test may wait "
                    f"({PYTORCH_BUILD_SECONDS} s): run scripts/build-pytorch-image.sh first "
                    "(.ci/run does, in a stage of its own)")
    if build.returncode != 0:
        reason = errors.strip().splitlines()[-1:] or ["no message"]
        pytest.skip(f"{PYTORCH_IMAGE} cannot be built here, so the PyTorch tests do not "
                    f"run: {reason[0]} (scripts/build-pytorch-image.sh)")
    docker_client.images.get(PYTORCH_IMAGE)
    return PYTORCH_IMAGE
