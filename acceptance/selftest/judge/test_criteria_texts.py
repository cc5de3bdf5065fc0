"""`python -m harness criteria` exactly: what `check` prints for each verdict and its exit code, the golden
file `golden` writes (indent, provenance, band rule from its options and their defaults), the usage errors and
the help; a verdict's message (the pass line, the last log lines read from the file, no lines, whose remedy);
evidence read from a log file; judging with some kinds excluded; compute_band's absolute floor and its error.
(Written against the mutation run's survivors in harness.judge.criteria and harness.judge.bands.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.judge import bands, criteria
from harness.evidence import mutants
from harness.judge.profiles import Criterion, FAIL, load_profile, NOT_MEASURABLE, PASS
from harness.evidence.diagnose import Diagnosis
from harness.evidence.records import RunEvidence
from harness.judge.kinds import CHECKERS, Finding
from harness.base.paths import FIXTURES, RECORDED_LOGS

RECORDED = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
RECIPE_B = RECORDED_LOGS / "reference_trainer_h200_recipe_b_seed1234.log"


def _printed(verdicts) -> str:
    """check's output: a passing verdict's line, a failing or unmeasured one's block and an empty line after it."""
    return "".join(v.message + "\n" if v.status == PASS else v.message + "\n\n" for v in verdicts)


def test_check_prints_every_verdict_and_exits_1_on_a_failure(tmp_path, capsys):
    log = tmp_path / "stopped.log"
    log.write_text(mutants.stopped_at(150)(RECORDED.read_text()))
    assert criteria.main(["check", "--log", str(log)]) == 1        # the reference profile by default
    verdicts = criteria.evaluate(load_profile("reference"), criteria.evidence_from_log_file(log))
    assert {v.status for v in verdicts} >= {PASS, FAIL}
    assert capsys.readouterr().out == _printed(verdicts)


def test_check_of_a_passing_log_exits_0(capsys):
    assert criteria.main(["check", "--profile", "megatron-lm", "--log", str(RECORDED)]) == 0
    verdicts = criteria.evaluate(load_profile("megatron-lm"), criteria.evidence_from_log_file(RECORDED))
    assert capsys.readouterr().out == _printed(verdicts)


def test_golden_writes_the_band_rule_of_its_options_indented_by_one(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert criteria.main(["golden", "--out", str(out), "--rel-tol-floor", "0.5", "--k", "1.5",
                          str(RECORDED), str(RECIPE_B)]) == 0
    assert capsys.readouterr().out == f"wrote {out}: 2 run(s)\n"
    text = out.read_text()
    assert text.startswith('{\n "schema": 1,\n "provenance": {\n  "runs": 2,') and text.endswith("}\n")
    doc = json.loads(text)
    assert doc["band_rule"] == {"k_std": 1.5, "rel_tol_floor": 0.5}
    assert doc["provenance"] == {"runs": 2, "run_names": sorted([RECORDED.stem, RECIPE_B.stem])}


def test_golden_defaults_without_provenance(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert criteria.main(["golden", "--out", str(out), str(RECORDED)]) == 0
    doc = json.loads(out.read_text())
    assert doc["band_rule"] == {"k_std": 3.0, "rel_tol_floor": 0.02}
    assert doc["provenance"] == {"runs": 1, "run_names": [RECORDED.stem]}
    assert capsys.readouterr().out == f"wrote {out}: 1 run(s)\n"


@pytest.mark.parametrize("argv, error", [
    ([], "the following arguments are required: command"),
    (["check"], "the following arguments are required: --log"),
    (["golden", str(RECORDED)], "the following arguments are required: --out"),
])
def test_usage_errors_name_what_is_missing(argv, error, capsys):
    with pytest.raises(SystemExit) as exc:
        criteria.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m harness criteria") and error in err, err


def test_help_names_the_commands_and_options(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        criteria.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m harness criteria [-h] {check,golden} ...")
    assert "    check         judge a training log with a criteria profile\n" in out
    assert "    golden        compute a golden-values file (bands from the spread of runs)\n" in out
    with pytest.raises(SystemExit):
        criteria.main(["golden", "--help"])
    out = capsys.readouterr().out
    assert "  --provenance PROVENANCE\n                        JSON object: gpu, versions, date, seeds, ...\n" in out
    assert "--k K                 tolerance = max(k * std, floor)\n" in out
    with pytest.raises(SystemExit):
        criteria.main(["check", "--help"])
    assert "usage: python -m harness criteria check [-h] [--profile PROFILE] --log LOG" in capsys.readouterr().out


def test_evidence_from_a_log_file_names_its_folder_and_path(tmp_path):
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text(RECORDED.read_text())
    ev = criteria.evidence_from_log_file(log)
    assert ev.run_dir == str(tmp_path / "run") and ev.log_path == str(log)
    assert ev.log.lines_total == criteria.logs.parse_log_file(RECORDED).lines_total and ev.log.iterations


def test_excluded_kinds_are_not_judged():
    profile = load_profile("reference")
    ev = criteria.evidence_from_log_file(RECORDED)
    ids = [v.criterion_id for v in criteria.evaluate(profile, ev, exclude={"resume_matches", "cuda_graph_used"})]
    assert ids == [i for i in profile.ids if i not in ("resume-matches", "cuda-graph")]


def test_compute_band_absolute_floor_and_its_error():
    assert bands.compute_band([0.0, 0.0], rel_tol_floor=0.1, abs_floor=5.0) == bands.Band(mean=0.0, std=0.0, tol=5.0,
                                                                                          n=2)
    with pytest.raises(ValueError, match="^compute_band needs at least one sample$"):
        bands.compute_band([], 0.02)


def _criterion() -> Criterion:
    return load_profile("reference").by_id("final-loss")


def test_a_pass_is_one_line_with_id_measured_and_expected():
    c = _criterion()
    ev = RunEvidence(run_dir="/runs/t")
    assert criteria.render_message(c, Finding(PASS, "8.1000 at iteration 200", "in [7.5, 8.8]", "iteration 200"),
                                   ev) == f"PASS: {c.label} [final-loss]: measured 8.1000 at iteration 200; expected in [7.5, 8.8]"


def test_the_message_tails_the_log_file_when_no_lines_were_parsed(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("".join(f"line {i} of the log\n" for i in range(15)))
    c = _criterion()
    text = criteria.render_message(c, Finding(FAIL, "m", "e", "w"), RunEvidence(run_dir="/runs/t", log_path=str(path)))
    tail = [f"    | line {i} of the log" for i in range(6, 15)] + ["    | "]      # the file ends with a newline
    assert text.split("\n")[5:17] == ["  last log lines:", *tail, f"  remedy:    {c.remedy}"]
    none = criteria.render_message(c, Finding(NOT_MEASURABLE, "m", "e", "w"), RunEvidence(run_dir="/runs/t"))
    assert "  last log lines:\n    (no log lines)\n  remedy:" in none


def test_only_a_failure_for_missing_evidence_after_a_root_cause_has_no_remedy_of_its_own():
    c, ev = _criterion(), RunEvidence(run_dir="/runs/t")
    cause = Diagnosis("cuda-oom", "out of memory", "lower the batch", "CUDA out of memory")
    missing = Finding(FAIL, "m", "e", "w", missing=True)
    present = Finding(FAIL, "m", "e", "w")
    assert criteria.render_message(c, missing, ev, cause).endswith(f"  remedy:    {criteria.CONSEQUENCE_REMEDY}")
    assert criteria.render_message(c, present, ev, cause).endswith(f"  remedy:    {c.remedy}")
    assert criteria.render_message(c, missing, ev).endswith(f"  remedy:    {c.remedy}")
    assert criteria.render_message(c, missing, ev, cause).split("\n")[1:3] == [
        "  ROOT CAUSE [cuda-oom]: out of memory", "  fix first: lower the batch"]


def test_a_crash_with_no_known_cause_names_the_logs_last_line():
    text = "starting\nsomething odd happened here\n"
    cause = criteria.root_cause(RunEvidence(run_dir="/r", exit_code=1, log=criteria.logs.parse_log(text)))
    assert cause.cause_id == "crashed"
    assert cause.cause == ("the run exited with code 1 and its log names no known cause; last line: something odd "
                           "happened here")


def test_evidence_from_log_text_is_the_log_alone():
    text = RECORDED.read_text()
    ev = criteria.evidence_from_log_text(text)
    assert (ev.run_dir, ev.log_path, ev.exit_code, ev.checkpoints, ev.memory) == ("(recorded log)", None, None, None,
                                                                                 None)
    assert ev.log.lines_total == criteria.logs.parse_log(text).lines_total
    named = criteria.evidence_from_log_text("x\n", run_dir="/runs/r", log_path="/runs/r/train.log")
    assert (named.run_dir, named.log_path, named.log.lines) == ("/runs/r", "/runs/r/train.log", ("x",))


def test_a_log_file_is_read_with_undecodable_bytes_replaced_and_bounded(tmp_path, monkeypatch):
    path = tmp_path / "train.log"
    path.write_bytes(b"\xffstart\n" + b"x" * 40 + b"\nlast \xfe line\n")
    ev = RunEvidence(run_dir="/runs/t", log_path=str(path))
    text = criteria.render_message(_criterion(), Finding(FAIL, "m", "e", "w"), ev)
    assert "    | \ufffdstart\n" in text and "    | last \ufffd line\n" in text
    monkeypatch.setattr(criteria, "KEEP_CHARS", 4)
    assert criteria._log_text(ev) == "\ufffdstart\nx"                         # 2 x KEEP_CHARS characters


def test_judgement_fields_recipe_variant_and_root_cause():
    profile = load_profile("reference")
    j = criteria.judge(profile, criteria.evidence_from_log_file(RECIPE_B))
    assert (j.profile, j.recipe, j.recipe_how, j.diagnosis) == (
        "reference", "b", "arguments block: bert_binary_head False", None)
    golden = {v.criterion_id: v for v in j.verdicts}["golden-final-loss"]
    b_golden, a_golden = profile.for_recipe("b").golden.path, profile.for_recipe("a").golden.path
    assert b_golden != a_golden and f"({Path(b_golden).name}, calibrated on" in golden.expected, golden.expected
    assert [v.label for v in j.verdicts] == [c.label for c in profile.for_recipe("b").criteria]


def test_a_stopped_run_names_its_root_cause_in_each_missing_failure(tmp_path):
    log = tmp_path / "stopped.log"
    log.write_text(mutants.stopped_at(150)(RECORDED.read_text()))
    profile = load_profile("reference")
    ev = criteria.evidence_from_log_file(log)
    j = criteria.judge(profile, ev)
    assert j.diagnosis.cause_id == "log-ends-early" and j.verdict == "fail"
    by = {v.criterion_id: v for v in j.verdicts}
    assert by["final-loss"].status == FAIL and by["final-loss"].consequence_of == "log-ends-early"
    assert by["first-loss"].consequence_of is None and by["exit-code"].consequence_of is None
    # "the run completed" is measured from the log: it fails on its own (where it stopped), live or recorded
    outcome = CHECKERS["exit_code"](profile.by_id("exit-code"), ev, None)
    assert (outcome.status, outcome.measured, outcome.missing) == (
        FAIL, "stopped at iteration 150 of 200; missing: iterations 151-200", False)
    live = {v.criterion_id: v for v in criteria.judge(profile, ev, live=True).verdicts}["exit-code"]
    assert (live.status, live.measured, live.expected, live.where, live.consequence_of) == (
        FAIL, outcome.measured, outcome.expected, outcome.where, None)
    assert live.message.split("\n")[-1] == f"  remedy:    {profile.by_id('exit-code').remedy}"


def test_root_cause_of_a_complete_log_only_when_it_crashed_timed_out_or_diverged():
    text = RECORDED.read_text()
    log = criteria.logs.parse_log(text)
    last = [line.strip() for line in text.splitlines() if line.strip()][-1]
    assert criteria.root_cause(RunEvidence(run_dir="/r", log=log)) is None
    assert criteria.root_cause(RunEvidence(run_dir="/r", log=log, exit_code=0)) is None
    crashed = criteria.root_cause(RunEvidence(run_dir="/r", log=log, exit_code=1))
    assert (crashed.cause_id, crashed.cause, crashed.evidence) == (
        "crashed", f"the run exited with code 1 and its log names no known cause; last line: {last}", last)
    timed_out = criteria.root_cause(RunEvidence(run_dir="/r", log=log, timed_out=True))
    assert timed_out.cause_id == "timeout" and timed_out.cause.endswith(f"; last line: {last}")
    nan = criteria.root_cause(RunEvidence(run_dir="/r", log=criteria.logs.parse_log(mutants.nan_at(150)(text))))
    assert nan.cause_id == "nan"


def _diagnosis(text: str, **fields):
    cause = criteria.root_cause(RunEvidence(run_dir="/r", log=criteria.logs.parse_log(text), **fields))
    return None if cause is None else (cause.cause_id, cause.cause, cause.remedy, cause.evidence)


STOPPED_REMEDY = ("submit the complete log of a run that reached --train-iters (it ends with the test-set loss "
                  "line)")


def test_a_recorded_log_that_stops_is_cut_not_hung():
    text = mutants.stopped_at(150)(RECORDED.read_text())
    last = text.rstrip("\n").split("\n")[-1].strip()
    # the cause says where the log stopped (harness.evidence.logs.run_end), then that no error is in it
    assert _diagnosis(text) == ("log-ends-early", "stopped at iteration 150 of 200, with no error in the log: the run "
                                "was stopped (--exit-interval), killed, or the log was cut", STOPPED_REMEDY, last)
    started = "\n".join(text.split("\n")[:40]) + "\n"   # the arguments block, cut before any iteration line
    cut_at = started.rstrip("\n").split("\n")[-1].strip()
    assert _diagnosis(started)[:2] == ("log-ends-early", "stopped before training started, while printing its "
                                       f"arguments (last line: {cut_at}), with no error in the log: the run was "
                                       "stopped (--exit-interval), killed, or the log was cut")


@pytest.mark.parametrize("text", ["", "\n \n\t\n"])
def test_an_empty_log_is_named_empty(text):
    assert _diagnosis(text) == ("log-empty", "the log is empty: none of the run's output reached it",
                                "submit the file the run's output went to (e.g. `bash train.sh 2>&1 | tee train.log`)",
                                "(empty)")


@pytest.mark.parametrize("text", ["setting up\n", "".join(map(chr, range(32, 127))) * 50,
                                  bytes(range(256)).decode("latin-1") * 20])
def test_a_file_with_no_line_of_a_training_run_is_not_a_training_log(text):
    """A shell history, a README, random bytes: no Megatron-LM line at all, and no Python error in it."""
    found = _diagnosis(text)
    assert found[0] == "not-a-training-log" and "none of the lines a Megatron-LM training run prints" in found[1], found


def test_a_log_stopping_after_an_unknown_error_names_the_error():
    text = mutants.stopped_at(150)(RECORDED.read_text()) + "Traceback (most recent call last):\nValueError: odd\n"
    assert _diagnosis(text) == ("crashed", "the log stops at iteration 150 of 200 after an error its log names no "
                                "known cause for: ValueError: odd", "read the traceback that ends with that line in "
                                "the log", "ValueError: odd")


def test_the_crash_and_timeout_texts():
    text = RECORDED.read_text()
    last = [line.strip() for line in text.splitlines() if line.strip()][-1]
    assert _diagnosis(text, exit_code=1) == (
        "crashed", f"the run exited with code 1 and its log names no known cause; last line: {last}",
        "read the traceback at the end of the log", last)
    assert _diagnosis(text, timed_out=True)[1] == (f"stage 'train' hung (timed out) after an unknown time with no "
                                                   f"known cause; last line: {last}")


@pytest.mark.parametrize("fixture, cause_id", [("cuda-oom.log", "cuda-oom"), ("one-sentence-docs.log",
                                                                            "one-sentence-docs")])
def test_a_recorded_log_gets_the_rule_its_text_matches(fixture, cause_id):
    """A recorded log that stops while BERT's datasets are built is a hang there (stalled), not a cut log."""
    text = (FIXTURES / "diagnoses" / fixture).read_text()
    assert _diagnosis(text)[0] == cause_id


def test_a_run_without_any_log_ends_early_with_no_output():
    cause = criteria.root_cause(RunEvidence(run_dir="/r"))
    assert (cause.cause_id, cause.evidence) == ("log-ends-early", "(no output)")
