"""The grader's own texts and names, exactly: the folder under OUT for any submission name, the name shown for
undecodable bytes, the grade of a submission that was not judged (refused, no log, grader error, interrupted),
the error grade's one-line reason, why a folder is refused, which sub-folders are graded, and the summary line
with its exit code. (Written against the mutation run's survivors in harness.grade; test_grade_untrusted.py runs
the grader end to end, test_gradebook_readback.py reads its files back.)"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from harness import grade
from harness.judge import criteria


def _digest(name: str) -> str:
    return hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:10]


@pytest.mark.parametrize("name, slot", [
    ("alice", "alice"), ("Alice.v2-1_x", "Alice.v2-1_x"),
    ("a b", f"a_b-{_digest('a b')}"), ("é", f"_-{_digest('é')}"), ("\udcff", f"_-{_digest(chr(0xdcff))}"),
    (".hidden", f"hidden-{_digest('.hidden')}"), ("...", f"submission-{_digest('...')}"),
    ("x.", "x."), ("a" * 80, "a" * 80), ("a" * 81, f"{'a' * 80}-{_digest('a' * 81)}"),
])
def test_slot_names_are_plain_unique_and_never_hidden(name, slot):
    assert grade.slot_name(name) == slot


def test_display_names_replace_undecodable_bytes():
    assert grade.display_name("a\udcffb") == "a\ufffdb"
    assert grade.display_name("é☃") == "é☃"


def _task(name: str = "bob", index: int = 0, out: str = "/out") -> grade.Task:
    return grade.Task(index, f"/dir/{name}", name, grade.slot_name(name), out, "reference")


def test_a_grade_without_criteria_is_complete_and_says_why():
    assert grade._not_judged(_task(), "fail", "no-log", "no *.log in the folder", save="/dir/bob/ckpt") == {
        "submission": "bob", "log": None, "save_dir": "/dir/bob/ckpt", "verdict": "fail", "failed": ["submission"],
        "not_measured": [], "recipe": None, "recipe_detected_by": None,
        "diagnosis": "no-log: no *.log in the folder", "diagnosis_id": "no-log",
        "diagnosis_cause": "no *.log in the folder", "criteria": [], "loss_curve": None}
    error = grade._not_judged(_task(), "error", "grader-error", "grader-error: already prefixed", log="/dir/bob/x.log")
    assert (error["failed"], error["diagnosis"], error["log"]) == ([], "grader-error: already prefixed",
                                                                     "/dir/bob/x.log")


def test_the_error_grade_names_the_exception_on_one_line():
    long = "x" * 400
    g = grade.error_grade(_task(), ValueError(f"  first line\nsecond line  "))
    assert g["verdict"] == "error" and g["diagnosis_id"] == "grader-error"
    assert g["diagnosis_cause"] == grade.MSG_ERROR.format(error="ValueError: first line")
    assert grade.error_grade(_task(), RuntimeError(long))["diagnosis_cause"] == grade.MSG_ERROR.format(
        error="RuntimeError: " + "x" * 300)
    assert grade.error_grade(_task(), KeyError())["diagnosis_cause"] == grade.MSG_ERROR.format(error="KeyError")
    assert grade.error_grade(_task(), OSError("bad\x1b[2Jname"))["diagnosis_cause"] == grade.MSG_ERROR.format(
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
    (root / "old" / grade.MARKER).write_text("{}")
    (root / "link").symlink_to(root / "old")
    folders, skipped = grade.submission_folders(root, root / "grades")
    assert [p.name for p in folders] == ["a", "b", "link"]
    assert skipped == [("old", f"an earlier run's grades folder ({grade.MARKER} in it)")]


def test_jobs_default_to_the_usable_cores():
    assert grade._jobs(3) == 3 and grade._jobs(0) == len(os.sched_getaffinity(0))


def _batch(tmp_path, verdicts: dict, skipped=()) -> grade.Batch:
    tasks = [_task(name, i, str(tmp_path)) for i, name in enumerate(verdicts)]
    batch = grade.Batch(tasks, tmp_path, criteria.load_profile("reference"), list(skipped))
    for t, verdict in zip(tasks, verdicts.values()):
        if verdict is not None:
            batch.grades[t.index] = {"submission": t.name, "verdict": verdict}
    return batch


def test_not_graded_submissions_are_incomplete_in_dir_order(tmp_path):
    batch = _batch(tmp_path, {"a": "pass", "b": None})
    assert batch.ordered() == [{"submission": "a", "verdict": "pass"},
                               grade._not_judged(batch.tasks[1], "incomplete", "incomplete", grade.MSG_INCOMPLETE)]


@pytest.mark.parametrize("verdicts, interrupted, code, tail", [
    ({"a": "pass", "b": "pass"}, False, grade.EXIT_PASSED, ""),
    ({"a": "pass", "b": "fail"}, False, grade.EXIT_FAILED, "; failed: b"),
    ({"a": "error", "b": "fail"}, False, grade.EXIT_GRADER_ERROR, "; failed: b; grader error: a"),
    ({"a": "error", "b": None}, True, grade.EXIT_INTERRUPTED, "; grader error: a; not graded (interrupted): b"),
])
def test_the_summary_line_and_exit_code(tmp_path, capsys, verdicts, interrupted, code, tail):
    batch = _batch(tmp_path, verdicts, skipped=[("old", "an earlier run's grades")])
    assert grade._summary(batch, tmp_path, interrupted) == code
    passed = sum(v == "pass" for v in verdicts.values())
    assert capsys.readouterr().out == (f"{passed} of {len(verdicts)} submissions passed; grades in "
                                       f"{tmp_path}/grades.md{tail}; not a submission: old (an earlier run's grades)\n")


def test_the_summary_names_fifty_and_counts_the_rest(tmp_path, capsys):
    names = [f"s{i:02d}" for i in range(53)]
    batch = _batch(tmp_path, {n: "fail" for n in names})
    assert grade._summary(batch, Path("/o"), False) == grade.EXIT_FAILED
    assert capsys.readouterr().out == (f"0 of 53 submissions passed; grades in /o/grades.md; failed: "
                                       f"{', '.join(names[:50])} and 3 more\n")
