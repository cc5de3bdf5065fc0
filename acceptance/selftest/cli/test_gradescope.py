"""The Gradescope autograder (examples/gradescope/run_autograder -> python -m harness gradescope) on CPU.

Each test builds a fake /autograder tree in tmp_path (submission/, results/), runs the example's run_autograder
with the tree moved there (AUTOGRADER_ROOT), and checks results.json against Gradescope's documented format
(https://gradescope-autograders.readthedocs.io/en/latest/specs/) with a validator written here, independent of
the module: required keys and types, scores within max_score, the overall score the sum of the tests'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import gradescope
from harness.evidence import mutants
from harness.base.paths import FIXTURES, RECORDED_LOGS, REPO
from harness.judge.profiles import load_profile

RUN_AUTOGRADER = REPO / "examples" / "gradescope" / "run_autograder"
GOOD_LOG = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
CHECKPOINT_IDS = {"checkpoints-saved", "checkpoint-tracker", "checkpoint-loads"}
# a log cannot show these: listed with 0 points in the default weights
LIVE_ONLY = {"exit-code", "ran-on-gpu", "gpu-memory", "resume-matches", "cuda-graph"}


def shape_problems(data) -> list[str]:
    """What in `data` breaks Gradescope's results.json format (empty when it is valid)."""
    problems = []
    number = (int, float)
    top = {"score": number, "execution_time": int, "output": str, "visibility": str, "stdout_visibility": str,
           "tests": list}
    for key, kind in top.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            problems.append(f"top-level {key!r}: {data.get(key)!r} is not {kind}")
    for key in ("visibility", "stdout_visibility"):
        if data.get(key) not in VISIBILITY:
            problems.append(f"top-level {key!r}: {data.get(key)!r} not one of {sorted(VISIBILITY)}")
    for i, t in enumerate(data.get("tests") or []):
        for key, kind in {"name": str, "score": number, "max_score": number, "status": str, "output": str,
                          "visibility": str, "number": str, "tags": list}.items():
            if not isinstance(t.get(key), kind) or isinstance(t.get(key), bool):
                problems.append(f"tests[{i}] {key!r}: {t.get(key)!r} is not {kind}")
        if t.get("status") not in ("passed", "failed"):
            problems.append(f"tests[{i}] status {t.get('status')!r}")
        if t.get("visibility") not in VISIBILITY:
            problems.append(f"tests[{i}] visibility {t.get('visibility')!r}")
        if isinstance(t.get("score"), number) and isinstance(t.get("max_score"), number) and not (
                0 <= t["score"] <= t["max_score"] + 1e-9):
            problems.append(f"tests[{i}] score {t['score']} outside [0, {t['max_score']}]")
        if t.get("status") == "passed" and t.get("score") != t.get("max_score"):
            problems.append(f"tests[{i}] passed with {t.get('score')} of {t.get('max_score')}")
    if not problems and data["tests"]:
        total = sum(t["score"] for t in data["tests"])
        if abs(total - data["score"]) > 0.01:
            problems.append(f"score {data['score']} is not the tests' sum {total}")
    return problems


def test_the_validator_catches_a_malformed_result():
    """The shape check itself can fail: a result with a wrong type, a bad status and an inflated score."""
    bad = {"score": "100", "execution_time": 1.5, "output": "", "visibility": "public", "stdout_visibility": "hidden",
           "tests": [{"name": "x", "score": 6, "max_score": 5, "status": "ok", "output": "", "visibility": "visible",
                      "number": 1, "tags": []}]}
    found = " | ".join(shape_problems(bad))
    for fragment in ("'score'", "'execution_time'", "'visibility'", "status 'ok'", "'number'", "outside [0, 5]"):
        assert fragment in found, (fragment, found)


def autograder_tree(tmp_path: Path, files: dict | None = None) -> Path:
    """A fake /autograder: submission/ with `files` (name -> text), results/ empty."""
    root = tmp_path / "autograder"
    (root / "results").mkdir(parents=True)
    submission = root / "submission"
    submission.mkdir()
    for name, text in (files or {}).items():
        (submission / name).parent.mkdir(parents=True, exist_ok=True)
        (submission / name).write_text(text)
    return root


def run_autograder(root: Path, args: str = "", python: str = sys.executable) -> tuple[dict, subprocess.CompletedProcess]:
    """Run the example's run_autograder against the tree; results.json parsed, and the process."""
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": python, "AUTOGRADER_SUITE": str(REPO),
           "AUTOGRADER_ARGS": args}
    done = subprocess.run(["bash", str(RUN_AUTOGRADER)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = root / "results" / "results.json"
    assert results.is_file(), f"run_autograder wrote no results.json\n{done.stdout}\n{done.stderr}"
    data = json.loads(results.read_text())
    assert shape_problems(data) == [], shape_problems(data)
    return data, done


def by_id(data: dict) -> dict:
    """criterion id (the first tag) -> test."""
    return {t["tags"][0]: t for t in data["tests"]}


def test_good_log_gets_every_point_a_log_can_show(tmp_path):
    data, _ = run_autograder(autograder_tree(tmp_path, {"train.log": GOOD_LOG.read_text()}))
    tests = by_id(data)
    assert list(tests) == load_profile("reference").ids           # one test per criterion, in order
    assert sum(t["max_score"] for t in data["tests"]) == pytest.approx(100)
    failed = {cid for cid, t in tests.items() if t["status"] == "failed"}
    # no --save folder: the folder's criteria are not measured, so they earn nothing (never a silent pass); what the
    # log itself proves passes: its completed saves (checkpoints-saved), its normal end (exit-code), its CUDA memory
    # reports (ran-on-gpu), and its own memory lines (gpu-memory: judged, 0 points)
    from_log = {"checkpoints-saved", "exit-code", "ran-on-gpu"}
    assert failed == (CHECKPOINT_IDS | LIVE_ONLY) - from_log - {"gpu-memory"}
    assert all(tests[cid]["status"] == "passed" for cid in from_log | {"gpu-memory"})
    assert all("not-measured" in tests[cid]["tags"] and tests[cid]["output"].startswith("NOT MEASURED")
               for cid in failed)
    # the folder's checkpoint-tracker and checkpoint-loads (5 points each) are all it misses
    assert data["score"] == pytest.approx(90.0)
    assert all(tests[cid]["max_score"] == 0 for cid in LIVE_ONLY - from_log)
    assert all(tests[cid]["max_score"] == pytest.approx(5.0) for cid in from_log)
    assert data["output"].startswith("13 of 15 graded criteria passed")


def test_all_graded_criteria_passing_is_the_full_score(tmp_path):
    """Weights that grade only what a log shows: the good log scores the assignment's total."""
    weights = (FIXTURES / "gradescope" / "weights.toml").read_text()
    for cid in CHECKPOINT_IDS:
        weights = weights.replace(f"\n{cid} = 5\n", f"\n{cid} = 0\n")
    (tmp_path / "log-only.toml").write_text(weights.replace("total = 100", "total = 40"))
    data, _ = run_autograder(autograder_tree(tmp_path, {"run/train.log": GOOD_LOG.read_text()}),
                             f"--weights {tmp_path / 'log-only.toml'}")
    assert data["score"] == pytest.approx(40.0)
    assert all(t["status"] == "passed" for t in data["tests"] if t["max_score"] > 0)


@pytest.mark.parametrize("name, files, root_cause", [
    ("empty submission", {}, "no-log"),
    ("Transformer Engine import error", {"train.log": (FIXTURES / "diagnoses" / "transformer-engine.log").read_text()},
     "transformer-engine"),
    ("NaN at iteration 120", {"train.log": mutants.nan_at(120)(GOOD_LOG.read_text())}, "nan"),
    ("binary garbage", {"train.log": "\x00\x01\x02 not a log \udcff".encode("utf-8", "surrogateescape")
                        .decode("utf-8", "replace")}, None),
])
def test_broken_submission_gets_a_valid_result_with_the_root_cause_first(tmp_path, name, files, root_cause):
    data, done = run_autograder(autograder_tree(tmp_path, files))
    assert "Traceback" not in done.stdout + done.stderr, name
    assert data["score"] < 100 * 0.6, (name, data["score"])
    failed = [t for t in data["tests"] if t["status"] == "failed" and t["max_score"] > 0]
    assert failed, name
    if root_cause:
        assert data["output"].startswith(f"ROOT CAUSE [{root_cause}]"), data["output"]
        assert all(t["output"].startswith(f"ROOT CAUSE [{root_cause}]") for t in failed), name


def test_no_submission_folder_scores_zero_with_the_reason(tmp_path):
    root = autograder_tree(tmp_path)
    (root / "submission").rmdir()
    data, _ = run_autograder(root)
    assert data["score"] == 0 and "no submission folder" in data["output"]
    assert all(t["status"] == "failed" and "not-judged" in t["tags"] for t in data["tests"])


def test_link_out_of_the_submission_is_refused_not_read(tmp_path):
    secret = tmp_path / "staff-only.log"
    secret.write_text(GOOD_LOG.read_text())
    root = autograder_tree(tmp_path)
    (root / "submission" / "train.log").symlink_to(secret)
    data, _ = run_autograder(root)
    assert data["score"] == 0 and "symbolic links" in data["output"] and "train.log ->" in data["output"]
    assert "PPL" not in json.dumps(data)        # nothing of the linked file (its loss lines) reached the student
    assert "PPL" in secret.read_text()


def test_autograder_bug_still_writes_a_result(tmp_path):
    data, done = run_autograder(autograder_tree(tmp_path, {"train.log": GOOD_LOG.read_text()}),
                                "--criteria no-such-profile")
    assert data["score"] == 0 and "not a verdict on your work" in data["output"]
    assert "Traceback" in done.stdout          # for the staff, in stdout (stdout_visibility hidden)
    assert data["stdout_visibility"] == "hidden"


def test_autograder_that_cannot_start_still_writes_a_result(tmp_path):
    data, _ = run_autograder(autograder_tree(tmp_path, {"train.log": "x"}), python=str(tmp_path / "no-python"))
    assert data["score"] == 0 and "could not start" in data["output"] and data["tests"] == []


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("\nrecipe = 10\n", "\n"), "criteria without points: recipe"),
    (lambda t: t.replace("\nno-nan = 10\n", "\nno-nann = 10\n"), "no such criterion: no-nann"),
    (lambda t: t.replace("\nfinal-loss = 10\n", "\nfinal-loss = -1\n"), "final-loss = -1"),
    (lambda t: t.replace('visibility = "visible"', 'visibility = "public"'), "visibility = 'public'"),
    (lambda t: t.replace("total = 100", "total = 0"), "total = 0"),
    (lambda t: "bonus = 3\n" + t, "unknown key(s) bonus"),
])
def test_weights_file_errors_name_the_file_and_the_fix(tmp_path, edit, message):
    path = tmp_path / "weights.toml"
    path.write_text(edit(gradescope.DEFAULT_WEIGHTS.read_text()))
    with pytest.raises(gradescope.GradescopeError) as caught:
        gradescope.load_weights(path).max_scores(load_profile("reference"))
    assert message in str(caught.value) and str(path) in str(caught.value) and "Fix:" in str(caught.value)


@pytest.mark.parametrize("weights", ["weights.toml", "checkout-weights.toml"])
@pytest.mark.parametrize("profile", ["reference", "course", "megatron-lm"])
def test_shipped_weights_cover_every_profile_and_sum_to_the_total(weights, profile):
    w = gradescope.load_weights(FIXTURES / "gradescope" / weights)
    maxima = w.max_scores(load_profile(profile))
    assert sum(maxima.values()) == pytest.approx(w.total)


def test_gradescope_is_a_subcommand():
    from harness.__main__ import build_parser

    args = build_parser().parse_args(["gradescope", "--submission", "S", "--results", "R.json"])
    assert (args.command, args.submission, args.results) == ("gradescope", "S", "R.json")
