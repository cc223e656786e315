"""Submit a job config to the local platform, follow it, print its log.

Run by `make demo` after `make up`. A second run submits the same config
under a fresh name (the first one's name is taken).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

HOST = os.environ.get("PAI_API_HOST", "127.0.0.1")
API = f"http://{HOST}:{os.environ.get('PAI_API_PORT', '9186')}"
USER = os.environ.get("PAI_ADMIN_USER", "admin")
PASSWORD = os.environ.get("PAI_ADMIN_PASSWORD", "admin-password")
TOKEN: list[str] = []
FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def call(method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if TOKEN:
        headers["Authorization"] = f"Bearer {TOKEN[0]}"
    req = urllib.request.Request(API + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read().decode()
        return json.loads(raw) if resp.headers.get_content_type() == "application/json" else raw


def main(path: str) -> int:
    with open(path) as f:
        config = json.load(f)
    config["jobName"] = f"{config['jobName']}-{time.strftime('%Y%m%d-%H%M%S')}"
    TOKEN.append(call("POST", "/api/v1/token", {"username": USER, "password": PASSWORD})["token"])
    try:
        submitted = call("POST", f"/api/v1/user/{USER}/jobs", config)
    except urllib.error.HTTPError as error:
        print(f"demo: submit refused: {error.read().decode()}", file=sys.stderr)
        return 1
    name = submitted["name"]
    print(f"demo: submitted {name}: {API}{submitted['url']}")
    state, deadline = "", time.monotonic() + 300
    while time.monotonic() < deadline:
        detail = call("GET", f"/api/v1/user/{USER}/jobs/{name}")
        status = detail["jobStatus"]
        if status["state"] != state:
            state = status["state"]
            reason = f" ({status['waitingReason']})" if status.get("waitingReason") else ""
            print(f"demo: {name} is {state}{reason}")
        if state in FINAL:
            break
        time.sleep(0.2)
    else:
        print("demo: the job did not finish within 5 minutes", file=sys.stderr)
        return 1
    for role, info in detail["taskRoles"].items():
        for task in info["taskStatuses"]:
            print(f"--- log of {role}[{task['taskIndex']}] ---")
            print(call("GET", f"/api/v1/user/{USER}/jobs/{name}/tasks/{role}/"
                              f"{task['taskIndex']}/log"), end="")
    return 0 if state == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
