"""CPU-heavy calls off the event loop (shared/infra/offload.py).

Threat: under the API's gevent workers one argon2 hash (~150 ms) holds
every other request of its process; a stream of logins (or of guesses)
would stop the API for everyone. Under gevent the hash runs on a real
thread; elsewhere it is a plain call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from shared.infra.offload import OffLoopHasher, off_loop

REPO = Path(__file__).resolve().parents[2]

UNDER_GEVENT = """
from gevent import monkey
monkey.patch_all()
import threading
from shared.infra.offload import OffLoopHasher, off_loop
loop_thread = threading.get_native_id()
assert off_loop(threading.get_native_id) != loop_thread, "ran on the event loop"
hasher = OffLoopHasher(time_cost=1, memory_cost=64, parallelism=1)
assert hasher.verify(hasher.hash("secret"), "secret")
print("ok")
"""


def test_without_an_event_loop_it_is_a_plain_call() -> None:
    assert off_loop(threading.get_ident) == threading.get_ident()
    hasher = OffLoopHasher(time_cost=1, memory_cost=64, parallelism=1)
    assert hasher.verify(hasher.hash("secret"), "secret")


def test_under_gevent_the_hash_runs_on_a_thread_of_its_own() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO),
                                                         os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", UNDER_GEVENT], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=False)

    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
