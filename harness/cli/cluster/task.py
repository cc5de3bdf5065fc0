"""One grading job: a student's checkout, copied into its own folder, run through checkout mode; and its grade.

`run_task(spec)` runs inside the submitit job (on a Slurm node, in a local process, or in-process for `debug`).
It sees only its TaskSpec: that student's checkout and train script (copied into the task's own folder first),
its own run folder, and the command to run (checkout mode by default:
`pytest -m gpu acceptance/test_checkout.py --megatron-lm COPY --run-dir RUN --junitxml JUNIT`; a test injects a
stub). It never raises: whatever happens comes back in the returned dict, which the submitting process turns into a
grade with `grade_from_task` (the shape harness.cli.grade.grade_one returns), so the usual writers apply.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from harness.cli.cluster import outdir
from harness.judge import criteria
from harness.judge.grade_record import CriterionEntry, Grade
from harness.report import junit
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, Profile

CHECKOUT_TEST = "acceptance/test_checkout.py"
# {python}, {checkout}, {run_dir}, {junit} are filled in per task; --train-script FILE and --criteria NAME are
# appended when given. The suite's folder is the working directory.
DEFAULT_COMMAND = ("{python}", "-m", "pytest", "-m", "gpu", CHECKOUT_TEST, "-p", "no:cacheprovider",
                   "--megatron-lm", "{checkout}", "--run-dir", "{run_dir}", "--junitxml", "{junit}")
CRITERION_TEST = "test_checkout_meets_criterion["
CAN_TRAIN_TEST = "test_checkout_can_train_here"
TAIL = 30
# the grading machine's fault, never the student's: a task that found no GPU, or no working CUDA
MACHINE_FAULT = re.compile(r"needs \d+ CUDA GPU\(s\), found \d+|No CUDA GPUs are available|no usable CUDA GPU|"
                           r"CUDA driver initialization failed|Found no NVIDIA driver")
NO_GPU_EXIT = 3                    # checkout mode's exit when it stops for want of a usable CUDA GPU (conftest.py)
MACHINE_CAUSES = ("no-gpu",)       # diagnose's rule ids that are the machine's
GRADER_FAULTS = ("task-died", "not-finished", "no-gpu", "task-error-grader")   # diagnosis ids judged "died"
OUTCOME_STATUS = {"passed": PASS, "failed": FAIL, "error": FAIL,
                  "skipped": NOT_MEASURABLE}


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
    out_root: str | None = None    # OUT, when task_dir is OUT/tasks/<student>: every removal walks from it, no link


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
    base, parts = _task_parts(spec)
    try:
        owned = spec.out_root is not None
        outdir.remove(base, *parts, owned=owned)
        outdir.real_dir(base, *parts, owned=owned)
        copy_checkout(spec.checkout, paths["copy"])
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
        result["grader_fault"] = isinstance(exc, outdir.OutError)
    finally:
        if not spec.keep_copy:
            try:
                outdir.remove(base, *parts, "Megatron-LM", owned=spec.out_root is not None)
            except (OSError, outdir.OutError) as exc:   # noqa: PERF203 - reported, never followed
                result["error"] = result["error"] or f"removing the copy: {type(exc).__name__}: {exc}"
    result["seconds"] = round(time.monotonic() - started, 2)
    if paths["junit"].is_file():
        result["junit"] = str(paths["junit"])
    report = paths["run_dir"] / "megatron-lm" / "report.json"
    if report.is_file():
        result["report"] = str(report)
    if paths["log"].is_file():
        result["tail"] = "\n".join(paths["log"].read_text(errors="replace").splitlines()[-TAIL:])
    return result


def _task_parts(spec: TaskSpec) -> tuple[Path, tuple[str, ...]]:
    """(the folder removals start from, the names below it): OUT and ("tasks", student), else the task's parent."""
    task_dir = Path(spec.task_dir)
    if spec.out_root:
        relative = task_dir.relative_to(spec.out_root)
        return Path(spec.out_root), relative.parts
    return task_dir.parent, (task_dir.name,)


class LinkOut(Exception):
    """A link in a student's checkout whose target leaves it (the copy would follow it later)."""


class CopyRefused(LinkOut):
    """A checkout the copy refuses: an entry that is not a regular file, folder or inside link (a device node,
    FIFO, socket), a file or the whole copy over its size bound, too many entries or too deep, or an entry that
    changed while it was copied."""


COPY_MAX_FILE_BYTES = 1 << 30        # one file (its apparent size: a sparse file counts whole)
COPY_MAX_TOTAL_BYTES = 8 << 30       # the whole checkout (Megatron-LM's own checkout with .git: ~0.3 GB)
COPY_MAX_ENTRIES = 200_000           # files, folders and links (Megatron-LM's checkout with .git: ~6,000)
COPY_MAX_DEPTH = 256


def copy_checkout(source: str | os.PathLike, dest: Path, max_file: int = COPY_MAX_FILE_BYTES,
                  max_total: int = COPY_MAX_TOTAL_BYTES, max_entries: int = COPY_MAX_ENTRIES,
                  max_depth: int = COPY_MAX_DEPTH) -> None:
    """Copy a student's checkout without following any link, iteratively: folders and regular files are opened
    relative to their folder's fd with O_NOFOLLOW and checked by fstat to be what was listed (a file swapped for a
    link or another file meanwhile is refused, never followed); links stay links, and a link whose target leaves
    the checkout (absolute, or `..` past its root) is refused, so nothing outside it is read through the copy; a
    device node, FIFO or socket is refused (never read); a file's apparent size, the total, the number of entries
    and the depth are bounded (CopyRefused names which). Each file's bytes are copied up to its size when listed
    and no further; after the copy, the copy is walked again and any link leaving it is refused."""
    import stat

    root = Path(source).resolve()
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    flags_file = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    dest = Path(dest)
    dest.mkdir()
    total, entries = 0, 0
    stack = [(os.open(root, flags_dir), dest, Path(), 0)]
    try:
        while stack:
            dfd, to, rel, depth = stack.pop()
            try:
                with os.scandir(dfd) as it:
                    names = sorted(e.name for e in it)
                for name in names:
                    entries += 1
                    if entries > max_entries:
                        raise CopyRefused(f"more than {max_entries:,} entries: over the copy's bound")
                    where = rel / name
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISLNK(st.st_mode):
                        target = os.readlink(name, dir_fd=dfd)
                        if os.path.isabs(target) or not (root / rel / target).resolve().is_relative_to(root):
                            raise LinkOut(f"{where} -> {target}: a link out of the student's checkout")
                        os.symlink(target, to / name)
                    elif stat.S_ISDIR(st.st_mode):
                        if depth + 1 > max_depth:
                            raise CopyRefused(f"{where}: folders nested deeper than {max_depth}")
                        sub = os.open(name, flags_dir, dir_fd=dfd)
                        if (os.fstat(sub).st_ino, os.fstat(sub).st_dev) != (st.st_ino, st.st_dev):
                            os.close(sub)
                            raise CopyRefused(f"{where}: changed while the checkout was copied")
                        (to / name).mkdir()
                        stack.append((sub, to / name, where, depth + 1))
                    elif stat.S_ISREG(st.st_mode):
                        if st.st_size > max_file:
                            raise CopyRefused(f"{where}: {st.st_size:,} bytes (apparent size, sparse or not), over "
                                              f"the copy's bound of {max_file:,} for one file")
                        total += st.st_size
                        if total > max_total:
                            raise CopyRefused(f"the checkout is over the copy's bound of {max_total:,} bytes")
                        _copy_file(dfd, name, where, st, to / name, flags_file)
                    else:
                        raise CopyRefused(f"{where}: not a regular file, folder or link (a device node, FIFO or "
                                          "socket): never read")
            finally:
                os.close(dfd)
    except BaseException:
        for dfd, *_ in stack:
            os.close(dfd)
        raise
    folders, real = [dest], dest.resolve()            # checked after the copy too (iteratively: any depth)
    while folders:
        with os.scandir(folders.pop()) as it:
            for entry in it:
                path = Path(entry.path)
                if entry.is_symlink():
                    if not path.resolve().is_relative_to(real):
                        raise LinkOut(f"{path.relative_to(dest)} -> {os.readlink(path)}: a link out of the copied "
                                      "checkout")
                elif entry.is_dir(follow_symlinks=False):
                    folders.append(path)


def _copy_data(fd: int, out: int, size: int) -> None:
    """The first `size` bytes of fd into out, holes kept as holes (SEEK_DATA/SEEK_HOLE: a sparse file stays
    sparse, never written densely), never past `size` whatever the file holds now."""
    import errno

    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        except OSError as exc:
            if exc.errno == errno.ENXIO:             # only a hole is left
                break
            start, end = pos, size                   # no SEEK_DATA here: copy it all
        if start >= size:
            break
        os.lseek(fd, start, os.SEEK_SET)
        os.lseek(out, start, os.SEEK_SET)
        left = end - start
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
            left -= len(chunk)
        pos = end
    os.ftruncate(out, size)


def _copy_file(dfd: int, name: str, where: Path, listed, to: Path, flags: int) -> None:
    """One regular file, by fd: opened without following a link, the same file as listed (inode, size), at most
    its listed size copied; a file that changed meanwhile is refused."""
    import stat

    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except OSError as exc:
        raise CopyRefused(f"{where}: cannot be opened without following a link ({exc.strerror or exc})")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_ino, st.st_dev) != (listed.st_ino, listed.st_dev):
            raise CopyRefused(f"{where}: changed while the checkout was copied (not the file listed)")
        os.set_blocking(fd, True)
        out = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                      stat.S_IMODE(listed.st_mode) | 0o600)
        try:
            _copy_data(fd, out, listed.st_size)
        finally:
            os.close(out)
        after = os.fstat(fd)
        if after.st_size != listed.st_size or (after.st_ino, after.st_dev) != (listed.st_ino, listed.st_dev):
            raise CopyRefused(f"{where}: changed while the checkout was copied ({listed.st_size:,} -> "
                              f"{after.st_size:,} bytes)")
        try:
            now = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            now = None
        if now is None or (now.st_ino, now.st_dev) != (listed.st_ino, listed.st_dev):
            raise CopyRefused(f"{where}: replaced while the checkout was copied (a link or another file now)")
    finally:
        os.close(fd)


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


def _stopped_without_gpu(result: dict) -> str | None:
    """The line with which checkout mode stopped, before any test, on a machine without a usable CUDA GPU (exit
    NO_GPU_EXIT, conftest.py's NO_GPU_STOP), or None."""
    if result.get("returncode") != NO_GPU_EXIT:
        return None
    for line in reversed((result.get("tail") or "").splitlines()):
        if MACHINE_FAULT.search(line):
            return " ".join(line.strip(" !").split())[:400]
    return None


def machine_fault(cases: dict, cause: dict | None) -> str | None:
    """Why this task's outcome is the grading machine's (no GPU, no CUDA), from its JUnit cases and report; None
    when nothing says so. A skip of the can-train test, or any criterion skipped for want of a GPU, is the machine."""
    if cause and cause.get("id") in MACHINE_CAUSES:
        return " ".join(str(cause.get("cause", "")).split())[:300]
    for name, (outcome, _props, text) in cases.items():
        text = " ".join((text or "").split())
        if (name == CAN_TRAIN_TEST or name.startswith(CRITERION_TEST)) and MACHINE_FAULT.search(text):
            return text[:300]
    return None


def base_grade(student: str, checkout: str | None) -> Grade:
    """A student's grade before its checkout is judged (a Grade with its `checkout`)."""
    return Grade(student, checkout=checkout)


def not_judged(grade: Grade, cause_id: str, cause: str, fix: str, verdict: str = "fail") -> Grade:
    """A grade with no criteria: why, and what to do."""
    return grade.update(verdict=verdict, failed=("submission",), diagnosis=f"{cause}: {fix}", diagnosis_id=cause_id,
                        diagnosis_cause=cause)


def grade_from_task(student: str, checkout: str, result: dict, profile: Profile) -> Grade:
    """A finished task's grade: one entry per criterion from its JUnit file, the root cause from its report."""
    grade = Grade(student, checkout=checkout, task={k: result.get(k) for k in
                                                    ("host", "returncode", "timed_out", "seconds", "error")})
    tail = result.get("tail") or "(no output)"
    if result.get("error") and result.get("grader_fault"):
        return not_judged(grade, "task-error-grader", f"the grading job refused its own folder: {result['error']}",
                          "give grade-checkouts an --out it created (or a new one) and run again", verdict="died")
    if result.get("error"):
        return not_judged(grade, "task-error", f"the grading job could not run checkout mode: {result['error']}",
                          "check the checkout folder can be copied and the suite is installed on the node")
    if result.get("timed_out"):
        return not_judged(grade, "task-timeout", f"checkout mode did not finish within {result.get('seconds')} s; "
                                                 f"last lines:\n{tail}",
                          "give the jobs more time (--time) or look for a hang in the task log")
    stopped = _stopped_without_gpu(result)
    if stopped:
        return not_judged(grade, "no-gpu", f"the grading machine gave this task no usable GPU, so the student's "
                                           f"checkout was not judged: {stopped}",
                          "grade where every task gets its own GPU (grade-checkouts caps --parallelism at the GPUs "
                          "it sees; check --gpus / CUDA_VISIBLE_DEVICES), then re-run these with --resume",
                          verdict="died")
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
    fault = machine_fault(cases, cause)
    if fault:
        return not_judged(grade, "no-gpu", f"the grading machine gave this task no usable GPU, so the student's "
                                           f"checkout was not judged: {fault}",
                          "grade where every task gets its own GPU (grade-checkouts caps --parallelism at the GPUs "
                          "it sees; check --gpus / CUDA_VISIBLE_DEVICES), then re-run these with --resume",
                          verdict="died")
    if cause:
        grade = grade.update(diagnosis=f"{cause['cause']}: {cause['remedy']}", diagnosis_id=cause["id"],
                             diagnosis_cause=cause["cause"])
    elif cases.get(CAN_TRAIN_TEST, ("passed",))[0] != "passed":
        reason = cases[CAN_TRAIN_TEST][2] or "the checkout could not be trained"
        grade = grade.update(diagnosis=reason, diagnosis_id="cannot-train", diagnosis_cause=reason.split(". Fix:")[0])
    entries = []
    for c in profile.criteria:
        case = cases.get(f"{CRITERION_TEST}{c.id}]")
        if case is None:
            continue
        outcome, props, text = case
        v = verdicts.get(c.id, {})
        status = props.get("status") or OUTCOME_STATUS[outcome]
        measured = props.get("measured") or v.get("measured") or text.split("\n")[0]
        expected = props.get("expected") or v.get("expected") or ""
        message = text if status != PASS else criteria.PASS_TEMPLATE.format(
            label=c.label, criterion_id=c.id, measured=measured, expected=expected)
        entries.append(CriterionEntry(c.id, status, measured, expected, v.get("where", ""), v.get("consequence_of"),
                                      message, label=c.label))
    grade = grade.update(recipe=run.get("recipe"), log=run.get("log"), criteria=tuple(entries),
                         failed=tuple(e.id for e in entries if e.status == FAIL),
                         not_measured=tuple(e.id for e in entries if e.status == NOT_MEASURABLE))
    if not grade.criteria:
        return not_judged(grade, grade.diagnosis_id or "no-criteria",
                          grade.diagnosis_cause or f"checkout mode ran (exit code {result.get('returncode')}) "
                                                   "but judged no criterion",
                          "read the task's JUnit file and task.log")
    return grade.update(verdict="fail" if grade.failed or grade.diagnosis_id else "pass")
