"""Exact texts and choices of the band checkers where the verdict's status alone does not show a change: the
trend's window means and rises, the final band's missing-loss texts, the golden checks' values, worst point,
missing list and whether a curve failure counts as a consequence of missing evidence. (Written against the
mutation run's survivors in harness.judge.kinds.)"""

from __future__ import annotations

import math

from harness.judge import kinds
from harness.evidence import logs
from harness.judge.profiles import FAIL, load_profile, NOT_MEASURABLE, PASS
from harness.evidence.records import RunEvidence
from harness.judge.profiles import Golden, GoldenSeries
from harness.evidence.logformat import IterationRecord, ParsedLog, format_iteration

PROFILE = load_profile("reference")


def _log(losses: dict, train_iters: int = 200) -> ParsedLog:
    lines = ["training ..."] + [format_iteration(IterationRecord(
        iteration=it, train_iters=train_iters, consumed_samples=16 * it, elapsed_ms=90.0, learning_rate=1e-4,
        global_batch_size=16, loss_scale=65536.0, lm_loss=v, sop_loss=0.69, skipped=0, nan=0))
        for it, v in losses.items()]
    return logs.parse_log("\n".join(lines) + "\n")


def _line(log, it: int) -> int:
    return next(r.line_no for r in log.iterations if r.iteration == it)


def _check(cid: str, log, golden=None, **params):
    c = PROFILE.by_id(cid)
    from dataclasses import replace

    c = replace(c, params={**c.params, **params})
    return c, kinds.CHECKERS[c.kind](c, RunEvidence(run_dir="/r", log=log), golden)


# ---------------------------------------------------------------- decreasing_trend


def test_trend_reports_first_and_last_window_means_and_counts_only_real_rises():
    # window 1: six windows 10, 9, 9, 8, 7, 6 -> equal neighbours are not a rise
    log = _log({10 * i: v for i, v in enumerate([10.0, 9.0, 9.0, 8.0, 7.0, 6.0], start=2)})
    _, out = _check("loss-decreases", log, window_iters=10, min_drop=0.5, max_increases=0)
    assert out.status == PASS, out.measured
    assert out.measured == "drop 4.0000 (10.0000 -> 6.0000), 0 rise(s) over 6 window means", out.measured


def test_trend_names_a_non_finite_value_with_its_expectation():
    log = _log({20: 10.0, 30: 9.5, 40: math.nan, 50: 9.0, 60: 8.8, 70: 8.6})
    c, out = _check("loss-decreases", log)
    assert out.status == FAIL and out.measured == "non-finite lm loss nan at iteration 40"
    assert out.expected.startswith(f"first minus last window mean of lm loss >= {c.params['min_drop']}")
    assert out.where == f"iteration 40, log line {_line(log, 40)}"


# ---------------------------------------------------------------- final_loss_band


def test_final_band_texts_for_no_line_no_loss_and_a_value():
    c, out = _check("final-loss", logs.parse_log("training ...\n"))
    assert out.measured == "no iteration line in the log" and out.missing
    log = _log({190: 8.2, 200: None})
    c, out = _check("final-loss", log)
    assert out.measured == "no lm loss on the iteration line at 200 (every step of its log interval was skipped)"
    assert out.expected == f"lm loss in [{c.params['lo']}, {c.params['hi']}] on the last iteration line, of the log interval that ends at --train-iters"
    assert out.where == f"iteration 200, log line {_line(log, 200)}"
    log = _log({190: 8.2, 200: 8.1})
    c, out = _check("final-loss", log)
    assert out.measured == "8.1000 at iteration 200"


# ---------------------------------------------------------------- golden checks

GOLDEN = Golden(path="/g/golden.json", provenance={}, metrics={
    "lm loss": GoldenSeries(tuple(range(20, 201, 10)), tuple([8.0] * 19), tuple([0.1] * 19))})


def test_golden_final_loss_prints_the_value_and_its_distance():
    _, out = _check("golden-final-loss", _log({it: 8.0 for it in range(20, 191, 10)} | {200: 8.25}), GOLDEN)
    assert out.status == FAIL and out.measured == "8.2500 (off by 0.2500)", out.measured


def test_golden_checks_without_golden_values_say_which_metric():
    for cid in ("golden-final-loss", "golden-curve"):
        _, out = _check(cid, _log({200: 8.0}), None)
        assert out.status == NOT_MEASURABLE and out.expected == "lm loss golden values", (cid, out.expected)


def test_golden_curve_worst_point_is_the_non_finite_one_and_prints_the_value():
    losses = {it: 8.0 for it in range(20, 201, 10)} | {50: 8.5, 120: math.nan}
    log = _log(losses)
    _, out = _check("golden-curve", log, GOLDEN, max_misses=2)
    assert out.status == PASS   # two misses allowed
    assert out.measured == "2 miss(es) of 19; worst at iteration 120: nan vs 8.0000 +/- 0.1000", out.measured
    assert out.where == f"iteration 120, log line {_line(log, 120)}"
    _, out = _check("golden-curve", _log({it: 8.0 for it in range(20, 201, 10)} | {50: 8.5}), GOLDEN)
    assert out.measured == "1 miss(es) of 19; worst at iteration 50: 8.5000 vs 8.0000 +/- 0.1000", out.measured


def test_golden_curve_missing_list_is_cut_after_eight():
    eight = {it: 8.0 for it in range(20, 201, 10) if not 30 <= it <= 100}
    _, out = _check("golden-curve", _log(eight), GOLDEN)
    assert out.measured == ("8 miss(es) of 19; missing iteration(s) 30, 40, 50, 60, 70, 80, 90, 100 (the log proves "
                            "the run reached iteration 200 (its last iteration line, log line 12): 8 of them cut from "
                            "the log)"), out.measured
    nine = {it: 8.0 for it in range(20, 201, 10) if not 30 <= it <= 110}
    _, out = _check("golden-curve", _log(nine), GOLDEN)
    assert "missing iteration(s) 30, 40, 50, 60, 70, 80, 90, 100 ... (" in out.measured, out.measured


def test_golden_curve_is_a_consequence_of_missing_evidence_only_when_the_missing_points_alone_fail_it():
    full = {it: 8.0 for it in range(20, 201, 10)}
    _, out = _check("golden-curve", _log({k: v for k, v in full.items() if k not in (190, 200)} | {50: 9.0}), GOLDEN,
                    max_misses=2)
    assert out.status == FAIL and not out.missing   # 3 misses: 2 missing, 1 off the band
    _, out = _check("golden-curve", _log({k: v for k, v in full.items() if k not in (180, 190, 200)}), GOLDEN,
                    max_misses=2)
    assert out.status == FAIL and out.missing       # 3 missing points alone
    _, out = _check("golden-curve", _log(full | {50: 9.0, 60: 9.0, 70: 9.0}), GOLDEN, max_misses=2)
    assert out.status == FAIL and not out.missing   # nothing missing


def test_golden_curve_with_a_zero_tolerance_point_misses_any_difference():
    golden = Golden(path="/g/z.json", provenance={}, metrics={
        "lm loss": GoldenSeries((20, 30), (8.0, 8.0), (0.1, 0.0))})
    _, out = _check("golden-curve", _log({20: 8.0, 30: 8.01}), golden, max_misses=0)
    assert out.status == FAIL and out.measured == "1 miss(es) of 2; worst at iteration 30: 8.0100 vs 8.0000 +/- 0.0000"


def _rec(it: int, skipped: int, lm=8.0):
    return IterationRecord(iteration=it, train_iters=200, consumed_samples=0, elapsed_ms=1.0,
                                learning_rate=1e-4, global_batch_size=16, loss_scale=1024.0, lm_loss=lm,
                                skipped=skipped, nan=skipped)


def test_a_repeated_iteration_line_is_not_a_whole_skipped_interval():
    """Two lines of one iteration (a zero-length interval, e.g. logs stitched at a resume) with no skip: healthy."""
    from harness.evidence import fp16

    assert fp16.divergence([_rec(40, 0), _rec(50, 0), _rec(50, 0), _rec(60, 0)], 40) is None


def test_with_log_interval_one_a_single_skipped_step_is_a_whole_interval():
    """--log-interval 1: a line whose one step was skipped is a whole interval skipped, even with a loss printed."""
    from harness.evidence import fp16

    found = fp16.divergence([_rec(40, 0), _rec(41, 1), _rec(42, 0)], 40)
    assert found is not None and found[1].iteration == 41 and "interval ending at iteration 41" in found[0]


def test_the_default_search_end_is_the_profiles():
    """divergence()'s default `after` (used by the diagnosis of a failed run) is the profile's no-nan `after`."""
    from harness.evidence import fp16

    after = PROFILE.by_id("no-nan").params["after"]
    assert fp16.divergence([_rec(after, 0), _rec(after + 1, 1)]) is not None
    assert fp16.divergence([_rec(after - 1, 0), _rec(after, 1)]) is None
