"""The `pai` CLI installs alone (issue 14): `pip install ./cli` into a bare
virtualenv gives a working `pai`, and nothing of the server comes with it.

Users install the CLI on their laptops next to their own code. Before the
split it pulled in Flask, Celery and the Docker SDK and put top-level
packages named `shared`, `services` and `cli` into their environment, where
they shadow or are shadowed by anything else so named. This test builds the
environment a user would have and looks at what is in it.

It is the one test that reaches the package index (through pip only, which
caches what it downloads); the copy of cli/ keeps pip's build files out of
the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PIP_TIMEOUT_S = 280


def _env() -> dict[str, str]:
    """The caller's environment without what would put this checkout on the path."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _python(env_dir: Path, code: str) -> subprocess.CompletedProcess[str]:
    # -I: no current folder, no PYTHON* variables, no user site: only the venv.
    return subprocess.run([str(env_dir / "bin" / "python"), "-I", "-c", code],
                          capture_output=True, text=True, env=_env(), timeout=60,
                          check=False)


@pytest.fixture(scope="module")
def cli_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A virtualenv without system site packages and `pip install <copy of cli/>`."""
    root = tmp_path_factory.mktemp("cli-install")
    source = root / "cli"
    shutil.copytree(REPO_ROOT / "cli", source,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(env_dir)
    installed = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", str(source)],
        capture_output=True, text=True, env=_env(), timeout=PIP_TIMEOUT_S, check=False)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    yield env_dir


def test_pai_help_works_in_a_bare_virtualenv(cli_venv: Path) -> None:
    shown = subprocess.run([str(cli_venv / "bin" / "pai"), "--help"], capture_output=True,
                           text=True, env=_env(), cwd=cli_venv, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    for command in ("login", "submit", "jobs", "logs", "stop"):
        assert f"  {command} " in shown.stdout


def test_a_local_run_says_what_it_needs_besides_the_cli(cli_venv: Path) -> None:
    ran = subprocess.run([str(cli_venv / "bin" / "pai"), "run", "--local",
                          str(REPO_ROOT / "examples" / "hello-world.json")],
                         capture_output=True, text=True, env=_env(), cwd=cli_venv, timeout=60,
                         check=False)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert 'pip install ./ "./cli[local]"' in ran.stderr and "Traceback" not in ran.stderr


@pytest.mark.parametrize("module", ["flask", "celery", "docker", "kombu", "redis",
                                    "marshmallow", "gunicorn"])
def test_the_server_s_libraries_do_not_come_with_the_cli(cli_venv: Path, module: str) -> None:
    probe = _python(cli_venv, f"import {module}")
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, probe.stderr


@pytest.mark.parametrize("name", ["shared", "services", "cli"])
def test_no_generic_top_level_package_is_installed(cli_venv: Path, name: str) -> None:
    probe = _python(cli_venv, f"import importlib.util; print(importlib.util.find_spec({name!r}))")
    assert probe.returncode == 0 and probe.stdout.strip() == "None", probe.stdout + probe.stderr


def test_the_distribution_ships_one_import_package(cli_venv: Path) -> None:
    """Every file pai-cli installs is its package, its metadata or its script."""
    probe = _python(cli_venv, "import importlib.metadata as m; "
                              "print('\\n'.join(str(f) for f in m.files('pai-cli')))")
    assert probe.returncode == 0, probe.stderr
    tops = {Path(line).parts[0] for line in probe.stdout.split()}
    tops = {top for top in tops if not top.endswith(".dist-info") and top != ".."}
    assert tops == {"pai_cli"}


def test_the_cli_pins_match_the_server_s() -> None:
    """Exact pins, and one version of each library in the repository: a pin the
    CLI shares with the server's pyproject (PyYAML) is the same pin."""

    def pins(path: Path) -> dict[str, str]:
        found = tomllib.loads(path.read_text())["project"]["dependencies"]
        assert all("==" in pin for pin in found), found
        return dict(pin.lower().split("==", 1) for pin in found)

    cli, server = pins(REPO_ROOT / "cli" / "pyproject.toml"), pins(REPO_ROOT / "pyproject.toml")
    assert set(cli) == {"click", "rich", "pyyaml", "simple-websocket"}
    assert {name: cli[name] for name in cli.keys() & server.keys()} == \
        {name: server[name] for name in cli.keys() & server.keys()}
