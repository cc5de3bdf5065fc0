"""The mutant report's "as intended" flag (harness.evidence.mutants) read back: a row is as intended only when the log
fails EXACTLY its expected criteria: no fewer (a missed failure) and no more (an extra failure). Read back from the
MatrixRow, the Markdown table (parsed) and the CLI's exit code, on the real recorded log.
"""

from __future__ import annotations

import pytest

from harness.evidence import mutants
from harness.judge import mutant_matrix
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, load_profile


@pytest.fixture(scope="module")
def profile():
    return load_profile("megatron-lm")


@pytest.fixture(scope="module")
def good_text():
    return mutants.RECORDED_LOG.read_text()


@pytest.fixture(scope="module")
def lr_zero_failures(profile, good_text) -> frozenset:
    """What the lr_zero breakage really fails (measured, not assumed): at least two criteria."""
    row = mutant_matrix.mutant_matrix(profile, good_text, [mutants.Mutant("probe", "", mutants.lr_zero, frozenset())])[1]
    failed = frozenset(c for c, s in row.statuses.items() if s == FAIL)
    assert len(failed) >= 2
    return failed


def parse_markdown(text: str) -> list[dict]:
    """The matrix table as rows of {column: cell} (a pipe table: header, separator, rows; blank line ends it)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert set(lines[1].replace("|", "").replace("-", "")) <= {" ", ""}, lines[1]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def row_for(profile, good_text, expected: frozenset):
    rows = mutant_matrix.mutant_matrix(profile, good_text, [mutants.Mutant("m", "lr 0", mutants.lr_zero, expected)])
    return rows[1], rows


def test_exact_expected_failures_are_as_intended(profile, good_text, lr_zero_failures):
    row, rows = row_for(profile, good_text, lr_zero_failures)
    assert row.as_intended and rows[0].as_intended and rows[0].name == "good"
    assert row.expected_failures == lr_zero_failures
    assert parse_markdown(mutant_matrix.matrix_markdown(rows))[1]["as intended"] == "yes"


def test_an_extra_failure_is_not_as_intended(profile, good_text, lr_zero_failures):
    """Expected a strict subset of what failed: the log failed more than intended."""
    for dropped in sorted(lr_zero_failures):
        row, rows = row_for(profile, good_text, lr_zero_failures - {dropped})
        assert not row.as_intended, f"an extra failure ({dropped}) was counted as intended"
        table = parse_markdown(mutant_matrix.matrix_markdown(rows))
        assert table[1]["as intended"] == "NO" and table[1][dropped] == "**FAIL**"


def test_a_missed_failure_is_not_as_intended(profile, good_text, lr_zero_failures):
    """Expected more than failed: a criterion that should have failed passed."""
    passing = sorted(c for c in profile.ids if c not in lr_zero_failures)
    row, rows = row_for(profile, good_text, lr_zero_failures | {passing[0]})
    assert not row.as_intended
    assert parse_markdown(mutant_matrix.matrix_markdown(rows))[1]["as intended"] == "NO"


def test_markdown_cells_read_back_every_status(profile, good_text, lr_zero_failures):
    row, rows = row_for(profile, good_text, lr_zero_failures)
    table = parse_markdown(mutant_matrix.matrix_markdown(rows))
    cell = {PASS: "pass", FAIL: "**FAIL**", NOT_MEASURABLE: "n/m"}
    for parsed, got in zip(table, rows):
        assert parsed["log"] == got.name
        assert {c: parsed[c] for c in got.statuses} == {c: cell[s] for c, s in got.statuses.items()}
    assert {parsed for parsed in table[1].values()} >= {"pass", "**FAIL**", "n/m"}


def test_cli_exit_code_follows_the_flag(monkeypatch, capsys, lr_zero_failures):
    """main() exits 0 when every row is as intended, 1 when one mutant fails one criterion too many."""
    exact = [mutants.Mutant("exact", "lr 0, its measured failures", mutants.lr_zero, lr_zero_failures)]
    monkeypatch.setattr(mutants, "MUTANTS", exact)
    assert mutant_matrix.main([]) == 0
    extra = [mutants.Mutant("extra", "lr 0, one failure not expected", mutants.lr_zero,
                            frozenset(sorted(lr_zero_failures)[1:]))]
    monkeypatch.setattr(mutants, "MUTANTS", extra)
    assert mutant_matrix.main([]) == 1
    assert "| extra |" in capsys.readouterr().out


# ---------------------------------------------------------------- the session report's "caught exactly"
# (harness.report.session_report over harness.run.runs.RunSpec.judge: the live mutants of a GPU session)

def _entry(expected: set, failed: set, tolerated: set = frozenset(), ids=("a", "b", "c", "d")):
    from types import SimpleNamespace

    from harness.report import session_report as report
    from harness.run.runs import RunSpec

    spec = RunSpec("mutant-x", "a broken run", expected_failures=frozenset(expected),
                   tolerated_failures=frozenset(tolerated), why_tolerated="because" if tolerated else "")
    outcome = SimpleNamespace(spec=spec, stage=None, memory=None, seconds=1.0, summary={})
    verdicts = [SimpleNamespace(criterion_id=i, label=f"L{i}", status=FAIL if i in failed else PASS,
                                measured="m", expected="e", where="w", consequence_of=None) for i in ids]
    entry = report.run_entry(outcome, verdicts)
    table = parse_markdown(report.markdown({"profile": "reference", "runs": [entry]}))
    return entry, table[0]


@pytest.mark.parametrize("expected,failed,tolerated,exact,cells", [
    ({"a", "b"}, {"a", "b"}, set(), True, {"a": "x", "b": "x", "c": "", "d": ""}),
    ({"a", "b"}, {"a", "b", "c"}, set(), False, {"a": "x", "b": "x", "c": "UNEXPECTED", "d": ""}),   # an extra one
    ({"a", "b"}, {"a"}, set(), False, {"a": "x", "b": "MISSED", "c": "", "d": ""}),                  # a missed one
    ({"a"}, {"a", "d"}, {"d"}, True, {"a": "x", "b": "", "c": "", "d": "(x)"}),                       # tolerated
    ({"a"}, {"a", "c", "d"}, {"d"}, False, {"a": "x", "b": "", "c": "UNEXPECTED", "d": "(x)"}),
])
def test_report_caught_exactly_and_its_cells(expected, failed, tolerated, exact, cells):
    entry, row = _entry(expected, failed, tolerated)
    assert entry["caught_exactly"] is exact
    assert entry["expected_failures"] == sorted(expected) and entry["actual_failures"] == sorted(failed)
    assert entry["tolerated_failures"] == sorted(tolerated)
    assert row["caught exactly"] == ("yes" if exact else "NO") and row["mutant"] == "mutant-x"
    assert {i: row[i] for i in cells} == cells
