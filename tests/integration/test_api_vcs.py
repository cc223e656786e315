"""Virtual clusters through the API on a real Redis: guarantees, borrowing,
what is used and who waits, admin-only changes, and what a submission may
ask of a VC."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from flask.testing import FlaskClient

from shared.domain.models import Gpu, Node, TaskPlacement
from shared.state import keys
from shared.state.lifecycle import mark_task_running
from shared.state.placing import commit_placement
from shared.state.store import Store
from tests.support.api import AuthedClient, config, error_of, new_user


@pytest.fixture
def alice(flask_client: FlaskClient, admin: AuthedClient) -> AuthedClient:
    """An ordinary user of `default` and `vision` (guaranteed 4 GPUs, no borrowing)."""
    assert admin.put("/api/v1/virtual-clusters/vision",
                     json={"gpuQuota": 4, "description": "computer vision",
                           "borrowing": False}).status_code == 201
    client = new_user(flask_client, admin, "alice")
    admin.put("/api/v1/user/alice/virtualClusters",
              json={"virtualClusters": ["default", "vision"]})
    return client


def gpu_job(name: str, vc: str, tasks: int, gpus: int = 1) -> dict[str, Any]:
    job = config(name, virtualCluster=vc)
    job["taskRoles"][0].update(taskNumber=tasks, gpuNumber=gpus)
    return job


def vc_view(client: AuthedClient, name: str) -> dict[str, Any]:
    resp = client.get(f"/api/v1/virtual-clusters/{name}")
    assert resp.status_code == 200, resp.json
    body: dict[str, Any] = resp.json
    return body


# ----------------------------------------------------------------- default


def test_the_default_vc_exists_without_a_quota(alice: AuthedClient) -> None:
    listed = alice.get("/api/v1/virtual-clusters")

    assert listed.status_code == 200 and listed.json is not None
    assert sorted(listed.json) == ["default", "vision"]
    default = vc_view(alice, "default")
    assert default.pop("queue") == []  # one VC's view lists its queue
    assert default == listed.json["default"]
    assert default["name"] == "default"
    # no node has reported: what the others leave of nothing is nothing
    assert (default["gpuQuota"], default["gpuGuaranteed"], default["gpuFree"]) == (None, 0, 0)
    assert default["borrowing"] is True
    assert default["resourcesUsed"] == {"GPUs": 0, "CPUs": 0, "memoryMB": 0, "tasks": 0}
    assert (default["waitingJobs"], default["runningJobs"]) == (0, 0)


def test_the_default_vc_cannot_be_deleted(admin: AuthedClient) -> None:
    resp = admin.delete("/api/v1/virtual-clusters/default")
    assert error_of(resp, 403) == "ForbiddenVirtualClusterError"
    assert vc_view(admin, "default")["name"] == "default"


def test_an_unknown_vc_is_404(alice: AuthedClient, admin: AuthedClient) -> None:
    assert error_of(alice.get("/api/v1/virtual-clusters/nope"), 404) == "NoVirtualClusterError"
    assert error_of(admin.delete("/api/v1/virtual-clusters/nope"), 404) \
        == "NoVirtualClusterError"


# ------------------------------------------------------ create, update, delete


def test_an_admin_creates_updates_and_deletes_a_vc(admin: AuthedClient,
                                                   redis_client: redis.Redis) -> None:
    created = admin.put("/api/v1/virtual-clusters/speech",
                        json={"gpuQuota": 8, "description": "speech team"})
    assert created.status_code == 201 and created.json is not None
    assert {k: created.json[k] for k in ("name", "gpuQuota", "description", "gpuFree")} == {
        "name": "speech", "gpuQuota": 8, "description": "speech team", "gpuFree": 8}

    updated = admin.put("/api/v1/virtual-clusters/speech",
                        json={"gpuQuota": 16, "description": "speech team"})
    assert updated.status_code == 200
    assert vc_view(admin, "speech")["gpuQuota"] == 16

    unguaranteed = admin.put("/api/v1/virtual-clusters/speech", json={"gpuQuota": None})
    assert unguaranteed.status_code == 200 and unguaranteed.json is not None
    assert (unguaranteed.json["gpuQuota"], unguaranteed.json["gpuGuaranteed"],
            unguaranteed.json["borrowing"]) == (None, 0, True)

    assert admin.delete("/api/v1/virtual-clusters/speech").status_code == 200
    assert error_of(admin.get("/api/v1/virtual-clusters/speech"), 404) \
        == "NoVirtualClusterError"
    assert redis_client.smembers(keys.VCS) == {"default"}


def test_a_zero_quota_vc_borrows_unless_told_not_to(admin: AuthedClient) -> None:
    assert admin.put("/api/v1/virtual-clusters/lender", json={"gpuQuota": 0}).status_code \
        == 201
    borrowing = admin.post("/api/v1/user/root/jobs", json=gpu_job("one", "lender", tasks=1))
    assert borrowing.status_code == 202
    assert admin.put("/api/v1/virtual-clusters/frozen",
                     json={"gpuQuota": 0, "borrowing": False}).status_code == 201
    resp = admin.post("/api/v1/user/root/jobs", json=gpu_job("one", "frozen", tasks=1))
    assert error_of(resp, 400) == "InvalidJobConfigError"
    oppo = {**config("cpu-oppo", virtualCluster="frozen"), "jobPriorityClass": "oppo"}
    assert error_of(admin.post("/api/v1/user/root/jobs", json=oppo), 400) \
        == "InvalidJobConfigError"
    cpu_only = admin.post("/api/v1/user/root/jobs", json=config("cpu", virtualCluster="frozen"))
    assert cpu_only.status_code == 202


@pytest.mark.parametrize(("name", "body"), [
    ("speech", {"gpuQuota": -1}),
    ("speech", {"gpuQuota": "8"}),
    ("speech", {"gpuQuota": True}),
    ("speech", {"gpuQuota": 1.5}),
    ("speech", {"gpuQuota": 1_000_001}),
    ("speech", {"gpuQuota": 8, "description": 5}),
    ("speech", {"gpuQuota": 8, "description": "d" * 1025}),
    ("speech", [8]),
    (".hidden", {"gpuQuota": 8}),
    ("x" * 65, {"gpuQuota": 8}),
], ids=["negative quota", "quota a string", "quota a boolean", "quota a fraction",
        "quota too large", "description not a string", "description too long",
        "not an object", "name with a leading dot", "name too long"])
def test_put_vc_rejects_bad_input(admin: AuthedClient, redis_client: redis.Redis, name: str,
                                  body: Any) -> None:
    resp = admin.put(f"/api/v1/virtual-clusters/{name}", json=body)
    assert error_of(resp, 400) == "BadRequestError"
    assert redis_client.smembers(keys.VCS) == {"default"}


def test_only_admins_change_vcs(alice: AuthedClient) -> None:
    for resp in (alice.put("/api/v1/virtual-clusters/vision", json={"gpuQuota": 400}),
                 alice.put("/api/v1/virtual-clusters/mine", json={"gpuQuota": 400}),
                 alice.delete("/api/v1/virtual-clusters/vision")):
        assert error_of(resp, 403) == "ForbiddenUserError"
    assert vc_view(alice, "vision")["gpuQuota"] == 4
    assert error_of(alice.get("/api/v1/virtual-clusters/mine"), 404) == "NoVirtualClusterError"


def test_a_vc_with_live_jobs_cannot_be_deleted(admin: AuthedClient,
                                               alice: AuthedClient) -> None:
    alice.post("/api/v1/user/alice/jobs", json=gpu_job("cnn", "vision", tasks=1))

    resp = admin.delete("/api/v1/virtual-clusters/vision")

    assert error_of(resp, 409) == "ConflictVirtualClusterError"
    alice.put("/api/v1/user/alice/jobs/cnn/executionType", json={"value": "STOP"})
    assert admin.delete("/api/v1/virtual-clusters/vision").status_code == 200


def test_a_deleted_vc_takes_no_more_jobs(admin: AuthedClient, alice: AuthedClient) -> None:
    admin.delete("/api/v1/virtual-clusters/vision")
    resp = alice.post("/api/v1/user/alice/jobs", json=gpu_job("cnn", "vision", tasks=1))
    assert error_of(resp, 400) == "NoVirtualClusterError"


# --------------------------------------------------- quota, used, waiting


def _run_on_node(store: Store, job_id: str, tasks: int) -> None:
    """Place every task of `job_id` on node n1 (one GPU each) and start them."""
    job = store.get_job(job_id)
    assert job is not None
    placements = [TaskPlacement(role="main", index=i, node="n1", ip="127.0.0.1", gpus=(i,),
                                cpus=1, memory_mb=128, ports={}) for i in range(tasks)]
    assert commit_placement(store, job_id, version=job.version, attempt=0,
                            placements=placements, launch_deadline_ms=2**40)
    for i in range(tasks):
        assert mark_task_running(store, job_id, 0, "main", i, f"container-{i}")


def test_a_vc_shows_its_quota_what_is_used_and_who_waits(
        admin: AuthedClient, alice: AuthedClient, redis_client: redis.Redis) -> None:
    store = Store(redis_client)
    store.register_node(Node("n1", "127.0.0.1", cpus=8, memory_mb=8000,
                             gpus=[Gpu(i) for i in range(4)]))
    for name in ("running", "queued-1", "queued-2"):
        assert alice.post("/api/v1/user/alice/jobs",
                          json=gpu_job(name, "vision", tasks=2)).status_code == 202
    assert alice.post("/api/v1/user/alice/jobs", json=config("elsewhere")).status_code == 202
    _run_on_node(store, "alice~running", tasks=2)

    view = vc_view(alice, "vision")

    assert view["gpuQuota"] == 4
    assert view["resourcesUsed"] == {"GPUs": 2, "CPUs": 2, "memoryMB": 256, "tasks": 2}
    assert view["gpuFree"] == 2
    assert view["gpuBorrowed"] == 0
    assert (view["runningJobs"], view["waitingJobs"]) == (1, 2)
    assert view.pop("queue") == ["alice~queued-1", "alice~queued-2"]
    default = vc_view(alice, "default")
    assert (default["runningJobs"], default["waitingJobs"]) == (0, 1)
    assert default["resourcesUsed"]["GPUs"] == 0
    assert alice.get("/api/v1/virtual-clusters").json["vision"] == view


# ------------------------------------------------------ submit and the VC


def test_submitting_to_a_vc_the_user_may_not_use_is_403(admin: AuthedClient,
                                                        alice: AuthedClient,
                                                        redis_client: redis.Redis) -> None:
    admin.put("/api/v1/virtual-clusters/private", json={"gpuQuota": 8})

    resp = alice.post("/api/v1/user/alice/jobs", json=config(virtualCluster="private"))

    assert error_of(resp, 403) == "ForbiddenUserError"
    assert redis_client.zcard(keys.JOBS) == 0


def test_an_admin_submitting_for_a_user_is_held_to_the_users_vcs(
        admin: AuthedClient, alice: AuthedClient) -> None:
    admin.put("/api/v1/virtual-clusters/private", json={"gpuQuota": 8})
    resp = admin.post("/api/v1/user/alice/jobs", json=config(virtualCluster="private"))
    assert error_of(resp, 403) == "ForbiddenUserError"
    own = admin.post("/api/v1/user/root/jobs", json=config(virtualCluster="private"))
    assert own.status_code == 202


def test_submitting_to_an_unknown_vc_is_400(alice: AuthedClient,
                                            redis_client: redis.Redis) -> None:
    resp = alice.post("/api/v1/user/alice/jobs", json=config(virtualCluster="nope"))
    assert error_of(resp, 400) == "NoVirtualClusterError"
    assert redis_client.zcard(keys.JOBS) == 0


def test_a_job_needing_more_gpus_than_a_non_borrowing_vc_guarantees_is_400(alice: AuthedClient,
                                                          redis_client: redis.Redis) -> None:
    resp = alice.post("/api/v1/user/alice/jobs", json=gpu_job("big", "vision", tasks=5))

    assert error_of(resp, 400) == "InvalidJobConfigError"
    assert resp.json is not None
    assert resp.json["fields"] == {"virtualCluster": [
        "the job needs 5 GPUs at once; vision is guaranteed 4 and does not borrow"]}
    assert redis_client.zcard(keys.JOBS) == 0


def test_the_guarantee_counts_gpus_over_every_role(alice: AuthedClient) -> None:
    job = gpu_job("two-roles", "vision", tasks=1, gpus=3)
    job["taskRoles"].append({**job["taskRoles"][0], "name": "worker", "gpuNumber": 2})
    resp = alice.post("/api/v1/user/alice/jobs", json=job)
    assert error_of(resp, 400) == "InvalidJobConfigError"


def test_a_job_needing_exactly_the_quota_is_accepted(alice: AuthedClient) -> None:
    resp = alice.post("/api/v1/user/alice/jobs", json=gpu_job("fits", "vision", tasks=2, gpus=2))
    assert resp.status_code == 202


def test_an_admin_chooses_what_idle_gpu_jobs_get_per_vc(admin: AuthedClient,
                                                        alice: AuthedClient) -> None:
    created = admin.put("/api/v1/virtual-clusters/lab", json={"gpuQuota": 1})
    assert created.status_code == 201 and created.json["idleGpuAction"] == "notify"
    changed = admin.put("/api/v1/virtual-clusters/lab",
                        json={"gpuQuota": 1, "idleGpuAction": "stop"})
    assert changed.status_code == 200 and changed.json["idleGpuAction"] == "stop"
    assert admin.get("/api/v1/virtual-clusters/lab").json["idleGpuAction"] == "stop"
    refused = admin.put("/api/v1/virtual-clusters/lab",
                        json={"gpuQuota": 1, "idleGpuAction": "kill"})
    assert error_of(refused, 400) == "BadRequestError"
    assert admin.get("/api/v1/virtual-clusters/lab").json["idleGpuAction"] == "stop"
    assert alice.put("/api/v1/virtual-clusters/lab",
                     json={"gpuQuota": 1, "idleGpuAction": "notify"}).status_code == 403
