"""Every v1 job config in examples/ is one the API accepts (its validation is
the domain's), so a user copying one never meets a 400."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.domain.jobspec import validate_job_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.name)
def test_each_example_is_valid(path: Path) -> None:
    config = json.loads(path.read_text())
    validated = validate_job_config(config, username="alice", storage_roots=["/srv/pai"])
    assert validated.config["jobName"] == config["jobName"]


@pytest.mark.parametrize("name", ["pytorch-digits.json", "pytorch-ddp.json",
                                  "pytorch-preemptible.json"])
def test_the_pytorch_examples_run_the_script_the_image_holds(name: str) -> None:
    config = json.loads((EXAMPLES / name).read_text())
    for role in config["taskRoles"]:
        words = role["command"].split()
        # exec: the trainer itself gets the stop signal, not a shell that dies of it
        assert words[:2] == ["exec", "python3"]
        assert words[2].startswith("/opt/pai-examples/")
        assert (EXAMPLES / "pytorch" / Path(words[2]).name).is_file()
