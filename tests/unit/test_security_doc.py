"""docs/security.md names a test for each guarantee: each named test exists,
so a renamed or deleted test cannot leave a guarantee without its proof."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
# `file.py::test_name` or a bare `::test_name` continuing the previous file.
REFERENCE = re.compile(r"`((?:tests/[\w/]+/)?[\w]+\.py)?::(test_\w+)`"
                       r"|`((?:tests/[\w/]+/)?test_\w+\.py)`")


def _path(name: str) -> Path:
    return ROOT / name if name.startswith("tests/") else ROOT / "tests" / "integration" / name


def references() -> list[tuple[Path, str | None]]:
    found: list[tuple[Path, str | None]] = []
    for line in DOC.read_text().splitlines():
        current: Path | None = None
        for match in REFERENCE.finditer(line):
            file, test, bare_file = match.groups()
            if bare_file:
                current = _path(bare_file)
                found.append((current, None))
                continue
            if file:
                current = _path(file)
            assert current is not None, f"`::{test}` names no file before it: {line}"
            found.append((current, test))
    return found


def test_every_test_the_threat_model_names_exists() -> None:
    refs = references()
    assert len(refs) > 40
    missing = [f"{path.relative_to(ROOT)}::{test or ''}" for path, test in refs
               if not path.is_file()
               or (test and not re.search(rf"^def {test}\(", path.read_text(), re.M))]
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"
