"""`pai ssh`'s pure parts: the ssh command it runs, its files, its task choice."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from pai_cli.commands.ssh import _container, job_file_stem, ssh_command, ssh_folder, write_key
from pai_cli.session import CliError

ANSWER = {"containers": [{"id": "worker-0", "sshIp": "10.0.0.1", "sshPort": "15100"},
                         {"id": "worker-1", "sshIp": "10.0.0.2", "sshPort": "15101"}]}


@pytest.mark.parametrize(("key", "remote", "argv"), [
    (Path("/k"), [], ["ssh", "-p", "15100", "-o", "StrictHostKeyChecking=accept-new",
                      "-o", "UserKnownHostsFile=/kh", "-i", "/k", "-o", "IdentitiesOnly=yes",
                      "root@10.0.0.1"]),
    (None, ["nvidia-smi", "-L"], ["ssh", "-p", "15100", "-o", "StrictHostKeyChecking=accept-new",
                                  "-o", "UserKnownHostsFile=/kh", "root@10.0.0.1", "--",
                                  "nvidia-smi", "-L"]),
])
def test_the_ssh_command(key: Path | None, remote: list[str], argv: list[str]) -> None:
    assert ssh_command("ssh", key, Path("/kh"), "10.0.0.1", "15100", remote) == argv


def test_the_task_is_picked_by_role_and_index() -> None:
    assert _container(ANSWER, "job", "worker", 1)["sshPort"] == "15101"
    with pytest.raises(CliError, match=r"worker\[2\] of job job is not running "
                                       r"\(running: worker-0, worker-1\)"):
        _container(ANSWER, "job", "worker", 2)
    with pytest.raises(CliError, match=r"running: none"):
        _container({"containers": []}, "job", "worker", 0)


def test_a_job_submitted_again_gets_its_own_known_hosts() -> None:
    first = job_file_stem("c", "alice", "job/../x", 1000)
    assert first == "c-alice~job_.._x-1000" and "/" not in first
    assert job_file_stem("c", "alice", "job/../x", 2000) != first


def test_the_key_file_and_its_folder_are_the_users_alone(tmp_path: Path) -> None:
    folder = ssh_folder(tmp_path / "pai" / "config.yaml")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    key = folder / "k"
    write_key(key, "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_text().endswith("-----\n")
    (folder / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):  # a planted link is not followed
        write_key(folder / "link", "secret")
    assert not (tmp_path / "elsewhere").exists()
