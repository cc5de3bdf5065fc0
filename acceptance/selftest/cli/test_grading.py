"""Grading what students submit: logs and --save folders outside the repo, recipe deviations, root cause first,
both course recipes, and `python -m harness grade` agreeing with `pytest -m gpu --from-log`.

The submissions are built in a temporary folder outside the repository from the recorded logs, each by a named
transformation (harness.evidence.mutants) or a recorded failure text (fixtures/diagnoses/).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.evidence import mutants
from harness.judge.submission import find_submission, judge_submission
from harness.base.paths import FIXTURES, RECORDED_LOGS, REPO
from harness.evidence.logformat import ARGUMENTS_BEGIN, ARGUMENTS_END
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, load_profile

GOOD_A = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
GOOD_B = RECORDED_LOGS / "reference_trainer_h200_recipe_b_seed1234.log"
DIAGNOSES = FIXTURES / "diagnoses"
# Remedies of criteria that a failed run never reached: printing them would send the student the wrong way.
WRONG_REMEDIES = {cid: c.remedy for cid, c in ((c.id, c) for c in load_profile("reference").criteria)
                  if cid in ("datasets-built", "training-started", "first-loss", "loss-decreases", "final-loss")}


def _arg(text: str, name: str, value: str) -> str:
    """The log with one argument of Megatron's `arguments` block changed."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith(f"  {name} ") and "..." in line:
            lines[i] = line[: line.rindex(" ") + 1] + value
            return "\n".join(lines)
    raise AssertionError(f"{name} not in the arguments block")


def _seed(text: str, value: str) -> str:
    """The log with its seed changed everywhere Megatron prints it (the arguments block, `setting random seeds`,
    the dataset config), as a run with that seed prints it (its losses left: only a replay can tell)."""
    seed = next(line.split()[-1] for line in text.split("\n") if line.startswith("  seed ") and "..." in line)
    text = text.replace(f"> setting random seeds to {seed} ...", f"> setting random seeds to {value} ...")
    return _arg(text.replace(f"random_seed={seed},", f"random_seed={value},"), "seed", value)


def _hung_in_sample_index(text: str) -> str:
    """Cut right after the BERT dataset marker: the one-sentence-document hang, killed."""
    return mutants.truncated(mutants._marker_line_no(text, "building_bert_datasets") + 1)(text)


@dataclass(frozen=True)
class Sub:
    """A submission to build, and the grade it must get."""

    name: str
    build: object                         # () -> log text
    verdict: str
    diagnosis: str | None                 # root-cause id (a changed flag: recipe-deviation), None for a healthy run
    failed: frozenset | None = None       # exactly these criteria fail (None: not pinned)
    recipe: str | None = None


A, B = GOOD_A.read_text(), GOOD_B.read_text()
SUBMISSIONS = (
    Sub("good-a", lambda: A, "pass", None, frozenset(), "a"),
    Sub("good-b", lambda: B, "pass", None, frozenset(), "b"),
    Sub("hung-sample-index", lambda: _hung_in_sample_index(A), "fail", "one-sentence-docs"),
    Sub("te-import-error", lambda: (DIAGNOSES / "transformer-engine.log").read_text(), "fail", "transformer-engine"),
    # a flag edited in the arguments block alone: the recipe fails, and so does log-consistent (the rest of the log
    # still shows the course's batch and schedule)
    Sub("changed-global-batch", lambda: _arg(A, "global_batch_size", "32"), "fail", "recipe-deviation",
        frozenset({"recipe", "log-consistent"}), "a"),
    Sub("changed-lr", lambda: _arg(A, "lr", "0.0002"), "fail", "recipe-deviation",
        frozenset({"recipe", "log-consistent"}), "a"),
    Sub("changed-dropout-b", lambda: _arg(B, "hidden_dropout", "0.0"), "fail", "recipe-deviation",
        frozenset({"recipe"}), "b"),
    Sub("other-seed", lambda: _seed(A, "77"), "pass", None, frozenset(), "a"),
    Sub("truncated", lambda: mutants.stopped_at(150)(A), "fail", "log-ends-early"),
    Sub("nan", lambda: mutants.nan_at(120)(A), "fail", "nan"),
    Sub("cuda-oom", lambda: (DIAGNOSES / "cuda-oom.log").read_text(), "fail", "cuda-oom"),
    Sub("missing-module", lambda: (DIAGNOSES / "missing-module.log").read_text(), "fail", "missing-module"),
    Sub("keyerror-text", lambda: (DIAGNOSES / "missing-text-key.log").read_text(), "fail", "missing-text-key"),
    Sub("data-missing", lambda: (DIAGNOSES / "data-missing.log").read_text(), "fail", "data-missing"),
)
BY_NAME = {s.name: s for s in SUBMISSIONS}


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Path:
    """One folder per submission, outside the repository, each with its log under a student's own name."""
    root = tmp_path_factory.mktemp("submissions")
    assert REPO not in root.parents
    for sub in SUBMISSIONS:
        (root / sub.name).mkdir()
        (root / sub.name / f"{sub.name}-train.log").write_text(sub.build())
    return root


@pytest.mark.parametrize("sub", SUBMISSIONS, ids=[s.name for s in SUBMISSIONS])
def test_submission_gets_its_verdict_and_root_cause(sub, batch):
    """The right verdict and root cause; a failed run's unreached criteria carry no remedy of their own."""
    found = find_submission(batch / sub.name)
    j = judge_submission(load_profile("reference"), found.log, found.save_dir)
    assert j.verdict == sub.verdict, [v.message for v in j.verdicts if v.status == FAIL]
    assert (j.diagnosis.cause_id if j.diagnosis else None) == sub.diagnosis, j.diagnosis
    if sub.failed is not None:
        assert set(j.ids(FAIL)) == sub.failed
    if sub.recipe is not None:
        assert j.recipe == sub.recipe, j.recipe_how
    for v in j.verdicts:
        if v.status != FAIL:
            continue
        if j.diagnosis is not None:
            first = v.message.splitlines()[1]
            assert first.startswith(f"  ROOT CAUSE [{j.diagnosis.cause_id}]"), v.message
        if v.consequence_of is not None:
            wrong = [r for r in WRONG_REMEDIES.values() if r in v.message]
            assert not wrong, f"{v.criterion_id} of {sub.name} prints an unrelated remedy: {wrong}"


def test_recipe_deviations_name_each_flag(batch):
    """`name: course value -> run value` for each deviation; a different --seed is reported and passes."""
    profile = load_profile("reference")
    changed = judge_submission(profile, batch / "changed-lr" / "changed-lr-train.log")
    recipe = {v.criterion_id: v for v in changed.verdicts}["recipe"]
    assert "lr: 0.0001 -> 0.0002" in recipe.measured and "min_lr" not in recipe.measured, recipe.measured
    seed = {v.criterion_id: v for v in judge_submission(profile, batch / "other-seed" / "other-seed-train.log").verdicts}
    assert seed["recipe"].status == PASS and "seed: 1234 -> 77" in seed["recipe"].measured


def test_a_huge_flag_value_is_quoted_cut_in_the_root_cause(tmp_path):
    """A student's log decides how long a printed value is: the deviation quotes its start and its length, so the
    root cause and every failing message stay one short line (50,000 digits made a 50 KB grades table)."""
    from harness.evidence.recipe import QUOTE_MAX_CHARS

    log = tmp_path / "train.log"
    log.write_text(_arg(A, "lr", "9" * 5_000))   # under logread.MAX_LINE_CHARS (a longer line is cut there)
    j = judge_submission(load_profile("reference"), log)
    assert j.diagnosis is not None and j.diagnosis.cause_id == "recipe-deviation"
    assert f"lr: 0.0001 -> {'9' * QUOTE_MAX_CHARS}... (5000 chars)" in j.diagnosis.cause, j.diagnosis.cause[:300]
    assert len(j.diagnosis.cause) < 300 and all(len(v.message) < 5_000 for v in j.verdicts)


def test_log_without_arguments_block_is_not_measured_and_recipe_comes_from_sop_loss(batch, tmp_path):
    """No `arguments` block: recipe `not measured` (listed, never a pass); (a)/(b) recognised by the sop loss."""
    for source, expect in ((A, "a"), (B, "b")):
        begin, end = source.index(ARGUMENTS_BEGIN), source.index(ARGUMENTS_END) + len(ARGUMENTS_END)
        text = source[:begin] + source[end:]
        log = tmp_path / f"no-args-{expect}.log"
        log.write_text(text)
        j = judge_submission(load_profile("reference"), log)
        assert j.recipe == expect and "sop loss" in j.recipe_how
        assert "recipe" in j.ids(NOT_MEASURABLE)


def _run(argv: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """A subprocess importing this checkout's harness (not an installed copy), wherever it starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def graded(batch, tmp_path_factory) -> tuple:
    """`python -m harness grade DIR --out OUT`, started from a folder outside the repo."""
    out = tmp_path_factory.mktemp("grades")
    done = _run([sys.executable, "-m", "harness", "grade", str(batch), "--out", str(out), "--no-progress",
                 "--no-copy-detection"],      # the batch is made from two recorded logs: copies by construction
                cwd=tmp_path_factory.mktemp("elsewhere"))
    return done, out, {g["submission"]: g for g in json.loads((out / "grades.json").read_text())}


def test_grade_writes_every_output_and_exits_1(graded):
    """grades.json/.md/.csv, a JUnit file (submission x criterion) and a picture per judged log; exit 1."""
    done, out, grades = graded
    assert done.returncode == 1, done.stderr
    assert set(grades) == set(BY_NAME)
    for name, g in grades.items():
        assert g["verdict"] == BY_NAME[name].verdict and g["diagnosis_id"] == BY_NAME[name].diagnosis, g
        assert {"submission", "verdict", "failed", "diagnosis", "criteria"} <= set(g)
    md = (out / "grades.md").read_text()
    assert all(f"| {name} |" in md for name in grades)
    rows = list(csv.DictReader((out / "grades.csv").open()))
    assert {r["submission"]: r["verdict"] for r in rows} == {n: g["verdict"] for n, g in grades.items()}
    suite = ET.parse(out / "grades-junit.xml").getroot()
    cases = suite.findall("testcase")
    ids = load_profile("reference").ids
    assert len(cases) == sum(len(g["criteria"]) or 1 for g in grades.values()) and len(cases) >= len(grades) * len(ids) - 4 * len(ids)
    assert int(suite.get("failures")) == sum(1 for c in cases if c.find("failure") is not None) > 0
    for name in ("good-a", "good-b", "nan", "truncated"):
        png = out / grades[name]["loss_curve"]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_grade_usage_errors_exit_2(tmp_path):
    """A missing folder, an empty one, or an unknown profile: exit 4 with one line naming the fix."""
    cases = [[str(tmp_path / "nowhere")], [str(tmp_path)], [str(tmp_path), "--criteria", "nosuch"]]
    (tmp_path / "alice").mkdir()
    cases[1] = [str(tmp_path / "alice")]
    for extra in cases:
        done = _run([sys.executable, "-m", "harness", "grade", *extra, "--no-progress"], cwd=tmp_path)
        assert done.returncode == 4 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr, done


def _pytest_from_log(args: list, cwd: Path, junit: Path) -> tuple:
    """`pytest -m gpu ...` judging a log; (rc, {criterion: outcome}) from the JUnit properties."""
    done = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q",
                 f"--junitxml={junit}", *args], cwd=cwd)
    outcomes = {}
    if junit.is_file():
        for case in ET.parse(junit).getroot().iter("testcase"):
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            if "criterion" in props:
                outcome = ("failed" if case.find("failure") is not None else
                           "skipped" if case.find("skipped") is not None else "passed")
                outcomes[props["criterion"]] = (outcome, props["status"])
    return done, outcomes


STATUS_TO_OUTCOME = {PASS: "passed", FAIL: "failed", NOT_MEASURABLE: "skipped"}


@pytest.mark.slow
@pytest.mark.parametrize("name,form,where", [
    ("good-a", "space", "repo"), ("changed-lr", "equals", "repo"), ("hung-sample-index", "space", "elsewhere"),
    ("good-b", "equals", "elsewhere")])
def test_pytest_from_log_agrees_with_grade(name, form, where, batch, graded, tmp_path):
    """`pytest -m gpu --from-log PATH` (both forms, from the repo or elsewhere) gives grade's verdicts, and on a
    machine without a GPU runs no test that needs one."""
    log = find_submission(batch / name).log
    option = ["--from-log", str(log)] if form == "space" else [f"--from-log={log}"]
    args = option if where == "repo" else [str(REPO), *option]
    done, outcomes = _pytest_from_log(args, REPO if where == "repo" else tmp_path, tmp_path / "junit.xml")
    assert "unrecognized arguments" not in done.stderr, done.stderr
    expected = {c["id"]: STATUS_TO_OUTCOME[c["status"]] for c in graded[2][name]["criteria"]}
    assert {cid: o for cid, (o, _) in outcomes.items()} == expected, done.stdout[-3000:]
    assert done.returncode == (0 if BY_NAME[name].verdict == "pass" else 1), done.stdout[-3000:]
    assert "test_gpumem" not in (tmp_path / "junit.xml").read_text(), "a GPU-only test ran on a recorded log"


@pytest.mark.slow
@pytest.mark.parametrize("args,says", [
    (["--from-log=/no/such/train.log"], "--from-log /no/such/train.log: no such file"),
    (["--from-log", "/no/such/train.log"], "--from-log /no/such/train.log: no such file"),
    (["--criteria", "nosuch"], "--criteria nosuch:"),
    (["--time-limit", "soon"], "--time-limit 'soon': not a number"),
    (["--stage-timeout", "soon"], "--stage-timeout 'soon': not a number"),     # the old spelling, still read
    (["--vocab-file=/no/such/vocab.txt"], "--vocab-file /no/such/vocab.txt: no such file"),
    (["--checkpoint-dir", "/no/such/ckpt", f"--from-log={GOOD_A}"], "--checkpoint-dir /no/such/ckpt: no such folder"),
    (["--from-log", str(GOOD_A), f"--from-log={GOOD_B}"], "--from-log given 2 times"),
], ids=["from-log-equals", "from-log-space", "criteria", "time-limit", "stage-timeout", "vocab-file", "checkpoint-dir",
        "from-log-twice"])
def test_bad_option_is_one_usage_error_before_any_test(args, says, tmp_path):
    """One `ERROR:` line naming the option and the fix, exit code 4, no test run, no traceback."""
    done = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", *args], cwd=REPO)
    assert done.returncode == 4, (done.stdout[-2000:], done.stderr[-2000:])
    assert says in done.stderr and "Traceback" not in done.stderr + done.stdout, done.stderr
    assert " passed" not in done.stdout and " skipped" not in done.stdout


@pytest.mark.slow
def test_pytest_from_log_shows_escape_sequences_instead_of_sending_them(tmp_path):
    """A log whose last lines hold terminal escape sequences (clear screen, set title, bell): the failure text
    quotes them as \\x1b..., and pytest's output carries no escape character from the log."""
    log = tmp_path / "train.log"
    log.write_text(mutants.stopped_at(150)(A) + "\x1b[2J\x1b]0;owned\x07 \u202eevil\n")
    done = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-k", "final_lm_loss",
                 "--from-log", str(log)], cwd=REPO)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "\\x1b[2J\\x1b]0;owned\\x07 \\u202eevil" in done.stdout, done.stdout[-3000:]
    assert "\x1b" not in done.stdout + done.stderr and "\u202e" not in done.stdout
