"""Every state of grade-checkouts' task state machine entered, and every transition the docs promise.

A student's entry in OUT/checkouts-state.json is `pending` (about to be submitted), `submitted` (a job id known),
`finished` (a result), `died` (the job ended without one), or anything else an interrupted or older run left
(an unknown status, no entry at all). docs and harness/cli/cluster/checkouts.py promise: `--resume` submits again
every student not finished (died, pending, submitted on a local machine, unknown, missing) and only those; a
Slurm task submitted before (`--no-wait`) is waited for by its job id, not submitted twice; the merge grades a
finished task from its files and every other state "died" with why and what to do; without `--resume` everyone
runs again. The runs use the real stub checkout mode (checkout_stub.py) on submitit's debug executor, or an
in-process executor standing in for Slurm (submit/map_array/result, job ids, states), so each state is reached on
purpose and fast.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from harness.__main__ import build_parser
from harness.cli.cluster import checkouts, task
from harness.base.paths import REPO
from harness.judge.profiles import load_profile

STUB = Path(__file__).parents[1] / "checkout_stub.py"
STUB_COMMAND = f"{{python}} {shlex.quote(str(STUB))} --megatron-lm {{checkout}} --run-dir {{run_dir}} --junitxml {{junit}}"
STUDENTS = ("alice", "bob", "carol", "dave", "erin", "frank")


def make_students(root: Path, names=STUDENTS, behaviour: str = "pass") -> Path:
    for student in names:
        checkout = root / student / "Megatron-LM"
        (checkout / "megatron" / "core").mkdir(parents=True, exist_ok=True)
        (checkout / "STUB").write_text(behaviour)
    return root


def grade_checkouts(root: Path, out: Path, *extra: str) -> int:
    args = build_parser().parse_args(["grade-checkouts", str(root), "--out", str(out), "--task-command", STUB_COMMAND,
                                      *extra])
    return checkouts.main(args)


def ran(runs_file: Path, since: int = 0) -> list[str]:
    """Students whose checkout mode ran, in order (from the stub's own record)."""
    lines = runs_file.read_text().splitlines() if runs_file.is_file() else []
    return [Path(json.loads(x)["argv"][json.loads(x)["argv"].index("--megatron-lm") + 1]).parent.name
            for x in lines[since:]]


def count(runs_file: Path) -> int:
    return len(runs_file.read_text().splitlines()) if runs_file.is_file() else 0


def state_of(out: Path) -> dict:
    return json.loads((out / checkouts.STATE_FILE).read_text())["students"]


def set_state(out: Path, students: dict) -> None:
    (out / checkouts.STATE_FILE).write_text(json.dumps({"students": students}))


def grades(out: Path) -> dict:
    return {g["submission"]: g for g in json.loads((out / "grades.json").read_text())}


@pytest.fixture
def runs(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "runs.jsonl"
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(path))
    return path


def test_resume_reruns_every_state_but_finished(tmp_path, runs, capsys):
    """died, pending, submitted (local), an unknown status and a missing entry are run again; finished is kept;
    an entry for a student no longer in DIR is dropped."""
    root, out = make_students(tmp_path / "class"), tmp_path / "out"
    assert grade_checkouts(root, out, "--cluster", "debug") == 0
    first = state_of(out)
    assert {s: e["status"] for s, e in first.items()} == dict.fromkeys(STUDENTS, checkouts.FINISHED)
    left = {
        "alice": first["alice"],
        "bob": {**first["bob"], "status": checkouts.DIED, "reason": "the node failed [NODE_FAIL, job 3]", "result": None},
        "carol": {"status": "pending", "job_id": None, "reason": None, "result": None},
        "dave": {"status": checkouts.SUBMITTED, "job_id": "77", "reason": None, "result": None},
        "erin": {"status": "running", "job_id": "78", "reason": None, "result": None},   # not a status we write
        # frank: no entry at all (the run was interrupted before he was reached)
        "zed": {"status": checkouts.DIED, "job_id": "9", "reason": "x", "result": None},  # gone from DIR
    }
    set_state(out, left)
    capsys.readouterr()
    before = count(runs)
    assert grade_checkouts(root, out, "--cluster", "debug", "--resume") == 0
    assert sorted(ran(runs, before)) == ["bob", "carol", "dave", "erin", "frank"]
    assert "5 checkout(s) to run, 1 already finished" in capsys.readouterr().out
    after = state_of(out)
    assert set(after) == set(STUDENTS)                                    # zed dropped
    assert {s: e["status"] for s, e in after.items()} == dict.fromkeys(STUDENTS, checkouts.FINISHED)
    assert after["alice"] == first["alice"]                               # kept as it was, not re-run
    assert all(g["verdict"] == "pass" for g in grades(out).values()) and list(grades(out)) == list(STUDENTS)


def test_without_resume_everyone_runs_again(tmp_path, runs):
    root, out = make_students(tmp_path / "class", ("alice", "bob")), tmp_path / "out"
    assert grade_checkouts(root, out, "--cluster", "debug") == 0
    before = count(runs)
    set_state(out, {"alice": {**state_of(out)["alice"]}, "bob": {"status": "pending", "job_id": None}})
    assert grade_checkouts(root, out, "--cluster", "debug") == 0
    assert sorted(ran(runs, before)) == ["alice", "bob"]


def test_resume_with_everything_finished_runs_nothing_and_merges_again(tmp_path, runs, capsys):
    root, out = make_students(tmp_path / "class", ("alice", "bob")), tmp_path / "out"
    (root / "bob" / "Megatron-LM" / "STUB").write_text("fail-final-loss")
    assert grade_checkouts(root, out, "--cluster", "debug") == 1
    before = count(runs)
    (out / "grades.json").unlink()
    capsys.readouterr()
    assert grade_checkouts(root, out, "--cluster", "debug", "--resume") == 1
    assert ran(runs, before) == []
    assert "0 checkout(s) to run, 2 already finished" in capsys.readouterr().out
    got = grades(out)
    assert got["alice"]["verdict"] == "pass" and got["bob"]["failed"] == ["final-loss"]


@pytest.mark.parametrize("status,job_id,diagnosis", [
    (checkouts.DIED, "3", "task-died"), (checkouts.SUBMITTED, "41", "not-finished"), ("pending", None, "not-finished"),
    ("running", "5", "not-finished"), (None, None, "not-finished")])
def test_merge_grades_every_unfinished_state_died_with_why(tmp_path, status, job_id, diagnosis):
    """The merge: each state that is not finished is a 'died' grade naming the state, the job and --resume; every
    writer (JSON, CSV, Markdown, JUnit, Gradescope) gets it, with 0 points."""
    profile = load_profile("megatron-lm")
    from harness.cli import gradescope
    weights = gradescope.load_weights(gradescope.WEIGHTS_DIR / "checkout-weights.toml")
    checkout = tmp_path / "class" / "amy" / "Megatron-LM"
    state = {"students": {} if status is None else {
        "amy": {"status": status, "job_id": job_id, "reason": "the node failed [NODE_FAIL, job 3]", "result": None}}}
    out = tmp_path / "out"
    out.mkdir()
    (grade,) = [g.to_dict() for g in checkouts.merge([("amy", checkout, None)], state, profile, weights, out)]
    assert grade["verdict"] == "died" and grade["diagnosis_id"] == diagnosis and grade["criteria"] == []
    assert "--resume" in grade["diagnosis"]
    if status == checkouts.DIED:
        assert "the node failed [NODE_FAIL, job 3]" in grade["diagnosis"]
    else:
        assert f"({status}, job {job_id})" in grade["diagnosis"]
    result = json.loads((out / "gradescope" / "amy" / "results.json").read_text())
    assert result["score"] == 0 and all(t["status"] == "failed" for t in result["tests"])
    assert "**DIED**" in (out / "grades.md").read_text()
    assert "died" in (out / "grades.csv").read_text()
    assert (out / "grades-junit.xml").read_bytes().count(b"<testcase") >= 1


def test_merge_of_a_student_without_a_checkout_is_never_run_and_says_why(tmp_path):
    profile = load_profile("megatron-lm")
    from harness.cli import gradescope
    weights = gradescope.load_weights(gradescope.WEIGHTS_DIR / "checkout-weights.toml")
    out = tmp_path / "out"
    out.mkdir()
    (grade,) = [g.to_dict() for g in checkouts.merge([("ann", None, "no Megatron-LM/ folder")], {"students": {}},
                                                     profile, weights, out)]
    assert grade["diagnosis_id"] == "no-checkout" and grade["verdict"] == "fail"


# ---------------------------------------------------------------- an in-process stand-in for Slurm


class FakeJob:
    def __init__(self, job_id: str, spec, fate: str):
        self.job_id, self.spec, self.fate = job_id, spec, fate
        self.state = "COMPLETED" if fate == "ok" else fate

    def done(self) -> bool:
        return True

    def result(self):
        if self.fate != "ok":
            raise RuntimeError(f"job {self.job_id} has not produced any output (state: {self.fate})")
        return task.run_task(self.spec)


class FakeSlurm:
    """submit/map_array like submitit's executors; each student's fate (ok, NODE_FAIL, ...) from `fates`."""

    cluster = "slurm"

    def __init__(self, fates: dict, log: list):
        self.fates, self.log, self.next_id = fates, log, 100

    def _job(self, spec):
        self.next_id += 1
        self.log.append(("submit", spec.student))
        return FakeJob(str(self.next_id), spec, self.fates.get(spec.student, "ok"))

    def map_array(self, fn, specs):
        return [self._job(s) for s in specs]

    def submit(self, fn, spec):
        return self._job(spec)


@pytest.fixture
def slurm(monkeypatch):
    """grade-checkouts on the stand-in: which cluster, the executor, and the reattach by job id."""
    fates, log = {}, []
    monkeypatch.setattr(checkouts, "which_cluster", lambda args: "slurm")
    monkeypatch.setattr(checkouts, "make_executor", lambda args, folder, n: FakeSlurm(fates, log))

    def reattach(executor, students, entries):
        for name in students:
            log.append(("reattach", name, entries[name]["job_id"]))
            spec = task.TaskSpec(student=name, checkout=entries[name]["checkout_for_test"], task_dir=entries[name]
                                 ["task_dir_for_test"], suite=str(REPO), command=tuple(shlex.split(STUB_COMMAND)))
            checkouts._collect(name, FakeJob(entries[name]["job_id"], spec, fates.get(name, "ok")), entries)

    monkeypatch.setattr(checkouts, "reattach", reattach)
    return fates, log


def test_slurm_states_no_wait_then_resume_waits_for_submitted_and_resubmits_the_rest(tmp_path, runs, slurm):
    """--no-wait leaves every student submitted with its job id; --resume waits for those by job id (never
    submits them twice), submits again a died one and one submitted without a job id; a job that dies on the
    scheduler is 'died' with its state and reason."""
    fates, log = slurm
    root, out = make_students(tmp_path / "class", ("alice", "bob", "carol", "dave")), tmp_path / "out"
    assert grade_checkouts(root, out, "--cluster", "slurm", "--no-wait") == 0
    st = state_of(out)
    assert {s: e["status"] for s, e in st.items()} == dict.fromkeys(("alice", "bob", "carol", "dave"), "submitted")
    assert len({e["job_id"] for e in st.values()}) == 4 and not (out / "grades.json").exists()
    assert [x for x in log if x[0] == "submit"] == [("submit", s) for s in ("alice", "bob", "carol", "dave")]

    # alice and bob still submitted (known job ids), carol died earlier, dave submitted but his id was lost
    for name in ("alice", "bob"):
        st[name].update(checkout_for_test=str((root / name / "Megatron-LM").resolve()),
                        task_dir_for_test=str((out / "tasks" / name).resolve()))
    st["carol"].update(status=checkouts.DIED, reason="the job was preempted by the scheduler [PREEMPTED, job 9]")
    st["dave"]["job_id"] = None
    set_state(out, st)
    fates["bob"] = "NODE_FAIL"
    log.clear()
    # a died task is not a pass: exit 1 (any failed or died) or, where the grader tells its own failures apart, 3
    assert grade_checkouts(root, out, "--cluster", "slurm", "--resume") in (1, 3)
    assert sorted(x[1] for x in log if x[0] == "reattach") == ["alice", "bob"]
    assert sorted(x[1] for x in log if x[0] == "submit") == ["carol", "dave"]
    after = state_of(out)
    assert {s: e["status"] for s, e in after.items()} == {"alice": "finished", "bob": "died", "carol": "finished",
                                                          "dave": "finished"}
    assert "the node failed [NODE_FAIL" in after["bob"]["reason"]
    got = grades(out)
    assert got["bob"]["verdict"] == "died" and got["bob"]["diagnosis_id"] == "task-died"
    assert all(got[s]["verdict"] == "pass" for s in ("alice", "carol", "dave"))


def test_interrupted_run_leaves_a_state_that_resume_completes(tmp_path, runs, monkeypatch):
    """An interrupt while the second task runs: the first stays finished in the state file, the others are left
    pending/submitted; --resume runs exactly those."""
    root, out = make_students(tmp_path / "class", ("alice", "bob", "carol")), tmp_path / "out"
    real = task.run_task
    calls = []

    def interrupted(spec):
        calls.append(spec.student)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(spec)

    monkeypatch.setattr(task, "run_task", interrupted)
    assert grade_checkouts(root, out, "--cluster", "debug") == 2      # interrupted (harness.cli.args)
    st = state_of(out)
    assert st["alice"]["status"] == checkouts.FINISHED
    assert st["bob"]["status"] in ("pending", checkouts.SUBMITTED) and st["carol"]["status"] in ("pending", checkouts.SUBMITTED)
    monkeypatch.setattr(task, "run_task", real)
    before = count(runs)
    assert grade_checkouts(root, out, "--cluster", "debug", "--resume") == 0
    assert sorted(ran(runs, before)) == ["bob", "carol"]
    assert {s: e["status"] for s, e in state_of(out).items()} == dict.fromkeys(("alice", "bob", "carol"), "finished")
