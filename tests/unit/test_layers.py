"""The layers of shared/ (shared/*/__init__.py say what each holds): a lower
layer never imports a higher one, and the domain does no IO.

    services          may import anything below
    shared.state      domain, infra
    shared.node       domain, infra
    shared.infra      domain
    shared.domain     nothing of the platform's but itself

A test of the rule's own teeth builds a module that breaks it and expects the
checker to say so.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

LAYERS = ("domain", "infra", "state", "node")
MAY_IMPORT = {
    "shared.domain": {"shared.domain"},
    "shared.infra": {"shared.domain", "shared.infra"},
    "shared.state": {"shared.domain", "shared.infra", "shared.state"},
    "shared.node": {"shared.domain", "shared.infra", "shared.node"},
}
# What the domain may not touch: the network, processes, the clock, files,
# and every client library of the platform's IO.
DOMAIN_FORBIDDEN = {
    "os", "time", "socket", "subprocess", "threading", "asyncio", "select", "shutil",
    "redis", "docker", "celery", "kombu", "flask", "werkzeug", "pynvml", "requests",
    "urllib3", "gevent", "prometheus_client", "gunicorn",
}


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "services":
        return "services"
    if parts[0] == "shared" and len(parts) > 1 and parts[1] in LAYERS:
        return f"shared.{parts[1]}"
    if parts[0] == "shared":
        return "shared"
    return None


def imported(source: str) -> list[str]:
    """Every module a source imports, `from shared import x` as `shared.x`."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names
                         if node.module in ("shared", *(f"shared.{layer}" for layer in LAYERS)))
    return names


def violations(module: str, source: str) -> list[str]:
    """What the module imports that its layer may not."""
    layer = layer_of(module)
    found = []
    for name in imported(source):
        target = layer_of(name)
        if layer in MAY_IMPORT and target not in (None, "shared", *MAY_IMPORT[layer]):
            found.append(f"{module} ({layer}) imports {name} ({target})")
        if layer == "shared.domain" and name.split(".")[0] in DOMAIN_FORBIDDEN:
            found.append(f"{module} (domain) imports {name}, which does IO")
    return found


def modules() -> list[tuple[str, pathlib.Path]]:
    found = []
    for folder in ("shared", "services"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found.append((name.removesuffix(".__init__"), path))
    return found


def test_every_module_of_shared_lives_in_a_layer() -> None:
    loose = [name for name, _ in modules()
             if name.startswith("shared.") and layer_of(name) == "shared"]
    assert loose == []


@pytest.mark.parametrize("name, path", modules(), ids=[name for name, _ in modules()])
def test_a_module_imports_only_its_own_layer_and_those_below(name: str,
                                                             path: pathlib.Path) -> None:
    assert violations(name, path.read_text()) == []


@pytest.mark.parametrize("module, source, complaint", [
    ("shared.domain.x", "from shared.state import keys\n", "imports shared.state.keys"),
    ("shared.domain.x", "import redis\n", "which does IO"),
    ("shared.domain.x", "import time\n", "which does IO"),
    ("shared.infra.x", "from shared.state.store import Store\n", "(shared.state)"),
    ("shared.node.x", "from shared.state import keys\n", "(shared.state)"),
    ("shared.state.x", "from shared.node.engine import Engine\n", "(shared.node)"),
    ("shared.state.x", "import services.api.app\n", "(services)"),
], ids=["domain->state", "domain->redis", "domain->clock", "infra->state", "node->state",
        "state->node", "state->services"])
def test_the_checker_names_an_import_across_the_rule(module: str, source: str,
                                                     complaint: str) -> None:
    found = violations(module, source)
    assert any(complaint in line for line in found), found


def test_the_checker_lets_an_allowed_import_through() -> None:
    assert violations("shared.state.x", "from shared.domain.models import Job\n"
                                        "from shared.infra import config\n") == []
