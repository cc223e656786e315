"""An OpenPAI protocol v2 job end to end: the two-role example of examples/,
with parameters and completion rules, submitted by `pai submit` and, as
OpenPAI's clients do, as YAML through the `/rest-server/` prefix, runs on
the real services and Docker engine to SUCCEEDED."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import yaml
from click.testing import CliRunner

from bench.live_platform import USER, USER_PASSWORD, Platform
from pai_cli.main import cli
from tests.support.platform import one_node_platform

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "v2-two-roles.yaml"


@pytest.fixture(scope="module")
def v2_platform(redis_server: str, docker_client: docker.DockerClient, test_image: str,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    with one_node_platform(redis_server, docker_client, test_image,
                           tmp_path_factory.mktemp("v2"), db=3, name="v2",
                           port_range="28000-28999") as pai:
        yield pai


def assert_two_roles_succeeded(platform: Platform, name: str) -> None:
    detail = platform.wait_state(name, timeout=180)
    assert detail["jobStatus"]["state"] == "SUCCEEDED", detail["jobStatus"]
    log = platform.log(name, "worker", 0)
    assert "step 3: hello from v2" in log, log
    assert "server list " in platform.log(name, "worker", 0)


def test_pai_submit_runs_the_two_role_v2_example(v2_platform: Platform,
                                                 tmp_path: Path) -> None:
    env = {"PAI_CONFIG": str(tmp_path / "config.yaml"), "PAI_CLUSTER": None,
           "COLUMNS": "250"}
    login = CliRunner().invoke(cli, ["login", "--username", USER, "--password-stdin",
                                     v2_platform.url], input=USER_PASSWORD + "\n", env=env)
    assert login.exit_code == 0, login.stderr
    name = f"v2-cli-{uuid.uuid4().hex[:8]}"

    done = CliRunner().invoke(cli, ["submit", str(EXAMPLE), "--name", name, "--wait"],
                              env=env)

    assert done.exit_code == 0, (done.stdout, done.stderr)
    assert done.stdout.splitlines()[-1] == f"job {name} SUCCEEDED"
    assert_two_roles_succeeded(v2_platform, name)


def test_yaml_through_the_rest_server_prefix_runs(v2_platform: Platform) -> None:
    name = f"v2-rest-{uuid.uuid4().hex[:8]}"
    job = yaml.safe_load(EXAMPLE.read_text())
    job["name"] = name
    resp = v2_platform.http.post(f"{v2_platform.url}/rest-server/api/v2/jobs",
                                 data=yaml.safe_dump(job),
                                 headers={"Content-Type": "text/yaml"}, timeout=30)
    assert resp.status_code == 202, resp.text
    assert_two_roles_succeeded(v2_platform, name)
    shown = v2_platform.http.get(
        f"{v2_platform.url}/rest-server/api/v1/user/{USER}/jobs/{name}/config",
        headers={"Accept": "text/yaml"}, timeout=30)
    assert yaml.safe_load(shown.text)["protocolVersion"] == 2
