"""Every field of the Gradescope writer's results.json read back with its documented meaning.

Gradescope's autograder format (https://gradescope-autograders.readthedocs.io/en/latest/specs/): top level `score`
(the submission's points), `execution_time` (seconds), `output` (text shown above the tests), `visibility` (who sees
the results: hidden | after_due_date | after_published | visible), `stdout_visibility` (who sees the autograder's
stdout, same values; the suite's tracebacks go there), `tests`: each with `name`, `number`, `score`, `max_score`,
`status` (passed | failed), `output`, `visibility`, `tags`. The weights file sets `total`, `visibility`,
`stdout_visibility` and the points (docs/gradescope.md). Each test below uses values that differ from the defaults
and from each other, so two fields swapped, a default kept or a value dropped shows.
"""

from __future__ import annotations

import itertools
import json
import types
from pathlib import Path

import pytest

from harness.cli import gradescope
from harness.base.paths import RECORDED_LOGS
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, Profile, load_profile

GOOD_LOG = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
VISIBILITY = ("hidden", "after_due_date", "after_published", "visible")


def weights_file(tmp_path: Path, profile: Profile, visibility: str | None, stdout: str | None,
                 total: float | None = 37, points=None) -> Path:
    """A weights TOML with the given visibilities (None: key left out), and distinct points per criterion."""
    points = points or {cid: i + 1 for i, cid in enumerate(profile.ids)}
    lines = [] if total is None else [f"total = {total}"]
    lines += [f'visibility = "{visibility}"'] if visibility else []
    lines += [f'stdout_visibility = "{stdout}"'] if stdout else []
    lines += ["[points]"] + [f'"{cid}" = {p}' for cid, p in points.items()]
    path = tmp_path / f"w-{visibility}-{stdout}-{total}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def synthetic_grade(profile: Profile, statuses: dict, diagnosis_id: str | None = None) -> dict:
    """A grade in harness.cli.grade.grade_one's shape: one criterion entry per id, with its own measured/expected."""
    crits = []
    for cid in profile.ids:
        status = statuses.get(cid, PASS)
        crits.append({"id": cid, "label": f"Label of {cid}", "status": status, "measured": f"measured-{cid}",
                      "expected": f"expected-{cid}", "where": f"line {len(cid)}", "consequence_of": None,
                      "message": f"{status.upper()}: Label of {cid} [{cid}] msg-{cid}"})
    grade = {"submission": "stu", "criteria": crits, "recipe": "recipe-b", "diagnosis": None, "diagnosis_id": None,
             "diagnosis_cause": None}
    if diagnosis_id:
        grade.update(diagnosis=f"cause text: fix text", diagnosis_id=diagnosis_id, diagnosis_cause="cause text")
    return grade


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile("reference")


@pytest.mark.parametrize("visibility,stdout", [p for p in itertools.permutations(VISIBILITY, 2)])
def test_visibilities_from_the_weights_file_land_in_their_own_fields(tmp_path, profile, visibility, stdout):
    """Every ordered pair of distinct values: the results' visibility is the file's visibility (top level and every
    test), stdout_visibility the file's stdout_visibility; never the other way round."""
    weights = gradescope.load_weights(weights_file(tmp_path, profile, visibility, stdout))
    assert (weights.visibility, weights.stdout_visibility) == (visibility, stdout)
    data = gradescope.results(synthetic_grade(profile, {}), profile, weights, 3.4)
    assert data["visibility"] == visibility and data["stdout_visibility"] == stdout
    assert {t["visibility"] for t in data["tests"]} == {visibility}


def test_defaults_show_results_to_students_and_hide_the_staff_stdout(tmp_path, profile):
    """Without the keys: results visible, stdout (tracebacks) hidden; the shipped weights file says the same."""
    for path in (weights_file(tmp_path, profile, None, None), gradescope.DEFAULT_WEIGHTS):
        weights = gradescope.load_weights(path)
        data = gradescope.results(synthetic_grade(profile, {}), profile, weights, 0.0)
        assert (data["visibility"], data["stdout_visibility"]) == ("visible", "hidden"), path
        assert all(t["visibility"] == "visible" for t in data["tests"])


def test_every_test_field_read_back(tmp_path, profile):
    """name, number, score, max_score, status, output, tags: each from its own source, per criterion."""
    ids = profile.ids
    statuses = {ids[1]: FAIL, ids[2]: NOT_MEASURABLE}
    weights = gradescope.load_weights(weights_file(tmp_path, profile, "after_published", "after_due_date", total=37))
    data = json.loads(json.dumps(gradescope.results(synthetic_grade(profile, statuses), profile, weights, 12.6)))
    points = {cid: i + 1 for i, cid in enumerate(ids)}
    scale = 37 / sum(points.values())
    assert [t["number"] for t in data["tests"]] == [str(i) for i in range(1, len(ids) + 1)]
    for cid, t in zip(ids, data["tests"]):
        status = statuses.get(cid, PASS)
        assert t["name"] == f"Label of {cid} [{cid}]"
        assert t["max_score"] == pytest.approx(points[cid] * scale, abs=1e-4)
        assert t["score"] == (t["max_score"] if status == PASS else 0.0)
        assert t["status"] == ("passed" if status == PASS else "failed")
        assert f"msg-{cid}" in t["output"]
        assert t["tags"][0] == cid and (("not-measured" in t["tags"]) == (status == NOT_MEASURABLE))
    nm = data["tests"][2]
    assert nm["output"].startswith("NOT MEASURED") and f"measured-{ids[2]}" in nm["output"]
    assert data["score"] == pytest.approx(sum(t["score"] for t in data["tests"]), abs=0.01)
    assert data["score"] == pytest.approx(37 - (points[ids[1]] + points[ids[2]]) * scale, abs=0.01)
    assert data["execution_time"] == 13
    assert f"{len(ids) - 2} of {len(ids)} graded criteria passed" in data["output"]
    assert "'reference'" in data["output"] and "recipe-b" in data["output"] and ids[2] in data["output"]


def test_without_total_the_points_are_the_scores(tmp_path, profile):
    points = {cid: (i % 3) * 2 for i, cid in enumerate(profile.ids)}      # some 0: listed, not graded
    weights = gradescope.load_weights(weights_file(tmp_path, profile, "hidden", "visible", total=None, points=points))
    assert weights.total is None
    data = gradescope.results(synthetic_grade(profile, {}), profile, weights, 0.0)
    assert [t["max_score"] for t in data["tests"]] == [float(points[c]) for c in profile.ids]
    assert data["score"] == sum(points.values())
    graded = sum(1 for p in points.values() if p > 0)
    assert data["output"].startswith(f"{graded} of {graded} graded criteria passed")


def test_root_cause_comes_first_in_every_failed_test_and_the_summary(tmp_path, profile):
    ids = profile.ids
    weights = gradescope.load_weights(weights_file(tmp_path, profile, "visible", "hidden"))
    grade = synthetic_grade(profile, {ids[0]: FAIL}, diagnosis_id="nan-loss")
    data = gradescope.results(grade, profile, weights, 0.0)
    first = data["tests"][0]
    assert first["output"].startswith("ROOT CAUSE [nan-loss]: cause text\nfix first: fix text")
    assert data["tests"][1]["output"] == f"PASS: Label of {ids[1]} [{ids[1]}] msg-{ids[1]}"
    assert data["output"].startswith("ROOT CAUSE [nan-loss]")


def test_not_judged_submission_keeps_the_weights_visibility(tmp_path, profile):
    """A submission that could not be judged: every criterion failed with the reason, in the file's visibility."""
    weights = gradescope.load_weights(weights_file(tmp_path, profile, "after_due_date", "visible"))
    data = gradescope.failure_results("no log uploaded", 2.0, profile, weights)
    assert data["output"] == "no log uploaded" and data["score"] == 0
    assert (data["visibility"], data["stdout_visibility"]) == ("after_due_date", "visible")
    assert all(t["status"] == "failed" and "not-judged" in t["tags"] and "no log uploaded" in t["output"]
               and t["visibility"] == "after_due_date" and t["score"] == 0 for t in data["tests"])
    bare = gradescope.failure_results("broken weights", 2.0)             # no weights at all: safe defaults
    assert (bare["visibility"], bare["stdout_visibility"]) == ("visible", "hidden")


def test_main_writes_what_the_weights_say_for_a_real_log(tmp_path, profile):
    """End to end in-process: the recorded real log judged, results.json read back field by field."""
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "train.log").write_text(GOOD_LOG.read_text())
    weights = weights_file(tmp_path, profile, "after_published", "after_due_date", total=50)
    out = tmp_path / "results" / "results.json"
    args = types.SimpleNamespace(submission=str(submission), results=str(out), criteria="reference",
                                 weights=str(weights))
    assert gradescope.main(args) == 0
    data = json.loads(out.read_text())
    assert (data["visibility"], data["stdout_visibility"]) == ("after_published", "after_due_date")
    assert {t["visibility"] for t in data["tests"]} == {"after_published"}
    assert [t["tags"][0] for t in data["tests"]] == profile.ids
    assert sum(t["max_score"] for t in data["tests"]) == pytest.approx(50, abs=1e-3)
    tests = {t["tags"][0]: t for t in data["tests"]}
    assert tests["final-loss"]["status"] == "passed" and tests["final-loss"]["score"] == tests["final-loss"]["max_score"]
    # no --save folder: what only the folder shows is not measured, failed with 0 points (never a silent pass)
    assert tests["checkpoint-loads"]["status"] == "failed" and "not-measured" in tests["checkpoint-loads"]["tags"]
    unmeasured = [t for t in data["tests"] if "not-measured" in t["tags"]]
    assert unmeasured and all(t["status"] == "failed" and t["score"] == 0 and t["max_score"] > 0 for t in unmeasured)
    assert data["score"] == pytest.approx(sum(t["score"] for t in data["tests"]), abs=0.01)


# ---------------------------------------------------------------- in process: what the subprocess tests also show
# (test_gradescope.py runs the real run_autograder; mutmut cannot attribute a subprocess, so the same behaviour is
# read back here in-process: every configuration error's words, the submission checks, the staff note, the flags)


@pytest.mark.parametrize("body,words", [
    ("not toml [", ["cannot read the weights file", "Fix: pass --weights FILE"]),
    ("total = 10\nsurprise = 1\n[points]\nrecipe = 1\n", ["unknown key(s) surprise", "Fix: use only points, "
                                                          "stdout_visibility, total, visibility"]),
    ("total = 10\n", ["no [points] table", "one `<criterion id> = N` line per criterion"]),
    ("[points]\nrecipe = -1\n", ["[points] recipe = -1", "Fix: a number >= 0"]),
    ("[points]\nrecipee = 1\n", ["[points] names no such criterion: recipee", "Fix: use the ids of"]),
    ("total = 0\n[points]\nrecipe = 1\n", ["total = 0", "the assignment's points, a number > 0"]),
    ('visibility = "public"\n[points]\nrecipe = 1\n', ["visibility = 'public'", "Fix: one of hidden, after_due_date, "
                                                       "after_published, visible"]),
    ('stdout_visibility = "shown"\n[points]\nrecipe = 1\n', ["stdout_visibility = 'shown'"]),
])
def test_every_weights_error_names_the_file_the_key_and_the_fix(tmp_path, body, words):
    path = tmp_path / "w.toml"
    path.write_text(body)
    with pytest.raises(gradescope.GradescopeError) as caught:
        gradescope.load_weights(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ")
    for w in words:
        assert w in text, (w, text)


def test_a_profile_criterion_without_points_is_named(tmp_path, profile):
    path = weights_file(tmp_path, profile, None, None, points={profile.ids[0]: 1})
    with pytest.raises(gradescope.GradescopeError) as caught:
        gradescope.load_weights(path).max_scores(profile)
    assert f"profile 'reference' has criteria without points: {', '.join(profile.ids[1:])}" in str(caught.value)
    assert "Fix: add `<id> = N` under [points] (0 lists it ungraded)" in str(caught.value)


def test_submission_problems_and_links_out(tmp_path):
    assert "no submission folder at" in gradescope.submission_problem(tmp_path / "missing")
    sub = tmp_path / "sub"
    (sub / "inner").mkdir(parents=True)
    (sub / "train.log").write_text("x")
    (sub / "ok.log").symlink_to(sub / "train.log")                # inside, to a file: fine
    assert gradescope.submission_problem(sub) is None and gradescope.links_out_of(sub) == []
    (tmp_path / "secret").write_text("s")
    (sub / "out.log").symlink_to(tmp_path / "secret")
    (sub / "loop").symlink_to(sub / "inner")                      # at a folder
    found = gradescope.links_out_of(sub)
    assert sorted(found) == sorted([f"out.log -> {tmp_path / 'secret'}", f"loop -> {sub / 'inner'}"])
    problem = gradescope.submission_problem(sub)
    assert problem.startswith("the submission contains symbolic links that point out of it or at a folder: ")
    assert "out.log -> " in problem and problem.endswith("Upload the files themselves, not links")


def test_a_broken_submission_is_a_score_zero_result_with_the_reason(tmp_path, profile, capsys):
    sub = tmp_path / "sub"
    sub.mkdir()
    (tmp_path / "secret").write_text("s")
    (sub / "x.log").symlink_to(tmp_path / "secret")
    out = tmp_path / "r" / "results.json"
    args = types.SimpleNamespace(submission=str(sub), results=str(out), criteria="reference",
                                 weights=str(weights_file(tmp_path, profile, "after_due_date", "visible")))
    assert gradescope.main(args) == 0
    data = json.loads(out.read_text())
    assert data["score"] == 0 and data["output"].startswith("the submission contains symbolic links")
    assert data["visibility"] == "after_due_date" and data["stdout_visibility"] == "visible"
    assert all("not-judged" in t["tags"] and t["status"] == "failed" for t in data["tests"])
    assert capsys.readouterr().out.startswith(f"score 0.0: results in {out}\nthe submission contains")


def test_the_autograders_own_failure_is_a_staff_note_never_a_verdict(tmp_path, capsys):
    out = tmp_path / "results.json"
    args = types.SimpleNamespace(submission=str(tmp_path), results=str(out), criteria="no-such-profile",
                                 weights=str(gradescope.DEFAULT_WEIGHTS))
    assert gradescope.main(args) == 0
    data = json.loads(out.read_text())
    assert data["output"].startswith("the autograder itself failed (") and "tell the course staff" in data["output"]
    assert data["tests"] == [{"number": "1", "name": "submission could be graded", "score": 0.0, "max_score": 0.0,
                              "status": "failed", "output": data["output"], "visibility": "visible",
                              "tags": ["not-judged"]}]
    assert (data["visibility"], data["stdout_visibility"], data["score"]) == ("visible", "hidden", 0.0)
    assert "Traceback" in capsys.readouterr().out                # for the staff, in the hidden stdout


def test_results_that_cannot_be_written_exit_3(tmp_path, capsys):
    """Not writing results.json is the grader's error (3), never a verdict."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = types.SimpleNamespace(submission=str(tmp_path / "none"), results=str(blocker / "results.json"),
                                 criteria="reference", weights=str(gradescope.DEFAULT_WEIGHTS))
    assert gradescope.main(args) == 3
    assert f"error: cannot write {blocker / 'results.json'}" in capsys.readouterr().err


def test_flags_default_to_gradescopes_paths_and_the_environment(monkeypatch):
    import argparse

    for name in ("GRADESCOPE_SUBMISSION", "GRADESCOPE_RESULTS", "GRADESCOPE_CRITERIA", "GRADESCOPE_WEIGHTS"):
        monkeypatch.delenv(name, raising=False)
    parser = argparse.ArgumentParser()
    gradescope.add_arguments(parser)
    keys = ("submission", "results", "criteria", "weights")
    got = {k: v for k, v in vars(parser.parse_args([])).items() if k in keys}
    assert got == {"submission": "/autograder/submission", "results": "/autograder/results/results.json",
                   "criteria": "reference", "weights": str(gradescope.DEFAULT_WEIGHTS)}
    env = {"GRADESCOPE_SUBMISSION": "/s", "GRADESCOPE_RESULTS": "/r.json", "GRADESCOPE_CRITERIA": "course",
           "GRADESCOPE_WEIGHTS": "/w.toml"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    parser = argparse.ArgumentParser()
    gradescope.add_arguments(parser)
    assert {k: v for k, v in vars(parser.parse_args([])).items() if k in keys} == {"submission": "/s", "results": "/r.json", "criteria": "course",
                                           "weights": "/w.toml"}


def test_not_measured_with_zero_points_and_consequence_tags(tmp_path, profile):
    ids = profile.ids
    points = {cid: (0 if cid == ids[2] else 1) for cid in ids}
    weights = gradescope.load_weights(weights_file(tmp_path, profile, "visible", "hidden", total=None, points=points))
    grade = synthetic_grade(profile, {ids[2]: NOT_MEASURABLE, ids[3]: FAIL})
    grade["criteria"][3]["consequence_of"] = "nan-loss"
    data = gradescope.results(grade, profile, weights, 0.0)
    nm, fail = data["tests"][2], data["tests"][3]
    assert nm["output"].startswith(f"NOT MEASURED (not graded (0 points); never counted as a pass): measured-{ids[2]}")
    assert fail["tags"] == [ids[3], "consequence-of:nan-loss"]
    assert data["output"].endswith(f"Not measured from what was submitted (no points, never a pass): {ids[2]}")
    one = dict(points, **{ids[2]: 3})
    weights = gradescope.load_weights(weights_file(tmp_path, profile, "visible", "hidden", total=None, points=one))
    nm = gradescope.results(grade, profile, weights, 0.0)["tests"][2]
    assert nm["output"].startswith("NOT MEASURED (0 of 3 points; never counted as a pass)")


def test_a_diagnosis_without_an_id_is_still_put_first(tmp_path, profile):
    weights = gradescope.load_weights(weights_file(tmp_path, profile, "visible", "hidden"))
    grade = synthetic_grade(profile, {profile.ids[0]: FAIL})
    grade.update(diagnosis="the log is empty", diagnosis_id=None)
    data = gradescope.results(grade, profile, weights, 0.0)
    assert data["tests"][0]["output"].startswith("the log is empty\n\n")
    assert data["output"].startswith("the log is empty\n")
    grade = {"diagnosis": None, "diagnosis_id": None, "criteria": [], "recipe": None}
    data = gradescope.results(grade, profile, weights, 0.0)
    assert all(t["output"].startswith("the submission was not judged\n\nNOT JUDGED: ") for t in data["tests"])
