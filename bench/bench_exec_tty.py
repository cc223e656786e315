"""Interactive exec: keystroke to echo on an idle node, beside bare Docker.

The whole platform runs as processes (bench/live_platform.py: the API under
gunicorn's gevent worker) on a throwaway Redis and the Docker engine
DOCKER_HOST names. One job of one task (`sleep 3600`) runs; then:

- platform: a terminal session over the WebSocket running `cat` (the task's
  TTY echoes what it is sent); one byte sent, timed until its echo comes
  back (client -> API -> Redis list -> launcher -> Docker's exec socket ->
  the TTY's echo -> Docker -> launcher -> Redis stream -> API -> client);
- reference: the same `cat` through the Docker SDK's exec socket directly,
  as the launcher holds it.

One byte at a time, PAI_BENCH_ROUNDS (50) rounds of each.
"""

from __future__ import annotations

import json
import os
import select
import time
from typing import Any

from simple_websocket import Client

from bench import BenchError, Figures, latency_figures, percentile
from bench.live_platform import USER, one_task_running

ROUNDS = 50
WARMUP = 3
JOB = "exec-tty-bench"
DEADLINE_SECONDS = 30.0


def _echo_over_websocket(ws: Client, key: bytes) -> float:
    start = time.perf_counter()
    ws.send(key)
    seen = b""
    while key not in seen:
        message = ws.receive(timeout=DEADLINE_SECONDS)
        if message is None:
            raise BenchError(f"no echo of {key!r} within {DEADLINE_SECONDS} s")
        if isinstance(message, str):
            raise BenchError(f"the session ended: {message}")
        seen += message
    return (time.perf_counter() - start) * 1000


def _echo_over_docker(sock: Any, key: bytes) -> float:
    raw = getattr(sock, "_sock", sock)
    start = time.perf_counter()
    raw.sendall(key)
    seen = b""
    while key not in seen:
        ready, _, _ = select.select([raw], [], [], DEADLINE_SECONDS)
        if not ready:
            raise BenchError(f"no echo of {key!r} from Docker within {DEADLINE_SECONDS} s")
        seen += raw.recv(4096)
    return (time.perf_counter() - start) * 1000


def run() -> Figures:
    rounds = int(os.environ.get("PAI_BENCH_ROUNDS", ROUNDS))
    with one_task_running(JOB) as (pai, container):
        ws_url = (f"{pai.url.replace('http', 'ws', 1)}/api/v1/user/{USER}/jobs/{JOB}"
                  "/tasks/main/0/exec?tty=1&command=cat")
        ws = Client.connect(ws_url, headers={
            "Authorization": str(pai.http.headers["Authorization"])})
        ws.send(json.dumps({"type": "resize", "cols": 80, "rows": 24}))
        api = pai.docker.api  # type: ignore[union-attr]
        exec_id = api.exec_create(container.id, ["cat"], stdin=True, tty=True)["Id"]
        sock = api.exec_start(exec_id, socket=True, tty=True)
        keys = [bytes([ord("a") + i % 26]) for i in range(rounds + WARMUP)]
        try:
            platform, reference = [], []
            for i, key in enumerate(keys):
                through_platform = _echo_over_websocket(ws, key)
                bare = _echo_over_docker(sock, key)
                if i >= WARMUP:
                    platform.append(through_platform)
                    reference.append(bare)
        finally:
            ws.close()
            sock.close()
        pai.stop(JOB)
    return {
        "rounds": f"{rounds} single keystrokes, alternating, idle node, `cat` on a TTY",
        "keystroke to echo": {
            "platform (WebSocket .../exec?tty=1)": latency_figures(platform),
            "bare Docker SDK exec socket (reference)": latency_figures(reference)},
        "ratio p50 platform vs reference": percentile(platform, 0.5)
        / percentile(reference, 0.5),
    }
