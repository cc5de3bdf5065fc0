"""What resume-matches measures and says when the resumed run cannot be compared: the iteration it resumed at is
missing from the uninterrupted run, or the resumed run logged no loss (its last lines quoted, each cut), or there is
no log. (Written against the mutation run's survivors in harness.judge.kinds._check_resume_matches.)"""

from __future__ import annotations


from harness.judge import criteria
from harness.evidence import logs
from harness.judge.profiles import FAIL, load_profile, NOT_MEASURABLE, Profile
from harness.evidence.records import RunEvidence
from harness.evidence.logformat import IterationRecord, ParsedLog, format_iteration


def _log(losses: dict) -> ParsedLog:
    lines = ["training ..."] + [format_iteration(IterationRecord(
        iteration=it, train_iters=200, consumed_samples=16 * it, elapsed_ms=90.0, learning_rate=1e-4,
        global_batch_size=16, loss_scale=65536.0, lm_loss=v, sop_loss=0.69, skipped=0, nan=0))
        for it, v in losses.items()]
    return logs.parse_log("\n".join(lines) + "\n")


def _verdict(ev: RunEvidence):
    c = load_profile("reference").by_id("resume-matches")
    one = Profile(name="t", path="t.toml", description="", criteria=(c,), golden=None)
    return c, criteria.evaluate(one, ev)[0]


BASE = _log({100: 8.5, 110: 8.42, 120: 8.38})


def test_a_resume_at_an_iteration_the_uninterrupted_run_did_not_log_fails_naming_it():
    resumed = _log({115: 8.4})
    c, v = _verdict(RunEvidence(run_dir="/r", log=BASE, resume_log=resumed))
    assert v.status == FAIL
    assert v.measured == "8.4000 at iteration 115, but the uninterrupted run has no lm loss there", v.measured
    assert v.expected == (f"first lm loss after resume within {c.params['tol']} of the uninterrupted run at the "
                          "same iteration")
    assert v.where == f"resumed run: iteration 115, log line {resumed.iterations[0].line_no}"


def test_a_resumed_run_without_a_loss_quotes_its_last_three_lines_each_cut_at_160():
    long = "RuntimeError: " + "x" * 300
    resumed = logs.parse_log("\n".join(["setup", "", "loading checkpoint", "Traceback (most recent call last):",
                                        long, ""]) + "\n")
    _, v = _verdict(RunEvidence(run_dir="/r", log=BASE, resume_log=resumed))
    assert v.status == FAIL
    assert v.measured == ("the resumed run logged no lm loss; its log ends: loading checkpoint / Traceback (most "
                          "recent call last): / " + long[:160]), v.measured
    assert v.where == f"resumed run's whole log ({resumed.lines_total} lines)"


def test_an_empty_resumed_log_says_so():
    c, v = _verdict(RunEvidence(run_dir="/r", log=BASE, resume_log=logs.parse_log("")))
    assert v.status == FAIL and v.measured == "the resumed run logged no lm loss; its log is empty", v.measured
    assert v.expected == (f"first lm loss after resume within {c.params['tol']} of the uninterrupted run at the "
                          "same iteration")


def test_no_resumed_run_and_no_training_log_are_named_apart():
    _, v = _verdict(RunEvidence(run_dir="/r", log=BASE))
    assert v.status == NOT_MEASURABLE and v.measured == "not measured: no resumed run"
    _, v = _verdict(RunEvidence(run_dir="/r", resume_log=BASE))
    assert v.status == NOT_MEASURABLE and v.measured == "not measured: no training log"
    assert v.expected.startswith("first lm loss after resume within")


def test_a_resumed_process_first_line_is_not_the_one_compared():
    """A run resumed at 100 prints its first iteration, 101, off its --log-interval 10 (one step's loss), then 110
    over 101-110 again: the first line over the same steps as the uninterrupted run's is 110, and it is compared."""
    resumed = _log({101: 8.9, 110: 8.42, 120: 8.38})
    _, v = _verdict(RunEvidence(run_dir="/r", log=BASE, resume_log=resumed))
    assert logs.log_interval(resumed) == 10
    assert v.status == "pass" and v.measured == "8.4200 vs 8.4200 (off by 0.0000)", v.measured
    assert v.where == f"resumed run: iteration 110, log line {resumed.iterations[1].line_no}"
    _, v = _verdict(RunEvidence(run_dir="/r", log=BASE, resume_log=_log({101: 8.9, 110: 8.52, 120: 8.38})))
    assert v.status == FAIL and v.measured == "8.5200 vs 8.4200 (off by 0.1000)", v.measured
