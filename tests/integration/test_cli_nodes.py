"""`pai nodes` in-process against the real API, served over HTTP on
127.0.0.1 from a real Redis: an admin cordons, drains and uncordons; a user
sees the state and is refused the change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flask import Flask

from tests.support.cli import api as api  # the fixture
from tests.support.cli import pai_as, run

pytestmark = pytest.mark.redis


def test_admin_cordons_drains_and_uncordons(api: tuple[str, Flask], tmp_path: Path) -> None:
    root = pai_as(api, tmp_path, "root")
    done = run(root, "nodes", "cordon", "n1", "--reason", "fan noise")
    assert (done.exit_code, done.stdout) == (0, "node n1 CORDONED: fan noise\n"), done.stderr
    done = run(root, "nodes", "drain", "n1")
    assert done.stdout == "node n1 DRAINING (1 tasks left): fan noise\n", done.stderr
    table = run(root, "nodes").stdout
    assert "DRAINING" in table and "Tesla V100" in table and "fan noise" in table
    [node] = json.loads(run(root, "nodes", "-o", "json").stdout)
    assert (node["state"], node["gpuFree"], node["cordonedBy"]) == ("DRAINING", 1, "root")
    done = run(root, "nodes", "uncordon", "n1", "-o", "json")
    assert json.loads(done.stdout)["state"] == "READY"


def test_a_user_sees_nodes_but_may_not_cordon(api: tuple[str, Flask], tmp_path: Path) -> None:
    alice = pai_as(api, tmp_path, "alice")
    assert "READY" in run(alice, "nodes").stdout
    done = run(alice, "nodes", "cordon", "n1")
    assert done.exit_code == 1
    assert done.stderr.startswith("error: ForbiddenUserError:")


def test_an_unknown_node_is_a_one_line_error(api: tuple[str, Flask], tmp_path: Path) -> None:
    done = run(pai_as(api, tmp_path, "root"), "nodes", "drain", "ghost")
    assert (done.exit_code, done.stderr) == (1, "error: NoNodeError: node ghost has never "
                                                "reported\n")
