"""deploy/prometheus: the config and alert rules load, and every rule's cases pass.

Runs Debian's `promtool` (`make test` installs the prometheus package when
missing, through scripts/runtime.sh prometheus-binary).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = sorted((DEPLOY / "rules").glob("*.yml"))
RULE_TESTS = sorted((DEPLOY / "tests").glob("*.yml"))


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not on PATH: run `make test` (it installs Debian's prometheus "
                    "package when root), or install prometheus yourself", pytrace=False)
    return found


def run(promtool: str, *args: str | Path) -> str:
    result = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_rules_are_valid(promtool: str) -> None:
    assert RULES
    run(promtool, "check", "rules", *RULES)


def test_the_compose_config_is_valid_with_its_rules(promtool: str) -> None:
    output = run(promtool, "check", "config", DEPLOY / "prometheus.yml")
    assert f"{len(RULES)} rule files found" in output


def test_every_rule_passes_its_promtool_cases(promtool: str) -> None:
    assert RULE_TESTS
    run(promtool, "test", "rules", *RULE_TESTS)


def test_every_alert_has_a_case_that_makes_it_fire() -> None:
    alerts = {rule["alert"] for path in RULES
              for group in yaml.safe_load(path.read_text())["groups"]
              for rule in group["rules"] if "alert" in rule}
    firing = {case["alertname"] for path in RULE_TESTS
              for test in yaml.safe_load(path.read_text())["tests"]
              for case in test.get("alert_rule_test", ()) if case.get("exp_alerts")}

    assert alerts == firing
    assert {"PaiNodeDown", "PaiSchedulerDown", "PaiRedisDown", "PaiJobWaitingTooLong",
            "PaiGpuUsedByExternalProcess", "PaiJobGpusIdle", "PaiGpuEccErrors"} <= alerts


def test_the_compose_config_scrapes_the_api_and_finds_the_nodes_through_it() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}

    assert [t for c in jobs["pai-api"]["static_configs"] for t in c["targets"]] == ["api:9186"]
    assert [c["url"] for c in jobs["pai-monitor"]["http_sd_configs"]] == [
        "http://api:9186/prometheus/targets"]
