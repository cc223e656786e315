"""SSH into tasks, the pure parts: the config's one field from v1 and v2, the
key pair's format, what goes into the container, and the API's answer shape."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
from hypothesis import given
from hypothesis import strategies as st

from services.api.ssh import containers, key_pair
from services.launcher.environment import task_environment
from services.launcher.ssh import keys_archive, sshd_script
from shared.domain import ssh
from shared.domain.jobspec import InvalidJobConfig, validate_job_config
from shared.domain.jobspec_v2 import convert_v2
from shared.domain.models import JobSpec, Task
from shared.domain.states import TaskState


def _public(comment: str = "alice@laptop") -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    line = key.public_bytes(serialization.Encoding.OpenSSH,
                            serialization.PublicFormat.OpenSSH).decode()
    return f"{line} {comment}"


USER_KEY = _public()
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key() \
    .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def v1(**extra: Any) -> dict[str, Any]:
    return {"jobName": "job1", "image": "busybox",
            "taskRoles": [{"name": "worker", "taskNumber": 2, "cpuNumber": 1, "memoryMB": 256,
                           "command": "sleep 1"}], **extra}


def v2(plugins: Any) -> dict[str, Any]:
    return {"protocolVersion": 2, "name": "job1", "type": "job",
            "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "busybox"}],
            "taskRoles": {"worker": {"instances": 2, "dockerImage": "img",
                                     "resourcePerInstance": {"cpu": 1, "memoryMB": 256},
                                     "commands": ["sleep 1"]}},
            "extras": {"com.microsoft.pai.runtimeplugin": plugins}}


def load(raw: dict[str, Any]) -> dict[str, Any]:
    if "protocolVersion" in raw:
        return convert_v2(raw, username="alice", storage_roots=["/data"]).config
    return validate_job_config(raw, username="alice", storage_roots=["/data"]).config


def rejected(raw: dict[str, Any]) -> dict[str, list[str]]:
    with pytest.raises(InvalidJobConfig) as caught:
        load(raw)
    return caught.value.fields


# --------------------------------------------------------- one stored field

CUSTOM = {"type": "custom", "value": USER_KEY}
PASTED_PRIVATE = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----"
STORED = [
    ("v1-true", v1(ssh=True), {"jobssh": True}),
    ("v1-false", v1(ssh=False), None),
    ("v1-absent", v1(), None),
    ("v1-plugin-shape", v1(ssh={"jobssh": True, "userssh": CUSTOM}),
     {"jobssh": True, "userssh": CUSTOM}),
    ("v1-user-key-only", v1(ssh={"userssh": CUSTOM}), {"jobssh": False, "userssh": CUSTOM}),
    ("v1-trailing-newline-dropped", v1(ssh={"jobssh": False, "userssh": {
        "type": "custom", "value": USER_KEY + "\n"}}), {"jobssh": False, "userssh": CUSTOM}),
    ("v1-rsa-user-key", v1(ssh={"userssh": {"value": RSA_KEY}}),
     {"jobssh": False, "userssh": {"type": "custom", "value": RSA_KEY}}),
    ("v1-both-off", v1(ssh={"jobssh": False, "userssh": {}}), None),
    ("v2-jobssh", v2([{"plugin": "ssh", "parameters": {"jobssh": True}}]), {"jobssh": True}),
    ("v2-both", v2([{"plugin": "ssh", "parameters": {"jobssh": True, "userssh": CUSTOM}}]),
     {"jobssh": True, "userssh": CUSTOM}),
    ("v2-after-another-plugin", v2([{"plugin": "tensorboard"},
                                    {"plugin": "ssh", "parameters": {"jobssh": True}}]),
     {"jobssh": True}),
    ("v2-no-ssh-plugin", v2([{"plugin": "tensorboard"}]), None),
    ("v2-plugin-without-parameters", v2([{"plugin": "ssh"}]), None),
]


def test_a_v2_ssh_plugin_asking_for_no_key_is_stored_only() -> None:
    converted = convert_v2(v2([{"plugin": "ssh", "parameters": {"jobssh": False}}]),
                           username="alice", storage_roots=["/data"])
    assert "ssh" not in converted.config
    assert "extras.com.microsoft.pai.runtimeplugin" in converted.ignored


@pytest.mark.parametrize(("raw", "stored"), [pytest.param(r, s, id=i) for i, r, s in STORED])
def test_v1_and_v2_store_one_ssh_field(raw: dict[str, Any], stored: Any) -> None:
    config = load(raw)
    assert config.get("ssh") == stored
    if stored is not None:  # the stored form is itself valid input
        assert load(v1(ssh=stored))["ssh"] == stored


REFUSED = [
    ("not-a-bool", v1(ssh="yes"), "ssh", "Must be true, false"),
    ("unknown-field", v1(ssh={"jobssh": True, "rootssh": True}), "ssh", "Unknown field"),
    ("jobssh-not-bool", v1(ssh={"jobssh": "true"}), "ssh", "jobssh"),
    ("userssh-type", v1(ssh={"userssh": {"type": "github", "value": USER_KEY}}), "ssh",
     "userssh.type"),
    ("private-key-pasted", v1(ssh={"userssh": {"value": PASTED_PRIVATE}}), "ssh", "private key"),
    ("options-prefix", v1(ssh={"userssh": {"value": f'command="rm -rf /" {USER_KEY}'}}), "ssh",
     "one OpenSSH public key line"),
    ("two-keys", v1(ssh={"userssh": {"value": f"{USER_KEY}\n{RSA_KEY}"}}), "ssh",
     "one OpenSSH public key line"),
    ("garbage-blob", v1(ssh={"userssh": {"value": "ssh-ed25519 AAAAnotakey"}}), "ssh",
     "Not a public key"),
    ("too-long", v1(ssh={"userssh": {"value": "ssh-rsa " + "A" * 20000}}), "ssh",
     "At most"),
    ("ssh-port-label-taken", v1(ssh=True, taskRoles=[{
        "name": "worker", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "command": "x",
        "portList": [{"label": "ssh", "beginAt": 0, "portNumber": 1}]}]),
     "taskRoles.0.portList.0.label", "SSH port"),
    ("v2-bad-key", v2([{"plugin": "ssh", "parameters": {"userssh": {"value": "nope"}}}]),
     "extras.com.microsoft.pai.runtimeplugin.ssh.parameters", "userssh.value"),
]


@pytest.mark.parametrize(("raw", "path", "text"),
                         [pytest.param(r, p, t, id=i) for i, r, p, t in REFUSED])
def test_what_ssh_refuses_is_named(raw: dict[str, Any], path: str, text: str) -> None:
    fields = rejected(raw)
    assert path in fields, fields
    assert any(text in message for message in fields[path]), fields[path]


def test_a_users_own_port_labelled_ssh_is_theirs_without_ssh() -> None:
    raw = v1(taskRoles=[{"name": "worker", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256,
                         "command": "x",
                         "portList": [{"label": "ssh", "beginAt": 0, "portNumber": 1}]}])
    assert load(raw)["taskRoles"][0]["portList"][0]["label"] == "ssh"


@given(st.text(max_size=300))
def test_any_text_is_a_key_or_a_clear_refusal(text: str) -> None:
    try:
        line = ssh.parse_public_key(text)
    except ssh.InvalidSshRequest as error:
        assert str(error)
    else:
        assert "\n" not in line and line == line.strip()


# ------------------------------------------------------------ the job's spec


@pytest.mark.parametrize(("value", "access"), [
    (True, ssh.SshAccess(job_key=True)),
    ({"jobssh": False, "userssh": CUSTOM}, ssh.SshAccess(job_key=False, user_key=USER_KEY)),
    (False, None),
])
def test_every_role_of_an_ssh_job_asks_for_an_ssh_port(value: Any, access: Any) -> None:
    spec = JobSpec.from_config(load(v1(ssh=value)))
    assert spec.ssh == access
    labels = [p.label for p in spec.task_roles[0].ports]
    assert labels == (["ssh"] if access else [])
    if access:
        assert spec.task_roles[0].ports[0].port_number == 1


def test_the_container_is_told_its_ssh_port_as_openpai_names_it() -> None:
    spec = JobSpec.from_config(load(v1(ssh=True)))
    tasks = [Task(role="worker", index=i, node="n1", ip="10.0.0.1",
                  ports={"default": [15000 + i], "ssh": [16000 + i]}) for i in range(2)]
    env = task_environment(spec, "alice", tasks, "worker", 1, default_fs_uri="")
    assert env["PAI_CONTAINER_SSH_PORT"] == "16001"
    assert env["PAI_CONTAINER_HOST_ssh_PORT_LIST"] == "16001"
    assert env["PAI_PORT_LIST_worker_0_ssh"] == "16000"


# ------------------------------------------------------------------ keys


def test_a_job_key_pair_is_openssh_ed25519_that_cryptography_loads() -> None:
    pair = ssh.generate(ssh.key_comment("alice~job1"))

    assert pair.private_key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    private = serialization.load_ssh_private_key(pair.private_key.encode(), password=None)
    assert isinstance(private, ed25519.Ed25519PrivateKey)
    public = serialization.load_ssh_public_key(pair.public_key.encode())
    assert public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) \
        == private.public_key().public_bytes(serialization.Encoding.Raw,
                                             serialization.PublicFormat.Raw)
    assert pair.public_key.endswith(" pai-job:alice~job1")
    assert ssh.pair_of(pair.private_key, "pai-job:alice~job1") == pair
    assert ssh.generate("x").private_key != pair.private_key


@pytest.mark.parametrize(("access", "job_key", "lines"), [
    (ssh.SshAccess(job_key=True), "ssh-ed25519 AAAA job", ["ssh-ed25519 AAAA job"]),
    (ssh.SshAccess(job_key=True, user_key=USER_KEY), "ssh-ed25519 AAAA job",
     ["ssh-ed25519 AAAA job", USER_KEY]),
    (ssh.SshAccess(job_key=False, user_key=USER_KEY), None, [USER_KEY]),
    (ssh.SshAccess(job_key=True), None, []),  # a key lost: nothing authorized, not garbage
])
def test_authorized_keys(access: ssh.SshAccess, job_key: str | None,
                         lines: list[str]) -> None:
    assert ssh.authorized_keys(access, job_key).splitlines() == lines


def test_the_keys_archive_makes_root_ssh_0700_and_the_file_0600_root_owned() -> None:
    data = keys_archive("ssh-ed25519 AAAA job\n", mtime=0)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"root/.ssh", "root/.ssh/authorized_keys"}  # /root as it was
        assert members["root/.ssh"].isdir() and members["root/.ssh"].mode == 0o700
        file = members["root/.ssh/authorized_keys"]
        assert file.isfile() and file.mode == 0o600 and (file.uid, file.gid) == (0, 0)
        extracted = tar.extractfile(file)
        assert extracted is not None and extracted.read() == b"ssh-ed25519 AAAA job\n"


def test_sshd_takes_keys_only_on_the_tasks_port() -> None:
    script = sshd_script(23456)
    assert "/usr/sbin/sshd -p 23456 " in script
    for option in ("PasswordAuthentication=no", "PermitRootLogin=prohibit-password",
                   "KbdInteractiveAuthentication=no", "UsePAM=no"):
        assert f"-o {option}" in script
    assert "ssh-keygen -A" in script


# ------------------------------------------------------------------ answer


def test_the_answer_lists_running_tasks_with_their_ssh_port_as_openpai_does() -> None:
    tasks = [
        Task(role="worker", index=1, state=TaskState.RUNNING, ip="10.0.0.2",
             ports={"default": [15001], "ssh": [15101]}),
        Task(role="worker", index=0, state=TaskState.RUNNING, ip="10.0.0.1",
             ports={"default": [15000], "ssh": [15100]}),
        Task(role="ps", index=0, state=TaskState.LAUNCHING, ip="10.0.0.3",
             ports={"default": [15002], "ssh": [15102]}),
        Task(role="ps", index=1, state=TaskState.WAITING),
    ]
    assert containers(tasks) == [
        {"id": "worker-0", "sshIp": "10.0.0.1", "sshPort": "15100"},
        {"id": "worker-1", "sshIp": "10.0.0.2", "sshPort": "15101"}]
    pair = ssh.KeyPair("PRIVATE", "PUBLIC")
    assert key_pair("/api/v1/user/alice/jobs/job1/ssh", "job1", pair) == {
        "folderPath": "/api/v1/user/alice/jobs/job1/ssh",
        "publicKeyFileName": "job1.pub", "privateKeyFileName": "job1",
        "privateKeyDirectDownloadLink": "/api/v1/user/alice/jobs/job1/ssh/job1",
        "publicKey": "PUBLIC", "privateKey": "PRIVATE"}
