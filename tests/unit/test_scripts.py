"""The Lua scripts (shared/state/scripts/): each declared once there, with
named KEYS and ARGV, run only through `scripts.run`, and no state name
spelled in Lua (states come in ARGV from shared/domain/states.py).

The scans read every module of shared/ and services/, so a script written
back into a module of its own, or run by hand, fails here.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from shared.domain.states import JobState, TaskState
from shared.state import scripts

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS_HOME = ROOT / "shared" / "state" / "scripts"
# What only a script's source or its runner says: Lua's call into Redis, and
# redis-py's ways of running a script past `scripts.run`.
OUTSIDE_RUN = re.compile(r"redis\.call\(|register_script\(|\.eval\(|\.evalsha\(")


def _sources() -> list[pathlib.Path]:
    found = []
    for folder in ("shared", "services"):
        found += [path for path in sorted((ROOT / folder).rglob("*.py"))
                  if SCRIPTS_HOME not in path.parents and path != SCRIPTS_HOME.with_suffix(".py")]
    return found


def outside_scripts(text: str) -> list[str]:
    """The lines of a module that hold Lua or run a script by hand."""
    return [line.strip() for line in text.splitlines() if OUTSIDE_RUN.search(line)]


def test_no_script_outside_the_scripts_module() -> None:
    found = {str(path.relative_to(ROOT)): lines for path in _sources()
             if (lines := outside_scripts(path.read_text()))}
    assert not found, f"Lua or a script run outside shared/state/scripts: {found}"


def test_the_scan_finds_a_script_outside() -> None:
    assert outside_scripts("X = \"\"\"\nredis.call('DEL', KEYS[1])\n\"\"\"")
    assert outside_scripts("pipe.eval(SOURCE, 1, key)")
    assert outside_scripts("r.register_script(SOURCE)")
    assert not outside_scripts("scripts.run(pipe, scripts.KEEP_HIGHER_STEP, [key], [a, b])")


def test_every_script_is_declared_once() -> None:
    names = [script.name for script in scripts.ALL]
    assert len(names) == len(set(names))
    assert len({script.source for script in scripts.ALL}) == len(names)


@pytest.mark.parametrize("script", scripts.ALL, ids=lambda script: script.name)
def test_no_state_name_in_lua(script: scripts.Script) -> None:
    states = {state.value for state in (*JobState, *TaskState)}
    quoted = set(re.findall(r"'([^']*)'", script.source))
    assert not quoted & states, f"{script.name} spells a state; pass it in ARGV"


def test_a_call_passes_what_the_script_declares() -> None:
    scripts.KEEP_HIGHER_STEP.check(["key"], ["0", "5"])
    with pytest.raises(ValueError, match="keep_higher_step takes 2 ARGV"):
        scripts.KEEP_HIGHER_STEP.check(["key"], ["0"])
    scripts.HGETALL_MANY.check(["a", "b", "c"], [])  # "..." takes as many as passed
    with pytest.raises(ValueError, match="KEYS"):
        scripts.CREATE_JOB.check(["too", "few"], [])
