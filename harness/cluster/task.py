"""One grading job: a student's checkout, copied into its own folder, run through checkout mode; and its grade.

`run_task(spec)` runs inside the submitit job (on a Slurm node, in a local process, or in-process for `debug`).
It sees only its TaskSpec: that student's checkout and train script (copied into the task's own folder first),
its own run folder, and the command to run (checkout mode by default:
`pytest -m gpu acceptance/test_checkout.py --megatron-lm COPY --run-dir RUN --junitxml JUNIT`; a test injects a
stub). It never raises: whatever happens comes back in the returned dict, which the submitting process turns into a
grade with `grade_from_task` (the shape harness.grade.grade_one returns), so the usual writers apply.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from harness.judge import criteria, junit

CHECKOUT_TEST = "acceptance/test_checkout.py"
# {python}, {checkout}, {run_dir}, {junit} are filled in per task; --train-script FILE and --criteria NAME are
# appended when given. The suite's folder is the working directory.
DEFAULT_COMMAND = ("{python}", "-m", "pytest", "-m", "gpu", CHECKOUT_TEST, "-p", "no:cacheprovider",
                   "--megatron-lm", "{checkout}", "--run-dir", "{run_dir}", "--junitxml", "{junit}")
CRITERION_TEST = "test_checkout_meets_criterion["
CAN_TRAIN_TEST = "test_checkout_can_train_here"
TAIL = 30
OUTCOME_STATUS = {"passed": criteria.PASS, "failed": criteria.FAIL, "error": criteria.FAIL,
                  "skipped": criteria.NOT_MEASURABLE}


@dataclass(frozen=True)
class TaskSpec:
    """Everything one job needs; nothing about any other student."""

    student: str
    checkout: str                  # the student's checkout (read only: the job works on a copy)
    task_dir: str                  # the job's own folder: copy, run folder, JUnit, log (emptied first)
    suite: str                     # the suite's folder (the command's working directory)
    command: tuple = DEFAULT_COMMAND
    train_script: str | None = None
    criteria: str | None = None
    timeout_s: float = 1500.0
    keep_copy: bool = False
    env: dict = field(default_factory=dict)     # extra environment (CUDA_VISIBLE_DEVICES for a local job)


def task_paths(task_dir: str | os.PathLike) -> dict:
    """The files of a task folder."""
    root = Path(task_dir)
    return {"copy": root / "Megatron-LM", "run_dir": root / "run", "junit": root / "junit.xml",
            "log": root / "task.log", "script_dir": root / "script"}


def command_for(spec: TaskSpec, copy: Path, script: Path | None) -> list[str]:
    """The command template filled in for this task, with --train-script and --criteria appended when given."""
    paths = task_paths(spec.task_dir)
    values = {"python": sys.executable, "checkout": str(copy), "run_dir": str(paths["run_dir"]),
              "junit": str(paths["junit"]), "suite": spec.suite}
    argv = [part.format(**values) for part in spec.command]
    if script is not None:
        argv += ["--train-script", str(script)]
    if spec.criteria:
        argv += ["--criteria", spec.criteria]
    return argv


def run_task(spec: TaskSpec) -> dict:
    """Copy the checkout, run the command under a time limit, and report what it left (never raises)."""
    started, paths = time.monotonic(), task_paths(spec.task_dir)
    result = {"student": spec.student, "host": platform.node(), "returncode": None, "timed_out": False,
              "seconds": 0.0, "junit": None, "report": None, "tail": "", "error": None}
    try:
        shutil.rmtree(spec.task_dir, ignore_errors=True)
        Path(spec.task_dir).mkdir(parents=True)
        shutil.copytree(spec.checkout, paths["copy"], symlinks=True)
        script = None
        if spec.train_script:
            paths["script_dir"].mkdir()
            script = Path(shutil.copy2(spec.train_script, paths["script_dir"]))
        argv = command_for(spec, paths["copy"], script)
        result["command"] = argv
        env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
        with paths["log"].open("wb") as log:
            log.write(f"$ cd {shlex.quote(spec.suite)} && {shlex.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(argv, cwd=spec.suite, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                result["returncode"] = proc.wait(timeout=spec.timeout_s)
            except subprocess.TimeoutExpired:
                result["timed_out"] = True
                os.killpg(proc.pid, signal.SIGKILL)
                result["returncode"] = proc.wait()
    except Exception as exc:   # noqa: BLE001 - the grade says what went wrong; the job must not die of it
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if not spec.keep_copy:
            shutil.rmtree(paths["copy"], ignore_errors=True)
    result["seconds"] = round(time.monotonic() - started, 2)
    if paths["junit"].is_file():
        result["junit"] = str(paths["junit"])
    report = paths["run_dir"] / "megatron-lm" / "report.json"
    if report.is_file():
        result["report"] = str(report)
    if paths["log"].is_file():
        result["tail"] = "\n".join(paths["log"].read_text(errors="replace").splitlines()[-TAIL:])
    return result


# ---------------------------------------------------------------- a task's files -> a grade


def _junit_cases(path: str) -> dict:
    """test name -> (outcome, properties, failure text), from a pytest JUnit file."""
    return {case.name: (case.outcome, case.properties, case.report) for case in junit.read(path)}


def _report_run(path: str | None) -> dict:
    """The checkout's run entry of report.json ({} when there is none)."""
    import json

    if not path:
        return {}
    try:
        runs = json.loads(Path(path).read_text()).get("runs") or []
    except (OSError, ValueError):
        return {}
    return runs[0] if runs else {}


def base_grade(student: str, checkout: str | None) -> dict:
    """The keys every grade has (harness.grade.grade_one's shape), for a submission not judged yet."""
    return {"submission": student, "log": None, "save_dir": None, "checkout": checkout, "verdict": "fail",
            "failed": [], "not_measured": [], "recipe": None, "recipe_detected_by": None, "diagnosis": None,
            "diagnosis_id": None, "diagnosis_cause": None, "criteria": [], "loss_curve": None}


def not_judged(grade: dict, cause_id: str, cause: str, fix: str, verdict: str = "fail") -> dict:
    """A grade with no criteria: why, and what to do."""
    return {**grade, "verdict": verdict, "failed": ["submission"], "diagnosis": f"{cause}: {fix}",
            "diagnosis_id": cause_id, "diagnosis_cause": cause}


def grade_from_task(student: str, checkout: str, result: dict, profile: criteria.Profile) -> dict:
    """A finished task's grade: one entry per criterion from its JUnit file, the root cause from its report."""
    grade = {**base_grade(student, checkout), "task": {k: result.get(k) for k in
                                                       ("host", "returncode", "timed_out", "seconds", "error")}}
    tail = result.get("tail") or "(no output)"
    if result.get("error"):
        return not_judged(grade, "task-error", f"the grading job could not run checkout mode: {result['error']}",
                          "check the checkout folder can be copied and the suite is installed on the node")
    if result.get("timed_out"):
        return not_judged(grade, "task-timeout", f"checkout mode did not finish within {result.get('seconds')} s; "
                                                 f"last lines:\n{tail}",
                          "give the jobs more time (--time) or look for a hang in the task log")
    if not result.get("junit"):
        return not_judged(grade, "task-error", f"checkout mode exited with code {result.get('returncode')} and "
                                               f"wrote no JUnit file; last lines:\n{tail}",
                          "run the task's command by hand (task.log has it) and fix the usage error it prints")
    try:
        cases = _junit_cases(result["junit"])
    except (OSError, ET.ParseError) as exc:
        return not_judged(grade, "task-error", f"checkout mode's JUnit file {result['junit']} is unreadable ({exc})",
                          "run the task's command by hand (task.log has it) and look at what it printed")
    run = _report_run(result.get("report"))
    verdicts = {v["id"]: v for v in run.get("verdicts") or []}
    cause = run.get("diagnosis")
    if cause:
        grade.update(diagnosis=f"{cause['cause']}: {cause['remedy']}", diagnosis_id=cause["id"],
                     diagnosis_cause=cause["cause"])
    elif cases.get(CAN_TRAIN_TEST, ("passed",))[0] != "passed":
        reason = cases[CAN_TRAIN_TEST][2] or "the checkout could not be trained"
        grade.update(diagnosis=reason, diagnosis_id="cannot-train", diagnosis_cause=reason.split(". Fix:")[0])
    for c in profile.criteria:
        case = cases.get(f"{CRITERION_TEST}{c.id}]")
        if case is None:
            continue
        outcome, props, text = case
        v = verdicts.get(c.id, {})
        status = props.get("status") or OUTCOME_STATUS[outcome]
        measured = props.get("measured") or v.get("measured") or text.split("\n")[0]
        expected = props.get("expected") or v.get("expected") or ""
        message = text if status != criteria.PASS else criteria.PASS_TEMPLATE.format(
            label=c.label, criterion_id=c.id, measured=measured, expected=expected)
        grade["criteria"].append({"id": c.id, "label": c.label, "status": status, "measured": measured,
                                  "expected": expected, "where": v.get("where", ""),
                                  "consequence_of": v.get("consequence_of"), "message": message})
    grade["recipe"] = run.get("recipe")
    grade["log"] = run.get("log")
    grade["failed"] = [c["id"] for c in grade["criteria"] if c["status"] == criteria.FAIL]
    grade["not_measured"] = [c["id"] for c in grade["criteria"] if c["status"] == criteria.NOT_MEASURABLE]
    if not grade["criteria"]:
        return not_judged(grade, grade["diagnosis_id"] or "no-criteria",
                          grade["diagnosis_cause"] or f"checkout mode ran (exit code {result.get('returncode')}) "
                                                      "but judged no criterion",
                          "read the task's JUnit file and task.log")
    grade["verdict"] = "fail" if grade["failed"] or grade["diagnosis_id"] else "pass"
    return grade
