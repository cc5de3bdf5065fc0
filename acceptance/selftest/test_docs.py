"""The README and docs/ stay true: every relative link resolves, every command they name answers --help, and the
README stays one screen long (the rest lives in docs/)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from harness.paths import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
COMMAND = re.compile(r"python3? -m (harness(?:\.[a-z_]+)*)(?: ([a-z][a-z-]{2,}))?(?=[\s`]|$)")
README_MAX_LINES = 200


def _links():
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
                yield page, target


def _commands() -> list:
    found = set()
    for page in PAGES:
        for module, sub in COMMAND.findall(page.read_text(encoding="utf-8")):
            found.add((module, sub))
    return sorted(found)


def test_readme_is_one_screen():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into a docs/ page and link it"


@pytest.mark.parametrize("page, target", list(_links()), ids=lambda v: v if isinstance(v, str) else v.name)
def test_every_relative_link_resolves(page, target):
    path = (page.parent / target.split("#")[0]).resolve()
    assert path.exists(), f"{page.relative_to(REPO)} links to {target}, which does not exist"


def test_every_docs_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize("module, sub", _commands(), ids=lambda v: v or "-")
def test_every_named_command_answers_help(module, sub):
    argv = [sys.executable, "-m", module, *([sub] if sub else []), "--help"]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"`{' '.join(argv[1:])}` exited {out.returncode}: {out.stderr[-600:]}"
