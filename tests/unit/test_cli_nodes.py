"""`pai nodes` and its admin commands: the bodies they send, the lines and
table they print (talking to the real API: tests/integration/test_cli_nodes.py)."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from pai_cli.api import node_path
from pai_cli.commands.cluster import node_change
from pai_cli.views import node_line, nodes_table


@pytest.mark.parametrize(("action", "reason", "body"), [
    pytest.param("cordon", None, {"schedulable": False}, id="cordon"),
    pytest.param("cordon", "fan", {"schedulable": False, "reason": "fan"},
                 id="cordon with a reason"),
    pytest.param("drain", "reboot", {"drain": True, "reason": "reboot"}, id="drain"),
    pytest.param("drain", "", {"drain": True, "reason": ""}, id="an empty reason clears it"),
    pytest.param("uncordon", None, {"schedulable": True}, id="uncordon"),
])
def test_node_change(action: str, reason: str | None, body: dict[str, Any]) -> None:
    assert node_change(action, reason) == body


def test_node_path_quotes_the_name() -> None:
    assert node_path("gpu/01 x") == "/api/v1/nodes/gpu%2F01%20x"


@pytest.mark.parametrize(("node", "line"), [
    pytest.param({"name": "n1", "state": "READY", "tasks": 3, "cordonReason": ""},
                 "node n1 READY", id="ready"),
    pytest.param({"name": "n1", "state": "CORDONED", "tasks": 3, "cordonReason": "fan"},
                 "node n1 CORDONED: fan", id="cordoned"),
    pytest.param({"name": "n1", "state": "DRAINING", "tasks": 2, "cordonReason": "reboot"},
                 "node n1 DRAINING (2 tasks left): reboot", id="draining"),
    pytest.param({"name": "n1", "state": "DRAINED", "tasks": 0, "cordonReason": ""},
                 "node n1 DRAINED", id="drained"),
])
def test_node_line(node: dict[str, Any], line: str) -> None:
    assert node_line(node) == line


def test_the_table_shows_state_model_used_free_and_reason() -> None:
    node = {"name": "gpu-07", "ip": "10.0.0.7", "state": "DRAINING", "cordonReason": "rma [2]",
            "gpus": [{"model": "NVIDIA H100"}, {"model": "NVIDIA H100"}, {"model": ""}],
            "gpuTotal": 8, "gpuUsed": 3, "gpuFree": 5, "cpuTotal": 64, "cpuUsed": 8,
            "memoryMBTotal": 512000, "memoryMBUsed": 2048, "tasks": 2,
            "lastHeartbeat": 95_000}
    console = Console(width=200, record=True)
    console.print(nodes_table([node], now=100_000))
    header, row = console.export_text().splitlines()
    assert header.split() == ["NAME", "STATE", "IP", "GPU", "MODEL", "GPUS", "FREE", "CPUS",
                              "MEMORY", "TASKS", "HEARTBEAT", "REASON"]
    assert row.split() == ["gpu-07", "DRAINING", "10.0.0.7", "NVIDIA", "H100", "3/8", "5",
                           "8/64", "2.0G/500.0G", "2", "5s", "ago", "rma", "[2]"]
