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
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.base.paths import FIXTURES, RECORDED_LOGS

CATALOGUE = FIXTURES / "failures" / "catalogue.toml"
LOGS = FIXTURES / "failures" / "logs"
HEAD_LOG = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
RESULTS = Path(__file__).resolve().parents[2] / "results" / "failures" / "hit-rate.json"
HELD_OUT, DERIVATION, HELD_OUT_2 = "held-out", "derivation", "held-out-2"
PARTS = (DERIVATION, HELD_OUT, HELD_OUT_2)

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
    round: int = 1                    # 2: collected after the rules and the first held-out measurement

    @property
    def part(self) -> str:
        return HELD_OUT_2 if self.round >= 2 else split(self.id)

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
                     HELD_OUT_2: RESULTS.parent / "held-out-2-first-evaluation.json"}


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


def main(argv: list) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m harness catalogue",
                                     description="The catalogue of real failures: build its fixture logs, show its "
                                                 "split, measure its hit rate.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="write fixtures/failures/logs/<id>.log for every entry")
    sub.add_parser("split", help="print each entry's part (derivation, held-out, held-out-2) and expected cause")
    ev = sub.add_parser("evaluate", help="grade every log; with no part, write results/failures/hit-rate.json")
    ev.add_argument("part", nargs="?", choices=PARTS, help="one part only (nothing is written)")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(f"wrote {len(build())} logs to {LOGS}")
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
