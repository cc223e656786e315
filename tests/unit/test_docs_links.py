"""The repository's documents stand alone: every relative link in the
Markdown files leads to a file of the repository (and to a heading of it,
when the link names one), and every `docs/<page>.md` that code, tests or
documents cite exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITED_PAGE = re.compile(r"\bdocs/[a-z0-9-]+\.md\b")
TEXT_SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".sh", ".cfg", ".txt", ".html", ".js"}


def tracked() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def markdown_files() -> list[Path]:
    return sorted(p for p in tracked() if p.suffix == ".md")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped,
    each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    headings = [line.lstrip("#") for line in path.read_text().splitlines()
                if re.match(r"#{1,6} ", line)]
    return {slug(heading) for heading in headings}


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(path: Path) -> None:
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        assert linked.exists(), f"{path.relative_to(ROOT)}: {target} is not in the repository"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), \
                f"{path.relative_to(ROOT)}: {target}: no such heading in {file_part or 'itself'}"


def test_every_cited_page_exists() -> None:
    missing = set()
    for path in tracked():
        if path.suffix not in TEXT_SUFFIXES or path.name == "PKG-INFO":
            continue
        for page in CITED_PAGE.findall(path.read_text(errors="replace")):
            if not (ROOT / page).exists():
                missing.add(f"{path.relative_to(ROOT)}: {page}")
    assert not missing, sorted(missing)


def test_the_slug_is_githubs() -> None:
    assert slug(" 2026-11-26 · Every issue 18 target in one `make bench` run, and the gap") \
        == "2026-11-26--every-issue-18-target-in-one-make-bench-run-and-the-gap"
    assert slug(" The design's targets: a, b") == "the-designs-targets-a-b"
