"""The real `pai-api` (gunicorn, gevent workers) as a process of the test on
127.0.0.1 and a free port, stopped by its process group at the end."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from bench import free_port
from tests.support import REPO_ROOT

DEADLINE_SECONDS = 60.0
ROOT, ROOT_PASSWORD = "root", "root-password"
FOLLOWED = "/api/v1/user/root/jobs/followed/tasks/main/0/log?follow=1"


class Api:
    """One `pai-api` process tree, stopped by its PID at the end."""

    def __init__(self, redis_url: str, work: Path, **settings: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAI_")}
        env.update({
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]),
            "PAI_REDIS_URL": redis_url, "PAI_API_HOST": "127.0.0.1",
            "PAI_API_PORT": str(self.port), "PAI_ADMIN_USER": ROOT,
            "PAI_ADMIN_PASSWORD": ROOT_PASSWORD, "PAI_STORAGE_ROOTS": str(work),
            **settings,
        })
        self.log = work / "api.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.api.run"], env=env, cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.http = requests.Session()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")
            with contextlib.suppress(requests.RequestException):
                token = requests.post(f"{self.url}/api/v1/token", timeout=5, json={
                    "username": ROOT, "password": ROOT_PASSWORD})
                if token.status_code == 200:
                    self.http.headers["Authorization"] = f"Bearer {token.json()['token']}"
                    return
            time.sleep(0.1)
        pytest.fail(f"the API did not come up:\n{self.log.read_text(errors='replace')}")

    def stop(self) -> None:
        self.http.close()
        self.proc.send_signal(signal.SIGINT)  # gunicorn's quick shutdown
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this test started
            self.proc.wait(timeout=30)

    def raw_request(self, head: bytes) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=DEADLINE_SECONDS)
        sock.sendall(head)
        return sock

    def follow(self) -> socket.socket:
        """A follow of root's job, as a raw socket: its answer's status line read."""
        auth = str(self.http.headers["Authorization"])
        return self.raw_request(f"GET {FOLLOWED} HTTP/1.1\r\nHost: t\r\n"
                                f"Authorization: {auth}\r\n\r\n".encode())
