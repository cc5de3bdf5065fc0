"""`python -m harness grade-checkouts DIR` on CPU: submitit's debug and local executors with a stub checkout mode.

The stub (checkout_stub.py) stands in for `pytest -m gpu acceptance/test_checkout.py`: no GPU, no Megatron-LM. Each
fake checkout holds a STUB file saying what the run does (pass, fail a criterion, kill its job, hang, write no
JUnit). The Slurm path is checked without a cluster: a fake srun/sbatch on PATH captures the script submitit submits.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from harness.__main__ import build_parser
from harness.cli.cluster import checkouts, task
from harness.base.paths import REPO
from harness.judge.profiles import load_profile

STUB = Path(__file__).parents[1] / "checkout_stub.py"
STUB_COMMAND = f"{{python}} {shlex.quote(str(STUB))} --megatron-lm {{checkout}} --run-dir {{run_dir}} --junitxml {{junit}}"


def make_students(root: Path, behaviours: dict) -> Path:
    """DIR/<student>/Megatron-LM/ with megatron/ and a STUB file; `behaviours`: student -> STUB text."""
    for student, behaviour in behaviours.items():
        checkout = root / student / "Megatron-LM"
        (checkout / "megatron" / "core").mkdir(parents=True)
        (checkout / "STUB").write_text(behaviour)
    return root


def grade_checkouts(root: Path, out: Path, *extra: str) -> int:
    args = build_parser().parse_args(["grade-checkouts", str(root), "--out", str(out), "--task-command", STUB_COMMAND,
                                      *extra])
    return checkouts.main(args)


def runs(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def grades(out: Path) -> dict:
    return {g["submission"]: g for g in json.loads((out / "grades.json").read_text())}


def test_debug_executor_grades_each_checkout_in_its_own_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(tmp_path / "runs.jsonl"))
    root = make_students(tmp_path / "class", {"alice": "pass", "bob": "fail-final-loss"})
    (root / "alice" / "train_script.py").write_text("print('alice trains')\n")
    (root / "carol").mkdir()                                  # no checkout
    make_students(root, {"dave": "pass"})
    (root / "dave" / "Megatron-LM" / "megatron" / "peek").symlink_to(root / "alice")   # a link to another student
    out = tmp_path / "out"

    assert grade_checkouts(root, out, "--cluster", "debug") == 1
    got = grades(out)
    assert list(got) == ["alice", "bob", "carol", "dave"]
    assert got["alice"]["verdict"] == "pass" and got["alice"]["failed"] == []
    assert len(got["alice"]["criteria"]) == 16 and got["alice"]["task"]["returncode"] == 0
    assert got["bob"]["verdict"] == "fail" and got["bob"]["failed"] == ["final-loss"]
    assert "lm loss 9.1" in next(c["message"] for c in got["bob"]["criteria"] if c["id"] == "final-loss")
    assert got["carol"]["diagnosis_id"] == "no-checkout" and "Megatron-LM" in got["carol"]["diagnosis"]
    assert got["dave"]["diagnosis_id"] == "no-checkout" and "links out of the student's folder" in got["dave"]["diagnosis"]

    seen = {r["argv"][r["argv"].index("--megatron-lm") + 1]: r for r in runs(tmp_path / "runs.jsonl")}
    assert sorted(seen) == [str((out / "tasks" / s / "Megatron-LM").resolve()) for s in ("alice", "bob")]
    alice = next(r for r in seen.values() if "alice" in r["argv"][1])
    assert alice["argv"][alice["argv"].index("--train-script") + 1] == str((out / "tasks/alice/script/train_script.py").resolve())
    assert not any("bob" in a for a in alice["argv"]) and not any(r["grades_visible"] for r in seen.values())
    assert alice["cwd"] == str(REPO)
    assert not (out / "tasks" / "alice" / "Megatron-LM").exists()          # the copy is removed after the run

    for name in ("grades.md", "grades.csv", "grades-junit.xml"):
        assert (out / name).stat().st_size > 0, name
    assert "**FAIL**" in (out / "grades.md").read_text() and "final-loss" in (out / "grades.md").read_text()
    scores = {s: json.loads((out / "gradescope" / s / "results.json").read_text())["score"] for s in got}
    assert scores == {"alice": 100.0, "bob": 90.0, "carol": 0.0, "dave": 0.0}


def test_local_executor_reports_a_dead_task_and_resume_reruns_only_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(tmp_path / "runs.jsonl"))
    root = make_students(tmp_path / "class", {"alice": "pass", "bob": "die", "carol": "pass"})
    out = tmp_path / "out"

    assert grade_checkouts(root, out, "--cluster", "local", "--gpus", "none") == 3   # a died task: not judged
    got = grades(out)
    assert [got[s]["verdict"] for s in ("alice", "bob", "carol")] == ["pass", "died", "pass"]
    assert got["bob"]["diagnosis_id"] == "task-died" and "--resume" in got["bob"]["diagnosis"]
    assert "job" in got["bob"]["diagnosis_cause"]
    assert "has not produced any output" in got["bob"]["diagnosis_cause"]      # submitit's words, kept
    state = json.loads((out / checkouts.STATE_FILE).read_text())["students"]
    assert {s: e["status"] for s, e in state.items()} == {"alice": "finished", "bob": "died", "carol": "finished"}
    assert "**DIED**" in (out / "grades.md").read_text()

    (root / "bob" / "Megatron-LM" / "STUB").write_text("pass")       # the node is back
    before = len(runs(tmp_path / "runs.jsonl"))
    assert grade_checkouts(root, out, "--cluster", "local", "--gpus", "none", "--resume") == 0
    again = runs(tmp_path / "runs.jsonl")[before:]
    assert [Path(r["argv"][r["argv"].index("--megatron-lm") + 1]).parent.name for r in again] == ["bob"]
    assert all(g["verdict"] == "pass" for g in grades(out).values())
    assert not again[0]["grades_visible"]                              # earlier grades removed before the rerun


def test_local_executor_gives_each_task_its_own_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(tmp_path / "runs.jsonl"))
    root = make_students(tmp_path / "class", {"alice": "pass", "bob": "pass"})
    assert grade_checkouts(root, tmp_path / "out", "--cluster", "local", "--gpus", "0,1") == 0
    assert sorted(r["cuda_visible_devices"] for r in runs(tmp_path / "runs.jsonl")) == ["0", "1"]


def _task(tmp_path, behaviour: str, timeout_s: float = 120.0) -> tuple[dict, dict]:
    checkout = make_students(tmp_path / "class", {"eve": behaviour}) / "eve" / "Megatron-LM"
    spec = task.TaskSpec(student="eve", checkout=str(checkout), task_dir=str(tmp_path / "t"), suite=str(REPO),
                         command=tuple(shlex.split(STUB_COMMAND)), timeout_s=timeout_s)
    result = task.run_task(spec)
    return result, task.grade_from_task("eve", str(checkout), result, load_profile("megatron-lm")).to_dict()


def test_task_that_hangs_is_stopped_at_its_time_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(tmp_path / "runs.jsonl"))
    result, grade = _task(tmp_path, "hang", timeout_s=2)
    assert result["timed_out"] and result["seconds"] < 60
    assert grade["verdict"] == "fail" and grade["diagnosis_id"] == "task-timeout" and "--time" in grade["diagnosis"]


def test_task_without_junit_names_the_exit_code_and_the_output(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(tmp_path / "runs.jsonl"))
    result, grade = _task(tmp_path, "no-junit")
    assert result["returncode"] == 4 and result["junit"] is None
    assert grade["diagnosis_id"] == "task-error" and "exited with code 4" in grade["diagnosis"]
    assert "usage: pytest" in grade["diagnosis"]


def test_default_command_is_checkout_mode(tmp_path):
    spec = task.TaskSpec(student="eve", checkout="C", task_dir=str(tmp_path / "t"), suite=str(REPO),
                         train_script="S.py", criteria="megatron-lm")
    argv = task.command_for(spec, tmp_path / "t" / "Megatron-LM", tmp_path / "t" / "script" / "S.py")
    assert argv[:6] == [sys.executable, "-m", "pytest", "-m", "gpu", "acceptance/test_checkout.py"]
    assert (REPO / argv[5]).is_file()
    for flag, value in (("--megatron-lm", tmp_path / "t" / "Megatron-LM"), ("--run-dir", tmp_path / "t" / "run"),
                        ("--junitxml", tmp_path / "t" / "junit.xml"),
                        ("--train-script", tmp_path / "t" / "script" / "S.py"), ("--criteria", "megatron-lm")):
        assert argv[argv.index(flag) + 1] == str(value), flag


# ---------------------------------------------------------------- Slurm, without a cluster

FAKE_SBATCH = """#!/bin/sh
cp "$1" "$SBATCH_CAPTURE"
echo "Submitted batch job 4242"
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """srun and sbatch on PATH: submitit picks Slurm; sbatch keeps the script it was given and answers job 4242."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    for tool in ("srun", "sbatch"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("SBATCH_CAPTURE", str(tmp_path / "submitted.sbatch"))
    return tmp_path / "submitted.sbatch"


SLURM_OPTIONS = ("--partition", "gpu", "--account", "course", "--qos", "normal", "--time", "20", "--parallelism", "2",
                 "--cpus", "6", "--mem-gb", "48")


def test_slurm_array_is_submitted_with_the_course_parameters(tmp_path, fake_slurm, capsys):
    root = make_students(tmp_path / "class", {"alice": "pass", "bob": "pass", "carol": "pass"})
    out = tmp_path / "out"
    assert grade_checkouts(root, out, *SLURM_OPTIONS, "--no-wait") == 0
    script = fake_slurm.read_text()
    for line in ("#SBATCH --array=0-2%2", "#SBATCH --gpus-per-node=1", "#SBATCH --partition=gpu",
                 "#SBATCH --account=course", "#SBATCH --qos=normal", "#SBATCH --time=20", "#SBATCH --cpus-per-task=6",
                 "#SBATCH --mem=48GB", "#SBATCH --job-name=bert-checkout", "#SBATCH --ntasks-per-node=1",
                 f"export PYTHONPATH={REPO}"):
        assert line in script, (line, script)
    assert "submitit.core._submit" in script and str((out / "submitit").resolve()) in script
    state = json.loads((out / checkouts.STATE_FILE).read_text())["students"]
    assert {s: (e["status"], e["job_id"]) for s, e in state.items()} == {
        "alice": ("submitted", "4242_0"), "bob": ("submitted", "4242_1"), "carol": ("submitted", "4242_2")}

    capsys.readouterr()
    assert grade_checkouts(root, out, *SLURM_OPTIONS, "--print-sbatch") == 0
    assert capsys.readouterr().out.strip() == script.strip()        # --print-sbatch shows exactly what is submitted


def test_slurm_executor_parameters(tmp_path, fake_slurm):
    args = build_parser().parse_args(["grade-checkouts", str(tmp_path), *SLURM_OPTIONS])
    executor = checkouts.make_executor(args, tmp_path / "submitit", 300)
    params = executor._executor.parameters
    assert executor.cluster == "slurm"
    assert {k: params[k] for k in ("partition", "account", "qos", "time", "gpus_per_node", "cpus_per_task", "mem",
                                   "array_parallelism", "job_name")} == {
        "partition": "gpu", "account": "course", "qos": "normal", "time": 20, "gpus_per_node": 1, "cpus_per_task": 6,
        "mem": "48GB", "array_parallelism": 2, "job_name": "bert-checkout"}


def test_refused_submission_is_a_usage_error_that_keeps_the_state(tmp_path, fake_slurm, capsys):
    (fake_slurm.parent / "bin" / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified: gpux' >&2\n"
                                                        "exit 1\n")
    root = make_students(tmp_path / "class", {"alice": "pass"})
    assert grade_checkouts(root, tmp_path / "out", "--partition", "gpux") == 4
    err = capsys.readouterr().err
    assert "submitting to slurm failed" in err and "invalid partition" in err and "--resume" in err
    assert json.loads((tmp_path / "out" / checkouts.STATE_FILE).read_text())["students"]["alice"]["status"] == "pending"


def test_usage_errors_name_the_fix(tmp_path, capsys):
    assert grade_checkouts(tmp_path / "missing", tmp_path / "out") == 4
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert grade_checkouts(tmp_path / "empty", tmp_path / "out") == 4
    assert "Megatron-LM" in capsys.readouterr().err
    make_students(tmp_path / "class", {"alice": "pass"})
    if __import__("shutil").which("srun") is None:
        assert grade_checkouts(tmp_path / "class", tmp_path / "out", "--cluster", "slurm") == 4
        assert "--cluster local" in capsys.readouterr().err
