"""The mutant matrix: the recorded good log and each of its mutants (harness.evidence.mutants) judged by every
criterion, and whether each failed exactly the criteria it was made to fail (`python -m harness mutants`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.evidence import mutants as _mutants
from harness.evidence.mutants import RECORDED_LOG
from harness.judge import criteria
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, Profile, load_profile


@dataclass(frozen=True)
class MatrixRow:
    """One log (good or mutant) judged by every criterion."""

    name: str
    description: str
    statuses: dict
    expected_failures: frozenset
    as_intended: bool


def judge_text(profile: Profile, text: str, name: str = "(mutant)") -> list:
    """Verdicts for a log text, with only log-derived evidence."""
    return criteria.evaluate(profile, criteria.evidence_from_log_text(text, run_dir=name))


def _row(profile, name: str, description: str, text: str, expected: frozenset) -> MatrixRow:
    """Judge one log and compare its failures with the intended ones."""
    statuses = {v.criterion_id: v.status for v in judge_text(profile, text, name)}
    failed = {cid for cid, s in statuses.items() if s == FAIL}
    return MatrixRow(name, description, statuses, expected, failed == set(expected))


def mutant_matrix(profile: Profile, log_text: str, mutants: list | None = None) -> list:
    """Rows for the good log and each mutant: criterion id -> status, plus whether it failed as intended."""
    rows = [_row(profile, "good", "the recorded log, unchanged", log_text, frozenset())]
    for m in _mutants.MUTANTS if mutants is None else mutants:
        rows.append(_row(profile, m.name, m.description, m.transform(log_text), m.expected_failures))
    return rows


CELL = {PASS: "pass", FAIL: "**FAIL**", NOT_MEASURABLE: "n/m"}


def matrix_markdown(rows: list) -> str:
    """The matrix as a markdown table (mutant x criterion)."""
    ids = list(rows[0].statuses)
    lines = ["| log | " + " | ".join(ids) + " | as intended |", "|---" * (len(ids) + 2) + "|"]
    for row in rows:
        cells = [CELL[row.statuses[i]] for i in ids]
        lines.append(f"| {row.name} | " + " | ".join(cells) + f" | {'yes' if row.as_intended else 'NO'} |")
    lines.append("")
    lines.append("n/m = not measurable from a log alone (needs the run: exit code, device, checkpoints, NVML).")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--profile", default="megatron-lm")
    parser.add_argument("--log", default=str(RECORDED_LOG))


def main(args) -> int:
    """Print the mutant matrix; exit 1 if any row did not fail exactly as intended."""
    if not isinstance(args, argparse.Namespace):
        parser = argparse.ArgumentParser(prog="python -m harness mutants", description=__doc__.split("\n")[0])
        add_arguments(parser)
        args = parser.parse_args(args)
    rows = mutant_matrix(load_profile(args.profile), Path(args.log).read_text(errors="replace"))
    print(matrix_markdown(rows))
    return int(not all(r.as_intended for r in rows))


if __name__ == "__main__":
    sys.exit(main())
