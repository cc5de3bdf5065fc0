"""The one grade record (harness.judge.grade_record.Grade): every shape a grade has (judged, not judged, a copy,
grade-checkouts' task) written with the keys, order and values the grade files have always had, read back to the
same record, and every writer giving the same bytes for the records as for their dicts."""

from __future__ import annotations

import json

import pytest

from harness.cli import grade as grader
from harness.judge import copies
from harness.judge.grade_record import ABSENT, CriterionEntry, Grade, GradeFormatError
from harness.judge.profiles import FAIL, NOT_MEASURABLE, load_profile
from harness.judge.submission import judge_submission
from harness.base.paths import RECORDED_LOGS
from harness.evidence import mutants
from harness.report import gradebook

RECORDED = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"


def _judged(tmp_path, text: str, name: str = "alice"):
    log = tmp_path / name / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text(text)
    return log, judge_submission(load_profile("reference"), log)


def _legacy_judged(name, log, j, picture) -> dict:
    """grade_one's dict as it was written by hand before the record (806a9d1)."""
    return {"submission": name, "log": str(log), "save_dir": None, "verdict": j.verdict, "failed": j.ids(FAIL),
            "not_measured": j.ids(NOT_MEASURABLE), "recipe": j.recipe, "recipe_detected_by": j.recipe_how,
            "provenance": list(j.provenance),
            "diagnosis": j.diagnosis.summary() if j.diagnosis else None,
            "diagnosis_id": j.diagnosis.cause_id if j.diagnosis else None,
            "diagnosis_cause": j.diagnosis.cause if j.diagnosis else None,
            "criteria": [{"id": v.criterion_id, "status": v.status, "measured": v.measured, "expected": v.expected,
                          "where": v.where, "consequence_of": v.consequence_of, "message": v.message}
                         for v in j.verdicts],
            "loss_curve": picture}


@pytest.mark.parametrize("text", [RECORDED.read_text(), mutants.stopped_at(150)(RECORDED.read_text())])
def test_a_judged_grade_is_written_as_it_always_was(tmp_path, text):
    log, j = _judged(tmp_path, text)
    g = Grade.judged("alice", log, None, j, "submissions/alice/loss-curve.png")
    legacy = _legacy_judged("alice", log, j, "submissions/alice/loss-curve.png")
    assert json.dumps(g.to_dict(), indent=2) == json.dumps(legacy, indent=2)    # keys, order and values
    assert g.json_text == json.dumps(legacy, indent=2) + "\n"
    assert Grade.from_dict(json.loads(g.json_text)) == g


def test_a_grade_without_criteria_and_the_skipped_rows_are_written_as_they_always_were():
    g = Grade.not_judged("bob", "fail", "no-log", "no *.log", save="/d/bob/ckpt")
    assert json.dumps(g.to_dict()) == json.dumps({
        "submission": "bob", "log": None, "save_dir": "/d/bob/ckpt", "verdict": "fail", "failed": ["submission"],
        "not_measured": [], "recipe": None, "recipe_detected_by": None, "diagnosis": "no-log: no *.log",
        "diagnosis_id": "no-log", "diagnosis_cause": "no *.log", "criteria": [], "loss_curve": None})
    e = Grade.not_judged("bob", "error", "grader-error", "grader-error: said", log="/d/bob/x.log")
    assert (e.failed, e.diagnosis, e.log) == ((), "grader-error: said", "/d/bob/x.log")
    assert Grade.from_dict(g.to_dict()) == g and Grade.from_dict(e.to_dict()) == e


def test_a_grade_checkouts_grade_keeps_its_checkout_task_and_labels():
    entry = CriterionEntry("final-loss", FAIL, "9.1", "6-7", "", None, "FAIL ...", label="final loss")
    g = Grade("eve", checkout="/c/eve", task={"host": "n1", "returncode": 0}, criteria=(entry,), failed=("final-loss",))
    d = g.to_dict()
    assert list(d) == ["submission", "log", "save_dir", "checkout", "verdict", "failed", "not_measured", "recipe",
                       "recipe_detected_by", "diagnosis", "diagnosis_id", "diagnosis_cause", "criteria", "loss_curve",
                       "task"]
    assert list(d["criteria"][0]) == ["id", "label", "status", "measured", "expected", "where", "consequence_of",
                                      "message"]
    assert Grade.from_dict(d) == g
    assert Grade("x", checkout=None).to_dict()["checkout"] is None           # None is written; ABSENT is not
    assert "checkout" not in Grade("x").to_dict() and Grade("x").checkout is ABSENT


def test_a_copy_is_added_to_the_grade_as_copy_detection_always_added_it(tmp_path):
    log, j = _judged(tmp_path, RECORDED.read_text())
    g = Grade.judged("alice", log, None, j, None)
    v = copies.verdict("alice", [("bob", "identical timestamps at 21/21 iteration lines")], str(log))
    c = g.with_copy(v)
    legacy = g.to_dict()                                                  # copies.annotate's edits, as they were
    legacy["criteria"] = [*legacy["criteria"], {"id": v.criterion_id, "status": v.status, "measured": v.measured,
                                                "expected": v.expected, "where": v.where, "consequence_of": None,
                                                "message": v.message}]
    legacy["failed"] = [*legacy["failed"], copies.CHECK_ID]
    legacy["verdict"] = "fail"
    legacy["diagnosis_id"], legacy["diagnosis_cause"] = copies.CHECK_ID, v.measured
    legacy["diagnosis"] = f"{copies.CHECK_ID}: {v.measured}"
    assert g.verdict == "pass" and json.dumps(c.to_dict()) == json.dumps(legacy)
    earlier = Grade.not_judged("x", "error", "grader-error", "boom").with_copy(v)
    assert earlier.verdict == "error" and earlier.diagnosis == f"log-copy: {v.measured} (and the log's own: grader-error: boom)"
    assert g.json_text != c.json_text                                    # each record its own text


@pytest.mark.parametrize("bad, why", [
    ([], "not an object"), ({"verdict": "pass"}, "submission"), ({"submission": "x"}, "verdict"),
    ({"submission": "x", "verdict": "pass", "extra": 1}, "unknown key"),
    ({"submission": "x", "verdict": "pass", "failed": "a"}, "failed"),
    ({"submission": "x", "verdict": "pass", "log": 3}, "log"),
    ({"submission": "x", "verdict": "pass", "criteria": [{"id": "a"}]}, "criterion"),
    ({"submission": "x", "verdict": "pass", "task": []}, "task"),
])
def test_what_is_not_a_grade_is_refused_naming_why(bad, why):
    with pytest.raises(GradeFormatError, match=why):
        Grade.from_dict(bad)


def test_every_writer_gives_the_same_bytes_for_records_and_their_dicts(tmp_path):
    log, j = _judged(tmp_path, mutants.nan_at(120)(RECORDED.read_text()))
    records = [Grade.judged("a|b\x1b", log, None, j, "submissions/a/loss-curve.png"),
               Grade.not_judged("=cmd", "fail", "refused", "refused: a link"),
               Grade.not_judged("c", "incomplete", "incomplete", grader.MSG_INCOMPLETE),
               Grade.not_judged("d", "error", "grader-limit", "not judged: over")]
    dicts = [g.to_dict() for g in records]
    assert gradebook.to_json(records) == json.dumps(dicts, indent=2) + "\n" == gradebook.to_json(dicts)
    assert gradebook.to_json([]) == json.dumps([], indent=2) + "\n"
    assert gradebook.markdown(records, "reference", True, [("x", "why")]) == gradebook.markdown(dicts, "reference", True,
                                                                                                [("x", "why")])
    ids = load_profile("reference").ids
    assert gradebook.csv_text(records, ids) == gradebook.csv_text(dicts, ids)
    assert gradebook.junit_bytes(records, "reference") == gradebook.junit_bytes(dicts, "reference")
    assert [Grade.from_dict(d) for d in json.loads(gradebook.to_json(records))] == records
