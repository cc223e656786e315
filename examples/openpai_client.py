"""A job client as OpenPAI users write them against the v1 REST API:
token -> submit -> poll the job's status -> print each task's log.

    python examples/openpai_client.py http://127.0.0.1:9186 USER PASSWORD JOB.json

Nothing here is specific to pai: the same calls work against OpenPAI's
rest-server. Exits 0 when the job succeeds.
"""

from __future__ import annotations

import json
import sys
import time

import requests


def main(base: str, username: str, password: str, job_file: str) -> int:
    api = base.rstrip("/") + "/api/v1"
    token = requests.post(f"{api}/token", json={
        "username": username, "password": password, "expiration": 3600,
    }, timeout=30).json()["token"]
    headers = {"Authorization": f"Bearer {token}"}

    with open(job_file) as f:
        job = json.load(f)
    job["jobName"] = f"{job['jobName']}-{int(time.time())}"
    resp = requests.post(f"{api}/user/{username}/jobs", json=job, headers=headers, timeout=30)
    if resp.status_code != 202:
        print(f"submit failed: {resp.status_code} {resp.text}", file=sys.stderr)
        return 1
    print(f"submitted {job['jobName']}")

    url = f"{api}/user/{username}/jobs/{job['jobName']}"
    deadline = time.time() + 600
    while time.time() < deadline:
        status = requests.get(url, headers=headers, timeout=30).json()
        state = status["jobStatus"]["state"]
        if state in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(1)
    print(f"job {job['jobName']} {state} (exit code {status['jobStatus']['appExitCode']})")

    for role, info in status["taskRoles"].items():
        for task in info["taskStatuses"]:
            log = requests.get(f"{url}/tasks/{role}/{task['taskIndex']}/log",
                               headers=headers, timeout=30)
            print(f"--- {role}[{task['taskIndex']}] on {task['containerNodeName']} ---")
            print(log.text, end="")
    return 0 if state == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
