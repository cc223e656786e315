"""`pai run`: its refusals and its dry run, which needs no Docker."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pai_cli.main import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def pai(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_without_local_it_says_what_it_does() -> None:
    code, _, err = pai("run", str(EXAMPLES / "hello-world.json"))
    assert code == 2 and "add --local" in err


def test_a_dry_run_prints_each_container(tmp_path: Path) -> None:
    code, out, _ = pai("run", "--local", "--dry-run", "--user", "alice", "--storage",
                       str(tmp_path), "-o", "json", str(EXAMPLES / "distributed.json"))

    assert code == 0
    plan = json.loads(out)
    assert [c["task"] for c in plan["containers"]] == [
        "ps_server[0]", "ps_server[1]", "worker[0]", "worker[1]"]
    worker = plan["containers"][2]
    assert worker["image"] == "pai-test/busybox:latest" and worker["network"] == "host"
    assert worker["environment"]["PAI_USER_NAME"] == "alice"
    assert worker["environment"]["PAI_TASK_ROLE_0_HOST_LIST"].startswith("127.0.0.1:")
    assert not any(tmp_path.iterdir())  # a dry run creates no folder


def test_the_dry_run_reads_yaml_and_commented_json(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text('// OpenPAI style\n{"jobName": "c", "image": "x", "taskRoles": [{"name": "m",'
                   ' "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128, "command": "true"}]}')
    code, out, _ = pai("run", "--local", "--dry-run", "--storage", str(tmp_path), str(job))
    assert code == 0 and yaml.safe_load(out)["containers"][0]["command"][-1] == "true"


def test_an_invalid_config_names_its_fields(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text('{"jobName": "bad name", "image": "x", "taskRoles": []}')
    code, _, err = pai("run", "--local", "--dry-run", "--storage", str(tmp_path), str(job))
    assert code == 1
    assert "error: InvalidJobConfigError" in err and "jobName:" in err and "taskRoles:" in err


def test_without_the_platforms_package_it_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "services.localrun", None)
    code, _, err = pai("run", "--local", str(EXAMPLES / "hello-world.json"))
    assert code == 1 and 'pip install ./ "./cli[local]"' in err
