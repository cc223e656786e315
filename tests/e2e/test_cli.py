"""The `pai` command line against the running platform (real processes, Redis, Docker).

Commands whose exit code or terminal behaviour matters (login, submit --wait,
wait after stop, an unreachable server) run as real subprocesses of the
installed console script; the rest run in-process with click's CliRunner,
which is faster and still talks HTTP to the real API.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from click.testing import CliRunner, Result

from bench.live_platform import Platform, free_port, wait_for
from pai_cli.main import cli

PAI = Path(sys.executable).parent / "pai"
ALICE, ALICE_PASSWORD = "alice", "alice-password"


def _env(config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PAI_CLUSTER", "COLUMNS")}
    env["PAI_CONFIG"] = str(config)
    return env


def run_pai(config: Path, *args: str, stdin: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real console script, as a user's shell runs it."""
    return subprocess.run([str(PAI), *args], env=_env(config), input=stdin, text=True,
                          capture_output=True, timeout=timeout, check=False)


class Pai:
    """`pai` in-process for one login (a config file of its own)."""

    def __init__(self, config: Path) -> None:
        self.config = config

    def __call__(self, *args: str, stdin: str | None = None) -> Result:
        return CliRunner().invoke(cli, list(args), input=stdin,
                                  env={"PAI_CONFIG": str(self.config), "PAI_CLUSTER": None,
                                       "COLUMNS": "250"})

    def ok(self, *args: str) -> str:
        result = self(*args)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--output", "json"))


def login(platform: Platform, config: Path, user: str, password: str) -> None:
    done = run_pai(config, "login", "--username", user, "--password-stdin", platform.url,
                   stdin=password + "\n")
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def alice_config(platform: Platform, tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = tmp_path_factory.mktemp("alice") / "config.yaml"
    login(platform, config, ALICE, ALICE_PASSWORD)
    return config


@pytest.fixture
def pai(alice_config: Path) -> Pai:
    return Pai(alice_config)


@pytest.fixture
def job_file(platform: Platform, tmp_path: Path) -> Callable[..., Path]:
    def write(name: str, command: str, **extra: Any) -> Path:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(platform.config(name, command, **extra), indent=2))
        return path
    return write


@pytest.fixture
def stop_afterwards(platform: Platform) -> Iterator[list[str]]:
    """Names of alice's jobs to stop when the test ends, so their GPUs come free."""
    names: list[str] = []
    yield names
    for name in names:
        platform.stop(name)
    for name in names:
        platform.wait_state(name)


# ----------------------------------------------------------------- logins


def test_login_with_password_stdin_stores_a_private_token(platform: Platform,
                                                          tmp_path: Path) -> None:
    config = tmp_path / "pai" / "config.yaml"
    login(platform, config, ALICE, ALICE_PASSWORD)

    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    stored = yaml.safe_load(config.read_text())
    name = platform.url.split("://", 1)[1]
    assert stored["current"] == name
    cluster = stored["clusters"][name]
    assert cluster["url"] == platform.url and cluster["username"] == ALICE
    token = cluster["token"]
    assert requests.get(f"{platform.url}/api/v1/jobs", timeout=10,
                        headers={"Authorization": f"Bearer {token}"}).status_code == 200

    pai = Pai(config)
    assert name in pai.ok("use")
    assert pai.ok("logout") == f"logged out of {name}\n"
    assert requests.get(f"{platform.url}/api/v1/jobs", timeout=10,
                        headers={"Authorization": f"Bearer {token}"}).status_code == 401
    after = pai("jobs")
    assert after.exit_code == 1
    assert after.stderr == f"error: not logged in to {name}; run pai login --cluster {name} " \
                           f"--username alice {platform.url}\n"


def test_a_wrong_password_prints_the_servers_error(platform: Platform, tmp_path: Path) -> None:
    done = run_pai(tmp_path / "config.yaml", "login", "--username", ALICE, "--password-stdin",
                   platform.url, stdin="wrong-password\n")

    assert done.returncode == 1
    assert done.stderr == ("error: IncorrectPasswordError: the user name or the password is "
                           "incorrect\n")
    assert not (tmp_path / "config.yaml").exists()


def test_clusters_are_contexts(platform: Platform, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    login(platform, config, ALICE, ALICE_PASSWORD)
    done = run_pai(config, "login", "--cluster", "admin", "--username",
                   platform.env["PAI_ADMIN_USER"], "--password-stdin", platform.url,
                   stdin=platform.env["PAI_ADMIN_PASSWORD"] + "\n")
    assert done.returncode == 0, done.stderr
    assert "(admin)" in done.stdout
    pai = Pai(config)

    assert yaml.safe_load(config.read_text())["current"] == "admin"
    alice = platform.url.split("://", 1)[1]
    assert pai.ok("use", alice) == f"now using {alice} ({platform.url})\n"
    assert yaml.safe_load(config.read_text())["current"] == alice
    assert pai.ok("--cluster", "admin", "logout", "--forget") == "logged out of admin\n"
    assert list(yaml.safe_load(config.read_text())["clusters"]) == [alice]
    unknown = pai("use", "nowhere")
    assert unknown.exit_code == 1 and "no cluster named nowhere" in unknown.stderr


def test_a_revoked_or_expired_login_says_how_to_renew_it(platform: Platform,
                                                          tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    login(platform, config, ALICE, ALICE_PASSWORD)
    stored = yaml.safe_load(config.read_text())
    name = stored["current"]
    token = stored["clusters"][name]["token"]
    renew = f"run pai login --cluster {name} --username alice {platform.url}"

    requests.delete(f"{platform.url}/api/v1/token", timeout=10,
                    headers={"Authorization": f"Bearer {token}"}).raise_for_status()
    revoked = Pai(config)("jobs")
    assert revoked.exit_code == 1
    assert revoked.stderr == f"error: your login to {name} has expired; {renew}\n"

    stored["clusters"][name]["expires"] = 1000
    config.write_text(yaml.safe_dump(stored))
    expired = Pai(config)("status", "anything")
    assert expired.stderr == f"error: your login to {name} has expired; {renew}\n"


def test_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "config.yaml"

    refused = run_pai(config, "login", "--username", ALICE, "--password-stdin", url,
                      stdin="x\n")
    assert refused.returncode == 1
    assert refused.stderr == f"error: cannot reach {url}: connection refused\n"

    config.write_text(yaml.safe_dump({"current": "gone", "clusters": {
        "gone": {"url": url, "username": ALICE, "token": "t", "expires": None}}}))
    for args in (["jobs"], ["status", "x"], ["logs", "x", "-f"], ["nodes", "-o", "json"]):
        done = run_pai(config, *args)
        assert done.returncode == 1, args
        assert done.stdout == ""
        assert done.stderr == f"error: cannot reach {url}: connection refused\n", args


# ------------------------------------------------------------------- jobs


def test_submit_wait_exits_zero_when_the_job_succeeds(
        platform: Platform, alice_config: Path, job_file: Callable[..., Path],
        unique: Callable[[str], str]) -> None:
    name = unique("cli-ok")
    done = run_pai(alice_config, "submit", str(job_file(name, "echo hello from $PAI_JOB_NAME")),
                   "--wait")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"submitted job {name} (WAITING)"
    assert lines[1] == f"{platform.url}/api/v1/user/alice/jobs/{name}"
    assert lines[-1] == f"job {name} SUCCEEDED"
    assert platform.detail(name)["jobStatus"]["state"] == "SUCCEEDED"


def test_submit_wait_exits_with_the_jobs_exit_code(
        platform: Platform, alice_config: Path, job_file: Callable[..., Path],
        unique: Callable[[str], str]) -> None:
    name = unique("cli-three")
    done = run_pai(alice_config, "submit", str(job_file(name, "exit 3")), "--wait")

    assert done.returncode == 3, (done.stdout, done.stderr)
    assert f"job {name} FAILED (exit code 3)" in done.stderr


def test_stopping_a_job_makes_wait_exit_130(
        platform: Platform, alice_config: Path, pai: Pai, job_file: Callable[..., Path],
        unique: Callable[[str], str]) -> None:
    name = unique("cli-stop")
    pai.ok("submit", str(job_file(name, "sleep 300")))
    platform.wait_state(name, "RUNNING")
    waiter = subprocess.Popen([str(PAI), "wait", name], env=_env(alice_config), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stopped = pai("stop", name)
        assert stopped.exit_code == 0, stopped.stderr
        assert stopped.stdout.startswith(f"stop requested for job {name}")
        _, err = waiter.communicate(timeout=120)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 130, err
    assert f"job {name} STOPPED" in err
    assert pai("wait", name).exit_code == 130


def test_a_job_file_with_comments_and_from_stdin(
        platform: Platform, pai: Pai, tmp_path: Path, unique: Callable[[str], str]) -> None:
    name = unique("cli-commented")
    path = tmp_path / "commented.json"
    path.write_text(f"""// a job as OpenPAI's documents write it
{{
  "jobName": "{name}", // the name
  /* the image, built
     locally */
  "image": "{platform.image}",
  "jobEnvs": {{"URL": "http://example.com/x"}},
  "taskRoles": [
    {{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 128,
      "gpuNumber": 0, "command": "echo $URL"}}  // one role
  ]
}}
""")
    assert pai.ok("submit", str(path)).startswith(f"submitted job {name} ")
    assert pai("wait", name).exit_code == 0
    assert pai.ok("logs", name) == "http://example.com/x\n"

    renamed = unique("cli-stdin")
    result = pai("submit", "-", "--name", renamed, stdin=path.read_text())
    assert result.exit_code == 0, result.stderr
    assert pai.json("config", renamed)["jobName"] == renamed


def test_submit_yaml_and_dry_run(platform: Platform, pai: Pai, tmp_path: Path,
                                 unique: Callable[[str], str]) -> None:
    name = unique("cli-yaml")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(platform.config(name, "true")))

    assert pai.ok("submit", str(path), "--dry-run") == \
        f"job config {name} is valid (dry run: nothing submitted)\n"
    assert pai("status", name).exit_code == 1  # nothing was submitted
    dry = pai.json("submit", str(path), "--dry-run")
    assert dry["config"]["jobName"] == name


def test_a_bad_config_prints_every_field_error(
        platform: Platform, pai: Pai, tmp_path: Path, unique: Callable[[str], str]) -> None:
    config = platform.config(unique("cli-bad"), "true")
    config["taskRoles"][0]["memoryMB"] = 10
    config["taskRoles"][0]["cpuNumber"] = 0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(config))

    result = pai("submit", str(path))

    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: InvalidJobConfigError: ")
    assert any(line.startswith("  taskRoles.0.memoryMB: ") for line in lines[1:]), lines
    assert any(line.startswith("  taskRoles.0.cpuNumber: ") for line in lines[1:]), lines
    assert "Traceback" not in result.output


def test_an_unreadable_job_file_is_one_line(pai: Pai, tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "jobName": "x"\n  "image": "y"\n}\n')

    result = pai("submit", str(broken))
    assert result.exit_code == 1
    assert result.stderr == f"error: {broken}:3:3: invalid JSON: Expecting ',' delimiter\n"
    missing = pai("submit", str(tmp_path / "nope.json"))
    assert missing.exit_code == 1 and "cannot read" in missing.stderr


def test_read_commands_as_tables_and_json(
        platform: Platform, pai: Pai, job_file: Callable[..., Path],
        unique: Callable[[str], str]) -> None:
    name = unique("cli-read")
    pai.ok("submit", str(job_file(name, "echo one; echo two", gpus=2)))
    assert pai("wait", name).exit_code == 0

    rows = pai.json("jobs", "--limit", "100")
    assert name in [row["name"] for row in rows]
    table = pai.ok("jobs", "--state", "succeeded", "--limit", "100")
    assert table.splitlines()[0].split() == ["NAME", "USER", "VC", "CLASS", "STATE", "GPUS",
                                             "SUBMITTED", "DURATION", "RETRIES"]
    row = next(line.split() for line in table.splitlines() if line.startswith(name + " "))
    assert row[1:6] == ["alice", "default", "test", "SUCCEEDED", "2"]

    detail = pai.json("status", name)
    assert detail["jobStatus"]["state"] == "SUCCEEDED"
    status = pai.ok("status", name)
    assert f"alice/{name}" in status and "Tasks (attempt 0)" in status
    assert platform.node in status

    assert pai.ok("logs", name, "--role", "main", "--index", "0") == "one\ntwo\n"
    assert pai.ok("logs", name, "--tail", "1") == "two\n"
    no_role = pai("logs", name, "--role", "nope")
    assert no_role.exit_code == 1
    assert no_role.stderr == f"error: job {name} has no role nope (roles: main)\n"

    assert pai.json("config", name)["taskRoles"][0]["gpuNumber"] == 2
    assert yaml.safe_load(pai.ok("config", name, "-o", "yaml"))["jobName"] == name

    nodes = pai.json("nodes")
    assert platform.node in [n["name"] for n in nodes]
    assert platform.node in pai.ok("nodes")
    assert "default" in pai.json("vcs")
    assert pai.ok("vcs").splitlines()[0].split()[:3] == ["NAME", "GUARANTEED", "GPUS"]


def test_logs_follow_until_the_task_ends(
        platform: Platform, pai: Pai, job_file: Callable[..., Path],
        unique: Callable[[str], str]) -> None:
    name = unique("cli-follow")
    pai.ok("submit", str(job_file(name, "for i in 1 2 3; do echo line $i; sleep 0.3; done")))

    assert pai.ok("logs", name, "-f") == "line 1\nline 2\nline 3\n"
    assert platform.wait_state(name)["jobStatus"]["state"] == "SUCCEEDED"


def test_exec_prints_the_output_and_exits_with_the_commands_code(
        platform: Platform, pai: Pai, alice_config: Path, job_file: Callable[..., Path],
        unique: Callable[[str], str], stop_afterwards: list[str]) -> None:
    name = unique("cli-exec")
    pai.ok("submit", str(job_file(name, "sleep 300")))
    stop_afterwards.append(name)
    platform.wait_state(name, "RUNNING")

    done = run_pai(alice_config, "exec", name, "--", "sh", "-c", "echo hi $PAI_JOB_NAME; exit 5")
    assert (done.returncode, done.stdout, done.stderr) == (5, f"hi {name}\n", "")

    # role and index given; the command's own options are not pai's
    listed = run_pai(alice_config, "exec", name, "main", "0", "--", "ls", "-d", "/")
    assert (listed.returncode, listed.stdout) == (0, "/\n")

    killed = run_pai(alice_config, "exec", name, "--timeout", "1", "--", "sh", "-c",
                     "echo before; sleep 300")
    assert (killed.returncode, killed.stdout) == (124, "before\n")
    assert "killed after 1 s" in killed.stderr

    no_task = pai("exec", name, "main", "3", "--", "true")
    assert no_task.exit_code == 1 and "tasks 0..0" in no_task.stderr

    platform.stop(name)
    platform.wait_state(name)
    finished = pai("exec", name, "--", "true")
    assert finished.exit_code == 1 and "ConflictJobError" in finished.stderr


def test_status_says_why_a_job_waits(
        platform: Platform, pai: Pai, job_file: Callable[..., Path],
        unique: Callable[[str], str], stop_afterwards: list[str]) -> None:
    first, second = unique("cli-hog"), unique("cli-queued")
    stop_afterwards += [first, second]
    pai.ok("submit", str(job_file(first, "sleep 300", gpus=8)))
    platform.wait_state(first, "RUNNING")
    pai.ok("submit", str(job_file(second, "true", gpus=8)))
    reason = wait_for(lambda: platform.detail(second)["jobStatus"]["waitingReason"],
                      what="a waiting reason")

    status = pai.ok("status", second)
    assert "WAITING" in status
    waiting = next(line for line in status.splitlines() if line.startswith("Waiting for"))
    assert waiting.split(None, 2)[2].startswith(reason)
    assert "Position" in status and "1 in default (0 ahead)" in status
    listed = pai.ok("jobs", "--waiting", "--limit", "100")
    assert listed.splitlines()[0].split()[-2:] == ["WAITING", "FOR"]
    assert second in listed and first not in listed


def test_an_admin_reads_another_users_jobs(
        platform: Platform, pai: Pai, job_file: Callable[..., Path], tmp_path: Path,
        unique: Callable[[str], str]) -> None:
    name = unique("cli-theirs")
    pai.ok("submit", str(job_file(name, "echo mine")))
    assert pai("wait", name).exit_code == 0
    admin = Pai(tmp_path / "admin.yaml")
    login(platform, admin.config, platform.env["PAI_ADMIN_USER"],
          platform.env["PAI_ADMIN_PASSWORD"])

    assert pai.json("status", name)["jobStatus"]["username"] == "alice"
    assert admin.json("status", name, "--user", "alice")["name"] == name
    assert admin.json("--user", "alice", "status", name)["name"] == name
    assert admin.ok("logs", name, "--user", "alice") == "mine\n"
    assert name in [r["name"] for r in admin.json("jobs", "--all", "--limit", "200")]
    assert name in [r["name"] for r in admin.json("jobs", "--user", "alice", "--limit", "200")]
    assert admin.json("jobs") == [] or all(r["username"] == "root" for r in admin.json("jobs"))

    refused = pai("config", name, "--user", "root")
    assert refused.exit_code == 1 and refused.stderr.startswith("error: ")


