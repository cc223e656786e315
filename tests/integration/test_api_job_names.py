"""A job name the platform could never have given a job, in a URL: 404.

Job records and their parts share one key space (`pai:job:<user>~<name>`,
`...:config`, `...:events`, shared/state/keys.py), so a name with a `:` in
it (`mnist:config`) reads another key of a real job; each job endpoint must
answer 404 before it looks, for the owner, another user and an admin alike.
"""

from __future__ import annotations

import pytest

from tests.support.api import AuthedClient, config, error_of

# Names that are another key of the job `mnist` (shared/state/keys.py).
KEY_NAMES = ["mnist:config", "mnist:attempts", "mnist:events", "mnist:attempt:0:tasks"]

# (method, path after /api/v1/user/alice/jobs/<name>, JSON body)
ENDPOINTS = [
    ("get", "", None),
    ("get", "/config", None),
    ("put", "/executionType", {"value": "STOP"}),
    ("get", "/tasks/main/0/log", None),
    ("get", "/tasks/main/0/samples", None),
    ("get", "/metrics", None),
    ("get", "/ssh", None),
    ("post", "/tasks/main/0/exec", {"command": ["true"]}),
    ("delete", "", None),
]


@pytest.fixture
def submitted(alice: AuthedClient) -> AuthedClient:
    """Alice with the job `mnist` submitted: its config, attempts and events exist."""
    assert alice.post("/api/v1/user/alice/jobs", json=config()).status_code == 202
    return alice


@pytest.mark.parametrize("name", KEY_NAMES)
@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS,
                         ids=[f"{m.upper()} {p or '/'}" for m, p, _ in ENDPOINTS])
def test_a_name_naming_another_key_of_a_job_is_404(
        submitted: AuthedClient, admin: AuthedClient, name: str, method: str, path: str,
        body: dict[str, object] | None) -> None:
    for client in (submitted, admin):
        resp = getattr(client, method)(f"/api/v1/user/alice/jobs/{name}{path}", json=body)
        assert error_of(resp, 404) == "NoJobError"


@pytest.mark.parametrize("name", KEY_NAMES)
def test_another_users_job_detail_by_such_a_name_is_404(submitted: AuthedClient,
                                                        bob: AuthedClient, name: str) -> None:
    resp = bob.get(f"/api/v1/user/alice/jobs/{name}")
    assert error_of(resp, 404) == "NoJobError"


def test_the_job_itself_is_still_found(submitted: AuthedClient) -> None:
    assert submitted.get("/api/v1/user/alice/jobs/mnist").status_code == 200
