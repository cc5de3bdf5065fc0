"""What skips-early-only measures and says, exactly: Megatron's extra iteration-1 line is not counted twice, the
search's count includes the interval ending at the limit, and every text names its iteration and log line.
(Written against the mutation run's survivors in harness.judge.kinds._check_skips_only_before.)"""

from __future__ import annotations

from harness.judge import criteria
from harness.evidence import logs
from harness.judge.profiles import FAIL, load_profile, NOT_MEASURABLE, PASS, Profile
from harness.evidence.records import RunEvidence
from harness.evidence.logformat import IterationRecord, ParsedLog, format_iteration

LIMIT = 40
SEARCH = {1: 1, 10: 10, 20: 7, 30: 0, 40: 1}     # Megatron's counters: the iteration-1 line is counted again at 10


def _log(after: dict, iterations=range(10, 201, 10), with_first: bool = True) -> ParsedLog:
    lines = ["training ..."]
    for it in ([1] if with_first else []) + list(iterations):
        skipped = SEARCH.get(it, after.get(it, 0))
        lines.append(format_iteration(IterationRecord(
            iteration=it, train_iters=200, consumed_samples=16 * it, elapsed_ms=90.0, learning_rate=1e-4,
            global_batch_size=16, loss_scale=65536.0, lm_loss=None if it < 20 else 8.0, sop_loss=None,
            skipped=skipped, nan=0)))
    return logs.parse_log("\n".join(lines) + "\n")


def _verdict(log, max_fraction: float):
    from dataclasses import replace

    c = load_profile("reference").by_id("skips-early-only")   # the profile's own criterion, params varied
    c = replace(c, params={**c.params, "iteration": LIMIT, "max_fraction": max_fraction})
    one = Profile(name="t", path="t.toml", description="", criteria=(c,), golden=None)
    return criteria.evaluate(one, RunEvidence(run_dir="/runs/t", log=log))[0]


def test_the_iteration_one_line_is_not_counted_twice_and_the_limit_is_inclusive():
    log = _log({50: 2})
    v = _verdict(log, 0.05)
    assert v.status == PASS, v.message
    # 10 + 7 + 0 + 1 (the interval ending at 40 is part of the search); the iteration-1 line's 1 is inside the 10
    assert v.measured == "18 skipped up to iteration 40; after it 2 of 160 steps (1.2%)", v.measured
    assert v.expected == "at most 5.0% of the steps after iteration 40 skipped (fp16 overflows now and then)"
    assert v.where == f"whole log ({log.lines_total} lines)"


def test_a_failure_names_the_first_late_interval_and_its_line():
    log = _log({50: 2, 90: 9, 120: 9})
    v = _verdict(log, 0.05)
    line_50 = next(r.line_no for r in log.iterations if r.iteration == 50)
    assert v.status == FAIL
    assert v.measured == ("18 skipped up to iteration 40; after it 20 of 160 steps (12.5%); first in the interval "
                          "ending at iteration 50"), v.measured
    assert v.where == f"iteration 50, log line {line_50}"


def test_with_max_fraction_zero_any_late_skip_fails_and_says_so():
    v = _verdict(_log({200: 1}), 0.0)
    assert v.status == FAIL and v.expected == ("skipped iterations only in log intervals ending at or before "
                                               f"iteration {LIMIT}")


def test_a_log_of_the_first_line_only_counts_that_line():
    log = _log({}, iterations=(), with_first=True)
    v = _verdict(log, 0.05)
    assert v.status == PASS and v.measured.startswith("1 skipped up to iteration 40"), v.measured


def test_missing_lines_and_counters_are_named():
    empty = logs.parse_log("training ...\n")
    v = _verdict(empty, 0.05)
    assert v.status == FAIL and v.measured.startswith("no iteration line in the log"), v.measured
    text = "\n".join(line.split(" | number of skipped")[0] + " |" if " iteration " in line else line
                     for line in "\n".join(_log({}).lines).splitlines()) + "\n"
    v = _verdict(logs.parse_log(text), 0.05)
    assert v.status == NOT_MEASURABLE and v.expected.startswith("at most 5.0% of the steps after iteration 40")
