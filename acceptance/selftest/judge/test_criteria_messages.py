"""What a failing or unmeasured verdict says, for the band and tolerance kinds: measured, expected and where are
always text, `expected` is the same whatever the evidence (it states the criterion), `where` points at the log line
or the whole log it was judged on, and each kind of missing evidence is named. Bounds come from the reference
profile and its golden file (test_criteria_edges.py judges the bounds themselves)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.judge import criteria
from harness.evidence import logs
from harness.judge.profiles import Criterion, FAIL, load_profile, NOT_MEASURABLE, PASS, Profile, Verdict
from harness.evidence.records import RunEvidence
from harness.base.paths import RECORDED_LOGS
from harness.evidence.logformat import MARKER_TRAINING

REFERENCE = load_profile("reference")
RECORDED = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
GOOD = logs.parse_log_file(RECORDED)
KINDS = ("first_loss_band", "final_loss_band", "decreasing_trend", "golden_final_loss", "golden_curve",
         "skips_only_before", "resume_matches")
CRITERIA = {c.kind: c for c in REFERENCE.criteria if c.kind in KINDS}


def judged(c: Criterion, ev: RunEvidence) -> Verdict:
    profile = Profile(name="m", path="m.toml", description="", criteria=(c,), golden=REFERENCE.golden)
    return criteria.judge(profile, ev).verdicts[0]


def good(**fields) -> RunEvidence:
    return RunEvidence(run_dir="/runs/m", log=GOOD, resume_log=GOOD, **fields)


def whole_log(log) -> str:
    return f"whole log ({log.lines_total} lines"


def texts_ok(v: Verdict, c: Criterion) -> None:
    """measured/expected/where are non-empty text, expected is the passing run's, the message shows all three."""
    assert all(isinstance(x, str) and x for x in (v.measured, v.expected, v.where)), v
    assert v.expected == judged(c, good()).expected
    for text in (v.measured, v.expected, v.where):
        assert text in v.message


def test_the_recorded_run_passes_every_kind_here():
    for kind, c in CRITERIA.items():
        assert judged(c, good()).status == PASS, kind
    assert set(CRITERIA) == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_no_log_is_named(kind):
    c = CRITERIA[kind]
    v = judged(c, RunEvidence(run_dir="/runs/m"))
    assert v.status == NOT_MEASURABLE
    assert v.measured in ("not measured: no training log", "not measured: no resumed run")
    texts_ok(v, c)


EMPTY = logs.parse_log(MARKER_TRAINING + "\n")


@pytest.mark.parametrize("kind, phrase", [
    ("first_loss_band", "no line with lm loss (0 iteration lines)"),
    ("final_loss_band", "no iteration line in the log"),
    ("decreasing_trend", "0 logged lm loss value(s) over no iteration"),
    ("golden_final_loss", "no iteration line in the log"),
    ("golden_curve", "missing iteration(s) "),
    ("skips_only_before", "no iteration line in the log"),
])
def test_a_log_without_iteration_lines_is_named(kind, phrase):
    c = CRITERIA[kind]
    v = judged(c, RunEvidence(run_dir="/runs/m", log=EMPTY))
    assert v.status == FAIL and phrase in v.measured, v.measured
    assert v.where.startswith(whole_log(EMPTY)), v.where
    texts_ok(v, c)


def test_resume_without_the_uninterrupted_log_is_named():
    c = CRITERIA["resume_matches"]
    v = judged(c, RunEvidence(run_dir="/runs/m", resume_log=GOOD))
    assert v.status == NOT_MEASURABLE and v.measured == "not measured: no training log"
    v = judged(c, RunEvidence(run_dir="/runs/m", log=GOOD, resume_log=EMPTY))
    assert v.status == FAIL and "the resumed run logged no lm loss" in v.measured
    assert v.where == "resumed run's " + whole_log(EMPTY) + ")"


def _cut(log, upto: int, truncated: bool):
    """The log stopped after iteration `upto`'s line: nothing after it (a log that keeps its final save and
    evaluations but lacks iteration lines is a log with lines taken out, a case of its own)."""
    its = tuple(r for r in log.iterations if r.iteration <= upto)
    end = its[-1].line_no
    return replace(log, iterations=its, truncated_last_line=truncated,
                   validations=tuple(v for v in log.validations if v.line_no <= end),
                   checkpoints=tuple(c for c in log.checkpoints if c.line_no <= end),
                   memory=tuple(m for m in log.memory if m.line_no <= end))


@pytest.mark.parametrize("truncated", [False, True])
def test_a_stopped_log_names_where_it_stopped(truncated):
    c = CRITERIA["final_loss_band"]
    upto = GOOD.iterations[len(GOOD.iterations) // 2].iteration
    log = _cut(GOOD, upto, truncated)
    last = log.iterations[-1]
    v = judged(c, RunEvidence(run_dir="/runs/m", log=log))
    assert v.status == FAIL
    assert v.measured == (f"the log stops at iteration {last.iteration} of {last.train_iters}"
                          + ("; the log's last line is cut off" if truncated else ""))
    assert v.where == f"iteration {last.iteration}, log line {last.line_no}"
    assert v.expected.endswith(", of the log interval that ends at --train-iters") and c.params["require_complete"]
    texts_ok(v, c)
    relaxed = replace(c, params={**c.params, "require_complete": False})
    assert judged(relaxed, RunEvidence(run_dir="/runs/m", log=log)).expected.endswith("on the last iteration line")


def test_a_failing_point_is_located_at_its_log_line():
    """first/final band, golden final loss, golden curve and resume: `where` is the judged iteration's line."""
    first, last = GOOD.first_loss_record, GOOD.iterations[-1]
    far = 1e3
    for kind, record in (("first_loss_band", first), ("final_loss_band", last), ("golden_final_loss", last),
                         ("golden_curve", last)):
        c = CRITERIA[kind]
        log = replace(GOOD, iterations=tuple(replace(r, lm_loss=r.lm_loss + far) if r is record else r
                                             for r in GOOD.iterations))
        if kind == "golden_curve":
            c = replace(c, params={**c.params, "max_misses": 0})
        v = judged(c, RunEvidence(run_dir="/runs/m", log=log))
        assert v.status == FAIL and v.where == f"iteration {record.iteration}, log line {record.line_no}", (kind, v)
        texts_ok(v, c)
    c = CRITERIA["resume_matches"]
    resumed = replace(GOOD, iterations=tuple(replace(r, lm_loss=r.lm_loss + far) if r.lm_loss is not None else r
                                             for r in GOOD.iterations))
    v = judged(c, RunEvidence(run_dir="/runs/m", log=GOOD, resume_log=resumed))
    assert v.where == f"resumed run: iteration {first.iteration}, log line {first.line_no}"
    assert v.measured.startswith(f"{first.lm_loss + far:.4f} vs {first.lm_loss:.4f}")


def test_golden_curve_names_missing_iterations_and_the_worst_point():
    c = replace(CRITERIA["golden_curve"], params={**CRITERIA["golden_curve"].params, "max_misses": 0})
    series = REFERENCE.golden.metrics["lm loss"]
    gone = set(series.iterations[:9])
    log = replace(GOOD, iterations=tuple(r for r in GOOD.iterations if r.iteration not in gone))
    v = judged(c, RunEvidence(run_dir="/runs/m", log=log))
    shown = ", ".join(map(str, sorted(gone)[:8]))
    assert v.status == FAIL and f"missing iteration(s) {shown} ..." in v.measured, v.measured
    assert v.where.startswith(whole_log(log))
    one = set(series.iterations[:1])
    log = replace(GOOD, iterations=tuple(r for r in GOOD.iterations if r.iteration not in one))
    v = judged(c, RunEvidence(run_dir="/runs/m", log=log))
    # the log's final save and evaluations prove the run got past it: the line was taken out of the log
    assert v.measured.endswith(f"missing iteration(s) {series.iterations[0]} (the log proves the run reached "
                               "iteration 200 (the final evaluation on the test set, log line 950): 1 of them cut "
                               "from the log)"), v.measured


def test_missing_counter_is_not_measured_and_named():
    c = CRITERIA["skips_only_before"]
    log = replace(GOOD, iterations=tuple(replace(r, skipped=None) for r in GOOD.iterations))
    v = judged(c, RunEvidence(run_dir="/runs/m", log=log))
    assert v.status == NOT_MEASURABLE
    assert "have no 'number of skipped iterations' counter" in v.measured
    assert v.where.startswith(whole_log(log))


def test_trend_names_its_window_span_and_a_non_finite_value():
    c = CRITERIA["decreasing_trend"]
    series = [(r.iteration, r.line_no) for r in GOOD.iterations if r.lm_loss is not None]
    v = judged(c, good())
    assert v.where == (f"iterations {series[0][0]}-{series[-1][0]}, log lines {series[0][1]}-{series[-1][1]}")
    bad = GOOD.iterations[-3]
    log = replace(GOOD, iterations=tuple(replace(r, lm_loss=float("nan")) if r is bad else r
                                         for r in GOOD.iterations))
    v = judged(c, RunEvidence(run_dir="/runs/m", log=log))
    assert v.status == FAIL and v.measured == f"non-finite lm loss nan at iteration {bad.iteration}"
    assert v.where == f"iteration {bad.iteration}, log line {bad.line_no}"
