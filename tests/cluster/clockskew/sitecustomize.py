"""A wall clock set off, for every Python process started with this folder
on PYTHONPATH and PAI_TEST_CLOCK_SKEW_SECONDS set (Python imports
`sitecustomize` at start-up): `time.time` and `time.time_ns`, what pai's
stamps and its logs read, run that many seconds off. The monotonic clock
and every timed wait stay the machine's.

Not libfaketime: its `clock_nanosleep` with the monotonic clock left real
(`FAKETIME_DONT_FAKE_MONOTONIC`) hands the kernel a bad deadline, so every
`time.sleep` of Python 3.11 raises EINVAL (libfaketime issue 426, in
Debian's 0.9.10): a node agent died at its first sleep, and any retry's
back-off in its launcher or monitor failed in the middle of its work.
"""

from __future__ import annotations

import os
import time

_SKEW_NS = int(float(os.environ.get("PAI_TEST_CLOCK_SKEW_SECONDS", "0")) * 1e9)

if _SKEW_NS:
    _real_time_ns = time.time_ns

    def _time_ns() -> int:
        return _real_time_ns() + _SKEW_NS

    def _time() -> float:
        return _time_ns() / 1e9

    time.time_ns, time.time = _time_ns, _time
