"""`python -m harness.judge.criteria` exactly: what `check` prints for each verdict and its exit code, the golden
file `golden` writes (indent, provenance, band rule from its options and their defaults), the usage errors and
the help; a verdict's message (the pass line, the last log lines read from the file, no lines, whose remedy);
evidence read from a log file; judging with some kinds excluded; compute_band's absolute floor and its error.
(Written against the mutation run's survivors in harness.judge.criteria and harness.judge.bands.)"""

from __future__ import annotations

import json

import pytest

from harness.judge import bands, criteria, mutants
from harness.judge.criteria import FAIL, NOT_MEASURABLE, PASS
from harness.judge.diagnose import Diagnosis
from harness.judge.evidence import RunEvidence
from harness.judge.kinds import Outcome
from harness.paths import RECORDED_LOGS

RECORDED = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
RECIPE_B = RECORDED_LOGS / "reference_trainer_h200_recipe_b_seed1234.log"


def _printed(verdicts) -> str:
    """check's output: a passing verdict's line, a failing or unmeasured one's block and an empty line after it."""
    return "".join(v.message + "\n" if v.status == PASS else v.message + "\n\n" for v in verdicts)


def test_check_prints_every_verdict_and_exits_1_on_a_failure(tmp_path, capsys):
    log = tmp_path / "stopped.log"
    log.write_text(mutants.stopped_at(150)(RECORDED.read_text()))
    assert criteria.main(["check", "--log", str(log)]) == 1        # the reference profile by default
    verdicts = criteria.evaluate(criteria.load_profile("reference"), criteria.evidence_from_log_file(log))
    assert {v.status for v in verdicts} >= {PASS, FAIL}
    assert capsys.readouterr().out == _printed(verdicts)


def test_check_of_a_passing_log_exits_0(capsys):
    assert criteria.main(["check", "--profile", "megatron-lm", "--log", str(RECORDED)]) == 0
    verdicts = criteria.evaluate(criteria.load_profile("megatron-lm"), criteria.evidence_from_log_file(RECORDED))
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
    assert err.startswith("usage: python -m harness.judge.criteria") and error in err, err


def test_help_names_the_commands_and_options(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        criteria.main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m harness.judge.criteria [-h] {check,golden} ...")
    assert "    check         judge a training log with a criteria profile\n" in out
    assert "    golden        compute a golden-values file (bands from the spread of runs)\n" in out
    with pytest.raises(SystemExit):
        criteria.main(["golden", "--help"])
    out = capsys.readouterr().out
    assert "--provenance PROVENANCE\n" in out and "JSON object: gpu, versions, date, seeds, ..." in out
    assert "--k K                 tolerance = max(k * std, floor)\n" in out
    with pytest.raises(SystemExit):
        criteria.main(["check", "--help"])
    assert "usage: python -m harness.judge.criteria check [-h] [--profile PROFILE] --log LOG" in capsys.readouterr().out


def test_evidence_from_a_log_file_names_its_folder_and_path(tmp_path):
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text(RECORDED.read_text())
    ev = criteria.evidence_from_log_file(log)
    assert ev.run_dir == str(tmp_path / "run") and ev.log_path == str(log)
    assert ev.log.lines_total == criteria.logs.parse_log_file(RECORDED).lines_total and ev.log.iterations


def test_excluded_kinds_are_not_judged():
    profile = criteria.load_profile("reference")
    ev = criteria.evidence_from_log_file(RECORDED)
    ids = [v.criterion_id for v in criteria.evaluate(profile, ev, exclude={"resume_matches", "cuda_graph_used"})]
    assert ids == [i for i in profile.ids if i not in ("resume-matches", "cuda-graph")]


def test_compute_band_absolute_floor_and_its_error():
    assert bands.compute_band([0.0, 0.0], rel_tol_floor=0.1, abs_floor=5.0) == bands.Band(mean=0.0, std=0.0, tol=5.0,
                                                                                          n=2)
    with pytest.raises(ValueError, match="^compute_band needs at least one sample$"):
        bands.compute_band([], 0.02)


def _criterion() -> criteria.Criterion:
    return criteria.load_profile("reference").by_id("final-loss")


def test_a_pass_is_one_line_with_id_measured_and_expected():
    c = _criterion()
    ev = RunEvidence(run_dir="/runs/t")
    assert criteria.render_message(c, Outcome(PASS, "8.1000 at iteration 200", "in [7.5, 8.8]", "iteration 200"),
                                   ev) == f"PASS: {c.label} [final-loss]: measured 8.1000 at iteration 200; expected in [7.5, 8.8]"


def test_the_message_tails_the_log_file_when_no_lines_were_parsed(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("".join(f"line {i} of the log\n" for i in range(15)))
    c = _criterion()
    text = criteria.render_message(c, Outcome(FAIL, "m", "e", "w"), RunEvidence(run_dir="/runs/t", log_path=str(path)))
    tail = [f"    | line {i} of the log" for i in range(6, 15)] + ["    | "]      # the file ends with a newline
    assert text.split("\n")[5:17] == ["  last log lines:", *tail, f"  remedy:    {c.remedy}"]
    none = criteria.render_message(c, Outcome(NOT_MEASURABLE, "m", "e", "w"), RunEvidence(run_dir="/runs/t"))
    assert "  last log lines:\n    (no log lines)\n  remedy:" in none


def test_only_a_failure_for_missing_evidence_after_a_root_cause_has_no_remedy_of_its_own():
    c, ev = _criterion(), RunEvidence(run_dir="/runs/t")
    cause = Diagnosis("cuda-oom", "out of memory", "lower the batch", "CUDA out of memory")
    missing = Outcome(FAIL, "m", "e", "w", missing=True)
    present = Outcome(FAIL, "m", "e", "w")
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
