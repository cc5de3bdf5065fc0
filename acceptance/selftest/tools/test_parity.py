"""Self-tests of harness.tools.parity on recorded logs: the comparison, its table, and its spec's errors."""

from __future__ import annotations

import json
import re

import pytest

from harness.base import paths
from harness.evidence import logs
from harness.tools import parity
from harness.evidence.logformat import ParsedLog

EVIDENCE = paths.REPO / "results" / "megatron-parity"


@pytest.fixture(scope="module")
def spec() -> parity.ParitySpec:
    return parity.load_spec()


@pytest.fixture(scope="module")
def megatron(spec) -> ParsedLog:
    return logs.parse_log_file(spec.reference_log)


def _text(spec) -> str:
    return spec.reference_log.read_text()


def _shift_lm_loss(text: str, iteration: int, by: float) -> str:
    """The recorded log with the lm loss of one iteration line moved by `by`."""
    def fix(line: str) -> str:
        rec = logs.parse_iteration_line(line)
        if rec is None or rec.iteration != iteration:
            return line
        return re.sub(r"lm loss: ([0-9.E+-]+)", lambda m: f"lm loss: {float(m.group(1)) + by:.6E}", line)
    return "\n".join(fix(line) for line in text.splitlines())


def test_recorded_log_matches_itself(spec, megatron):
    """Megatron's log against itself: every row compared, every |delta| 0, 19 lm-loss rows, 21 skipped rows."""
    result = parity.compare(megatron, megatron, spec)
    counts = {m: sum(r.metric == m for r in result.rows) for m in {r.metric for r in result.rows}}
    assert counts == {"lm loss": 19, "skipped": 21, "validation lm loss": 4, "final validation lm loss": 1,
                      "test lm loss": 1}, counts
    assert not result.failures and result.largest.delta == 0.0


def test_a_shift_beyond_the_tolerance_fails_at_its_interval(spec, megatron):
    """lm loss moved by 2x the tolerance at iteration 70 fails that row only, and the message names it."""
    shifted = logs.parse_log(_shift_lm_loss(_text(spec), 70, 2 * spec.loss_tol))
    result = parity.compare(megatron, shifted, spec)
    assert [(r.metric, r.iteration) for r in result.failures] == [("lm loss", 70)]
    assert (result.largest.metric, result.largest.iteration) == ("lm loss", 70)
    message = result.failure_message("RUN")
    assert "lm loss at iteration 70" in message and "artifacts: RUN" in message, message


def test_a_shift_within_the_tolerance_passes(spec, megatron):
    """Half the tolerance at every interval still passes, and the largest |delta| reports it."""
    text = _text(spec)
    for r in megatron.iterations:
        if r.lm_loss is not None:
            text = _shift_lm_loss(text, r.iteration, spec.loss_tol / 2)
    result = parity.compare(megatron, logs.parse_log(text), spec)
    assert not result.failures, result.failure_message()
    assert result.largest.delta == pytest.approx(spec.loss_tol / 2, abs=2e-6)


def test_skip_counts_must_be_equal(spec, megatron):
    """The old trainer's counting (reset after iteration 1: 9 at iteration 10) fails the skipped row of 10."""
    text = _text(spec).replace("number of skipped iterations:  10 |", "number of skipped iterations:   9 |")
    result = parity.compare(megatron, logs.parse_log(text), spec)
    assert [(r.metric, r.iteration, r.megatron, r.trainer) for r in result.failures] == [("skipped", 10, 10, 9)]


def test_a_missing_line_fails_and_says_missing(spec, megatron):
    """A trainer log that stops at iteration 150 fails every later row, marked missing."""
    text = "\n".join(line for line in _text(spec).splitlines()
                     if not re.search(r"iteration +(1[6-9]0|200)/|at iteration 200", line))
    result = parity.compare(megatron, logs.parse_log(text), spec)
    late = {(r.metric, r.iteration) for r in result.failures}
    assert ("lm loss", 200) in late and ("test lm loss", 200) in late and all(it > 150 for _, it in late), late
    assert parity.MISSING in result.failure_message()


@pytest.mark.parametrize("body, problem", [
    ("seed = 1234\n", "`reference_log` missing"),
    ('reference_log = "x.log"\nseed = 1\nloss_tol = "0.01"\nskipped_tol = 0\nrationale = "r"\n',
     "`loss_tol` must be float"),
    ('reference_log = "x.log"\nseed = 1\nloss_tol = 0.01\nskipped_tol = 0\nrationale = "r"\nextra = 1\n',
     "unknown key `extra`"),
    ('reference_log = "x.log"\nseed = 1\nloss_tol = -0.01\nskipped_tol = 0\nrationale = "r"\n', ">= 0"),
])
def test_bad_spec_names_file_and_key(tmp_path, body, problem):
    """A broken spec raises ParityError naming the file and what is wrong."""
    path = tmp_path / "parity.toml"
    path.write_text(body)
    with pytest.raises(parity.ParityError, match=re.escape(problem)) as info:
        parity.load_spec(path)
    assert str(path) in str(info.value)


def test_cli_writes_table_and_exits_by_verdict(tmp_path, spec):
    """`python -m harness parity LOG --out DIR` writes parity.md/json; exit 0 within tolerance, 1 outside."""
    assert parity.main([str(spec.reference_log), "--out", str(tmp_path / "ok")]) == 0
    doc = json.loads((tmp_path / "ok" / "parity.json").read_text())
    assert (doc["outside_tolerance"], doc["compared"]) == (0, 46), doc
    bad = tmp_path / "bad.log"
    bad.write_text(_shift_lm_loss(_text(spec), 200, 1.0))
    assert parity.main([str(bad), "--out", str(tmp_path / "bad")]) == 1
    assert "| lm loss | 200 |" in (tmp_path / "bad" / "parity.md").read_text()


def test_committed_evidence_is_the_comparison_of_the_committed_log(spec):
    """results/megatron-parity/parity.json is exactly what compare() gives for the committed trainer log."""
    committed = json.loads((EVIDENCE / "parity.json").read_text())
    again = parity.compare_files(EVIDENCE / "trainer-seed1234.log", spec).to_dict()
    assert committed["rows"] == json.loads(json.dumps(again["rows"])), "parity.json is stale: re-run the parity CLI"
    assert committed["outside_tolerance"] == 0 and committed["largest_abs_delta"]["abs_delta"] < spec.loss_tol
