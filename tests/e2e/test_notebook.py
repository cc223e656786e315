"""examples/pytorch-notebook.json: a real Jupyter server in a task, reached only
through the task port proxy. Its REST API answers over HTTP, a kernel runs
code asked over its WebSocket, another user is refused, and the notebook
refuses a direct connection that lacks the job's secret (other jobs share
the node's network)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from simple_websocket import Client

from bench.live_platform import USER, Platform, wait_for

pytestmark = pytest.mark.docker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
START_SECONDS = 120


def execute_request(code: str) -> dict[str, Any]:
    """A Jupyter messaging protocol request, as the legacy JSON WebSocket carries it."""
    return {"header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request",
                       "username": USER, "session": uuid.uuid4().hex, "version": "5.3",
                       "date": "2026-01-01T00:00:00Z"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}


def printed(ws: Client, msg_id: str) -> str:
    """What the kernel printed for request `msg_id`, up to its idle status."""
    out = ""
    while True:
        raw = ws.receive(timeout=60)
        assert raw is not None, "the kernel said nothing for a minute"
        message = json.loads(raw)
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if message["msg_type"] == "stream":
            out += message["content"]["text"]
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return out


def test_a_jupyter_server_in_a_task_answers_through_the_proxy_only(
        platform: Platform, pytorch_image: str, unique: Callable[[str], str]) -> None:
    name = unique("notebook")
    config = json.loads((EXAMPLES / "pytorch-notebook.json").read_text())
    config["jobName"] = name
    platform.submit_accepted(config)
    task = platform.wait_state(name, "RUNNING")["taskRoles"]["main"]["taskStatuses"][0]
    base = f"{platform.url}/api/v1/user/{USER}/jobs/{name}/tasks/main/0/proxy/jupyter/"
    try:
        status = wait_for(lambda: (lambda r: r if r.status_code == 200 else None)(
            platform.http.get(base + "api/status", timeout=30)), START_SECONDS,
            "Jupyter to answer through the proxy")
        assert "kernels" in status.json()

        kernel = platform.http.post(base + "api/kernels", json={"name": "python3"}, timeout=60)
        assert kernel.status_code == 201, kernel.text
        channels = base.replace("http://", "ws://") + f"api/kernels/{kernel.json()['id']}/channels"
        ws = Client.connect(channels, headers={
            "Authorization": platform.http.headers["Authorization"]})
        try:
            request = execute_request("print(6 * 7)")
            ws.send(json.dumps(request))
            assert printed(ws, request["header"]["msg_id"]) == "42\n"
        finally:
            ws.close()

        platform.create_user("eve", "eve-password")
        eve = requests.Session()
        platform.login(eve, "eve", "eve-password")
        assert eve.get(base + "api/status", timeout=30).status_code == 403
        # Straight to the node's port (as another job could), without the
        # job's secret: Jupyter itself refuses.
        direct = requests.get(f"http://{task['containerIp']}:{task['containerPorts']['jupyter']}"
                              f"/api/v1/user/{USER}/jobs/{name}/tasks/main/0/proxy/jupyter/"
                              "api/kernels", timeout=30)
        assert direct.status_code == 403
    finally:
        platform.stop(name)
