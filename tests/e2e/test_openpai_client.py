"""An OpenPAI user's own HTTP script runs unchanged against the platform."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.live_platform import Platform

ROOT = Path(__file__).resolve().parents[2]


def test_openpai_style_client_script(platform: Platform, tmp_path: Path) -> None:
    job = json.loads((ROOT / "examples" / "hello-world.json").read_text())
    job["jobName"] = "openpai-client"
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(job))

    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openpai_client.py"), platform.url,
         "alice", "alice-password", str(job_file)],
        capture_output=True, text=True, timeout=300, check=False)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCEEDED (exit code 0)" in done.stdout
    assert "Hello from openpai-client-" in done.stdout
    assert "--- main[0] on " in done.stdout
