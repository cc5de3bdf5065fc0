"""The house keeps its shape: no module over MAX_LINES lines, no import cycle, no import from a room above.

Every harness module's imports are read with ast (function-level imports included: a late import is still an
arrow). The rooms and what each may import are data (ROOMS, MAY_IMPORT below); the pipeline's data flows
data -> train -> run -> judge -> report, and the top-level commands sit above all. The judge reads what a run
leaves (log lines, checkpoints, evidence) and imports no stage that makes it; the trainer and the launcher import
it because the log format and the checkpoint layout they write are defined, once, beside their reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[3] / "harness"
MAX_LINES = 600
VENDORED = ("nltk_offline", "no_te_site")   # stand-ins put on another program's sys.path, not harness modules

# Rooms, bottom to top: one per folder of harness/ (docs/layout.md has the same rows); a module belongs to the
# room of its longest matching prefix. The pipeline's data flows data -> train -> run -> evidence -> judge -> report;
# the trainer and the launcher write what evidence/ reads (log lines, checkpoints), so they import evidence/, never
# judge/. cli/ (every user command), plugin/ (pytest) and tools/ (maintainers' tools) sit above them all.
ROOMS = {
    "harness": "base",
    "harness.__main__": "cli",
    "harness.base": "base",
    "harness.data": "data",
    "harness.evidence": "evidence",
    "harness.train": "train",
    "harness.run": "run",
    "harness.judge": "judge",
    "harness.report": "report",
    "harness.cli": "cli",
    "harness.plugin": "plugin",
    "harness.tools": "tools",
}
ORDER = ("base", "data", "evidence", "train", "run", "judge", "report", "cli", "plugin", "tools")
MAY_IMPORT = {r: set(ORDER[:i + 1]) for i, r in enumerate(ORDER)}
MAY_IMPORT["plugin"] -= {"tools"}
# the judge reads evidence, never a stage that makes it: no judge -> train or run
MAY_IMPORT["judge"] -= {"train", "run"}
MAY_IMPORT["report"] -= {"train", "run"}


def room(module: str) -> str:
    """The room of a dotted module name (longest matching prefix in ROOMS; "top" when none)."""
    parts = module.split(".")
    for n in range(len(parts), 1, -1):        # the package's own name matches only itself, not its submodules
        if ".".join(parts[:n]) in ROOMS:
            return ROOMS[".".join(parts[:n])]
    return ROOMS.get(module, "top")


def modules(root: Path) -> dict:
    """{dotted name: path} of every module under `root` (a package directory named like its package)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        if any(part in VENDORED for part in rel.parts):
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict) -> list:
    """[(imported module, line)] of every import of a package module in `path`, at any depth of the code."""
    root_package = name.split(".")[0]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.append((target if target in known else base, node.lineno))
    return [(target, line) for target, line in dict.fromkeys(found)    # `from m import a, b`: one arrow
            if target.split(".")[0] == root_package and target != name]


def graph(root: Path) -> tuple[dict, dict]:
    """({module: path}, {module: [(imported module, line)]}) for the package at `root`."""
    known = modules(root)
    return known, {name: imports(name, path, known) for name, path in known.items()}


def where(known: dict, name: str, line: int | None = None) -> str:
    """The module's path from the package's parent folder, with `:line` when given."""
    path = known[name].relative_to(known[name].parents[len(name.split(".")) - (known[name].name != "__init__.py")])
    return f"{path}:{line}" if line else str(path)


def oversized(known: dict, limit: int = MAX_LINES) -> list:
    """One message per module longer than `limit` lines."""
    problems = []
    for name, path in known.items():
        count = len(path.read_text().splitlines())
        if count > limit:
            problems.append(f"{where(known, name)} has {count} lines (limit {limit}): split it along its seams "
                            f"and keep the names others import from it importable there")
    return problems


def upward(known: dict, edges: dict) -> list:
    """One message per import of a module in a room its importer may not import."""
    problems = []
    for name, targets in edges.items():
        for target, line in targets:
            if target in known and room(target) not in MAY_IMPORT[room(name)]:
                problems.append(f"{where(known, name, line)}: {name} (room {room(name)!r}) imports {target} (room "
                                f"{room(target)!r}), a room above it; {room(name)!r} may import only "
                                f"{', '.join(sorted(MAY_IMPORT[room(name)]))}: move what both need to a room below "
                                f"both, or move the importer up")
    return problems


def cycles(known: dict, edges: dict) -> list:
    """One message per import cycle (a strongly connected set of modules), naming each arrow and its line."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target, _ in edges.get(node, ()):
            if target not in known:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for name in sorted(known):
        if name not in index:
            visit(name)
    problems = []
    for members in found:
        arrows = [f"{where(known, a, line)} imports {b}" for a in members for b, line in edges[a] if b in members]
        problems.append(f"import cycle among {', '.join(members)}: {'; '.join(arrows)}; move what they share into "
                        f"a module both import")
    return problems


# ---- the house itself


@pytest.fixture(scope="module")
def house():
    return graph(HARNESS)


def test_no_module_is_over_the_line_limit(house):
    problems = oversized(house[0])
    assert not problems, "\n".join(problems)


def test_no_import_cycle(house):
    problems = cycles(*house)
    assert not problems, "\n".join(problems)


def test_no_import_from_a_room_above(house):
    problems = upward(*house)
    assert not problems, "\n".join(problems)


def test_no_loose_module_at_the_top(house):
    """Every module lives in the folder of its layer: harness/ itself holds only __init__ and __main__."""
    loose = [name for name in house[0] if room(name) == "top"]
    assert not loose, f"modules outside every layer's folder: {loose}; move each into the folder of its layer"


def test_every_room_is_populated_and_every_module_has_one(house):
    """A renamed stage folder would leave its rule matching nothing: each room named in ROOMS holds a module."""
    rooms = {room(name) for name in house[0]}
    assert set(ROOMS.values()) <= rooms, f"rooms with no module: {set(ROOMS.values()) - rooms}"
    assert rooms <= set(MAY_IMPORT), f"rooms without an import rule: {rooms - set(MAY_IMPORT)}"


# ---- the checks catch what they are for (a package written for the test)


@pytest.fixture
def planted(tmp_path):
    pkg = tmp_path / "harness"
    for folder in ("base", "data", "run", "judge"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "base" / "paths.py").write_text("X = 1\n")
    (pkg / "data" / "bench.py").write_text("import os\n\n\ndef f():\n    from harness.run import launch\n")
    (pkg / "run" / "launch.py").write_text("from harness.base import paths\n")
    (pkg / "judge" / "a.py").write_text("from harness.judge import b\n")
    (pkg / "judge" / "b.py").write_text("def g():\n    from . import a\n" + "x = 1\n" * MAX_LINES)
    return pkg


def test_a_late_import_into_a_room_above_is_named_with_its_line(planted):
    problems = upward(*graph(planted))
    assert len(problems) == 1, problems
    assert problems[0].startswith("harness/data/bench.py:5: harness.data.bench (room 'data') imports "
                                  "harness.run.launch (room 'run')"), problems[0]


def test_a_cycle_through_a_relative_late_import_is_named_with_both_arrows(planted):
    problems = cycles(*graph(planted))
    assert problems == ["import cycle among harness.judge.a, harness.judge.b: harness/judge/a.py:1 imports "
                        "harness.judge.b; harness/judge/b.py:2 imports harness.judge.a; move what they share into "
                        "a module both import"]


def test_a_module_over_the_limit_is_named_with_its_count(planted):
    assert oversized(graph(planted)[0]) == [
        f"harness/judge/b.py has {MAX_LINES + 2} lines (limit {MAX_LINES}): split it along its seams and keep the "
        f"names others import from it importable there"]


@pytest.mark.parametrize("module, expected", [("harness", "base"), ("harness.base.proc", "base"),
                                              ("harness.report.session_report", "report"),
                                              ("harness.evidence.logs", "evidence"),
                                              ("harness.evidence.checkpoints.inspector", "evidence"),
                                              ("harness.run.launch", "run"), ("harness.cli.grade", "cli"),
                                              ("harness.cli.cluster.task", "cli"), ("harness.__main__", "cli"),
                                              ("harness.loose", "top")])
def test_rooms_by_longest_prefix(module, expected):
    assert room(module) == expected
