"""The grader's own texts and names, exactly: the folder under OUT for any submission name, the name shown for
undecodable bytes, the grade of a submission that was not judged (refused, no log, grader error, interrupted),
the error grade's one-line reason, why a folder is refused, which sub-folders are graded, and the summary line
with its exit code. (Written against the mutation run's survivors in harness.cli.grade; test_grade_untrusted.py runs
the grader end to end, test_gradebook_readback.py reads its files back.)"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from harness.cli import grade, grade_out
from harness.judge.grade_record import Grade
from harness.evidence import mutants
from harness.base.paths import RECORDED_LOGS
from harness.judge.profiles import FAIL, NOT_MEASURABLE, load_profile

RECORDED = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"


def _digest(name: str) -> str:
    return hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:10]


@pytest.mark.parametrize("name, slot", [
    ("alice", "alice"), ("Alice.v2-1_x", "Alice.v2-1_x"),
    ("a b", f"a_b-{_digest('a b')}"), ("é", f"_-{_digest('é')}"), ("\udcff", f"_-{_digest(chr(0xdcff))}"),
    (".hidden", f"hidden-{_digest('.hidden')}"), ("...", f"submission-{_digest('...')}"),
    ("x.", "x."), ("a" * 80, "a" * 80), ("a" * 81, f"{'a' * 80}-{_digest('a' * 81)}"),
    ("X.y z", f"X.y_z-{_digest('X.y z')}"),
])
def test_slot_names_are_plain_unique_and_never_hidden(name, slot):
    assert grade.slot_name(name) == slot


def test_display_names_replace_undecodable_bytes():
    assert grade.display_name("a\udcffb") == "a\\xffb"      # the byte, escaped as every writer shows it
    assert grade.display_name("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert grade.display_name("é☃") == "é☃"


def _task(name: str = "bob", index: int = 0, out: str = "/out") -> grade.Task:
    return grade.Task(index, f"/dir/{name}", name, grade.slot_name(name), out, "reference")


def test_a_grade_without_criteria_is_complete_and_says_why():
    assert grade._not_judged(_task(), "fail", "no-log", "no *.log in the folder", save="/dir/bob/ckpt").to_dict() == {
        "submission": "bob", "log": None, "save_dir": "/dir/bob/ckpt", "verdict": "fail", "failed": ["submission"],
        "not_measured": [], "recipe": None, "recipe_detected_by": None,
        "diagnosis": "no-log: no *.log in the folder", "diagnosis_id": "no-log",
        "diagnosis_cause": "no *.log in the folder", "criteria": [], "loss_curve": None}
    error = grade._not_judged(_task(), "error", "grader-error", "grader-error: already prefixed", log="/dir/bob/x.log")
    assert (error.failed, error.diagnosis, error.log) == ((), "grader-error: already prefixed", "/dir/bob/x.log")


def test_the_error_grade_names_the_exception_on_one_line():
    long = "x" * 400
    g = grade.error_grade(_task(), ValueError("  first line\nsecond line  "))
    assert g.verdict == "error" and g.diagnosis_id == "grader-error"
    assert g.diagnosis_cause == grade.MSG_ERROR.format(error="ValueError: first line")
    assert grade.error_grade(_task(), RuntimeError(long)).diagnosis_cause == grade.MSG_ERROR.format(
        error="RuntimeError: " + "x" * 300)
    assert grade.error_grade(_task(), KeyError()).diagnosis_cause == grade.MSG_ERROR.format(error="KeyError")
    assert grade.error_grade(_task(), OSError("bad\x1b[2Jname")).diagnosis_cause == grade.MSG_ERROR.format(
        error="OSError: bad\\x1b[2Jname")


def test_refusals_name_the_link_and_where_it_leads(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.log").write_text("x\n")
    assert grade.refusal(tmp_path / "real") is None
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert grade.refusal(tmp_path / "alias") == grade.MSG_FOLDER_SYMLINK.format(target=str(tmp_path / "real"))
    (tmp_path / "real" / "sub").mkdir()
    (tmp_path / "real" / "sub" / "secret.log").symlink_to("/etc/pass\x1bwd")
    assert grade.refusal(tmp_path / "real") == grade.MSG_SYMLINK_OUT.format(link="sub/secret.log",
                                                                           target="/etc/pass\\x1bwd")


def test_only_plain_visible_sub_folders_are_graded(tmp_path):
    root = tmp_path / "dir"
    for name in ("b", "a", ".hidden", "old", "grades"):
        (root / name).mkdir(parents=True)
    (root / "notes.txt").write_text("x")
    (root / "old" / grade_out.MARKER).write_text("{}")
    (root / "link").symlink_to(root / "old")
    folders, skipped = grade.submission_folders(root, root / "grades")
    # `grades` has no grader's marker: a student's folder, kept here so that giving it as --out is refused (exit 4)
    assert [p.name for p in folders] == ["a", "b", "grades", "link"]
    (root / "grades" / grade_out.MARKER).write_text("{}")            # the grader's own OUT is passed over
    assert [p.name for p in grade.submission_folders(root, root / "grades")[0]] == ["a", "b", "link"]
    # every entry not graded is reported with its reason (issue 31: none is skipped silently)
    assert [name for name, _ in skipped] == [".hidden", "notes.txt", "old"]
    assert skipped[2] == ("old", f"an earlier run's grades folder ({grade_out.MARKER} in it)")
    assert "hidden" in skipped[0][1] and "a file, not a folder" in skipped[1][1]


def test_jobs_default_to_the_usable_cores(monkeypatch):
    assert grade._jobs(3) == 3 and grade._jobs(1) == 1 and grade._jobs(0) == len(os.sched_getaffinity(0))
    monkeypatch.delattr(os, "sched_getaffinity")              # not Linux: the CPU count, else 1
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert grade._jobs(0) == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert grade._jobs(0) == 1


def _batch(tmp_path, verdicts: dict, skipped=()) -> grade.Batch:
    tasks = [_task(name, i, str(tmp_path)) for i, name in enumerate(verdicts)]
    batch = grade.Batch(tasks, tmp_path, load_profile("reference"), list(skipped))
    for t, verdict in zip(tasks, verdicts.values()):
        if verdict is not None:
            batch.grades[t.index] = Grade(t.name, verdict=verdict)
    return batch


def test_not_graded_submissions_are_incomplete_in_dir_order(tmp_path):
    batch = _batch(tmp_path, {"a": "pass", "b": None})
    assert batch.ordered() == [Grade("a", verdict="pass"),
                               grade._not_judged(batch.tasks[1], "incomplete", "incomplete", grade.MSG_INCOMPLETE)]


@pytest.mark.parametrize("verdicts, interrupted, code, tail", [
    ({"a": "pass", "b": "pass"}, False, grade.EXIT_FAILED, ""),      # an entry not graded: never exit 0
    ({"a": "pass", "b": "fail"}, False, grade.EXIT_FAILED, "; failed: b"),
    ({"a": "error", "b": "fail"}, False, grade.EXIT_GRADER_ERROR, "; failed: b; grader error: a"),
    ({"a": "error", "b": None}, True, grade.EXIT_INTERRUPTED, "; grader error: a; not graded (interrupted): b"),
])
def test_the_summary_line_and_exit_code(tmp_path, capsys, verdicts, interrupted, code, tail):
    batch = _batch(tmp_path, verdicts, skipped=[("old", "an earlier run's grades")])
    assert grade._summary(batch, tmp_path, interrupted) == code
    passed = sum(v == "pass" for v in verdicts.values())
    assert capsys.readouterr().out == (f"{passed} of {len(verdicts)} submissions passed; grades in "
                                       f"{tmp_path}/grades.md{tail}; not graded: old (an earlier run's grades)\n")


@pytest.mark.parametrize("count, more", [(50, ""), (51, " and 1 more"), (53, " and 3 more")])
def test_the_summary_names_fifty_and_counts_the_rest(tmp_path, capsys, count, more):
    names = [f"s{i:02d}" for i in range(count)]
    batch = _batch(tmp_path, {n: "fail" for n in names})
    assert grade._summary(batch, Path("/o"), False) == grade.EXIT_FAILED
    assert capsys.readouterr().out == (f"0 of {count} submissions passed; grades in /o/grades.md; failed: "
                                       f"{', '.join(names[:50])}{more}\n")


class _Painter:
    """Records what grade_one asks to draw."""

    def __init__(self):
        self.calls = []

    def png(self, log, golden=None, title="", verdict=None, cause=None, warmup=None):
        self.calls.append((log, golden, title, verdict))     # the cause and the warm-up window: test_plot_marks
        return b"\x89PNG fake"


def test_grade_one_writes_every_field_of_a_judged_submission(tmp_path, monkeypatch):
    from harness.judge.submission import evidence, find_submission, judge_recorded

    painter = _Painter()
    monkeypatch.setattr(grade, "_painter", lambda: painter)
    folder = tmp_path / "dir" / "alice"
    folder.mkdir(parents=True)
    (folder / "train.log").write_text(mutants.stopped_at(150)(RECORDED.read_text()))
    out = tmp_path / "out"
    out.mkdir()                                                # prepare_out made it
    g = grade.grade_safely(grade.Task(0, str(folder), "alice", "alice", str(out), "reference")).to_dict()
    profile = load_profile("reference")
    sub = find_submission(folder)
    ev = evidence(sub.logs, sub.save_dir)
    j = judge_recorded(profile, ev)
    assert j.diagnosis.cause_id == "log-ends-early" and j.recipe == "a"
    assert g == {
        "submission": "alice", "log": str(folder / "train.log"), "save_dir": None, "verdict": "fail",
        "failed": j.ids(FAIL), "not_measured": j.ids(NOT_MEASURABLE), "recipe": "a",
        "recipe_detected_by": j.recipe_how, "provenance": list(j.provenance), "diagnosis": j.diagnosis.summary(),
        "diagnosis_id": "log-ends-early", "diagnosis_cause": j.diagnosis.cause,
        "criteria": [{"id": v.criterion_id, "status": v.status, "measured": v.measured, "expected": v.expected,
                      "where": v.where, "consequence_of": v.consequence_of, "message": v.message} for v in j.verdicts],
        "loss_curve": "submissions/alice/loss-curve.png"}
    assert (out / "submissions" / "alice" / "loss-curve.png").read_bytes() == b"\x89PNG fake"
    assert (out / "submissions" / "alice" / "grade.json").read_text() == json.dumps(g, indent=2) + "\n"
    assert painter.calls == [(ev.log, profile.for_recipe("a").golden, "alice (recipe a)", "fail")]


def test_grade_one_of_a_passing_log_without_a_picture(tmp_path, monkeypatch):
    painter = _Painter()
    painter.png = lambda *args: painter.calls.append(args)     # nothing to draw: None
    monkeypatch.setattr(grade, "_painter", lambda: painter)
    folder = tmp_path / "bob"
    folder.mkdir()
    (folder / "train.log").write_text(RECORDED.read_text())
    (tmp_path / "out").mkdir()
    g = grade.grade_safely(grade.Task(0, str(folder), "bob", "bob", str(tmp_path / "out"), "reference")).to_dict()
    assert (g["verdict"], g["diagnosis"], g["diagnosis_id"], g["diagnosis_cause"], g["loss_curve"]) == (
        "pass", None, None, None, None)
    assert painter.calls[0][2:4] == ("bob (recipe a)", "pass")
    assert not (tmp_path / "out" / "submissions" / "bob" / "loss-curve.png").exists()


def test_grades_of_refused_empty_and_failing_submissions(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    refused = tmp_path / "carol"
    refused.mkdir()
    (refused / "train.log").symlink_to("/etc/hostname")
    task = grade.Task(0, str(refused), "carol", "carol", str(out), "reference")
    assert grade.grade_safely(task) == grade._not_judged(task, "fail", "refused", grade.refusal(refused))
    empty = tmp_path / "dave"
    (empty / "ckpt").mkdir(parents=True)
    (empty / "ckpt" / "latest_checkpointed_iteration.txt").write_text("200")
    task = grade.Task(1, str(empty), "dave", "dave", str(out), "reference")
    g = grade.grade_safely(task)
    assert g == grade._not_judged(task, "fail", "no-log", f"no training log (*.log) in {empty}",
                                  save=str(empty / "ckpt"))

    def boom(task):
        raise ValueError("bad\nlog")

    monkeypatch.setattr(grade, "judge_one", boom)
    task = grade.Task(2, str(empty), "erin", "erin", str(out), "reference")
    g = grade.grade_safely(task)
    assert g == grade.error_grade(task, ValueError("bad"))
    assert (out / "submissions" / "erin" / "grade.json").read_text() == json.dumps(g.to_dict(), indent=2) + "\n"
    (out / "submissions" / "frank").write_text("a file where the grader's folder goes")
    task = grade.Task(3, str(empty), "frank", "frank", str(out), "reference")
    g = grade.grade_safely(task)
    assert g.verdict == "error" and g.diagnosis_cause.startswith(
        "the grader failed on this submission (FileExistsError: "), g


def test_grade_one_passes_the_save_folder_and_the_recipes_golden(tmp_path, monkeypatch):
    """recipe b's golden goes to the picture, an unknown recipe is '?', and the --save folder is inspected."""
    painter = _Painter()
    monkeypatch.setattr(grade, "_painter", lambda: painter)
    out = tmp_path / "out"
    out.mkdir()
    b = tmp_path / "b"
    (b / "ckpt").mkdir(parents=True)
    (b / "train.log").write_text((RECORDED_LOGS / "reference_trainer_h200_recipe_b_seed1234.log").read_text())
    (b / "ckpt" / "latest_checkpointed_iteration.txt").write_text("200")
    g = grade.grade_safely(grade.Task(0, str(b), "b", "b", str(out), "reference")).to_dict()
    assert g["save_dir"] == str(b / "ckpt") and g["recipe"] == "b"
    tracker = next(c for c in g["criteria"] if c["id"] == "checkpoint-tracker")
    assert (tracker["status"], tracker["where"]) == (FAIL, str(b / "ckpt"))   # inspected: no iter_ folder
    assert painter.calls[-1][1:3] == (load_profile("reference").for_recipe("b").golden, "b (recipe b)")
    odd = tmp_path / "odd"
    odd.mkdir()
    text = RECORDED.read_text()
    assert text.count("  bert_binary_head ................................ True") == 1
    (odd / "train.log").write_text(text.replace("  bert_binary_head ................................ True",
                                                "  bert_binary_head ................................ 7"))
    g = grade.grade_safely(grade.Task(1, str(odd), "odd", "odd", str(out), "reference"))
    assert g.recipe is None and painter.calls[-1][2] == "odd (recipe ?)"
