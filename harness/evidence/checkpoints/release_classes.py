"""Which classes each Megatron-LM release can pickle into a checkpoint, read from its sources (never imported).

A ``common.pt`` (and the legacy ``model_optim_rng.pt``) holds the training arguments: an ``argparse.Namespace``
whose values include Megatron's enums (``AttnBackend``, ``ModelType``, core_v0.18's ``InferenceCudaGraphScope``
...) and, in some releases, plain dataclasses. The safe unpickler (harness.evidence.checkpoints.safe_pickle) rebuilds those by
value from stand-ins, so the suite never imports Megatron-LM's training package; this module derives the table of
stand-ins from the sources of each release: every ``enum.Enum`` subclass with its members' values and every
``@dataclass`` with its field names, by defining module and qualified name, as ``pickle`` names them.

``python -m harness release-classes GIT_DIR REF...`` rewrites ``megatron_classes.json`` beside this file (a
full Megatron-LM clone with its tags); the committed file lists the refs it was derived from.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

TABLE_FILE = Path(__file__).with_name("megatron_classes.json")
DEFAULT_REFS = ("core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "core_v0.19.0", "d98e8a64")
_ENUM_BASES = {"Enum": "Enum", "IntEnum": "IntEnum", "StrEnum": "StrEnum", "Flag": "Flag", "IntFlag": "IntFlag"}


def module_name(path: str) -> str:
    """megatron/core/transformer/enums.py -> megatron.core.transformer.enums (a package's __init__ -> the package)."""
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _base_name(node: ast.expr) -> str:
    """`enum.Enum` / `Enum` / `str, Enum` -> the last dotted part."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if _base_name(target) == "dataclass":
            return True
    return False


def _enum_members(node: ast.ClassDef, kind: str) -> dict:
    """Member name -> value (literal constants, and enum.auto() as the enum module numbers it)."""
    members: dict = {}
    last = 0
    for stmt in node.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name = stmt.targets[0].id
        if name.startswith("_"):
            continue
        value = stmt.value
        if isinstance(value, ast.Call) and _base_name(value.func) == "auto":
            members[name] = name.lower() if kind == "StrEnum" else last + 1
        else:
            try:
                members[name] = ast.literal_eval(value)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue      # an expression: the member exists, its value is not literal; leave it out
        if isinstance(members[name], int) and not isinstance(members[name], bool):
            last = members[name]
    return members


def classes_in_source(module: str, source: str) -> tuple[dict, dict]:
    """({qualname: {kind, members}} of enums, {qualname: [fields]} of dataclasses) defined in one module."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}, {}
    enums: dict = {}
    dataclasses: dict = {}

    def visit(body, prefix: str) -> None:
        for node in body:
            if not isinstance(node, ast.ClassDef):
                continue
            qual = f"{prefix}{node.name}"
            kinds = [_ENUM_BASES[_base_name(b)] for b in node.bases if _base_name(b) in _ENUM_BASES]
            if kinds or any(f"{module}.{prefix}{_base_name(b)}" in enums for b in node.bases):
                kind = kinds[0] if kinds else "Enum"
                if kind == "Enum" and any(_base_name(b) == "str" for b in node.bases):
                    kind = "StrEnum"
                enums[f"{module}.{qual}"] = {"kind": kind, "members": _enum_members(node, kind)}
            elif _is_dataclass(node):
                fields = [s.target.id for s in node.body
                          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
                dataclasses[f"{module}.{qual}"] = fields
            visit(node.body, qual + ".")

    visit(tree.body, "")
    return enums, dataclasses


def _sources(git_dir: str, ref: str):
    """(path, text) of every megatron/**.py at `ref`, through one `git cat-file --batch`."""
    listing = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", ref, "--", "megatron"],
                             capture_output=True, text=True, check=True).stdout
    blobs = [(line.split("\t", 1)[1], line.split()[2]) for line in listing.splitlines()
             if line.endswith(".py") and " blob " in line]
    proc = subprocess.Popen(["git", "--git-dir", git_dir, "cat-file", "--batch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    out, _ = proc.communicate("".join(f"{sha}\n" for _, sha in blobs).encode())
    pos = 0
    for path, _ in blobs:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        yield path, out[header_end + 1: header_end + 1 + size].decode("utf-8", "replace")
        pos = header_end + 1 + size + 1


def derive(git_dir: str, refs=DEFAULT_REFS) -> dict:
    """The table over `refs`: a class's entry lists the refs that define it and the union of its members."""
    enums: dict = {}
    dataclasses: dict = {}
    for ref in refs:
        for path, text in _sources(git_dir, ref):
            found_enums, found_dcs = classes_in_source(module_name(path), text)
            for name, info in found_enums.items():
                entry = enums.setdefault(name, {"kind": info["kind"], "members": {}, "releases": []})
                entry["members"].update(info["members"])
                entry["releases"].append(ref)
            for name, fields in found_dcs.items():
                entry = dataclasses.setdefault(name, {"fields": [], "releases": []})
                entry["fields"] = sorted(set(entry["fields"]) | set(fields))
                entry["releases"].append(ref)
    return {"derived_from": list(refs), "enums": dict(sorted(enums.items())),
            "dataclasses": dict(sorted(dataclasses.items()))}


def load_table() -> dict:
    """The committed table (megatron_classes.json)."""
    return json.loads(TABLE_FILE.read_text())


def main(argv: list[str] | None = None) -> int:
    """Rewrite megatron_classes.json from a Megatron-LM clone's sources at the given refs."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness release-classes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("git_dir", help="a Megatron-LM clone's git directory (with its tags)")
    parser.add_argument("refs", nargs="*", default=list(DEFAULT_REFS),
                        help=f"tags or commits (default: {' '.join(DEFAULT_REFS)})")
    args = parser.parse_args(argv)
    table = derive(args.git_dir, tuple(args.refs))
    TABLE_FILE.write_text(json.dumps(table, indent=1, sort_keys=False, default=str) + "\n")
    print(f"{TABLE_FILE}: {len(table['enums'])} enums, {len(table['dataclasses'])} dataclasses "
          f"from {', '.join(table['derived_from'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
