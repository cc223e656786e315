"""The task port proxy's added latency per request, beside a direct connection.

The whole platform runs as processes (bench/live_platform.py). One job of
one task serves a small file with busybox's httpd on its `web` port, under
its `PAI_PROXY_PATH/web/` as a notebook would; then, alternating, one at a
time, a GET of that file:

- platform: through the API, `.../tasks/main/0/proxy/web/index.html` with
  the user's token (a kept-alive connection to the API; the token check,
  the job, task and node reads, the user's lease, a connection to the task);
- reference: straight to the task's node IP and port, the same path.

busybox's httpd closes each connection after its answer, so both open one
connection to the task per request. PAI_BENCH_ROUNDS overrides the 200
rounds of each.
"""

from __future__ import annotations

import os
import time

import requests

from bench import BenchError, Figures, latency_figures, percentile, throwaway_redis
from bench.live_platform import USER, running_platform, wait_for

ROUNDS = 200
WARMUP = 10
JOB = "proxy-bench"
SERVE = ('d="/tmp/www$PAI_PROXY_PATH/web"; mkdir -p "$d" && echo ok > "$d/index.html" && '
         'exec httpd -f -p "$PAI_CONTAINER_HOST_web_PORT_LIST" -h /tmp/www')


def run() -> Figures:
    rounds = int(os.environ.get("PAI_BENCH_ROUNDS", ROUNDS))
    with throwaway_redis() as url, running_platform(url) as pai:
        config = pai.config(JOB, SERVE)
        config["taskRoles"][0]["portList"] = [{"label": "web", "beginAt": 0, "portNumber": 1}]
        pai.submit_accepted(config)
        task = pai.wait_state(JOB, "RUNNING")["taskRoles"]["main"]["taskStatuses"][0]
        path = f"/api/v1/user/{USER}/jobs/{JOB}/tasks/main/0/proxy/web/index.html"
        proxied = f"{pai.url}{path}"
        direct = f"http://{task['containerIp']}:{task['containerPorts']['web']}{path}"
        plain = requests.Session()

        def timed(session: requests.Session, where: str) -> float:
            start = time.perf_counter()
            resp = session.get(where, timeout=30)
            took = (time.perf_counter() - start) * 1000
            if resp.status_code != 200 or resp.text != "ok\n":
                raise BenchError(f"GET {where} answered {resp.status_code}: {resp.text[:200]}")
            return took

        wait_for(lambda: requests.get(direct, timeout=5).ok, 30, "httpd to serve")
        for _ in range(WARMUP):
            timed(pai.http, proxied)
            timed(plain, direct)
        platform, reference = [], []
        for _ in range(rounds):
            platform.append(timed(pai.http, proxied))
            reference.append(timed(plain, direct))
        pai.stop(JOB)
    return {
        "rounds": f"{rounds} of each, alternating, one at a time, a 3-byte file",
        "GET round trip": {"through the proxy (API)": latency_figures(platform),
                           "direct to the task (reference)": latency_figures(reference)},
        "added p50 ms": percentile(platform, 0.5) - percentile(reference, 0.5),
        "ratio p50 proxy vs direct": percentile(platform, 0.5) / percentile(reference, 0.5),
    }
