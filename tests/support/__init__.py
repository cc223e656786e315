"""What tests share: rigs (a node, a scheduler, a Redis group, the whole
platform), builders of configs and records, pollers that wait on a condition
with a bound, and clients of the API. Test modules import from here, never
from each other: a test module is a list of cases, and this package is the
code under them.

    api.py            the Flask test client with a user's token; configs; errors
    api_process.py    the real pai-api as a process
    cli.py            the `pai` CLI against the API over HTTP
    interleave.py     deterministic interleavings for race tests
    joblist.py        jobs written straight into Redis for the list's tests
    launcher_rig.py   a node for the launcher's tests
    lifecycle.py      placing tasks by hand; racing calls
    monitor_rig.py    a node for the monitor's tests
    platform.py       the platform as processes (e2e), and job gates
    policy.py         worlds for the scheduling policy's tests
    polling.py        wait_for, wait_past
    promql.py         the metric names an expression uses
    redis_group.py    a Redis Sentinel group
    redis_server.py   the test Redis servers
    scheduling.py     a scheduler on a real Redis
    threads.py        a thread's wakeups
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
