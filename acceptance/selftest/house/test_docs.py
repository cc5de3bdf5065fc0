"""The README and docs/ stay true: every relative link resolves, every command they name answers --help, and the
README stays one screen long (the rest lives in docs/)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from harness.base.paths import REPO

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


def test_docs_name_commands_not_modules():
    """Every command a page names is `python -m harness COMMAND` (one table, harness/__main__.py), never a module's
    path: a module may move between layers, the command stays."""
    dotted = sorted({(page.name, module) for page in PAGES for module, _ in COMMAND.findall(page.read_text("utf-8"))
                     if module != "harness"})
    assert not dotted, f"pages naming `python -m harness.x` instead of `python -m harness COMMAND`: {dotted}"


def test_the_command_table_is_documented_row_for_row():
    """docs/commands.md has one row per command of harness/__main__.py's table, and no other."""
    from harness.__main__ import SUBCOMMANDS

    page = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z][a-z-]*)` \|", page, re.M))
    assert documented == set(SUBCOMMANDS), (f"in the table, not documented: {sorted(set(SUBCOMMANDS) - documented)}; "
                                            f"documented, not in the table: {sorted(documented - set(SUBCOMMANDS))}")


def test_every_self_test_file_has_a_readme_row():
    """acceptance/selftest/README.md names every test file, in the folder of its layer, and no file that is gone."""
    selftest = REPO / "acceptance" / "selftest"
    files = {p.relative_to(selftest).as_posix() for p in selftest.glob("*/test_*.py")}
    rows = set(re.findall(r"^\| `([a-z]+/test_[a-z0-9_]+\.py)` \|", (selftest / "README.md").read_text("utf-8"), re.M))
    assert files == rows, f"no row: {sorted(files - rows)}; row of no file: {sorted(rows - files)}"
    assert not list(selftest.glob("test_*.py")), "a test file outside every layer's folder"


def test_the_layout_page_and_the_layering_test_are_one_map():
    """docs/layout.md's table lists exactly the layers of house/test_layering.py, in its order, each with its folder."""
    sys.path.insert(0, str(REPO / "acceptance" / "selftest" / "house"))
    import test_layering

    page = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| ([a-z]+) \| `harness/([a-z]+)/` \|", page, re.M)
    assert [layer for layer, _ in rows] == list(test_layering.ORDER)
    assert all(test_layering.ROOMS[f"harness.{folder}"] == layer for layer, folder in rows)
    folders = {p.name for p in (REPO / "harness").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == {folder for _, folder in rows}, folders
