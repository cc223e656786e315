"""Storage per user through the API, on a real Redis: the submit check and the
admin's storage shares. The storage root is the test's tmp_path."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.state import keys
from tests.support.api import AuthedClient, config, error_of

SUBMIT = "/api/v1/user/bob/jobs?dryRun=true"
SHARES = "/api/v1/storage/shares"


def _refused_fields(resp: Any) -> dict[str, list[str]]:
    assert error_of(resp, 403) == "ForbiddenStorageError"
    found: dict[str, list[str]] = resp.json["fields"]
    return found


@pytest.mark.parametrize("field", ["outputDir", "dataDir", "codeDir"])
@pytest.mark.parametrize("target", ["{root}/alice", "{root}/alice/mnist/output", "{root}",
                                    "{root}/alice/../alice", "{root}//alice/.",
                                    "file://{root}/alice/x"],
                         ids=["A's folder", "A's output", "the bare root", "dot-dot",
                              "double slash and dot", "file URI"])
def test_a_user_cannot_name_another_users_folder_or_the_root(
        alice: AuthedClient, bob: AuthedClient, tmp_path: Path, field: str,
        target: str) -> None:
    """Threat: user B's job writes into user A's output, forges A's logs, or
    reads A's data by naming A's folder (or the whole root) as its own dir."""
    value = target.format(root=tmp_path)
    resp = bob.post(SUBMIT, json=config(**{field: value}))
    if "/../" in value:
        assert error_of(resp, 400) == "InvalidJobConfigError"  # refused by its form
        return
    assert field in _refused_fields(resp)


def test_the_refusal_names_every_field_at_once(bob: AuthedClient, tmp_path: Path) -> None:
    resp = bob.post(SUBMIT, json=config(outputDir=f"{tmp_path}/alice/o",
                                        dataDir=f"{tmp_path}/alice/d",
                                        codeDir=f"{tmp_path}/bob/code"))
    assert set(_refused_fields(resp)) == {"outputDir", "dataDir"}


def test_own_folder_is_accepted(bob: AuthedClient, tmp_path: Path) -> None:
    resp = bob.post(SUBMIT, json=config(outputDir=f"{tmp_path}/bob/o",
                                        dataDir=f"{tmp_path}/bob/d",
                                        codeDir="$PAI_DEFAULT_FS_URI/$PAI_USERNAME/code"))
    assert resp.status_code == 200, resp.json
    assert resp.json["config"]["codeDir"] == f"{tmp_path}/bob/code"


def test_nothing_is_stored_for_a_refused_job(bob: AuthedClient, tmp_path: Path,
                                             redis_client: redis.Redis) -> None:
    resp = bob.post("/api/v1/user/bob/jobs", json=config(outputDir=f"{tmp_path}/alice/o"))
    assert resp.status_code == 403
    assert redis_client.zcard(keys.JOBS) == 0


def test_no_one_mounts_the_platform_log_tree(admin: AuthedClient, bob: AuthedClient,
                                             tmp_path: Path) -> None:
    """Threat: a job mounts the platform's log tree and rewrites other jobs' logs."""
    for client, user in ((bob, "bob"), (admin, "root")):
        resp = client.post(f"/api/v1/user/{user}/jobs?dryRun=true",
                           json=config(outputDir=f"{tmp_path}/.pai-logs"))
        assert "outputDir" in _refused_fields(resp)


def test_admins_may_name_any_folder_under_a_root(admin: AuthedClient, alice: AuthedClient,
                                                 tmp_path: Path) -> None:
    """The documented choice: admins, like Slurm's or OpenPAI's, may read or
    write any user's folder (never the log tree, never outside the roots)."""
    resp = admin.post("/api/v1/user/root/jobs?dryRun=true",
                      json=config(outputDir=f"{tmp_path}/alice/o", dataDir=str(tmp_path)))
    assert set(_refused_fields(resp)) == {"dataDir"}  # the root holds the log tree
    resp = admin.post("/api/v1/user/root/jobs?dryRun=true",
                      json=config(outputDir=f"{tmp_path}/alice/o",
                                  dataDir=f"{tmp_path}/alice/d"))
    assert resp.status_code == 200, resp.json


# ---------------------------------------------------------------- shares


def _share(admin: AuthedClient, name: str, path: str, **members: list[str]) -> Any:
    return admin.put(f"{SHARES}/{name}", json={"path": path, **members})


def test_a_share_for_the_users_vc_lets_them_read_it(
        admin: AuthedClient, alice: AuthedClient, bob: AuthedClient, tmp_path: Path) -> None:
    assert admin.put("/api/v1/virtual-clusters/vision", json={"gpuQuota": None}).status_code \
        == 201
    assert admin.put("/api/v1/user/bob/virtualClusters",
                     json={"virtualClusters": ["default", "vision"]}).status_code == 200
    data = f"{tmp_path}/datasets/imagenet"
    assert bob.post(SUBMIT, json=config(dataDir=data)).status_code == 403

    created = _share(admin, "imagenet", data, virtualClusters=["VISION"])
    assert created.status_code == 201, created.json
    assert created.json == {"name": "imagenet", "path": data, "users": [],
                            "virtualClusters": ["vision"]}

    assert bob.post(SUBMIT, json=config(dataDir=f"{data}/train")).status_code == 200
    refused = alice.post("/api/v1/user/alice/jobs?dryRun=true", json=config(dataDir=data))
    assert "dataDir" in _refused_fields(refused)  # alice is not in vision
    # A share is read-only: never an outputDir.
    assert "outputDir" in _refused_fields(bob.post(SUBMIT, json=config(outputDir=data)))


def test_a_share_for_a_user_and_its_removal(admin: AuthedClient, bob: AuthedClient,
                                            tmp_path: Path) -> None:
    data = f"{tmp_path}/alice/public"
    assert _share(admin, "alice-public", data, users=["bob"]).status_code == 201
    assert bob.post(SUBMIT, json=config(codeDir=data)).status_code == 200
    assert bob.get(f"{SHARES}/alice-public").status_code == 200
    assert [s["name"] for s in bob.get(SHARES).json] == ["alice-public"]

    assert admin.delete(f"{SHARES}/alice-public").status_code == 200
    assert "codeDir" in _refused_fields(bob.post(SUBMIT, json=config(codeDir=data)))
    assert error_of(admin.delete(f"{SHARES}/alice-public"), 404) == "NoStorageShareError"


def test_changing_a_share_answers_200(admin: AuthedClient, tmp_path: Path) -> None:
    assert _share(admin, "d", f"{tmp_path}/d").status_code == 201
    changed = _share(admin, "d", f"{tmp_path}/d2/", users=["bob", "bob"])
    assert changed.status_code == 200
    assert changed.json["path"] == f"{tmp_path}/d2" and changed.json["users"] == ["bob"]


def test_only_admins_write_shares_and_users_see_only_theirs(
        admin: AuthedClient, alice: AuthedClient, tmp_path: Path) -> None:
    """Threat: a user shares another user's folder with themselves."""
    assert error_of(_share(alice, "mine", f"{tmp_path}/bob", users=["alice"]), 403) \
        == "ForbiddenUserError"
    assert _share(admin, "secret", f"{tmp_path}/x", users=["bob"]).status_code == 201
    assert alice.get(SHARES).json == []
    assert error_of(alice.get(f"{SHARES}/secret"), 404) == "NoStorageShareError"
    assert error_of(alice.delete(f"{SHARES}/secret"), 403) == "ForbiddenUserError"


@pytest.mark.parametrize(("body", "field"), [
    ({"path": "/etc"}, "path"),
    ({"path": "{root}"}, "path"),
    ({"path": "{root}/.pai-logs/x"}, "path"),
    ({"path": "{root}/a/../b"}, "path"),
    ({"path": "hdfs://nn/x"}, "path"),
    ({}, "path"),
    ({"path": "{root}/d", "users": ["..", "ok"]}, "users.0"),
    ({"path": "{root}/d", "virtualClusters": "vision"}, "virtualClusters"),
    ({"path": "{root}/d", "colour": "blue"}, "colour"),
    ({"path": 7}, "path"),
], ids=["outside the roots", "a whole root", "the log tree", "dot-dot", "hdfs", "no path",
        "a bad user name", "not a list", "an unknown field", "not a string"])
def test_bad_shares_get_400_naming_the_field(admin: AuthedClient, tmp_path: Path,
                                            body: dict[str, Any], field: str) -> None:
    if isinstance(body.get("path"), str):
        body = {**body, "path": body["path"].format(root=tmp_path)}
    resp = admin.put(f"{SHARES}/d", json=body)
    assert error_of(resp, 400) == "BadRequestError"
    assert field in resp.json["fields"]


@pytest.mark.parametrize("body", [b"", b"[1]", b"{", b"null"])
def test_malformed_share_bodies_get_400(admin: AuthedClient, body: bytes) -> None:
    resp = admin.put(f"{SHARES}/d", data=body, content_type="application/json")
    assert error_of(resp, 400) == "BadRequestError"


def test_a_bad_share_name_gets_400_or_404(admin: AuthedClient, tmp_path: Path) -> None:
    assert error_of(_share(admin, "..x", f"{tmp_path}/d"), 400) == "BadRequestError"
    assert error_of(admin.get(f"{SHARES}/..x"), 404) == "NoStorageShareError"


def test_concurrent_share_writes_all_land(admin: AuthedClient, tmp_path: Path,
                                          redis_client: redis.Redis) -> None:
    """The hash is written compare-and-set: parallel PUTs of different shares all land."""
    statuses: list[int] = []

    def put(i: int) -> None:
        statuses.append(_share(admin, f"s{i}", f"{tmp_path}/d{i}").status_code)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(statuses) == [201] * 8
    assert redis_client.hlen(keys.STORAGE_SHARES) == 8
