"""The v1 job config contract (docs/design.md, "Job protocol" and the
storage rules of "Inside a job container").

Each rule has a valid and an invalid case in the tables below, so a change to
a rule shows up as a named failing case rather than a silent drift.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pai_cli.jobfile import strip_json_comments
from shared.domain.jobspec import (
    InvalidJobConfig,
    ValidatedConfig,
    is_job_name,
    validate_job_config,
)
from shared.domain.models import JobSpec

ROOTS = ("/data",)
USER = "alice"

# The seed's hello-world job (002_a144df1eccc627ae.txt), verbatim.
HELLO_WORLD = """
{
"jobName": "tensorflow-cifar10",
"image": "tensorflow/tensorflow:1.12.0-gpu-py3",
"taskRoles": [
    {
    "name": "default",
    "taskNumber": 1,
    "cpuNumber": 4,
    "memoryMB": 8192,
    "gpuNumber": 1,
    "command": "apt update && apt install -y git && git clone https://github.com/tensorflow/models && cd models/research/slim && python download_and_convert_data.py --dataset_name=cifar10 --dataset_dir=/tmp/data && python train_image_classifier.py --dataset_name=cifar10 --dataset_dir=/tmp/data --max_number_of_steps=1000"
    }
]
}
"""  # noqa: E501

# The seed's distributed TensorFlow example (001_40d5190b18e7495e.txt), verbatim.
DISTRIBUTED_TF = """
{
  "jobName": "tensorflow-distributed-example",
  // customized tensorflow docker image with hdfs, cuda and cudnn support
  "image": "your_docker_registry/pai.run.tensorflow",
  // this example uses cifar10 dataset, which is available from
  // http://www.cs.toronto.edu/~kriz/cifar.html
  "dataDir": "hdfs://path/to/data",
  "outputDir": "hdfs://path/to/output",
  // this example uses code from tensorflow benchmark https://git.io/vF4wT
  "codeDir": "hdfs://path/to/code",
  "taskRoles": [
    {
      "name": "ps_server",
      // use 2 ps servers in this job
      "taskNumber": 2,
      "cpuNumber": 2,
      "memoryMB": 8192,
      "gpuNumber": 0,
      // run tf_cnn_benchmarks.py in code directory
      // please refer to https://www.tensorflow.org/performance/performance_models#executing_the_script for arguments' detail
      // if there's no `scipy` in the docker image, need to install it first
      "command": "pip --quiet install scipy && python tf_cnn_benchmarks.py --local_parameter_device=cpu --num_gpus=4 --batch_size=32 --model=resnet20 --variable_update=parameter_server --data_dir=$PAI_DATA_DIR --data_name=cifar10 --train_dir=$PAI_OUTPUT_DIR --ps_hosts=$PAI_TASK_ROLE_0_HOST_LIST --worker_hosts=$PAI_TASK_ROLE_1_HOST_LIST --job_name=ps --task_index=$PAI_TASK_ROLE_INDEX"
    },
    {
      "name": "worker",
      // use 2 workers in this job
      "taskNumber": 2,
      "cpuNumber": 2,
      "memoryMB": 16384,
      "gpuNumber": 4,
      "command": "pip --quiet install scipy && python tf_cnn_benchmarks.py --local_parameter_device=cpu --num_gpus=4 --batch_size=32 --model=resnet20 --variable_update=parameter_server --data_dir=$PAI_DATA_DIR --data_name=cifar10 --train_dir=$PAI_OUTPUT_DIR --ps_hosts=$PAI_TASK_ROLE_0_HOST_LIST --worker_hosts=$PAI_TASK_ROLE_1_HOST_LIST --job_name=worker --task_index=$PAI_TASK_ROLE_INDEX"
    }
  ],
  // kill all 4 tasks when 2 worker tasks completed
  "killAllOnCompletedTaskNumber": 2,
  "retryCount": 0
}
"""  # noqa: E501


def role(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 1024, "command": "true"}
    base.update(overrides)
    return base


def config(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"jobName": "job-1", "image": "busybox", "taskRoles": [role()]}
    base.update(overrides)
    return base


def validate(raw: Any, roots: tuple[str, ...] = ROOTS) -> ValidatedConfig:
    return validate_job_config(raw, username=USER, storage_roots=roots)


def rejected(raw: Any, roots: tuple[str, ...] = ROOTS) -> dict[str, list[str]]:
    with pytest.raises(InvalidJobConfig) as info:
        validate(raw, roots)
    return info.value.fields


def ports(n: int) -> list[dict[str, Any]]:
    return [{"label": f"p{i}", "portNumber": 1} for i in range(n)]


def envs(n: int) -> dict[str, str]:
    return {f"V{i}": "x" for i in range(n)}


# ---------------------------------------------------------------- valid cases

VALID: list[tuple[str, dict[str, Any]]] = [
    ("minimal", config()),
    ("jobName-all-allowed-chars", config(jobName="A.b_c~d-9")),
    ("jobName-255-chars", config(jobName="j" * 255)),
    ("image-1024-chars", config(image="i" * 1024)),
    ("dirs-empty-strings", config(dataDir="", outputDir="", codeDir="")),
    ("virtualCluster-set", config(virtualCluster="team_a-1")),
    ("virtualCluster-64-chars", config(virtualCluster="v" * 64)),
    ("virtualCluster-empty-means-default", config(virtualCluster="")),
    ("retryCount-0", config(retryCount=0)),
    ("retryCount-cap-100", config(retryCount=100)),
    ("retryCount-unlimited-serving", config(retryCount=-2)),
    ("minFailedTaskCount-never", config(taskRoles=[role(minFailedTaskCount=-1)])),
    ("retryCount-integral-float", config(retryCount=2.0)),
    ("killAll-0", config(killAllOnCompletedTaskNumber=0)),
    ("killAll-equals-total-tasks",
     config(killAllOnCompletedTaskNumber=5, taskRoles=[role(taskNumber=2), role(
         name="b", taskNumber=3)])),
    ("jobEnvs-scalars", config(jobEnvs={"A": "x", "_B": 1, "C2": 1.5, "D": True})),
    ("jobEnvs-1000-entries", config(jobEnvs=envs(1000))),
    ("gpuType-string", config(gpuType="K80")),
    ("gpuType-null", config(gpuType=None)),
    ("extras-nested-object", config(extras={"a": [1, {"b": None}]})),
    ("authFile-string", config(authFile="hdfs://x/auth")),
    ("gangAllocation-false", config(extras={"gangAllocation": False})),
    ("taskRetryCount-0-and-cap", config(taskRoles=[role(taskRetryCount=0),
                                                   role(name="b", taskRetryCount=100)])),
    ("gangAllocation-true", config(extras={"gangAllocation": True})),
    ("taskRoles-100-roles", config(taskRoles=[role(name=f"r{i}") for i in range(100)])),
    ("total-tasks-10000", config(taskRoles=[role(name=f"r{i}", taskNumber=1000)
                                            for i in range(10)])),
    ("role-name-allowed-chars", config(taskRoles=[role(name="A.b_c~9")])),
    ("role-name-64-chars", config(taskRoles=[role(name="r" * 64)])),
    ("taskNumber-1000", config(taskRoles=[role(taskNumber=1000)])),
    ("cpuNumber-1024", config(taskRoles=[role(cpuNumber=1024)])),
    ("memoryMB-100", config(taskRoles=[role(memoryMB=100)])),
    ("memoryMB-16TiB", config(taskRoles=[role(memoryMB=16 * 1024 * 1024)])),
    ("gpuNumber-0", config(taskRoles=[role(gpuNumber=0)])),
    ("gpuNumber-64", config(taskRoles=[role(gpuNumber=64)])),
    ("shmMB-0", config(taskRoles=[role(shmMB=0)])),
    ("shmMB-equals-memoryMB", config(taskRoles=[role(memoryMB=512, shmMB=512)])),
    ("portList-entries", config(taskRoles=[role(portList=[
        {"label": "ssh", "beginAt": 0, "portNumber": 1},
        {"label": "tensor.board~1", "beginAt": 30000, "portNumber": 100}])])),
    ("portList-100-entries", config(taskRoles=[role(portList=ports(100))])),
    ("portList-beginAt-defaults-to-0", config(taskRoles=[role(portList=[
        {"label": "http", "portNumber": 2}])])),
    ("command-64KiB", config(taskRoles=[role(command="c" * 64 * 1024)])),
    ("minCounts-null", config(taskRoles=[role(minFailedTaskCount=None,
                                              minSucceededTaskCount=None)])),
    ("minCounts-1-and-taskNumber", config(taskRoles=[role(taskNumber=3, minFailedTaskCount=1,
                                                          minSucceededTaskCount=3)])),
    ("imageAuth", config(imageAuth={"username": "u", "password": "p",
                                    "registryuri": "reg.example:5000"})),
    ("imageAuth-without-registry", config(imageAuth={"username": "u", "password": ""})),
    ("hello-world-seed", json.loads(HELLO_WORLD)),
    ("distributed-tf-seed", json.loads(strip_json_comments(DISTRIBUTED_TF))),
]


@pytest.mark.parametrize("raw", [c for _, c in VALID], ids=[i for i, _ in VALID])
def test_valid_configs_are_accepted(raw: dict[str, Any]) -> None:
    original = copy.deepcopy(raw)
    result = validate(raw)
    assert result.config["jobName"] == raw["jobName"]
    assert raw == original, "validation must not mutate the caller's config"


# ---------------------------------------------------------------- invalid cases

INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("jobName-missing", {"image": "x", "taskRoles": [role()]}, "jobName"),
    ("jobName-bad-char", config(jobName="my job"), "jobName"),
    ("jobName-slash", config(jobName="a/b"), "jobName"),
    ("jobName-256-chars", config(jobName="j" * 256), "jobName"),
    ("jobName-dotdot", config(jobName=".."), "jobName"),
    ("jobName-not-string", config(jobName=5), "jobName"),
    ("image-missing", {"jobName": "j", "taskRoles": [role()]}, "image"),
    ("image-empty", config(image=""), "image"),
    ("image-blank", config(image="  "), "image"),
    ("image-1025-chars", config(image="i" * 1025), "image"),
    ("dataDir-not-string", config(dataDir=3), "dataDir"),
    ("outputDir-null", config(outputDir=None), "outputDir"),
    ("codeDir-list", config(codeDir=["/data"]), "codeDir"),
    ("virtualCluster-bad-char", config(virtualCluster="bad vc!"), "virtualCluster"),
    ("virtualCluster-65-chars", config(virtualCluster="v" * 65), "virtualCluster"),
    ("retryCount-below-minus-2", config(retryCount=-3), "retryCount"),
    ("retryCount-over-cap", config(retryCount=101), "retryCount"),
    ("retryCount-bool", config(retryCount=True), "retryCount"),
    ("retryCount-fraction", config(retryCount=1.5), "retryCount"),
    ("retryCount-string", config(retryCount="2"), "retryCount"),
    ("killAll-negative", config(killAllOnCompletedTaskNumber=-1), "killAllOnCompletedTaskNumber"),
    ("killAll-over-total-tasks", config(killAllOnCompletedTaskNumber=2),
     "killAllOnCompletedTaskNumber"),
    ("jobEnvs-not-object", config(jobEnvs=["A=1"]), "jobEnvs"),
    ("jobEnvs-nested-object", config(jobEnvs={"A": {"b": 1}}), "jobEnvs.A"),
    ("jobEnvs-list-value", config(jobEnvs={"A": [1]}), "jobEnvs.A"),
    ("jobEnvs-null-value", config(jobEnvs={"A": None}), "jobEnvs.A"),
    ("jobEnvs-nan-value", config(jobEnvs={"A": float("nan")}), "jobEnvs.A"),
    ("jobEnvs-bad-key", config(jobEnvs={"1A": "x"}), "jobEnvs.1A"),
    ("jobEnvs-key-with-dash", config(jobEnvs={"A-B": "x"}), "jobEnvs.A-B"),
    ("jobEnvs-1001-entries", config(jobEnvs=envs(1001)), "jobEnvs"),
    ("gpuType-number", config(gpuType=5), "gpuType"),
    ("extras-list", config(extras=[1]), "extras"),
    ("authFile-number", config(authFile=1), "authFile"),
    ("taskRoles-missing", {"jobName": "j", "image": "x"}, "taskRoles"),
    ("taskRoles-empty", config(taskRoles=[]), "taskRoles"),
    ("taskRoles-not-list", config(taskRoles={"name": "a"}), "taskRoles"),
    ("taskRoles-101-roles", config(taskRoles=[role(name=f"r{i}") for i in range(101)]),
     "taskRoles"),
    ("taskRoles-entry-not-object", config(taskRoles=["worker"]), "taskRoles.0"),
    ("total-tasks-over-10000", config(taskRoles=[role(name=f"r{i}", taskNumber=1000)
                                                 for i in range(11)]), "taskRoles"),
    ("role-name-missing", config(taskRoles=[{k: v for k, v in role().items() if k != "name"}]),
     "taskRoles.0.name"),
    ("role-name-bad-char", config(taskRoles=[role(name="ps-server")]), "taskRoles.0.name"),
    ("role-name-65-chars", config(taskRoles=[role(name="r" * 65)]), "taskRoles.0.name"),
    ("role-name-duplicate", config(taskRoles=[role(), role()]), "taskRoles.1.name"),
    ("taskNumber-0", config(taskRoles=[role(taskNumber=0)]), "taskRoles.0.taskNumber"),
    ("taskNumber-1001", config(taskRoles=[role(taskNumber=1001)]), "taskRoles.0.taskNumber"),
    ("taskNumber-bool", config(taskRoles=[role(taskNumber=True)]), "taskRoles.0.taskNumber"),
    ("taskNumber-missing",
     config(taskRoles=[{k: v for k, v in role().items() if k != "taskNumber"}]),
     "taskRoles.0.taskNumber"),
    ("cpuNumber-0", config(taskRoles=[role(cpuNumber=0)]), "taskRoles.0.cpuNumber"),
    ("cpuNumber-1025", config(taskRoles=[role(cpuNumber=1025)]), "taskRoles.0.cpuNumber"),
    ("cpuNumber-fraction", config(taskRoles=[role(cpuNumber=1.5)]), "taskRoles.0.cpuNumber"),
    ("memoryMB-99", config(taskRoles=[role(memoryMB=99)]), "taskRoles.0.memoryMB"),
    ("memoryMB-over-16TiB", config(taskRoles=[role(memoryMB=16 * 1024 * 1024 + 1)]),
     "taskRoles.0.memoryMB"),
    ("memoryMB-string", config(taskRoles=[role(memoryMB="1024")]), "taskRoles.0.memoryMB"),
    ("gpuNumber-negative", config(taskRoles=[role(gpuNumber=-1)]), "taskRoles.0.gpuNumber"),
    ("gpuNumber-65", config(taskRoles=[role(gpuNumber=65)]), "taskRoles.0.gpuNumber"),
    ("shmMB-negative", config(taskRoles=[role(shmMB=-1)]), "taskRoles.0.shmMB"),
    ("shmMB-over-memoryMB", config(taskRoles=[role(memoryMB=512, shmMB=513)]),
     "taskRoles.0.shmMB"),
    ("portList-not-list", config(taskRoles=[role(portList={"label": "a"})]),
     "taskRoles.0.portList"),
    ("portList-101-entries", config(taskRoles=[role(portList=ports(101))]),
     "taskRoles.0.portList"),
    ("port-label-bad-char", config(taskRoles=[role(portList=[{"label": "a b", "portNumber": 1}])]),
     "taskRoles.0.portList.0.label"),
    ("port-label-default", config(taskRoles=[role(portList=[
        {"label": "default", "portNumber": 1}])]), "taskRoles.0.portList.0.label"),
    ("port-label-duplicate", config(taskRoles=[role(portList=[
        {"label": "a", "portNumber": 1}, {"label": "a", "portNumber": 1}])]),
     "taskRoles.0.portList.1.label"),
    ("port-beginAt-negative", config(taskRoles=[role(portList=[
        {"label": "a", "beginAt": -1, "portNumber": 1}])]), "taskRoles.0.portList.0.beginAt"),
    ("port-portNumber-0", config(taskRoles=[role(portList=[{"label": "a", "portNumber": 0}])]),
     "taskRoles.0.portList.0.portNumber"),
    ("port-portNumber-101", config(taskRoles=[role(portList=[
        {"label": "a", "portNumber": 101}])]), "taskRoles.0.portList.0.portNumber"),
    ("port-unknown-field", config(taskRoles=[role(portList=[
        {"label": "a", "portNumber": 1, "protocol": "tcp"}])]),
     "taskRoles.0.portList.0.protocol"),
    ("command-missing", config(taskRoles=[{k: v for k, v in role().items() if k != "command"}]),
     "taskRoles.0.command"),
    ("command-empty", config(taskRoles=[role(command="")]), "taskRoles.0.command"),
    ("command-blank", config(taskRoles=[role(command=" \n")]), "taskRoles.0.command"),
    ("command-over-64KiB", config(taskRoles=[role(command="c" * (64 * 1024 + 1))]),
     "taskRoles.0.command"),
    ("minFailedTaskCount-0", config(taskRoles=[role(minFailedTaskCount=0)]),
     "taskRoles.0.minFailedTaskCount"),
    ("minFailedTaskCount-over-taskNumber", config(taskRoles=[role(minFailedTaskCount=2)]),
     "taskRoles.0.minFailedTaskCount"),
    ("minSucceededTaskCount-0", config(taskRoles=[role(minSucceededTaskCount=0)]),
     "taskRoles.0.minSucceededTaskCount"),
    ("minSucceededTaskCount-over-taskNumber",
     config(taskRoles=[role(taskNumber=2, minSucceededTaskCount=3)]),
     "taskRoles.0.minSucceededTaskCount"),
    ("unknown-top-level-field", config(jobname="typo"), "jobname"),
    ("taskRetryCount-negative", config(taskRoles=[role(taskRetryCount=-1)]),
     "taskRoles.0.taskRetryCount"),
    ("taskRetryCount-over-cap", config(taskRoles=[role(taskRetryCount=101)]),
     "taskRoles.0.taskRetryCount"),
    ("taskRetryCount-bool", config(taskRoles=[role(taskRetryCount=True)]),
     "taskRoles.0.taskRetryCount"),
    ("gangAllocation-not-boolean", config(extras={"gangAllocation": 0}), "extras.gangAllocation"),
    ("unknown-role-field", config(taskRoles=[role(memoryMb=2048)]), "taskRoles.0.memoryMb"),
    ("imageAuth-without-username", config(imageAuth={"password": "p"}), "imageAuth.username"),
    ("imageAuth-unknown-key", config(imageAuth={"username": "u", "password": "p", "x": 1}),
     "imageAuth.x"),
    ("imageAuth-not-an-object", config(imageAuth="u:p"), "imageAuth"),
]


@pytest.mark.parametrize(("raw", "path"), [(c, p) for _, c, p in INVALID],
                         ids=[i for i, _, _ in INVALID])
def test_invalid_configs_name_the_field(raw: dict[str, Any], path: str) -> None:
    fields = rejected(raw)
    assert path in fields, fields
    assert all(isinstance(m, str) and m for m in fields[path])


@pytest.mark.parametrize("raw", [None, [], "job", 3, True],
                         ids=["null", "list", "string", "number", "bool"])
def test_top_level_must_be_an_object(raw: Any) -> None:
    with pytest.raises(InvalidJobConfig) as info:
        validate(raw)
    assert list(info.value.fields) == ["_schema"]
    assert "object" in info.value.message


def test_every_mistake_is_named_at_once() -> None:
    raw = config(
        jobName="bad name", retryCount=-3, colour="blue", dataDir="/data/../etc",
        taskRoles=[role(memoryMB=50, gpuNumber=True), role(taskNumber=0, extra=1)],
    )
    with pytest.raises(InvalidJobConfig) as info:
        validate(raw)
    assert set(info.value.fields) == {
        "jobName", "retryCount", "colour", "dataDir",
        "taskRoles.0.memoryMB", "taskRoles.0.gpuNumber",
        "taskRoles.1.taskNumber", "taskRoles.1.extra", "taskRoles.1.name",
    }
    assert info.value.message == "job config has 9 invalid fields"
    assert str(info.value) == info.value.message


def test_unknown_field_message_is_clear() -> None:
    assert rejected(config(jobname="x")) == {"jobname": ["Unknown field."]}


def test_single_error_message_is_singular() -> None:
    with pytest.raises(InvalidJobConfig) as info:
        validate(config(retryCount=-3))
    assert info.value.message == "job config has 1 invalid field"


# ---------------------------------------------------------------- normalization


def test_defaults_are_filled() -> None:
    result = validate(config())
    cfg = result.config
    assert cfg["virtualCluster"] == "default"
    assert cfg["retryCount"] == 0
    assert cfg["killAllOnCompletedTaskNumber"] == 0
    assert cfg["jobEnvs"] == {}
    assert cfg["extras"] == {}
    assert cfg["outputDir"] == "/data/alice/job-1/output"
    (r,) = cfg["taskRoles"]
    assert r["gpuNumber"] == 0
    assert r["shmMB"] == 64
    assert r["portList"] == []
    assert r["minFailedTaskCount"] is None
    assert r["minSucceededTaskCount"] is None
    assert result.ignored == []


def test_integral_float_is_normalized_to_int() -> None:
    cfg = validate(config(retryCount=2.0, taskRoles=[role(taskNumber=3.0)])).config
    assert cfg["retryCount"] == 2 and type(cfg["retryCount"]) is int
    assert type(cfg["taskRoles"][0]["taskNumber"]) is int


def test_empty_virtual_cluster_means_default() -> None:
    assert validate(config(virtualCluster="")).config["virtualCluster"] == "default"


def test_explicit_shm_is_kept() -> None:
    assert validate(config(taskRoles=[role(shmMB=256)])).config["taskRoles"][0]["shmMB"] == 256


def test_extras_and_auth_file_are_stored() -> None:
    cfg = validate(config(extras={"k": [1]}, authFile="hdfs://a")).config
    assert cfg["extras"] == {"k": [1]}
    assert cfg["authFile"] == "hdfs://a"


def test_ignored_fields_are_reported_and_kept() -> None:
    result = validate(config(authFile="", jobEnvs={"isDebug": True, "paiAzRDMA": "1", "X": 1}))
    assert result.ignored == ["authFile", "jobEnvs.isDebug", "jobEnvs.paiAzRDMA"]
    assert result.config["jobEnvs"] == {"isDebug": True, "paiAzRDMA": "1", "X": 1}


def test_seed_distributed_example_keeps_hdfs_dirs() -> None:
    cfg = validate(json.loads(strip_json_comments(DISTRIBUTED_TF))).config
    assert (cfg["dataDir"], cfg["outputDir"], cfg["codeDir"]) == (
        "hdfs://path/to/data", "hdfs://path/to/output", "hdfs://path/to/code")
    assert [r["name"] for r in cfg["taskRoles"]] == ["ps_server", "worker"]
    assert cfg["killAllOnCompletedTaskNumber"] == 2


def test_seed_hello_world_without_roots_has_no_output_dir() -> None:
    cfg = validate(json.loads(HELLO_WORLD), roots=()).config
    assert cfg["outputDir"] == ""
    assert cfg["taskRoles"][0]["gpuNumber"] == 1


# ---------------------------------------------------------------- paths

PATHS_OK: list[tuple[str, str, tuple[str, ...], str]] = [
    ("plain-under-root", "/data/x", ROOTS, "/data/x"),
    ("equal-to-root", "/data", ROOTS, "/data"),
    ("normalized", "/data//x/./y/", ROOTS, "/data/x/y"),
    ("file-uri", "file:///data/x", ROOTS, "/data/x"),
    ("second-root", "/nfs/b", ("/data", "/nfs"), "/nfs/b"),
    ("root-with-trailing-slash", "/data/x", ("/data/",), "/data/x"),
    ("fs-uri-var", "$PAI_DEFAULT_FS_URI/in", ROOTS, "/data/in"),
    ("fs-uri-braced-var", "${PAI_DEFAULT_FS_URI}/in", ROOTS, "/data/in"),
    ("username-vars", "/data/$PAI_USERNAME/$PAI_USER_NAME", ROOTS, "/data/alice/alice"),
    ("job-name-var", "/data/$PAI_JOB_NAME", ROOTS, "/data/job-1"),
    ("openpai-idiom", "$PAI_DEFAULT_FS_URI/$PAI_USER_NAME/$PAI_JOB_NAME/out", ROOTS,
     "/data/alice/job-1/out"),
    ("unknown-var-kept", "/data/$PAI_OTHER", ROOTS, "/data/$PAI_OTHER"),
    ("longer-name-not-substituted", "/data/$PAI_JOB_NAME_X", ROOTS, "/data/$PAI_JOB_NAME_X"),
    ("hdfs-untouched", "hdfs://nn:9000/$PAI_USERNAME/x", (), "hdfs://nn:9000/alice/x"),
    ("root-is-slash", "/anything", ("/",), "/anything"),
    ("dots-in-name-not-segment", "/data/a..b", ROOTS, "/data/a..b"),
]


@pytest.mark.parametrize("field", ["dataDir", "outputDir", "codeDir"])
@pytest.mark.parametrize(("value", "roots", "expected"),
                         [(v, r, e) for _, v, r, e in PATHS_OK], ids=[i for i, *_ in PATHS_OK])
def test_dirs_are_substituted_and_checked(field: str, value: str, roots: tuple[str, ...],
                                          expected: str) -> None:
    assert validate(config(**{field: value}), roots).config[field] == expected


PATHS_BAD: list[tuple[str, str, tuple[str, ...], str]] = [
    ("traversal", "/data/../etc", ROOTS, "'..'"),
    ("traversal-at-end", "/data/x/..", ROOTS, "'..'"),
    ("traversal-via-var", "$PAI_DEFAULT_FS_URI/../etc", ROOTS, "'..'"),
    ("file-uri-outside", "file:///etc/shadow", ROOTS, "must be under one of the storage roots"),
    ("relative", "data/x", ROOTS, "absolute"),
    ("other-scheme", "s3://bucket/x", ROOTS, "absolute"),
    ("nul-byte", "/data/x\x00y", ROOTS, "NUL"),
    ("no-roots", "/data/x", (), "no storage roots are configured (PAI_STORAGE_ROOTS)"),
    ("fs-uri-without-roots", "$PAI_DEFAULT_FS_URI/x", (), "no storage roots are configured"),
]


@pytest.mark.parametrize("field", ["dataDir", "outputDir", "codeDir"])
@pytest.mark.parametrize(("value", "roots", "message"),
                         [(v, r, m) for _, v, r, m in PATHS_BAD], ids=[i for i, *_ in PATHS_BAD])
def test_bad_dirs_are_rejected(field: str, value: str, roots: tuple[str, ...],
                               message: str) -> None:
    fields = rejected(config(**{field: value}), roots)
    assert list(fields) == [field]
    assert message in fields[field][0]


OUTSIDE_EVERY_ROOT = [
    ("openpai-tmp-data", "/tmp/data", "/tmp/data"),
    ("sibling-prefix", "/database", "/database"),
    ("double-slash-kept-as-written", "//etc", "//etc"),
    ("var-substituted", "/tmp/$PAI_USERNAME", "/tmp/alice"),
]


@pytest.mark.parametrize("field", ["dataDir", "outputDir", "codeDir"])
@pytest.mark.parametrize(("value", "expected"), [(v, e) for _, v, e in OUTSIDE_EVERY_ROOT],
                         ids=[i for i, *_ in OUTSIDE_EVERY_ROOT])
def test_dirs_outside_every_root_are_passed_on_unmounted(field: str, value: str,
                                                         expected: str) -> None:
    """As OpenPAI did: such a path is the job's business (its environment),
    never a mount, and the submitter is told so."""
    validated = validate(config(**{field: value}))
    assert validated.config[field] == expected
    assert validated.config["unmountedDirs"] == [field]
    assert JobSpec.from_config(validated.config).unmounted_dirs == (field,)
    assert any(field in note and "not mounted" in note for note in validated.notes)


def test_dirs_inside_a_root_are_mounted_as_before() -> None:
    validated = validate(config(dataDir="/data/alice/in"))
    assert "unmountedDirs" not in validated.config and validated.notes == []


def test_path_error_is_reported_with_schema_errors() -> None:
    assert set(rejected(config(dataDir="etc", retryCount=-3))) == {"dataDir", "retryCount"}


def test_output_dir_default_uses_first_root() -> None:
    cfg = validate(config(outputDir=""), ("/nfs/", "/data")).config
    assert cfg["outputDir"] == "/nfs/alice/job-1/output"


# ---------------------------------------------------------------- comments


COMMENTS: list[tuple[str, str, str]] = [
    ("line-comment", '{"a": 1} // note', '{"a": 1} '),
    ("block-comment", '{/* x */"a": 1}', '{ "a": 1}'),
    ("block-keeps-newlines", '{/* x\ny */"a": 1}', '{\n"a": 1}'),
    ("url-in-string", '{"u": "http://x//y"}', '{"u": "http://x//y"}'),
    ("block-marker-in-string", '{"u": "/* no */"}', '{"u": "/* no */"}'),
    ("escaped-quote-in-string", r'{"u": "a\"//b"} // c', r'{"u": "a\"//b"} '),
    ("escaped-backslash-ends-string", '{"u": "a\\\\"} // c', '{"u": "a\\\\"} '),
    ("comment-with-quote", '{} // say "hi"\n', "{} \n"),
    ("unterminated-block", '{} /* open', "{}  "),
    ("unterminated-string", '{"a": "x // y', '{"a": "x // y'),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in COMMENTS],
                         ids=[i for i, *_ in COMMENTS])
def test_strip_json_comments(text: str, expected: str) -> None:
    assert strip_json_comments(text) == expected


def test_seed_example_parses_after_stripping() -> None:
    cfg = json.loads(strip_json_comments(DISTRIBUTED_TF))
    assert cfg["taskRoles"][1]["command"].startswith("pip --quiet install scipy")


# ---------------------------------------------------------------- properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)


@given(json_values, st.booleans())
def test_strip_is_identity_on_plain_json(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert strip_json_comments(text) == text


@given(json_values, st.lists(st.text().filter(lambda t: "*/" not in t), min_size=1))
def test_comments_between_lines_are_removed(value: Any, notes: list[str]) -> None:
    lines = json.dumps(value, indent=1).split("\n")
    commented = "\n".join(
        f"{line} // {notes[i % len(notes)].replace(chr(10), ' ')}" if i % 2
        else f"/* {notes[i % len(notes)]} */ {line}"
        for i, line in enumerate(lines))
    assert json.loads(strip_json_comments(commented)) == value


def _mutate(base: dict[str, Any]) -> Callable[[Any], Any]:
    return lambda pair: {**base, pair[0]: pair[1]}


known_keys = st.sampled_from(sorted(config(outputDir="", dataDir="", jobEnvs={}, extras={})))
role_keys = st.sampled_from(sorted(role(shmMB=1, gpuNumber=1, portList=[],
                                        minFailedTaskCount=None)))


@settings(deadline=None)
@given(st.one_of(
    json_values,
    st.tuples(known_keys, json_values).map(_mutate(config())),
    st.tuples(role_keys, json_values).map(lambda pair: config(taskRoles=[
        {**role(), pair[0]: pair[1]}, role(name="b")])),
))
def test_validation_raises_only_invalid_job_config(raw: Any) -> None:
    try:
        result = validate(raw)
    except InvalidJobConfig as error:
        assert error.fields
        assert all(isinstance(k, str) and v for k, v in error.fields.items())
    else:
        json.dumps(result.config)


@pytest.mark.parametrize("field", ["jobName", "virtualCluster"])
def test_a_trailing_newline_does_not_slip_past_a_name_pattern(field: str) -> None:
    raw = {"jobName": "ok", "image": "busybox",
           "taskRoles": [{"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 100,
                          "command": "true"}]}
    raw[field] = "name\n"
    with pytest.raises(InvalidJobConfig) as caught:
        validate_job_config(raw, username="alice", storage_roots=["/data"])
    assert field in caught.value.fields


@pytest.mark.parametrize(("extra", "expected"), [
    pytest.param({}, "test", id="test by default"),
    pytest.param({"jobPriorityClass": "prod"}, "prod", id="the v1 field"),
    pytest.param({"extras": {"hivedScheduler": {"jobPriorityClass": "oppo"}}}, "oppo",
                 id="HiveD's extras"),
    pytest.param({"jobPriorityClass": "prod",
                  "extras": {"hivedScheduler": {"jobPriorityClass": "oppo"}}}, "prod",
                 id="the field wins over extras"),
])
def test_priority_class(extra: dict[str, Any], expected: str) -> None:
    validated = validate(config(**extra)).config
    assert JobSpec.from_config(validated).priority_class == expected


@pytest.mark.parametrize("extra", [
    pytest.param({"jobPriorityClass": "urgent"}, id="an unknown class"),
    pytest.param({"extras": {"hivedScheduler": {"jobPriorityClass": "vip"}}},
                 id="an unknown class in HiveD's extras"),
    pytest.param({"preemptionGracePeriodSec": -1}, id="a negative grace"),
    pytest.param({"preemptionGracePeriodSec": 3601}, id="a grace beyond an hour"),
])
def test_bad_scheduling_fields_are_refused(extra: dict[str, Any]) -> None:
    with pytest.raises(InvalidJobConfig):
        validate(config(**extra))


@pytest.mark.parametrize(("extras", "gang"), [
    pytest.param({}, True, id="default-gang"),
    pytest.param({"gangAllocation": True}, True, id="true"),
    pytest.param({"gangAllocation": False}, False, id="false"),
])
def test_gang_allocation_reaches_the_spec(extras: dict[str, Any], gang: bool) -> None:
    assert JobSpec.from_config(validate(config(extras=extras)).config).gang_allocation is gang



@pytest.mark.parametrize(("name", "expected"), [
    ("mnist", True),
    ("a.b_c~d-e", True),
    ("x" * 255, True),
    ("x" * 256, False),
    ("mnist:config", False),
    ("mnist/config", False),
    ("", False),
    (".", False),
    ("..", False),
], ids=["plain", "every allowed sign", "longest", "one too long", "a colon", "a slash",
        "empty", "dot", "dot dot"])
def test_is_job_name_is_the_rule_jobname_is_held_to(name: str, expected: bool) -> None:
    assert is_job_name(name) is expected
    if expected:
        assert validate(config(jobName=name)).config["jobName"] == name
    else:
        assert "jobName" in rejected(config(jobName=name))
