"""The catalogue of real failures (fixtures/failures/catalogue.toml): its fixture logs, its split, its hit rate.

Each entry is a failure a user posted in a public issue thread. ``build`` grafts the posted text at the point it
happens onto the head of a real core_v0.16.1 log (with a launcher/logger prefix where the entry asks for one) and
writes ``fixtures/failures/logs/<id>.log``; ``split`` puts an entry in the derivation part or the held-out part by a
hash of its id (about a third held out, nobody chooses); ``evaluate`` grades every log the way a submitted log is
graded (``criteria.root_cause`` on the log's text) and says, per entry, whether the root cause named first is the
expected one. ``python -m harness catalogue build|evaluate`` (evaluate writes
results/failures/hit-rate.json).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.base.paths import FIXTURES, RECORDED_LOGS

CATALOGUE = FIXTURES / "failures" / "catalogue.toml"
LOGS = FIXTURES / "failures" / "logs"
HEAD_LOG = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
RESULTS = Path(__file__).resolve().parents[2] / "results" / "failures" / "hit-rate.json"
HELD_OUT, DERIVATION, HELD_OUT_2, HELD_OUT_3, HELD_OUT_4 = ("held-out", "derivation", "held-out-2", "held-out-3",
                                                          "held-out-4")
PARTS = (DERIVATION, HELD_OUT, HELD_OUT_2, HELD_OUT_3, HELD_OUT_4)

# Where each point cuts the head log: the head keeps every line before the first line containing the marker, or
# up to and including it ("after").
POINTS = {
    "import": ("before", "------------------------ arguments ------------------------"),
    "tokenizer": ("after", "> building BertWordPieceLowerCase tokenizer ..."),
    "init": ("after", "> initializing torch distributed ..."),
    "compile": ("after", "> compiling dataset index builder ..."),
    "kernels": ("after", "> compiling and loading fused kernels ..."),
    "model": ("after", "building BERT model ..."),
    "load": ("after", "learning rate decay style"),
    "dataset": ("after", "> building train, validation, and test datasets for BERT ..."),
    "step": ("after", "[before the start of training step]"),
    "later": ("after", "iteration       10/"),
    "preprocess": None,                       # the preprocessing tool's own output: no training head
}
WRAPS = ("", "rank", "default", "srun", "ray", "stamp")


@dataclass(frozen=True)
class CatalogueEntry:
    """One catalogue entry."""

    id: str
    source: str
    summary: str
    point: str
    wrap: str
    expect: str
    text: str
    cause_has: tuple = ()
    round: int = 1                    # 2: collected after the rules and the first held-out measurement; 3: collected
                                      # after the structure reader (issue 39), of classes no earlier round had;
                                      # 4: collected after round 3's fixes, threads not read before, a check

    @property
    def part(self) -> str:
        return {2: HELD_OUT_2, 3: HELD_OUT_3, 4: HELD_OUT_4}.get(self.round, split(self.id))

    @property
    def log_path(self) -> Path:
        return LOGS / f"{self.id}.log"


def split(entry_id: str) -> str:
    """held-out for about a third of the ids (the first byte of the id's sha256, mod 3, is 0), else derivation."""
    return HELD_OUT if hashlib.sha256(entry_id.encode()).digest()[0] % 3 == 0 else DERIVATION


def load(path: Path = CATALOGUE) -> list:
    """The catalogue's entries, checked: unique ids, known points and wraps, a source URL and text each."""
    entries, seen = [], set()
    for raw in tomllib.loads(path.read_text(encoding="utf-8"))["failure"]:
        f = CatalogueEntry(raw["id"], raw["source"], raw["summary"], raw["point"], raw.get("wrap", ""), raw["expect"],
                    raw["text"].strip("\n"), tuple(raw.get("cause_has", ())), int(raw.get("round", 1)))
        if f.id in seen or f.point not in POINTS or f.wrap not in WRAPS or not f.source.startswith("https://") \
                or not f.text.strip():
            raise ValueError(f"catalogue entry {f.id!r}: duplicate id, unknown point/wrap, no source or no text")
        seen.add(f.id)
        entries.append(f)
    return entries


def _head(point: str) -> list:
    """The head log's lines up to the point."""
    if POINTS[point] is None:
        return []
    how, marker = POINTS[point]
    lines = HEAD_LOG.read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if marker in line)
    return lines[: at + 1 if how == "after" else at]


def _stamp(n: int) -> str:
    """A deterministic ISO timestamp for line n."""
    return f"2026-11-29T14:{17 + n // 3600:02d}:{n // 60 % 60:02d}.{n % 60:03d}Z "


def render(f: CatalogueEntry) -> str:
    """The fixture log: the head up to the entry's point, then the posted text, with the entry's wrapping."""
    head, text = _head(f.point), f.text.splitlines()
    if f.wrap == "rank":
        text = [f"[rank0]: {line}" for line in text]
    elif f.wrap == "ray":
        text = [f"(head, rank=0, pid=4242) {line}" for line in text]
    lines = head + text
    if f.wrap == "default":
        lines = [f"[default0]:{line}" for line in lines]
    elif f.wrap == "srun":
        lines = [f"0: {line}" for line in lines]
    elif f.wrap == "stamp":
        lines = [_stamp(n) + line for n, line in enumerate(lines)]
    return "\n".join(lines) + "\n"


def build(entries=None) -> list:
    """Write every entry's fixture log; the paths written."""
    LOGS.mkdir(parents=True, exist_ok=True)
    out = []
    for f in entries if entries is not None else load():
        f.log_path.write_text(render(f), encoding="utf-8")
        out.append(f.log_path)
    return out


def judge(f: CatalogueEntry, text: str | None = None):
    """The root cause the grader names first for the entry's log (as a submitted log is graded)."""
    from harness.judge import criteria

    text = text if text is not None else f.log_path.read_text(encoding="utf-8")
    return criteria.root_cause(criteria.evidence_from_log_text(text))


def hit(f: CatalogueEntry, cause) -> bool:
    """The expected cause came first, and its text names what the entry says it must."""
    return cause is not None and cause.cause_id == f.expect and all(w in cause.cause for w in f.cause_has)


def evaluate(entries=None, part: str | None = None) -> dict:
    """Per part: entries, hits, rate, and each miss with what was named instead."""
    entries = entries if entries is not None else load()
    out = {}
    for name in PARTS:
        if part not in (None, name):
            continue
        rows = [f for f in entries if f.part == name]
        misses = []
        for f in rows:
            cause = judge(f)
            if not hit(f, cause):
                misses.append({"id": f.id, "expected": f.expect, "got": cause.cause_id if cause else None,
                               "cause": cause.cause if cause else None})
        n = len(rows)
        out[name] = {"entries": n, "hits": n - len(misses), "rate": round((n - len(misses)) / n, 4) if n else None,
                     "misses": misses}
    return out


FIRST_EVALUATIONS = {HELD_OUT: RESULTS.parent / "held-out-first-evaluation.json",
                     HELD_OUT_2: RESULTS.parent / "held-out-2-first-evaluation.json",
                     HELD_OUT_3: RESULTS.parent / "held-out-3-first-evaluation.json",
                     HELD_OUT_4: RESULTS.parent / "held-out-4-first-evaluation.json"}


def first_evaluations() -> dict:
    """Each held-out part's hit rate as measured the one time it was evaluated before any rule looked at it
    (the files written then; a part never measured is absent)."""
    out = {}
    for part, path in FIRST_EVALUATIONS.items():
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            got = data[part]
            out[part] = {"entries": got["entries"], "hits": got["hits"], "rate": got["rate"],
                         "commit": data["measured_at_commit"], "misses": [m["id"] for m in got["misses"]]}
    return out


# ---- the flags of each Megatron-LM release, read from its sources (never imported) ---------------------------

FLAGS_TABLE = FIXTURES / "failures" / "megatron-flags.json"
ARGUMENT_FILES = ("megatron/training/arguments.py", "megatron/arguments.py")


def _git_show(git_dir: str, ref: str, path: str) -> str | None:
    import subprocess

    got = subprocess.run(["git", "-C", git_dir, "show", f"{ref}:{path}"], capture_output=True, text=True)
    return got.stdout if got.returncode == 0 else None


def _parse(source: str):
    """The module's syntax tree (its own warnings, e.g. an invalid escape in an old release, kept quiet)."""
    import ast
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source)


def _literal(node):
    import ast

    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None


def _config_fields(git_dir: str, ref: str, name: str, seen: set) -> list:
    """(field, annotation, default, argparse_meta) of a config dataclass and its bases, found by its name in the
    release's megatron/ sources (what ArgumentGroupFactory turns into flags)."""
    import ast
    import subprocess

    if name in seen:
        return []
    seen.add(name)
    hits = subprocess.run(["git", "-C", git_dir, "grep", "-l", "-E", rf"^class {name}\b", ref, "--", "megatron"],
                          capture_output=True, text=True).stdout.split()
    for hit in hits:
        tree = _parse(_git_show(git_dir, ref, hit.split(":", 1)[1]) or "")
        cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)
        if cls is None:
            continue
        out = []
        for base in cls.bases:
            if isinstance(base, ast.Name):
                out += _config_fields(git_dir, ref, base.id, seen)
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            default, meta, init = node.value, {}, True
            if isinstance(default, ast.Call) and getattr(default.func, "id", None) == "field":
                kw = {k.arg: k.value for k in default.keywords}
                default = kw.get("default")
                meta = (_literal(kw["metadata"]) or {}).get("argparse_meta", {}) if "metadata" in kw else {}
                init = _literal(kw["init"]) is not False if "init" in kw else True
            if init:
                out.append((node.target.id, ast.unparse(node.annotation), _literal(default) if default else None, meta))
        return out
    return []


def release_flags(git_dir: str, ref: str) -> dict:
    """{flag: [dest, value it stores when given (true/false) or null, help]} of one release's training parser:
    every add_argument of its arguments.py, and the flags ArgumentGroupFactory builds from config dataclasses
    (core_v0.16 and later), named as that factory names them."""
    import ast

    source = next((s for p in ARGUMENT_FILES if (s := _git_show(git_dir, ref, p))), None)
    if source is None:
        return {}
    tree, out = _parse(source), {}
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        lists = {t.id: _literal(n.value) for n in ast.walk(fn) if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.List)}
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            attr = getattr(call.func, "attr", None) or getattr(call.func, "id", None)
            kw = {k.arg: k.value for k in call.keywords}
            if attr == "add_argument":
                opts = [a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
                action = _literal(kw["action"]) if "action" in kw else None
                dest = _literal(kw["dest"]) if "dest" in kw else (opts[0][2:].replace("-", "_") if opts else None)
                given = {"store_true": True, "store_false": False}.get(action)
                helptext = _literal(kw["help"]) if "help" in kw else None
                choices = _literal(kw["choices"]) if "choices" in kw else None
                kind = ast.unparse(kw["type"]) if "type" in kw else action
                for opt in opts:
                    out[opt] = [dest, given, str(helptext or "")[:200], repr(choices) if choices else "", kind]
            elif attr == "ArgumentGroupFactory" and call.args and isinstance(call.args[0], ast.Name):
                exclude = kw.get("exclude")
                excluded = set(lists.get(exclude.id) or () if isinstance(exclude, ast.Name) else
                               _literal(exclude) or ()) if exclude is not None else set()
                for name, annotation, default, meta in _config_fields(git_dir, ref, call.args[0].id, set()):
                    if name in excluded:
                        continue
                    names, given = [f"--{name.replace('_', '-')}"], None
                    if annotation in ("bool", "Optional[bool]") and default in (True, False):
                        given = not default
                        if default is True:
                            names = [f"--no-{name.replace('_', '-')}", f"--disable-{name.replace('_', '-')}"]
                    names = list(meta.get("arg_names", names))
                    for opt in names:
                        out[opt] = [meta.get("dest", name), given, "", "", annotation]
    return out


# the sources saying so: "--checkpoint-activations is no longer valid, use --recompute-activations"
_RENAMED_SAID = re.compile(r"(--[\w-]{2,80})[^\n'\"]{0,30}?(?:is no longer (?:valid|supported)|is deprecated|has been "
                           r"(?:deprecated|removed|replaced|renamed))[^\n]{0,40}?(?:use|in favou?r of|replaced by|"
                           r"renamed to)\s+[`'\"]?(--[\w-]{2,80})")


def _renames(releases: list, flags: dict, sources: dict) -> dict:
    """{old flag: [new flag, release]}: a flag a release dropped while adding one that stores into the same dest, has
    the same help text, or takes the same choices of the same type under a similar help; a flag whose help calls it
    deprecated in favour of another; or a release's own source saying an old flag is no longer valid, use another."""
    import difflib

    out = {}
    for before, now in zip(releases, releases[1:]):
        a, b = flags[before], flags[now]
        added = [f for f in b if f not in a]
        for old in (f for f in a if f not in b):
            def score(new):
                same_dest = a[old][0] == b[new][0]
                text = max(difflib.SequenceMatcher(None, a[old][2], b[new][2]).ratio(),      # by characters, by words
                           difflib.SequenceMatcher(None, a[old][2].split(), b[new][2].split()).ratio()) \
                    if a[old][2] and b[new][2] else 0
                name = difflib.SequenceMatcher(None, old, new).ratio()
                same_choices = bool(a[old][3]) and a[old][3:5] == b[new][3:5] and text >= 0.6
                return (same_dest and name >= 0.6) or (text >= 0.9 and name >= 0.6) or same_choices, text + name
            found = sorted(((score(n)[1], n) for n in added if score(n)[0]), reverse=True)
            if found:
                out[old] = [found[0][1], now]
        for flag, (_, _, helptext, *_rest) in b.items():
            said = re.search(r"(?i)deprecated\b.{0,80}?(?:use|replaced by|in favou?r of)\s+`?(--[\w-]+)", helptext)
            if said and said[1] != flag and said[1] in b and flag not in out:
                out[flag] = [said[1], now]
        for said in _RENAMED_SAID.finditer(sources.get(now, "")):
            if said[1] != said[2] and said[2] in b and said[1] not in out:
                out[said[1]] = [said[2], now]
    return out


def derive_flags(git_dir: str, refs: list) -> dict:
    """The flags table: the releases in order, each flag's first and last release (indices) and what it stores,
    and the renames between releases."""
    sources = {r: next((s for p in ARGUMENT_FILES if (s := _git_show(git_dir, r, p))), None) for r in refs}
    releases = [r for r in refs if sources[r]]
    flags = {r: release_flags(git_dir, r) for r in releases}
    table = {}
    for i, r in enumerate(releases):
        for flag, (dest, given, *_) in flags[r].items():
            entry = table.setdefault(flag, {"dest": dest, "given": given, "first": i, "last": i})
            entry.update(last=i, dest=dest, given=given)
    return {"source": "NVIDIA/Megatron-LM: each release's megatron/training/arguments.py (megatron/arguments.py "
                      "before core_v0.7), read with ast, never imported; `python -m harness catalogue flags GIT_DIR`",
            "releases": releases, "flags": dict(sorted(table.items())),
            "renamed": dict(sorted(_renames(releases, flags, sources).items()))}


def flags_json(table: dict) -> str:
    """The table as JSON, one flag or rename per line (diffable)."""
    def block(name):
        rows = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in table[name].items()]
        return f' "{name}": {{\n' + ",\n".join(rows) + "\n }"
    head = f' "source": {json.dumps(table["source"])},\n "releases": {json.dumps(table["releases"])}'
    return "{\n" + ",\n".join([head, block("renamed"), block("flags")]) + "\n}\n"


def release_tags(git_dir: str) -> list:
    """The release tags of a Megatron-LM repository, oldest first (v1.0 ... v2.6, 23.04, 23.06, core_v0.4.0 ...)."""
    import subprocess

    tags = subprocess.run(["git", "-C", git_dir, "tag"], capture_output=True, text=True).stdout.split()
    def order(tag):
        return 0 if tag.startswith("v") else 1 if tag[0].isdigit() else 2, [int(x) for x in re.findall(r"\d+", tag)]
    return sorted((t for t in tags if re.fullmatch(r"core_v0\.\d+\.\d+|v\d\.\d+|2\d\.\d\d", t)), key=order)


def main(argv: list) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness catalogue",
                                     description="The catalogue of real failures: build its fixture logs, show its "
                                                 "split, measure its hit rate.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="write fixtures/failures/logs/<id>.log for every entry")
    sub.add_parser("split", help="print each entry's part (derivation, held-out, held-out-2, held-out-3) and expected "
                                 "cause")
    ev = sub.add_parser("evaluate", help="grade every log; with no part, write results/failures/hit-rate.json")
    ev.add_argument("part", nargs="?", choices=PARTS, help="one part only (nothing is written)")
    fl = sub.add_parser("flags", help=f"derive {FLAGS_TABLE.name} (every release's flags and renames) from a "
                                      "Megatron-LM git directory")
    fl.add_argument("git_dir", help="a Megatron-LM clone or bare repository")
    fl.add_argument("refs", nargs="*", help="releases, oldest first (default: every release tag)")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(f"wrote {len(build())} logs to {LOGS}")
    elif args.command == "flags":
        table = derive_flags(args.git_dir, args.refs or release_tags(args.git_dir))
        FLAGS_TABLE.write_text(flags_json(table), encoding="utf-8")
        print(f"wrote {FLAGS_TABLE}: {len(table['flags'])} flags of {len(table['releases'])} releases, "
              f"{len(table['renamed'])} renames")
    elif args.command == "split":
        for f in load():
            print(f.part, f.id, f.expect)
    else:
        result = evaluate(part=args.part)
        if args.part is None:
            result = {"catalogue_entries": sum(v["entries"] for v in result.values()), "now": result,
                      "first_evaluation": first_evaluations()}
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
