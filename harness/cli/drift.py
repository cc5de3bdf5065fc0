"""Compare two `pytest -m gpu` JUnit files (pinned versions, newest versions): which version moved which criterion.

    python -m harness drift "pinned (torch 2.11.0, megatron-core 0.16.1)=pinned.xml" "newest (...)=newest.xml"

Each checklist test records its verdict as JUnit properties (record_verdict: criterion, status, measured,
expected, value), so a CI dashboard can plot `value` night by night and this tool can say, per criterion, in which
run it failed and what it measured in both. Exit 0 when every test passed in both runs, 1 otherwise, 2 for bad input.
With GITHUB_STEP_SUMMARY set the table is appended there too, and each moved criterion becomes an ::error:: line.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from harness.base.errors import InputError
from harness.report import junit

PROPERTIES = ("criterion", "status", "measured", "expected", "value")
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
MOVED = ("{criterion}: {bad} {outcome} ({bad_measured}), {good} {good_outcome} ({good_measured}); "
         "expected {expected}")
BOTH = "{criterion}: fails in both runs ({a_measured} / {b_measured}): not version drift; see each run's report.md"
ONLY = "{test}: ran only in {label} ({outcome})"


def record_verdict(record_property, verdict) -> None:
    """The verdict of one criterion as JUnit properties; `value` is the first number measured (for plots)."""
    if verdict is None:
        return
    for name in PROPERTIES[:4]:
        record_property(name, getattr(verdict, "criterion_id" if name == "criterion" else name))
    found = NUMBER.search(str(verdict.measured))
    if found:
        record_property("value", float(found[0]))


Case = junit.Case
load_junit = junit.load


def compare(a_label: str, a: dict[str, Case], b_label: str, b: dict[str, Case]) -> list[str]:
    """One line per test that did not pass in both runs, naming the run (versions) that moved it."""
    lines = []
    for test in list(dict.fromkeys([*a, *b])):
        x, y = a.get(test), b.get(test)
        if x is None or y is None:
            label, case = (b_label, y) if x is None else (a_label, x)
            if case.outcome in ("failed", "error"):
                lines.append(ONLY.format(test=test, label=label, outcome=case.outcome))
            continue
        bad_x, bad_y = x.outcome in ("failed", "error"), y.outcome in ("failed", "error")
        if bad_x and bad_y:
            lines.append(BOTH.format(criterion=x.criterion, a_measured=x.measured, b_measured=y.measured))
        elif bad_x or bad_y:
            bad, good, bad_label, good_label = (x, y, a_label, b_label) if bad_x else (y, x, b_label, a_label)
            lines.append(MOVED.format(criterion=bad.criterion, bad=bad_label, outcome=bad.outcome,
                                      bad_measured=bad.measured, good=good_label, good_outcome=good.outcome,
                                      good_measured=good.measured,
                                      expected=bad.properties.get("expected") or good.properties.get("expected")
                                      or "see report.md"))
    return lines


def values_table(a_label: str, a: dict[str, Case], b_label: str, b: dict[str, Case]) -> str:
    """Markdown: criterion, measured in each run, for every test that recorded a verdict."""
    out = [f"| criterion | {a_label} | {b_label} |", "|---|---|---|"]
    for test in dict.fromkeys([*a, *b]):
        x, y = a.get(test), b.get(test)
        if not any(c is not None and "criterion" in c.properties for c in (x, y)):
            continue
        name = (x or y).criterion
        cell = lambda c: "-" if c is None else f"{c.outcome}: {c.measured}"  # noqa: E731
        out.append(f"| {name} | {cell(x)} | {cell(y)} |")
    return "\n".join(out) + "\n"


def _labelled(text: str) -> tuple[str, Path]:
    """LABEL=PATH (the label may hold spaces and parentheses, the path is after the last '=')."""
    label, sep, path = text.rpartition("=")
    if not sep or not label:
        raise InputError(f"expected LABEL=JUNIT.xml, got {text!r}", fix='e.g. "pinned (torch 2.11)=pinned.xml"')
    return label, Path(path)


def versions_label(name: str) -> str:
    """`NAME (torch X, megatron-core Y)`: the versions this Python would run, for naming a run."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "absent"

    return f"{name} (torch {installed('torch')}, megatron-core {installed('megatron-core')})"


def main(argv: list[str] | None = None) -> int:
    """Print the moved criteria (and the values table); exit 1 when any test failed in either run."""
    parser = argparse.ArgumentParser(prog="python -m harness drift", description=__doc__.splitlines()[0])
    parser.add_argument("a", nargs="?", help="LABEL=JUNIT.xml of the first run (e.g. the pinned versions)")
    parser.add_argument("b", nargs="?", help="LABEL=JUNIT.xml of the second run (e.g. the newest versions)")
    parser.add_argument("--markdown", type=Path, help="also write the result here")
    parser.add_argument("--label", metavar="NAME", help="only print NAME (torch X, megatron-core Y) and exit")
    args = parser.parse_args(argv)
    if args.label:
        print(versions_label(args.label))
        return 0
    if not (args.a and args.b):
        parser.error("give two LABEL=JUNIT.xml arguments (or --label NAME)")
    try:
        (a_label, a_path), (b_label, b_path) = _labelled(args.a), _labelled(args.b)
        a, b = load_junit(a_path), load_junit(b_path)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    moved = compare(a_label, a, b_label, b)
    text = ("\n".join(["## Drift: criteria that moved", "", *[f"- {m}" for m in moved]]) if moved
            else "## Drift: every test passed in both runs") + "\n\n" + values_table(a_label, a, b_label, b)
    print(text)
    for line in moved:
        print(f"::error title=bert-acceptance drift::{line}")
    if args.markdown:
        args.markdown.write_text(text)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(text)
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
