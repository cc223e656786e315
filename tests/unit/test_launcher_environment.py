"""The environment a task's container gets (docs/design.md, "Inside a job container")."""

from __future__ import annotations

from typing import Any

import pytest

from services.launcher.environment import (
    IncompletePlacement,
    env_name_part,
    env_value,
    gpu_environment,
    task_environment,
)
from shared.domain.models import JobSpec, Task
from shared.domain.states import TaskState

# The seed's distributed TensorFlow example: 2 ps servers and 2 workers.
SEED_CONFIG: dict[str, Any] = {
    "jobName": "tensorflow-distributed-example",
    "image": "your_docker_registry/pai.run.tensorflow",
    "dataDir": "hdfs://path/to/data",
    "outputDir": "hdfs://path/to/output",
    "codeDir": "hdfs://path/to/code",
    "taskRoles": [
        {"name": "ps_server", "taskNumber": 2, "cpuNumber": 2, "memoryMB": 8192,
         "gpuNumber": 0, "command": "python tf_cnn_benchmarks.py --job_name=ps"},
        {"name": "worker", "taskNumber": 2, "cpuNumber": 2, "memoryMB": 16384,
         "gpuNumber": 4, "command": "python tf_cnn_benchmarks.py --job_name=worker"},
    ],
    "killAllOnCompletedTaskNumber": 2,
    "retryCount": 0,
}


def placed(role: str, index: int, ip: str, port: int, gpus: list[int] | None = None,
           **ports: list[int]) -> Task:
    return Task(role=role, index=index, state=TaskState.LAUNCHING, node=f"node-{ip}", ip=ip,
                gpus=gpus or [], ports={"default": [port], **ports})


# Spread over two nodes, listed out of order on purpose.
SEED_TASKS = [
    placed("worker", 1, "10.0.0.2", 15001, [0, 1, 2, 3]),
    placed("ps_server", 1, "10.0.0.2", 15000),
    placed("worker", 0, "10.0.0.1", 15001, [4, 5, 6, 7]),
    placed("ps_server", 0, "10.0.0.1", 15000),
]


def seed_env(role: str, index: int, **kwargs: Any) -> dict[str, str]:
    return task_environment(JobSpec.from_config(SEED_CONFIG), "alice", SEED_TASKS, role, index,
                            default_fs_uri="/nfs", **kwargs)


def test_seed_example_worker_gets_every_variable() -> None:
    assert seed_env("worker", 1) == {
        "NVIDIA_VISIBLE_DEVICES": "0,1,2,3",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "PAI_JOB_NAME": "tensorflow-distributed-example",
        "PAI_FRAMEWORK_NAME": "alice~tensorflow-distributed-example",
        "PAI_VIRTUAL_CLUSTER": "default",
        "PAI_JOB_ATTEMPT_ID": "0",
        "PAI_USER_NAME": "alice",
        "PAI_USERNAME": "alice",
        "PAI_DEFAULT_FS_URI": "/nfs",
        "PAI_DATA_DIR": "hdfs://path/to/data",
        "PAI_OUTPUT_DIR": "hdfs://path/to/output",
        "PAI_CODE_DIR": "hdfs://path/to/code",
        "PAI_TASK_ROLE_NAME": "worker",
        "PAI_TASK_ROLE_NUM": "2",
        "PAI_TASK_CPU_NUM": "2",
        "PAI_TASK_MEM_MB": "16384",
        "PAI_TASK_GPU_NUM": "4",
        "PAI_TASK_ROLE_INDEX": "1",
        "PAI_TASK_ROLE_NO": "1",
        "PAI_TASK_INDEX": "1",
        "PAI_TASKS_NUM": "4",
        "PAI_JOB_TASK_COUNT": "4",
        "PAI_TASK_ROLES_NUM": "2",
        "PAI_JOB_TASK_ROLE_COUNT": "2",
        "PAI_KILL_ALL_ON_COMPLETED_TASK_NUM": "2",
        "PAI_CURRENT_CONTAINER_IP": "10.0.0.2",
        "PAI_CURRENT_CONTAINER_PORT": "15001",
        "PAI_CONTAINER_HOST_IP": "10.0.0.2",
        "PAI_CONTAINER_HOST_PORT": "15001",
        "PAI_CURRENT_TASK_ROLE_NAME": "worker",
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": "1",
        "PAI_CONTAINER_HOST_default_PORT_LIST": "15001",
        "PAI_CONTAINER_HOST_PORT_LIST": "default:15001;",
        "PAI_TASK_ROLE_COUNT": "2",
        "PAI_TASK_ROLE_LIST": "ps_server,worker",
        "PAI_JOB_TASK_ROLE_LIST": "ps_server,worker",
        "PAI_TASK_ROLE_INSTANCES": "ps_server:0,ps_server:1,worker:0,worker:1",
        "PAI_TASK_ROLE_0_HOST_LIST": "10.0.0.1:15000,10.0.0.2:15000",
        "PAI_TASK_ROLE_1_HOST_LIST": "10.0.0.1:15001,10.0.0.2:15001",
        "PAI_TASK_ROLE_ps_server_HOST_LIST": "10.0.0.1:15000,10.0.0.2:15000",
        "PAI_TASK_ROLE_worker_HOST_LIST": "10.0.0.1:15001,10.0.0.2:15001",
        "PAI_TASK_ROLE_TASK_COUNT_ps_server": "2",
        "PAI_TASK_ROLE_TASK_COUNT_worker": "2",
        "PAI_RESOURCE_ps_server": "0,2,8192,64",
        "PAI_RESOURCE_worker": "4,2,16384,64",
        "PAI_MIN_FAILED_TASK_COUNT_ps_server": "1",
        "PAI_MIN_FAILED_TASK_COUNT_worker": "1",
        "PAI_MIN_SUCCEEDED_TASK_COUNT_ps_server": "-1",
        "PAI_MIN_SUCCEEDED_TASK_COUNT_worker": "-1",
        "PAI_HOST_IP_ps_server_0": "10.0.0.1",
        "PAI_HOST_IP_ps_server_1": "10.0.0.2",
        "PAI_HOST_IP_worker_0": "10.0.0.1",
        "PAI_HOST_IP_worker_1": "10.0.0.2",
        "PAI_PORT_LIST_ps_server_0_default": "15000",
        "PAI_PORT_LIST_ps_server_1_default": "15000",
        "PAI_PORT_LIST_worker_0_default": "15001",
        "PAI_PORT_LIST_worker_1_default": "15001",
        "PAI_ps_server_0_default_PORT": "15000",
        "PAI_ps_server_1_default_PORT": "15000",
        "PAI_worker_0_default_PORT": "15001",
        "PAI_worker_1_default_PORT": "15001",
        "PAI_PREEMPTION_FILE": "/pai/preempted",
        "PAI_PROXY_PATH": "/api/v1/user/alice/jobs/tensorflow-distributed-example/tasks/worker/1"
                          "/proxy",
    }


@pytest.mark.parametrize(("role", "index", "name", "value"), [
    pytest.param("ps_server", 0, "PAI_TASK_ROLE_NO", "0", id="ps is role number 0"),
    pytest.param("ps_server", 1, "PAI_TASK_ROLE_INDEX", "1", id="second ps has index 1"),
    pytest.param("ps_server", 1, "PAI_CURRENT_CONTAINER_IP", "10.0.0.2", id="ps 1 on node b"),
    pytest.param("ps_server", 0, "PAI_TASK_GPU_NUM", "0", id="ps asks no GPU"),
    pytest.param("ps_server", 0, "PAI_TASK_MEM_MB", "8192", id="ps memory"),
    pytest.param("ps_server", 0, "NVIDIA_VISIBLE_DEVICES", "none", id="CPU-only: NVIDIA none"),
    pytest.param("ps_server", 0, "CUDA_VISIBLE_DEVICES", "", id="CPU-only: CUDA empty"),
    pytest.param("worker", 0, "NVIDIA_VISIBLE_DEVICES", "4,5,6,7", id="worker 0 node GPUs"),
    pytest.param("worker", 0, "PAI_TASK_ROLE_0_HOST_LIST", "10.0.0.1:15000,10.0.0.2:15000",
                 id="same host lists in every task"),
])
def test_seed_example_variables(role: str, index: int, name: str, value: str) -> None:
    assert seed_env(role, index)[name] == value


@pytest.mark.parametrize(("gpus", "renumbered", "nvidia", "cuda"), [
    pytest.param([], False, "none", "", id="CPU-only task sees no GPU"),
    pytest.param([], True, "none", "", id="CPU-only task on an NVIDIA node sees no GPU"),
    pytest.param([2, 5], False, "2,5", "2,5", id="virtual GPUs keep node indices"),
    pytest.param([2, 5], True, "2,5", "0,1", id="NVIDIA runtime renumbers CUDA devices"),
    pytest.param([0], True, "0", "0", id="one GPU"),
])
def test_gpu_variables(gpus: list[int], renumbered: bool, nvidia: str, cuda: str) -> None:
    assert gpu_environment(gpus, renumbered_gpus=renumbered) == {
        "NVIDIA_VISIBLE_DEVICES": nvidia, "CUDA_VISIBLE_DEVICES": cuda}


def test_worker_on_nvidia_node_counts_cuda_devices_from_zero() -> None:
    env = seed_env("worker", 0, renumbered_gpus=True)
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"]) == ("4,5,6,7", "0,1,2,3")


@pytest.mark.parametrize(("value", "text"), [
    pytest.param(True, "true", id="true"),
    pytest.param(False, "false", id="false"),
    pytest.param(3, "3", id="int"),
    pytest.param(0.5, "0.5", id="float"),
    pytest.param("a b=c", "a b=c", id="string as is"),
])
def test_job_env_values(value: Any, text: str) -> None:
    assert env_value(value) == text


def one_role_config(**overrides: Any) -> dict[str, Any]:
    role = {"name": "main", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256,
            "command": "true", **overrides.pop("role", {})}
    return {"jobName": "j", "image": "busybox", "taskRoles": [role], **overrides}


def test_job_envs_are_passed_as_strings_and_cannot_replace_platform_variables() -> None:
    config = one_role_config(jobEnvs={
        "LR": 0.01, "DEBUG": True, "QUIET": False, "EPOCHS": 10, "MODE": "train",
        "NVIDIA_VISIBLE_DEVICES": "all", "PAI_JOB_NAME": "spoofed"})
    env = task_environment(JobSpec.from_config(config), "bob",
                           [placed("main", 0, "127.0.0.1", 20000)], "main", 0,
                           default_fs_uri="")
    assert {k: env[k] for k in ("LR", "DEBUG", "QUIET", "EPOCHS", "MODE")} == {
        "LR": "0.01", "DEBUG": "true", "QUIET": "false", "EPOCHS": "10", "MODE": "train"}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "none"
    assert env["PAI_JOB_NAME"] == "j"


def test_port_labels_and_counts() -> None:
    config = one_role_config(role={
        "name": "srv", "taskNumber": 2, "minFailedTaskCount": 2, "minSucceededTaskCount": 1,
        "shmMB": 128, "gpuNumber": 1,
        "portList": [{"label": "http", "beginAt": 0, "portNumber": 1},
                     {"label": "ssh", "beginAt": 0, "portNumber": 2}]})
    tasks = [placed("srv", 0, "10.1.1.1", 20000, [0], http=[20001], ssh=[20002, 20003]),
             placed("srv", 1, "10.1.1.1", 20010, [1], http=[20011], ssh=[20012, 20013])]
    env = task_environment(JobSpec.from_config(config), "bob", tasks, "srv", 1,
                           default_fs_uri="")
    assert env["PAI_CONTAINER_HOST_http_PORT_LIST"] == "20011"
    assert env["PAI_CONTAINER_HOST_ssh_PORT_LIST"] == "20012,20013"
    assert env["PAI_CONTAINER_HOST_default_PORT_LIST"] == "20010"
    assert env["PAI_PORT_LIST_srv_0_ssh"] == "20002,20003"
    assert env["PAI_PORT_LIST_srv_1_http"] == "20011"
    assert env["PAI_PORT_LIST_srv_0_default"] == "20000"
    assert env["PAI_RESOURCE_srv"] == "1,1,256,128"
    assert env["PAI_MIN_FAILED_TASK_COUNT_srv"] == "2"
    assert env["PAI_MIN_SUCCEEDED_TASK_COUNT_srv"] == "1"
    assert env["PAI_TASK_ROLE_srv_HOST_LIST"] == "10.1.1.1:20000,10.1.1.1:20010"


# OpenPAI's own PyTorch DDP example (examples/Distributed-example in its
# repository) reads these and nothing else of the platform's: its rank from
# PAI_TASK_INDEX, the master's address and port from worker 0's.
OPENPAI_DDP_CONFIG: dict[str, Any] = {
    "jobName": "cifar10-single-mul-DDP-gloo", "image": "openpai/standard",
    "taskRoles": [{"name": "worker", "taskNumber": 2, "cpuNumber": 8, "memoryMB": 16384,
                   "gpuNumber": 2, "command": "python cifar10-single-mul-DDP-nccl-gloo.py",
                   "portList": [{"label": "SynPort", "beginAt": 0, "portNumber": 1}]}],
}
OPENPAI_DDP_TASKS = [
    placed("worker", 1, "10.0.0.2", 15010, [0, 1], SynPort=[15011]),
    placed("worker", 0, "10.0.0.1", 15000, [0, 1], SynPort=[15001]),
]


@pytest.mark.parametrize("index", [0, 1], ids=["worker 0", "worker 1"])
def test_openpai_ddp_example_finds_its_rank_and_master(index: int) -> None:
    env = task_environment(JobSpec.from_config(OPENPAI_DDP_CONFIG), "alice",
                           OPENPAI_DDP_TASKS, "worker", index, default_fs_uri="")
    assert env["PAI_TASK_INDEX"] == str(index)
    assert env["PAI_HOST_IP_worker_0"] == "10.0.0.1"
    assert env["PAI_worker_0_SynPort_PORT"] == "15001"
    assert env["PAI_worker_1_SynPort_PORT"] == "15011"
    assert env["PAI_TASK_ROLE_INSTANCES"] == "worker:0,worker:1"


def test_openpai_runtime_names_beside_the_seed_table() -> None:
    config = one_role_config(virtualCluster="research", role={
        "name": "srv", "taskNumber": 1,
        "portList": [{"label": "http", "beginAt": 0, "portNumber": 2}]})
    env = task_environment(JobSpec.from_config(config), "bob",
                           [placed("srv", 0, "10.1.1.1", 20000, http=[20001, 20002])],
                           "srv", 0, default_fs_uri="")
    assert env["PAI_FRAMEWORK_NAME"] == "bob~j"
    assert env["PAI_VIRTUAL_CLUSTER"] == "research"
    assert env["PAI_CONTAINER_HOST_IP"] == "10.1.1.1"
    assert env["PAI_CONTAINER_HOST_PORT"] == "20000"
    assert env["PAI_CONTAINER_HOST_PORT_LIST"] == "default:20000;http:20001,20002;"
    assert env["PAI_srv_0_http_PORT"] == "20001,20002"
    assert (env["PAI_JOB_TASK_COUNT"], env["PAI_JOB_TASK_ROLE_COUNT"],
            env["PAI_JOB_TASK_ROLE_LIST"]) == ("1", "1", "srv")


@pytest.mark.parametrize(("name", "part"), [
    pytest.param("worker", "worker", id="plain name kept"),
    pytest.param("ps.server", "ps_server", id="dot replaced"),
    pytest.param("a~b.c", "a_b_c", id="tilde replaced"),
    pytest.param("Role_9", "Role_9", id="underscore and digits kept"),
])
def test_env_name_part(name: str, part: str) -> None:
    assert env_name_part(name) == part


def test_role_names_with_dots_are_sanitized_in_names_not_values() -> None:
    config = one_role_config(role={"name": "ps.v~1", "portList": [
        {"label": "my.port", "beginAt": 0, "portNumber": 1}]})
    env = task_environment(JobSpec.from_config(config), "bob",
                           [placed("ps.v~1", 0, "10.0.0.9", 21000, **{"my.port": [21001]})],
                           "ps.v~1", 0, default_fs_uri="")
    assert env["PAI_TASK_ROLE_LIST"] == "ps.v~1"
    assert env["PAI_CURRENT_TASK_ROLE_NAME"] == "ps.v~1"
    assert env["PAI_TASK_ROLE_NAME"] == "ps.v~1"
    assert env["PAI_TASK_ROLE_ps_v_1_HOST_LIST"] == "10.0.0.9:21000"
    assert env["PAI_HOST_IP_ps_v_1_0"] == "10.0.0.9"
    assert env["PAI_PORT_LIST_ps_v_1_0_my_port"] == "21001"
    assert env["PAI_CONTAINER_HOST_my_port_PORT_LIST"] == "21001"
    assert env["PAI_ps_v_1_0_my_port_PORT"] == "21001"
    assert env["PAI_TASK_ROLE_INSTANCES"] == "ps.v~1:0"
    assert all(name.replace("_", "a").isalnum() for name in env)


def test_colliding_names_keep_the_first_role_and_role_numbers_win() -> None:
    config = {"jobName": "j", "image": "busybox", "taskRoles": [
        {"name": "1", "taskNumber": 1, "cpuNumber": 1, "memoryMB": 256, "command": "true"},
        {"name": "a.b", "taskNumber": 1, "cpuNumber": 2, "memoryMB": 256, "command": "true"},
        {"name": "a_b", "taskNumber": 1, "cpuNumber": 3, "memoryMB": 256, "command": "true"},
    ]}
    tasks = [placed("1", 0, "10.0.0.1", 1), placed("a.b", 0, "10.0.0.2", 2),
             placed("a_b", 0, "10.0.0.3", 3)]
    env = task_environment(JobSpec.from_config(config), "bob", tasks, "1", 0,
                           default_fs_uri="")
    assert env["PAI_TASK_ROLE_1_HOST_LIST"] == "10.0.0.2:2"  # role number 1, not role "1"
    assert env["PAI_RESOURCE_a_b"] == "0,2,256,64"  # "a.b" came first


@pytest.mark.parametrize(("tasks", "problem"), [
    pytest.param([Task(role="main", index=0, ip=None, ports={"default": [1]})],
                 IncompletePlacement, id="no IP"),
    pytest.param([Task(role="main", index=0, ip="10.0.0.1", ports={})],
                 IncompletePlacement, id="no default port"),
    pytest.param([], KeyError, id="task not in the attempt"),
])
def test_unplaced_tasks_are_refused(tasks: list[Task], problem: type[Exception]) -> None:
    with pytest.raises(problem):
        task_environment(JobSpec.from_config(one_role_config()), "bob", tasks, "main", 0,
                         default_fs_uri="")


def test_missing_peer_is_refused() -> None:
    config = one_role_config(role={"taskNumber": 2})
    with pytest.raises(IncompletePlacement, match="1 of its 2 tasks"):
        task_environment(JobSpec.from_config(config), "bob",
                         [placed("main", 0, "10.0.0.1", 1)], "main", 0, default_fs_uri="")


def test_dirs_and_default_fs_uri() -> None:
    config = one_role_config(dataDir="/nfs/bob/data", outputDir="/nfs/bob/j/output",
                             codeDir="/nfs/bob/code")
    env = task_environment(JobSpec.from_config(config), "bob",
                           [placed("main", 0, "127.0.0.1", 1)], "main", 0,
                           default_fs_uri="/nfs")
    assert (env["PAI_DATA_DIR"], env["PAI_OUTPUT_DIR"], env["PAI_CODE_DIR"],
            env["PAI_DEFAULT_FS_URI"]) == ("/nfs/bob/data", "/nfs/bob/j/output",
                                           "/nfs/bob/code", "/nfs")


def test_the_attempt_is_visible_so_a_retry_can_tell_itself_from_the_first_run() -> None:
    assert seed_env("worker", 0)["PAI_JOB_ATTEMPT_ID"] == "0"
    assert seed_env("worker", 0, attempt=3)["PAI_JOB_ATTEMPT_ID"] == "3"


def test_without_gang_allocation_peers_not_placed_yet_are_left_out() -> None:
    config = one_role_config(role={"taskNumber": 3}, extras={"gangAllocation": False})
    tasks = [placed("main", 0, "10.0.0.1", 1), Task(role="main", index=1),
             placed("main", 2, "10.0.0.2", 3)]
    env = task_environment(JobSpec.from_config(config), "bob", tasks, "main", 2,
                           default_fs_uri="")
    assert env["PAI_TASK_ROLE_main_HOST_LIST"] == "10.0.0.1:1,10.0.0.2:3"
    assert env["PAI_TASK_ROLE_0_HOST_LIST"] == "10.0.0.1:1,10.0.0.2:3"
    assert env["PAI_HOST_IP_main_2"] == "10.0.0.2"
    assert "PAI_HOST_IP_main_1" not in env
    assert env["PAI_TASK_ROLE_NUM"] == "3"
    # The task itself must still be placed.
    with pytest.raises(IncompletePlacement):
        task_environment(JobSpec.from_config(config), "bob", tasks, "main", 1,
                         default_fs_uri="")


def test_the_proxy_token_is_passed_when_the_job_has_one() -> None:
    assert "PAI_PROXY_TOKEN" not in seed_env("worker", 0)
    env = seed_env("ps_server", 1, proxy_token="s3cret")
    assert env["PAI_PROXY_TOKEN"] == "s3cret"
    assert env["PAI_PROXY_PATH"] == ("/api/v1/user/alice/jobs/tensorflow-distributed-example"
                                     "/tasks/ps_server/1/proxy")


def test_job_envs_cannot_replace_the_proxy_variables() -> None:
    config = one_role_config(jobEnvs={"PAI_PROXY_TOKEN": "guess", "PAI_PROXY_PATH": "/x"})
    env = task_environment(JobSpec.from_config(config), "bob",
                           [placed("main", 0, "127.0.0.1", 1)], "main", 0,
                           default_fs_uri="", proxy_token="real")
    assert (env["PAI_PROXY_TOKEN"], env["PAI_PROXY_PATH"]) == (
        "real", "/api/v1/user/bob/jobs/j/tasks/main/0/proxy")
