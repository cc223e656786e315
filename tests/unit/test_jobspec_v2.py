"""Protocol v2 -> the v1 config a job runs from (shared/domain/jobspec_v2.py).

One row per v2 feature: what the user writes, and the v1 field, ignored
field or error path it must become.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from shared.domain.jobspec import InvalidJobConfig
from shared.domain.jobspec_v2 import REDACTED, convert_v2, is_v2

BASE: dict[str, Any] = {
    "protocolVersion": 2, "name": "job1", "type": "job",
    "prerequisites": [{"name": "img", "type": "dockerimage", "uri": "busybox:1"}],
    "taskRoles": {"worker": {"instances": 2, "dockerImage": "img",
                             "resourcePerInstance": {"cpu": 1, "memoryMB": 256, "gpu": 0},
                             "commands": ["echo a", "echo b"]}},
}


def job(**changes: Any) -> dict[str, Any]:
    """BASE with dotted-path changes (`taskRoles.worker.instances`=3)."""
    out = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = out
        parts = path.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def convert(raw: Any) -> Any:
    return convert_v2(raw, username="alice", storage_roots=["/data"])


def role(config: dict[str, Any], name: str = "worker") -> dict[str, Any]:
    return next(r for r in config["taskRoles"] if r["name"] == name)


ACTS_ON = [
    ("name", job(), lambda c: c["jobName"] == "job1"),
    ("dockerimage", job(), lambda c: c["image"] == "busybox:1"),
    ("instances", job(), lambda c: role(c)["taskNumber"] == 2),
    ("instances-default-1", job(taskRoles__worker__instances=1),
     lambda c: role(c)["taskNumber"] == 1),
    ("resources", job(taskRoles__worker__resourcePerInstance={"cpu": 3, "memoryMB": 512,
                                                                "gpu": 2}),
     lambda c: (role(c)["cpuNumber"], role(c)["memoryMB"], role(c)["gpuNumber"]) == (3, 512, 2)),
    ("ports", job(taskRoles__worker__resourcePerInstance={"cpu": 1, "memoryMB": 256,
                                                            "ports": {"ssh": 1, "http": 2}}),
     lambda c: role(c)["portList"] == [{"label": "ssh", "beginAt": 0, "portNumber": 1},
                                       {"label": "http", "beginAt": 0, "portNumber": 2}]),
    ("commands-joined-by-lines", job(), lambda c: role(c)["command"] == "echo a\necho b"),
    ("parameters", job(parameters={"n": 5, "flag": True},
                       taskRoles__worker__commands=[
                           "run <% $parameters.n %> <%$parameters.flag%>"]),
     lambda c: role(c)["command"] == "run 5 true"),
    ("secrets-substituted", job(secrets={"db": {"pw": "s3cret"}},
                                taskRoles__worker__commands=["login <% $secrets.db.pw %>"]),
     lambda c: role(c)["command"] == "login s3cret"),
    ("min-failed", job(taskRoles__worker__completion={"minFailedInstances": 2}),
     lambda c: role(c)["minFailedTaskCount"] == 2),
    ("min-failed-never", job(taskRoles__worker__completion={"minFailedInstances": -1}),
     lambda c: role(c)["minFailedTaskCount"] == -1),
    ("min-succeeded", job(taskRoles__worker__completion={"minSucceededInstances": 1}),
     lambda c: role(c)["minSucceededTaskCount"] == 1),
    ("min-succeeded-never-is-all", job(taskRoles__worker__completion={
        "minSucceededInstances": -1}), lambda c: role(c)["minSucceededTaskCount"] is None),
    ("job-retry", job(jobRetryCount=3), lambda c: c["retryCount"] == 3),
    ("job-retry-unlimited", job(jobRetryCount=-2), lambda c: c["retryCount"] == -2),
    ("virtual-cluster", job(defaults={"virtualCluster": "vision"}),
     lambda c: c["virtualCluster"] == "vision"),
    ("priority-class", job(extras={"hivedScheduler": {"jobPriorityClass": "prod"}}),
     lambda c: c["extras"]["hivedScheduler"]["jobPriorityClass"] == "prod"),
    ("shm", job(taskRoles__worker__extraContainerOptions={"shmMB": 128}),
     lambda c: role(c)["shmMB"] == 128),
    ("deployment-pre-post", job(
        deployments=[{"name": "d", "taskRoles": {"worker": {"preCommands": ["pre"],
                                                             "postCommands": ["post"]}}}],
        defaults={"deployment": "d"}),
     lambda c: role(c)["command"] == "pre\necho a\necho b\npost"),
    ("deployment-unused-without-default", job(
        deployments=[{"name": "d", "taskRoles": {"worker": {"preCommands": ["pre"]}}}]),
     lambda c: role(c)["command"] == "echo a\necho b"),
    ("task-retry", job(taskRoles__worker__taskRetryCount=2),
     lambda c: role(c)["taskRetryCount"] == 2),
    ("task-retry-zero-is-none", job(taskRoles__worker__taskRetryCount=0),
     lambda c: "taskRetryCount" not in role(c)),
    ("gang-allocation-false", job(extras={"gangAllocation": False}),
     lambda c: c["extras"]["gangAllocation"] is False),
    ("gang-allocation-true", job(extras={"gangAllocation": True}),
     lambda c: c["extras"]["gangAllocation"] is True),
    ("protocol-version-string", job(protocolVersion="2"), lambda c: c["jobName"] == "job1"),
    ("registry-auth", job(prerequisites=[{
        "name": "img", "type": "dockerimage", "uri": "reg.example:5000/team/img:1",
        "auth": {"username": "u", "password": "p", "registryuri": "reg.example:5000"}}],),
     lambda c: c["imageAuth"] == {"username": "u", "password": "p",
                                  "registryuri": "reg.example:5000"}),
    ("registry-auth-from-secrets", job(
        secrets={"registry": {"user": "u", "pw": "s3cret"}},
        prerequisites=[{"name": "img", "type": "dockerimage", "uri": "busybox:1",
                        "auth": {"username": "<% $secrets.registry.user %>",
                                 "password": "<% $secrets.registry.pw %>"}}]),
     lambda c: c["imageAuth"] == {"username": "u", "password": "s3cret"}),
    ("registry-auth-of-an-unused-image", job(prerequisites=[
        {"name": "img", "type": "dockerimage", "uri": "busybox:1"},
        {"name": "other", "type": "dockerimage", "uri": "other:1",
         "auth": {"username": "u", "password": "p"}}]),
     lambda c: "imageAuth" not in c),
]


@pytest.mark.parametrize(("raw", "check"), [pytest.param(r, c, id=i) for i, r, c in ACTS_ON])
def test_v2_fields_pai_acts_on(raw: dict[str, Any], check: Any) -> None:
    assert check(convert(raw).config)


IGNORED = [
    ("description", job(description="d", contributor="me"), ["contributor", "description"]),
    ("registry-auth-other-keys", job(prerequisites=[{
        "name": "img", "type": "dockerimage", "uri": "busybox:1",
        "auth": {"username": "u", "password": "p", "email": "u@x"}}]),
     ["prerequisites.0.auth.email"]),
    ("runtime-plugin", job(extras={"com.microsoft.pai.runtimeplugin": [
        {"plugin": "tensorboard"}]}), ["extras.com.microsoft.pai.runtimeplugin"]),
    ("runtime-plugin-beside-ssh", job(extras={"com.microsoft.pai.runtimeplugin": [
        {"plugin": "ssh", "parameters": {"jobssh": True}}, {"plugin": "tensorboard"}]}),
     ["extras.com.microsoft.pai.runtimeplugin.1"]),
    ("unknown-top-level", job(somethingNew=1), ["somethingNew"]),
    ("hived-other-keys", job(extras={"hivedScheduler": {"jobPriorityClass": "test",
                                                        "taskRoles": {}}}),
     ["extras.hivedScheduler.taskRoles"]),
    ("container-options", job(taskRoles__worker__extraContainerOptions={"infiniband": True}),
     ["taskRoles.worker.extraContainerOptions.infiniband"]),
    ("defaults-other", job(defaults={"virtualCluster": "default", "cluster": "x"}),
     ["defaults.cluster"]),
]


@pytest.mark.parametrize(("raw", "ignored"), [pytest.param(r, g, id=i) for i, r, g in IGNORED])
def test_v2_fields_pai_stores_only_are_listed(raw: dict[str, Any], ignored: list[str]) -> None:
    assert sorted(set(ignored) & set(convert(raw).ignored)) == sorted(ignored)


REFUSED = [
    ("not-an-object", ["x"], "_schema"),
    ("version-1", job(protocolVersion=1), "protocolVersion"),
    ("type-not-job", job(type="component"), "type"),
    ("no-task-roles", job(taskRoles={}), "taskRoles"),
    ("gpu-too-many", job(taskRoles__worker__resourcePerInstance={"cpu": 1, "memoryMB": 256,
                                                                  "gpu": 1000}),
     "taskRoles.worker.resourcePerInstance.gpu"),
    ("gpu-not-number", job(taskRoles__worker__resourcePerInstance={"cpu": 1, "memoryMB": 256,
                                                                    "gpu": "two"}),
     "taskRoles.worker.resourcePerInstance.gpu"),
    ("unknown-resource", job(taskRoles__worker__resourcePerInstance={"cpu": 1, "memoryMB": 256,
                                                                      "gpus": 1}),
     "taskRoles.worker.resourcePerInstance.gpus"),
    ("unknown-image", job(taskRoles__worker__dockerImage="nope"),
     "taskRoles.worker.dockerImage"),
    ("prerequisite-of-another-plugin", job(prerequisites=[
        {"name": "img", "type": "dockerimage", "uri": "busybox:1"},
        {"name": "s", "type": "script", "plugin": "com.example.teamwise", "uri": "x"}]),
     "prerequisites.1"),
    ("data-with-nothing-to-fetch", job(prerequisites=[
        {"name": "img", "type": "dockerimage", "uri": "busybox:1"},
        {"name": "d", "type": "data"}]), "prerequisites.1"),
    ("data-hdfs-without-an-endpoint", job(prerequisites=[
        {"name": "img", "type": "dockerimage", "uri": "busybox:1"},
        {"name": "d", "type": "data", "uri": ["hdfs://nn:9000/d"]}],
        taskRoles__worker__data="d"), "taskRoles.worker.prerequisites"),
    ("output-over-http", job(prerequisites=[
        {"name": "img", "type": "dockerimage", "uri": "busybox:1"},
        {"name": "o", "type": "output", "uri": "http://x/o"}],
        taskRoles__worker__output="o"), "taskRoles.worker.prerequisites"),
    ("role-lists-an-unknown-prerequisite", job(taskRoles__worker__prerequisites=["nope"]),
     "taskRoles.worker.prerequisites.0"),
    ("data-field-names-a-script", job(prerequisites=[
        {"name": "img", "type": "dockerimage", "uri": "busybox:1"},
        {"name": "s", "type": "script", "uri": "http://x/s.sh"}],
        taskRoles__worker__data="s"), "taskRoles.worker.data"),
    ("data-reference", job(taskRoles__worker__data="d"), "taskRoles.worker.data"),
    ("missing-parameter", job(taskRoles__worker__commands=["<% $parameters.nope %>"]),
     "taskRoles.worker.commands"),
    ("missing-secret", job(taskRoles__worker__commands=["<% $secrets.nope %>"]),
     "taskRoles.worker.commands"),
    ("nested-parameter", job(parameters={"p": {"a": 1}}), "parameters.p"),
    ("retry-below-minus-2", job(jobRetryCount=-3), "jobRetryCount"),
    ("completion-zero", job(taskRoles__worker__completion={"minFailedInstances": 0}),
     "taskRoles.worker.completion.minFailedInstances"),
    ("completion-over-instances", job(taskRoles__worker__completion={"minFailedInstances": 5}),
     "taskRoles.worker.completion.minFailedInstances"),
    ("bad-role-name", job(taskRoles={"bad role": BASE["taskRoles"]["worker"]}),
     "taskRoles.bad role.name"),
    ("unknown-deployment", job(defaults={"deployment": "nope"}), "defaults.deployment"),
    ("two-images", job(prerequisites=[
        {"name": "img", "type": "dockerimage", "uri": "busybox:1"},
        {"name": "other", "type": "dockerimage", "uri": "busybox:2"}],
        taskRoles={"a": BASE["taskRoles"]["worker"],
                   "b": {**BASE["taskRoles"]["worker"], "dockerImage": "other"}}),
     "taskRoles"),
    ("secrets-not-an-object", job(secrets=["a"]), "secrets"),
    ("too-many-secrets", job(secrets={f"s{i}": "x" for i in range(101)}), "secrets"),
    ("bad-priority", job(extras={"hivedScheduler": {"jobPriorityClass": "vip"}}),
     "extras.hivedScheduler.jobPriorityClass"),
    ("task-retry-negative", job(taskRoles__worker__taskRetryCount=-1),
     "taskRoles.worker.taskRetryCount"),
    ("task-retry-over-cap", job(taskRoles__worker__taskRetryCount=101),
     "taskRoles.worker.taskRetryCount"),
    ("task-retry-not-number", job(taskRoles__worker__taskRetryCount="two"),
     "taskRoles.worker.taskRetryCount"),
    ("gang-allocation-not-boolean", job(extras={"gangAllocation": "no"}),
     "extras.gangAllocation"),
]


@pytest.mark.parametrize(("raw", "path"), [pytest.param(r, p, id=i) for i, r, p in REFUSED])
def test_v2_refused_with_the_v2_field_path(raw: Any, path: str) -> None:
    with pytest.raises(InvalidJobConfig) as refused:
        convert(raw)
    assert path in refused.value.fields, refused.value.fields


def test_secrets_are_never_shown_back() -> None:
    raw = job(secrets={"db": {"pw": "s3cret"}},
              taskRoles__worker__commands=["login <% $secrets.db.pw %>", "echo s3cret"])
    shown = convert(raw).shown
    assert "s3cret" not in repr(shown)
    assert shown["secrets"] == {"db": {"pw": REDACTED}}
    assert shown["taskRoles"]["worker"]["commands"][0] == "login <% $secrets.db.pw %>"


def test_a_registry_password_is_never_shown_back_even_in_clear() -> None:
    converted = convert(job(prerequisites=[{
        "name": "img", "type": "dockerimage", "uri": "busybox:1",
        "auth": {"username": "u", "password": "in-clear"}}]))
    assert converted.config["imageAuth"]["password"] == "in-clear"  # what the pull needs
    assert converted.shown["prerequisites"][0]["auth"] == {"username": "u", "password": REDACTED}
    assert "in-clear" not in repr(converted.shown)


@pytest.mark.parametrize(("raw", "expected"), [
    pytest.param({"protocolVersion": 2}, True, id="v2"),
    pytest.param({"jobName": "x"}, False, id="v1"),
    pytest.param([1], False, id="list"),
])
def test_is_v2(raw: Any, expected: bool) -> None:
    assert is_v2(raw) is expected


@pytest.mark.parametrize("version", [1, "1", 3, None, "v2"])
def test_a_protocol_version_other_than_2_is_the_only_error(version: Any) -> None:
    """A v1 config that says `protocolVersion: 1` is told that one thing,
    not every v2 field its v1 shape lacks."""
    v1 = {"protocolVersion": version, "jobName": "x", "image": "busybox",
          "taskRoles": [{"name": "a", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 100,
                         "command": "true"}]}
    with pytest.raises(InvalidJobConfig) as refused:
        convert(v1)
    assert list(refused.value.fields) == ["protocolVersion"]
    assert "remove" in refused.value.fields["protocolVersion"][0]
