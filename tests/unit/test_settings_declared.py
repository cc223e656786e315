"""Every `PAI_*` setting is declared once (shared/infra/config.py), and what
documents or passes on settings is held to those declarations: the README's
table, `.env.example`, docker-compose.yml and the Kubernetes manifests.

A deployment passing a setting is deliberate: each declaration names the
deployments whose files set it (`passed_by`), and the files must set exactly
those. A new setting is one declaration; the README's table is then printed
from it (`python -m shared.infra.config --update README.md`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.infra.config import (
    COMPOSE,
    K8S,
    SETTINGS,
    TABLE_BEGIN,
    TABLE_END,
    Settings,
    load_settings,
    settings_table,
    with_table,
)

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = (ROOT / "docker-compose.yml", ROOT / "docker-compose.gpu.yml")
# Variables of Compose's own with the platform's prefix, and why they are not settings.
COMPOSE_OWN = {
    "PAI_IMAGE": "the image Compose builds and runs",
    "PAI_STORAGE_ROOT": "the one host folder Compose mounts; passed on as PAI_STORAGE_ROOTS",
}
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def declared(deployment: str) -> set[str]:
    return {d.env for d in SETTINGS if deployment in d.passed_by}


# ---------------------------------------------------------------- the declarations


def test_each_setting_is_declared_once_with_a_line_of_doc() -> None:
    names = [d.env for d in SETTINGS]
    assert len(names) == len(set(names))
    for declaration in SETTINGS:
        assert re.fullmatch(r"PAI_[A-Z0-9_]+", declaration.env)
        assert declaration.doc.strip() and "\n" not in declaration.doc, declaration.env
        assert set(declaration.passed_by) <= {COMPOSE, K8S}, declaration.env


def test_an_empty_environment_gives_every_declared_default() -> None:
    loaded = load_settings({})
    for declaration in SETTINGS:
        if declaration.attribute:
            assert getattr(loaded, declaration.attribute) == declaration.default, \
                declaration.env
    assert loaded == Settings(node_name=loaded.node_name)


@pytest.mark.parametrize(("name", "raw", "attribute", "value"), [
    ("PAI_API_PORT", "8080", "api_port", 8080),
    ("PAI_API_PORT", "0", "api_port", 9186),
    ("PAI_RETENTION_DAYS", "0", "retention_days", 0),
    ("PAI_DEV_MODE", "", "dev_mode", False),
    ("PAI_SCHEDULER_LAS_THRESHOLDS", "", "las_thresholds_gpu_seconds", ()),
    ("PAI_SCHEDULER_LAS_PREEMPT", "", "las_preempt", True),
    ("PAI_LOG_LEVEL", "warn", "log_level", "WARNING"),
    ("PAI_ADMIN_PASSWORD", " pass word ", "admin_password", " pass word "),
    ("PAI_ADMIN_PASSWORD", "   ", "admin_password", "admin-password"),
    ("PAI_REDIS_MAXMEMORY", "512mb", "redis_maxmemory_bytes", 512 * 1024**2),
], ids=["a count", "a count's 0 is its default", "a whole number's 0 is 0",
        "dev mode: blank is off", "LAS thresholds: blank is one queue",
        "LAS preemption: blank is the default", "a level's short name",
        "text as written", "only spaces: the default", "a size"])
def test_a_declaration_reads_its_variable(name: str, raw: str, attribute: str,
                                          value: Any) -> None:
    outside_dev_mode = {"PAI_SECRET_KEY": "x" * 32, "PAI_ADMIN_PASSWORD": "not-the-default"}
    env = {**outside_dev_mode, "PAI_DEV_MODE": "1", name: raw}
    assert getattr(load_settings(env), attribute) == value


# ---------------------------------------------------------------- the README


def test_the_readme_table_is_printed_from_the_declarations() -> None:
    readme = (ROOT / "README.md").read_text()
    assert TABLE_BEGIN in readme and TABLE_END in readme
    assert with_table(readme) == readme, \
        "README.md's settings table is stale: python -m shared.infra.config --update README.md"
    for declaration in SETTINGS:
        assert f"| `{declaration.env}` |" in readme


def test_the_module_prints_and_updates_the_table(tmp_path: Path) -> None:
    printed = subprocess.run([sys.executable, "-m", "shared.infra.config", "--markdown"],
                             cwd=ROOT, capture_output=True, text=True, check=True)
    assert printed.stdout == settings_table()
    stale = tmp_path / "README.md"
    stale.write_text(f"# title\n{TABLE_BEGIN}\n| old |\n{TABLE_END}\nafter\n")
    subprocess.run([sys.executable, "-m", "shared.infra.config", "--update", str(stale)],
                   cwd=ROOT, check=True)
    assert stale.read_text() == f"# title\n{TABLE_BEGIN}\n{settings_table()}{TABLE_END}\nafter\n"


# ---------------------------------------------------------------- Compose


def compose_interpolations() -> dict[str, set[str]]:
    """Each variable docker-compose.yml (and its GPU file) reads, with the
    defaults it gives it (comments left out)."""
    found: dict[str, set[str]] = {}
    for path in COMPOSE_FILES:
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            for name, default in INTERPOLATION.findall(line):
                found.setdefault(name, set()).add(default)
    return found


def env_example() -> dict[str, str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    pairs = [line.split("=", 1) for line in lines if line.strip() and not line.startswith("#")]
    assert len({name for name, _ in pairs}) == len(pairs), "a variable twice in .env.example"
    return dict(pairs)


def compose_passed() -> set[str]:
    """The PAI_* names Compose puts into the environment of the platform's
    containers (those of its image)."""
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    passed: set[str] = set()
    for service in document["services"].values():
        if "PAI_IMAGE" in str(service.get("image", "")):
            passed |= {name for name in service.get("environment", {})
                       if name.startswith("PAI_")}
    return passed


def test_compose_passes_on_the_settings_declared_for_it() -> None:
    passed = compose_passed()
    assert passed - declared(COMPOSE) == set(), "passed by Compose, not declared as such"
    assert declared(COMPOSE) - passed == set(), "declared as passed by Compose, and not"


def test_env_example_offers_every_variable_compose_reads_at_its_default() -> None:
    example, reads = env_example(), compose_interpolations()
    assert set(example) == set(reads)
    for name, defaults in reads.items():
        assert defaults == {example[name]}, f"{name}: Compose's default(s) {defaults}, " \
                                            f".env.example's {example[name]!r}"


def test_every_prefixed_variable_compose_reads_is_a_setting_or_its_own() -> None:
    settings = {d.env for d in SETTINGS}
    prefixed = {name for name in compose_interpolations() if name.startswith("PAI_")}
    assert prefixed - settings == set(COMPOSE_OWN)
    assert not set(COMPOSE_OWN) & settings


# ---------------------------------------------------------------- Kubernetes


def k8s_passed(folder: Path) -> set[str]:
    """The PAI_* names the manifests in `folder` set: the ConfigMap's keys and
    every container's own `env`."""
    passed: set[str] = set()
    for path in sorted(folder.glob("*.yaml")):
        for resource in yaml.safe_load_all(path.read_text()):
            if not resource or resource.get("kind") == "Kustomization":
                continue
            if resource["kind"] == "ConfigMap":
                passed |= set(resource["data"])
            pod = resource.get("spec", {}).get("template", {}).get("spec", {})
            for container in pod.get("initContainers", []) + pod.get("containers", []):
                passed |= {e["name"] for e in container.get("env", [])}
    return {name for name in passed if name.startswith("PAI_")}


def k8s_secrets() -> set[str]:
    lines = (ROOT / "k8s" / "secrets.env.example").read_text().splitlines()
    return {line.split("=", 1)[0] for line in lines if line.strip() and not line.startswith("#")}


def test_kubernetes_passes_on_the_settings_declared_for_it() -> None:
    passed = k8s_passed(ROOT / "k8s") | k8s_secrets()
    assert passed - declared(K8S) == set(), "passed by k8s/, not declared as such"
    assert declared(K8S) - passed == set(), "declared as passed by k8s/, and not"


def test_the_ha_component_changes_only_settings_kubernetes_passes() -> None:
    assert k8s_passed(ROOT / "k8s" / "ha") <= declared(K8S)
