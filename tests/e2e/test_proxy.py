"""The task port proxy on the running platform (gunicorn's gevent workers):
HTTP and WebSocket to a task's labelled port, for the job's owner and admins
only, without the platform's credentials reaching the job.

The job runs `sleep`; the server on its `web` port is tests/e2e/taskserver.py,
started by the test on the port the platform gave the task (jobs share the
host's network, so that is where a notebook the task started would listen).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from simple_websocket import Client

from bench.live_platform import USER, USER_PASSWORD, Platform, wait_for
from tests.e2e.taskserver import TaskServer

pytestmark = pytest.mark.docker

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
TOKEN = re.compile(r"proxy token (\S+)")


@dataclass
class Notebook:
    """A running job with a server on its `web` port."""

    name: str
    url: str  # the proxy's URL of the task's `web` port, with a trailing /
    token: str  # the job's PAI_PROXY_TOKEN, as the task saw it
    server: TaskServer


@pytest.fixture(scope="module")
def notebook(platform: Platform) -> Iterator[Notebook]:
    name = f"proxied-{re.sub(r'[^a-z0-9]', '', platform.node)[-8:]}"
    config = platform.config(name, 'echo "proxy token $PAI_PROXY_TOKEN"; '
                             'echo "path $PAI_PROXY_PATH"; sleep 600')
    config["taskRoles"][0]["portList"] = [{"label": "web", "beginAt": 0, "portNumber": 1}]
    platform.submit_accepted(config)
    detail = platform.wait_state(name, "RUNNING")
    task = detail["taskRoles"]["main"]["taskStatuses"][0]
    log = wait_for(lambda: (lambda text: text if TOKEN.search(text) else None)(
        platform.log(name, "main")), what="the task to print its proxy token")
    token = TOKEN.search(log)
    assert token
    assert f"path /api/v1/user/{USER}/jobs/{name}/tasks/main/0/proxy" in log
    server = TaskServer(int(task["containerPorts"]["web"]))
    try:
        yield Notebook(name, f"{platform.url}/api/v1/user/{USER}/jobs/{name}/tasks/main/0"
                             "/proxy/web/", token[1], server)
    finally:
        server.close()
        platform.stop(name)


def arrived(resp: requests.Response) -> dict[str, Any]:
    """What the task's server says it received."""
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    body["header"] = {name.lower(): value for name, value in body["headers"]}
    return body


def test_an_http_request_round_trips_to_the_task_without_the_platforms_token(
        platform: Platform, notebook: Notebook) -> None:
    resp = platform.http.post(notebook.url + "api/contents/a%2Fb?x=1&y=%20", data=b"z" * 70000,
                              headers={"Cookie": "app=1; pai_portal=secret; other=2"},
                              timeout=30)

    got = arrived(resp)
    assert got["method"] == "POST" and got["bodyLength"] == 70000
    assert got["target"] == (f"/api/v1/user/{USER}/jobs/{notebook.name}/tasks/main/0/proxy/web"
                             "/api/contents/a%2Fb?x=1&y=%20")
    # the job's own secret instead of the caller's bearer token; the portal's
    # session cookie taken out, the job's own cookies kept
    assert got["header"]["authorization"] == f"token {notebook.token}"
    assert got["header"]["cookie"] == "app=1; other=2"
    assert got["header"]["x-forwarded-prefix"] == (
        f"/api/v1/user/{USER}/jobs/{notebook.name}/tasks/main/0/proxy/web")


def test_the_rest_server_prefix_reaches_the_same_path(platform: Platform,
                                                      notebook: Notebook) -> None:
    url = notebook.url.replace("/api/v1/", "/rest-server/api/v1/")
    got = arrived(platform.http.get(url + "lab", timeout=30))
    assert got["target"] == (f"/api/v1/user/{USER}/jobs/{notebook.name}/tasks/main/0/proxy/web"
                             "/lab")
    assert got["header"]["x-forwarded-prefix"].startswith("/rest-server/api/v1/")


def test_a_websocket_frame_round_trips(platform: Platform, notebook: Notebook) -> None:
    token = platform.http.headers["Authorization"]
    ws = Client.connect(notebook.url.replace("http://", "ws://") + "api/kernels/k/channels",
                        headers={"Authorization": token})
    try:
        ws.send("hello through the proxy")
        assert ws.receive(timeout=30) == "hello through the proxy"
        ws.send(b"\x00\x01binary")
        assert ws.receive(timeout=30) == b"\x00\x01binary"
    finally:
        ws.close()
    upgrade = [r for r in notebook.server.seen if r["target"].endswith("/channels")][-1]
    headers = {name.lower(): value for name, value in upgrade["headers"]}
    assert headers["authorization"] == f"token {notebook.token}"


def test_another_user_gets_403_and_no_token_401(platform: Platform,
                                                notebook: Notebook) -> None:
    platform.create_user("mallory", "mallory-password")
    mallory = requests.Session()
    platform.login(mallory, "mallory", "mallory-password")
    seen = len(notebook.server.seen)

    assert mallory.get(notebook.url, timeout=30).status_code == 403
    assert mallory.post(notebook.url + "api/kernels", timeout=30).status_code == 403
    assert requests.get(notebook.url, timeout=30).status_code == 401
    assert len(notebook.server.seen) == seen  # nothing reached the task


def test_an_admin_may_with_a_token(platform: Platform, notebook: Notebook) -> None:
    assert arrived(platform.admin.get(notebook.url, timeout=30))["method"] == "GET"


def test_unknown_labels_and_stopped_tasks_are_refused(platform: Platform,
                                                      notebook: Notebook) -> None:
    missing = platform.http.get(notebook.url.replace("/proxy/web/", "/proxy/jupyter/"),
                                timeout=30)
    assert missing.status_code == 404 and "its labels: default, web" in missing.json()["message"]
    assert platform.http.get(notebook.url.replace("/tasks/main/0/", "/tasks/main/1/"),
                             timeout=30).status_code == 404


def portal_session(platform: Platform, username: str, password: str) -> requests.Session:
    browser = requests.Session()
    form = CSRF.search(browser.get(f"{platform.url}/login", timeout=30).text)
    assert form
    assert browser.post(f"{platform.url}/login", allow_redirects=False, timeout=30, data={
        "csrf_token": form[1], "username": username, "password": password}).status_code == 302
    return browser


def test_in_a_browser_the_owner_gets_in_with_the_portal_cookie_and_an_admin_does_not(
        platform: Platform, notebook: Notebook) -> None:
    owner = portal_session(platform, USER, USER_PASSWORD)
    got = arrived(owner.get(notebook.url + "tree", timeout=30))
    assert "pai_portal" not in got["header"].get("cookie", "")
    assert got["header"]["authorization"] == f"token {notebook.token}"

    admin = portal_session(platform, platform.env["PAI_ADMIN_USER"],
                           platform.env["PAI_ADMIN_PASSWORD"])
    refused = admin.get(notebook.url + "tree", timeout=30)
    assert refused.status_code == 403 and "only the job's owner" in refused.json()["message"]


def test_the_task_cannot_set_the_portal_session_cookie(platform: Platform,
                                                       notebook: Notebook) -> None:
    resp = platform.http.get(notebook.url + "set-cookies", timeout=30)

    assert resp.status_code == 200
    assert resp.raw.headers.getlist("Set-Cookie") == ["app=1; Path=/"]


def test_a_task_that_stopped_listening_gives_502(platform: Platform,
                                                 unique: Callable[[str], str]) -> None:
    name = unique("deaf")
    config = platform.config(name, "sleep 600")
    platform.submit_accepted(config)
    platform.wait_state(name, "RUNNING")
    try:
        resp = platform.http.get(f"{platform.url}/api/v1/user/{USER}/jobs/{name}/tasks/main/0"
                                 "/proxy/default/", timeout=30)
        assert resp.status_code == 502 and resp.json()["code"] == "BadGatewayError"
    finally:
        platform.stop(name)
    platform.wait_state(name)
    stopped = platform.http.get(f"{platform.url}/api/v1/user/{USER}/jobs/{name}/tasks/main/0"
                                "/proxy/default/", timeout=30)
    assert stopped.status_code == 409
    assert json.loads(stopped.text)["code"] == "ConflictJobError"


def test_the_job_page_links_the_owner_to_each_port(platform: Platform,
                                                   notebook: Notebook) -> None:
    link = f'href="/api/v1/user/{USER}/jobs/{notebook.name}/tasks/main/0/proxy/web/"'
    owner = portal_session(platform, USER, USER_PASSWORD)
    page = owner.get(f"{platform.url}/jobs/{USER}/{notebook.name}", timeout=30)
    assert page.status_code == 200 and link in page.text

    admin = portal_session(platform, platform.env["PAI_ADMIN_USER"],
                           platform.env["PAI_ADMIN_PASSWORD"])
    page = admin.get(f"{platform.url}/jobs/{USER}/{notebook.name}", timeout=30)
    assert page.status_code == 200 and "/proxy/web/" not in page.text


def test_each_connection_holds_a_lease_until_it_ends(platform: Platform,
                                                     notebook: Notebook) -> None:
    cap = int(platform.env.get("PAI_PROXY_PER_USER", "32"))
    for _ in range(cap + 5):  # one after the other: each gives its lease back
        assert platform.http.get(notebook.url, timeout=30).status_code == 200

    token = platform.http.headers["Authorization"]
    socket_url = notebook.url.replace("http://", "ws://") + "api/events/subscribe"
    held = [Client.connect(socket_url, headers={"Authorization": token}) for _ in range(cap)]
    try:
        over = platform.http.get(notebook.url, timeout=30)
        assert over.status_code == 429 and over.headers["Retry-After"]
        held.pop().close()
        assert wait_for(lambda: platform.http.get(notebook.url, timeout=30).status_code == 200,
                        what="a closed WebSocket to give its lease back")
    finally:
        for ws in held:
            ws.close()
