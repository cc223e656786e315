"""Capabilities beyond a job container's default set, through the API on a real
Redis: only what an admin put on the job's VC allow-list is admitted.

The launcher side (what an admitted job's container gets) is proven on the
real engine in test_launcher_runtime.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from shared.domain.models import JobSpec
from shared.state import keys
from shared.state.store import Store
from tests.support.api import AuthedClient, config, error_of

pytestmark = pytest.mark.redis


def rdma_job(name: str = "allreduce", vc: str = "rdma", **extras: Any) -> dict[str, Any]:
    return config(name, virtualCluster=vc, extras={"capabilities": ["IPC_LOCK"], **extras})


@pytest.fixture
def rdma_user(admin: AuthedClient, alice: AuthedClient) -> AuthedClient:
    """alice, a user of `default` and of `rdma`, whose admin allows IPC_LOCK."""
    made = admin.put("/api/v1/virtual-clusters/rdma",
                     json={"gpuQuota": None, "allowedCapabilities": ["IPC_LOCK"]})
    assert made.status_code == 201, made.json
    assert made.json is not None and made.json["allowedCapabilities"] == ["IPC_LOCK"]
    admin.put("/api/v1/user/alice/virtualClusters",
              json={"virtualClusters": ["default", "rdma"]})
    return alice


def test_a_capability_the_vc_does_not_allow_is_refused_at_submit(
        rdma_user: AuthedClient, redis_client: redis.Redis) -> None:
    """Threat: a user gives their job a capability no admin granted (IPC_LOCK to
    pin the node's memory). Refused with 403 naming extras.capabilities; nothing
    is stored."""
    resp = rdma_user.post("/api/v1/user/alice/jobs", json=rdma_job(vc="default"))

    assert error_of(resp, 403) == "ForbiddenCapabilityError"
    assert resp.json is not None and "IPC_LOCK" in resp.json["message"]
    assert list(resp.json["fields"]) == ["extras.capabilities"]
    assert redis_client.zcard(keys.JOBS) == 0


def test_a_capability_the_vc_allows_is_admitted_and_kept_for_the_launcher(
        rdma_user: AuthedClient, redis_client: redis.Redis) -> None:
    resp = rdma_user.post("/api/v1/user/alice/jobs", json=rdma_job())

    assert resp.status_code == 202, resp.json
    stored = Store(redis_client).get_config("alice~allreduce")
    assert stored is not None
    assert JobSpec.from_config(stored).capabilities == ("IPC_LOCK",)


def test_an_admin_takes_a_capability_back(admin: AuthedClient,
                                          rdma_user: AuthedClient) -> None:
    """A PUT replaces the VC: without allowedCapabilities it allows none."""
    assert admin.put("/api/v1/virtual-clusters/rdma", json={"gpuQuota": 8}).status_code == 200
    resp = rdma_user.post("/api/v1/user/alice/jobs", json=rdma_job())
    assert error_of(resp, 403) == "ForbiddenCapabilityError"


def test_only_an_admin_sets_a_vc_allow_list(alice: AuthedClient) -> None:
    """Threat: a user allows themselves a capability."""
    resp = alice.put("/api/v1/virtual-clusters/default",
                     json={"gpuQuota": None, "allowedCapabilities": ["IPC_LOCK"]})
    assert resp.status_code == 403
    listed = alice.get("/api/v1/virtual-clusters/default")
    assert listed.json is not None and listed.json["allowedCapabilities"] == []


@pytest.mark.parametrize("capability", ["SYS_ADMIN", "NET_ADMIN", "SYS_MODULE",
                                        "DAC_READ_SEARCH", "ALL", "ipc_lock", 7])
def test_a_capability_that_reaches_the_host_cannot_be_allowed_even_by_an_admin(
        admin: AuthedClient, capability: Any) -> None:
    """Threat: an allow-list hands a job the host (mounts, the host's network
    configuration, kernel modules, open_by_handle_at). Only capabilities that
    stay inside the job can be allowed: 400, and the VC is unchanged."""
    resp = admin.put("/api/v1/virtual-clusters/default",
                     json={"gpuQuota": None, "allowedCapabilities": [capability]})
    assert error_of(resp, 400) == "BadRequestError"
    assert resp.json is not None
    assert any(f.startswith("allowedCapabilities") for f in resp.json["fields"]), resp.json
    view = admin.get("/api/v1/virtual-clusters/default").json
    assert view is not None and view["allowedCapabilities"] == []


@pytest.mark.parametrize("asked", [["SYS_ADMIN"], "IPC_LOCK", [None], ["NET_RAW"] * 99])
def test_a_job_asking_for_what_no_vc_may_allow_is_400(rdma_user: AuthedClient,
                                                     asked: Any) -> None:
    resp = rdma_user.post("/api/v1/user/alice/jobs",
                          json=config("bad", virtualCluster="rdma",
                                      extras={"capabilities": asked}))
    assert error_of(resp, 400) == "InvalidJobConfigError"
    assert resp.json is not None and list(resp.json["fields"]) == ["extras.capabilities"]
