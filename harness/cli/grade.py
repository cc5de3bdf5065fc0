"""`python -m harness grade DIR`: judge a folder of student submissions, one sub-folder each, in one go.

Each sub-folder holds the student's training log (*.log) and optionally its --save folder. Every submission is
judged exactly as `pytest -m gpu --from-log LOG --checkpoint-dir SAVE` judges it (harness.judge.submission), on
every core (--jobs). OUT gets grades.json, grades.md, grades.csv, grades-junit.xml, and per submission
submissions/<name>/grade.json (written as soon as it is graded) and submissions/<name>/loss-curve.png.

Submissions are untrusted input: nothing in them is run or unpickled; a submission with a symlink leading out of
its folder (or that is a symlink) is refused, its grade says why; one submission's failure or crash is its own
grade (`error`), the others are graded; Ctrl-C or SIGTERM writes what finished, the rest marked `incomplete`.
OUT is marked as the grader's (.bert-grades, which lists the files the grader wrote: a later run into the same
OUT removes those and nothing else) and locked while a run writes into it (.bert-grades.lock).

Exit codes (harness.cli.args, pytest's meanings for 2 and 4; docs/commands.md):
  0  every submission passed
  1  at least one submission failed
  2  interrupted (Ctrl-C, SIGTERM): the grades files hold what finished, the rest is `incomplete`
  3  grader error: a submission could not be graded (verdict `error`) or OUT could not be written
  4  usage error (DIR not a folder, no sub-folders, bad --criteria, OUT not the grader's or locked by another run)
"""

from __future__ import annotations

import functools
import gc
import hashlib
import os
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness.base import sandbox
from harness.base.errors import CriteriaError, Interrupted
from harness.base.paths import (inside, links_leaving, remove_atomic_leftovers, stop_signals_deferred, stop_signals_to,
                                write_bytes_atomic, write_text_atomic)
from harness.base.proc import usable_cores
from harness.cli.grade_out import MARKER, UsageError, prepare_out, write_marker
from harness.judge.grade_record import Grade, GradeFormatError
from harness.judge.profiles import Profile, load_profile
from harness.report import gradebook

from harness.cli.args import (EXIT_FAILED, EXIT_GRADER_ERROR, EXIT_INTERRUPTED, EXIT_PASSED, EXIT_USAGE,
                              add_jobs, add_time_limit, exit_codes_help, not_a_folder)

EXIT_CODES_HELP = exit_codes_help(interrupted="grades of what finished written, the rest marked incomplete",
                                  grader_error="a submission could not be graded, or OUT not writable")
OUTPUTS = ("grades.json", "grades.md", "grades.csv", "grades-junit.xml", "grades.html")
PER_SUBMISSION = "submissions"      # OUT/submissions/<name>/: grade.json and loss-curve.png
PR_SET_PDEATHSIG = 1
KILLED_WORKER_JOIN_S = 5.0          # after SIGKILL, how long to wait for a worker to be gone before sweeping its files
AGGREGATE_EVERY_S = 5.0             # the four grades files are rewritten at most this often while grading

MSG_SYMLINK_OUT = ("refused: {link} is a symlink to {target}, which resolves outside the submission's folder (or "
                   "nowhere); only files inside it are read. Submit the files themselves, not links")
MSG_FOLDER_SYMLINK = ("refused: the submission folder is a symlink (to {target}); submit a real folder")
MSG_ERROR = "the grader failed on this submission ({error}); the other submissions were graded. Report this with the folder"
MSG_LIMIT = ("not judged: {what} ({budget} per submission: --time-limit, --memory-limit). A submission of a normal "
             "run takes a few seconds and well under 1 GB; check its files, or raise the limits for it alone")
MSG_RAISED = ("not judged: reading this submission raised {error}; it was stopped in its own worker and the other "
              "submissions were graded. Report this with the folder")
MSG_INCOMPLETE = "not graded: the grader was interrupted before it got to this submission; run it again"


def add_arguments(parser) -> None:
    parser.add_argument("submissions", metavar="DIR", help="folder with one sub-folder per submission")
    parser.add_argument("--criteria", default="reference", metavar="PROFILE",
                        help="criteria profile: reference (default), course, megatron-lm, or a .toml path")
    parser.add_argument("--out", metavar="OUT", help="where the grades go (default: DIR-grades beside DIR, never inside it); a new or empty "
                                                     "folder, or one an earlier grade run wrote")
    add_jobs(parser, "submissions graded")
    add_time_limit(parser, sandbox.DEFAULT_TIME_S, "wall-clock (and CPU) time per submission; a submission over it "
                                                   "is not judged, its grade says so (docs/untrusted.md)",
                   old=("--timeout",))
    parser.add_argument("--memory-limit", type=int, default=sandbox.DEFAULT_MEMORY_MB, metavar="MB",
                        help=f"address space per submission's worker in MB (default {sandbox.DEFAULT_MEMORY_MB})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-copy-detection", action="store_true",
                        help="do not compare the submissions' timings with each other (by default two submissions "
                             "with one run's timestamps or timings both fail log-copy; docs/trust.md)")
    parser.epilog = EXIT_CODES_HELP


@dataclass(frozen=True)
class Task:
    """One submission to grade: where it is, its name in the grades and its folder under OUT."""

    index: int
    folder: str
    name: str           # as shown in the grades (undecodable bytes replaced)
    slot: str           # OUT/submissions/<slot>/: only [A-Za-z0-9._-], unique in the batch
    out: str
    profile: str
    fingerprint: bool = True    # the worker also returns the log's copy fingerprint (harness.judge.copies)


@dataclass(frozen=True)
class Judged:
    """What a judging worker hands back: the grade, and the log's copy fingerprint (None: not judged, no
    iteration line, or not asked for)."""

    grade: Grade
    fingerprint: object = None    # harness.judge.copies.Fingerprint | None


def display_name(name: str) -> str:
    """A folder name as text every writer can encode: gradebook.visible's escaping, the one every writer and the
    terminal use (a byte that is not UTF-8 shown as \\xNN, control characters and terminal escapes as \\xNN)."""
    return gradebook.visible(name)


def slot_name(name: str) -> str:
    """The folder under OUT/submissions for a submission: its name when that is plain, else a plain form plus a
    hash of the name (so two submissions never share one, and no name can reach outside)."""
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80]
    if plain == name and not name.startswith("."):
        return name
    digest = hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:10]
    return f"{plain.lstrip('.') or 'submission'}-{digest}"


def _not_judged(task: Task, verdict: str, cause_id: str, cause: str, log=None, save=None) -> Grade:
    """A grade without criteria: refused, no log, grader error, or not graded (interrupted)."""
    return Grade.not_judged(task.name, verdict, cause_id, cause, log, save)


@functools.lru_cache(maxsize=4)
def _profile(spec: str) -> Profile:
    return load_profile(spec)


@functools.lru_cache(maxsize=1)
def _painter():
    from harness.report.plot import LossCurvePainter

    return LossCurvePainter()


# the repository's own logs warm() judges: recipe (a) and (b) runs that pass, and real runs that failed (stopped,
# crashed on an import), so that the failure machinery (causes.toml, its patterns) is loaded too
WARM_LOGS = ("logs/core_v0.16.1_h200_course_flags_binary_head.log",
             "logs/reference_trainer_h200_recipe_b_seed1234.log",
             "failures/real-h200/core_v0.16.1-kill-it130-s1234.log.gz",
             "failures/real-h200/core_v0.15.3-te-import-s1234.log.gz")


def warm(spec: str) -> None:
    """In the coordinator, before the workers fork: what judging needs is imported, loaded and drawn once here, so
    each fork starts with it instead of filling it and losing it when it exits (the profile and its golden files,
    the failure causes and their compiled patterns, matplotlib, the painter's figure and background of each course
    recipe). It judges the repository's own logs (WARM_LOGS), never a submission; a failure here only costs speed."""
    from harness.base.paths import FIXTURES
    from harness.judge.submission import evidence, judge_recorded
    from harness.report import plot

    plot._pyplot()
    try:
        profile = _profile(spec)
        for name in WARM_LOGS:
            ev = evidence(FIXTURES / name)
            j = judge_recorded(profile, ev)
            _painter().png(ev.log, profile.for_recipe(j.recipe).golden, "warm", j.verdict,
                           j.diagnosis.cause_id if j.diagnosis else None, plot.warmup_of(profile))
            _fingerprint(ev.log)
    except Exception:  # noqa: BLE001 - warming is an optimisation; the workers fill what is missing
        pass


def refusal(folder: Path) -> str | None:
    """Why a submission folder is not read at all (a symlink, or holding links that lead out of it); else None."""
    if folder.is_symlink():
        return MSG_FOLDER_SYMLINK.format(target=gradebook.visible(os.readlink(folder)))
    leaving = links_leaving(folder, limit=1)
    if leaving:
        link, target = leaving[0]
        return MSG_SYMLINK_OUT.format(link=gradebook.visible(str(link.relative_to(folder))),
                                      target=gradebook.visible(target))
    return None


def judge_one(task: Task) -> Judged:
    """One submission judged: its grade and its log's copy fingerprint; its picture goes to
    OUT/submissions/<slot>/loss-curve.png. Runs in the submission's worker: the only code that reads its files."""
    from harness.judge.submission import evidence, find_submission, judge_recorded

    folder, out = Path(task.folder), Path(task.out)
    sandbox.phase("looking for links leaving the folder")
    refused = refusal(folder)
    if refused:
        return Judged(_not_judged(task, "fail", "refused", refused))
    sub = find_submission(folder)
    if sub.log is None:
        return Judged(_not_judged(task, "fail", "no-log", sub.problem, save=sub.save_dir))
    profile = _profile(task.profile)
    sandbox.phase(f"reading {_relative(folder, sub.log)}" + (f" and {_relative(folder, sub.save_dir)}"
                                                             if sub.save_dir else ""))
    ev = evidence(sub.logs, sub.save_dir)
    sandbox.phase("judging the criteria")
    j = judge_recorded(profile, ev)
    sandbox.phase("drawing the loss curve")
    from harness.report.plot import warmup_of

    png = _painter().png(ev.log, profile.for_recipe(j.recipe).golden, f"{task.name} (recipe {j.recipe or '?'})",
                         j.verdict, j.diagnosis.cause_id if j.diagnosis else None, warmup_of(profile))
    picture = None
    if png is not None:
        picture = f"{PER_SUBMISSION}/{task.slot}/loss-curve.png"
        write_bytes_atomic(_out_path(out, picture), png)
    return Judged(Grade.judged(task.name, sub.log, sub.save_dir, j, picture),
                  _fingerprint(ev.log) if task.fingerprint else None)


def _fingerprint(log):
    """The log's copy fingerprint (harness.judge.copies), None when it has no iteration line; a log whose timings
    cannot be read is compared with nothing, never an error of its grade."""
    from harness.judge import copies

    if log is None or not log.iterations:
        return None
    sandbox.phase("taking the log's timings for copy detection")
    try:
        return copies.Fingerprint.of(log)
    except Exception:  # noqa: BLE001 - judged already; no claim about copies either way
        return None


def grade_one(task: Task) -> dict:
    """One submission's grade as a JSON-able dict (judge_one's grade; its picture written)."""
    return judge_one(task).grade.to_dict()


def judge_in_worker(task: Task) -> dict:
    """judge_one as a bounded worker reports it (JSON): {"grade": ..., "fingerprint": ... or None}."""
    judged = judge_one(task)
    return {"grade": judged.grade.to_dict(),
            "fingerprint": judged.fingerprint.to_json() if judged.fingerprint is not None else None}


def _relative(folder: Path, path) -> str:
    try:
        return gradebook.visible(str(Path(path).relative_to(folder)))
    except ValueError:
        return gradebook.visible(str(path))


def grade_safely(task: Task) -> Grade:
    """judge_one in this process; any exception becomes this submission's `error` grade; its grade.json is
    written."""
    try:
        grade = judge_one(task).grade
    except Exception as exc:  # noqa: BLE001 - one submission's failure is its own grade, never the batch's
        interrupt = _interrupt_behind(exc)
        if interrupt is not None:    # an interrupt in disguise: the batch stops, this submission stays ungraded
            raise interrupt from exc
        grade = error_grade(task, exc)
    return write_grade(task, grade)


def write_grade(task: Task, grade: Grade) -> Grade:
    """OUT/submissions/<slot>/grade.json (by the coordinator, never by a worker); a failed write is an `error`."""
    try:
        write_text_atomic(_out_path(Path(task.out), f"{PER_SUBMISSION}/{task.slot}/grade.json"), grade.json_text)
    except OSError as exc:
        grade = error_grade(task, exc)
    return grade


def error_grade(task: Task, exc: BaseException) -> Grade:
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return _not_judged(task, "error", "grader-error", MSG_ERROR.format(
        error=gradebook.visible(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)))


def _out_path(out: Path, rel: str) -> Path:
    """OUT/rel with its folders made; refused (OSError) when a folder on the way is a symlink or leaves OUT."""
    path = out / rel
    folder = out
    for part in Path(rel).parent.parts:
        folder = folder / part
        if folder.is_symlink():
            raise OSError(f"{folder} is a symlink; the grader writes nothing through one. Remove it or use a new --out")
        folder.mkdir(exist_ok=True)
    if not inside(out, path.parent):
        raise OSError(f"{path} is outside {out}")
    return path


# ---------------------------------------------------------------- the batch


ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".gz", ".7z", ".rar")


def default_out(root: Path) -> Path:
    """DIR's grades beside DIR (DIR-grades/), never inside it: no student folder can take that name."""
    root = Path(root).expanduser().resolve()
    return root.parent / f"{root.name}-grades"


def _skip_reason(p: Path) -> str | None:
    """Why an entry of DIR is not graded as a submission (None: it is a folder to grade)."""
    if p.name.startswith("."):
        return "a hidden entry (its name starts with '.'); give the submission a folder whose name does not"
    if p.is_symlink() and not p.is_dir():
        return "a symlink that is not a folder; submit a real folder"
    if not p.is_dir():
        if p.name.lower().endswith(ARCHIVE_SUFFIXES):
            return "an archive, not a folder: the grader never unpacks; unpack it into a folder of its own"
        return "a file, not a folder: put each submission in a folder of its own"
    return None


def submission_folders(root: Path, out: Path) -> tuple[list, list]:
    """(sub-folders to grade, [(name, why)] not graded): every other entry of DIR (hidden, a file, an archive, an
    earlier run's grades folder) is skipped with its reason, each becoming a row of the grades."""
    folders, skipped = [], []
    for p in sorted(root.iterdir()):
        why = _skip_reason(p)
        if why:
            skipped.append((display_name(p.name), why))
            continue
        if p.resolve() == out.resolve() and not p.is_symlink() and (p / MARKER).is_file():
            continue    # OUT itself, the grader's (its marker): a student's folder given as --out is refused later
        if not p.is_symlink() and (p / MARKER).is_file():
            skipped.append((display_name(p.name), f"an earlier run's grades folder ({MARKER} in it)"))
        else:
            folders.append(p)
    return folders, skipped


def run_tasks(tasks: list, jobs: int, on_done, budget: sandbox.Budget | None = None) -> None:
    """judge_one every task, each in its own bounded worker (harness.base.sandbox), `jobs` at a time; on_done(task,
    Judged) in this process as each ends, its grade.json written. Everything this process needs of a submission
    comes back through its worker's pipe: its files are read there and only there. A worker over its time or
    memory budget, dead, or raising anything (SystemExit and KeyboardInterrupt from a submission's content
    included) costs only its own submission. An exception here (Ctrl-C, SIGTERM) kills every live worker and
    sweeps their half-written files."""
    budget = budget or sandbox.Budget()

    def ended(task, outcome):
        judged = judged_from_outcome(task, outcome, budget)
        on_done(task, Judged(write_grade(task, judged.grade), judged.fingerprint))

    try:
        sandbox.run_all(tasks, judge_in_worker, jobs, budget, ended)
    except BaseException:
        _remove_leftovers(tasks)    # a worker killed inside an atomic write left its temporary file
        raise


MSG_BAD_REPORT = "the judging worker's report is not a grade ({error})"


def judged_from_outcome(task: Task, outcome: sandbox.WorkerOutcome, budget: sandbox.Budget) -> Judged:
    """A worker's outcome as the submission's grade and fingerprint: its grade when judged, else `error` saying
    which budget ended it while reading what (grader-limit), or what reading it raised (grader-error)."""
    if outcome.ok:
        from harness.judge import copies

        value = outcome.value if isinstance(outcome.value, dict) else {}
        try:
            grade = Grade.from_dict(value.get("grade"))
            fingerprint = value.get("fingerprint")
            return Judged(grade, None if fingerprint is None else copies.Fingerprint.from_json(fingerprint))
        except (GradeFormatError, ValueError, TypeError) as exc:
            return error_grade_judged(task, RuntimeError(MSG_BAD_REPORT.format(error=exc)))
    _remove_leftovers([task])
    if outcome.status in (sandbox.OVER_TIME, sandbox.OVER_MEMORY):
        return Judged(_not_judged(task, "error", "grader-limit", MSG_LIMIT.format(
            what=gradebook.visible(outcome.text(budget)), budget=budget.words())))
    if outcome.status == sandbox.RAISED:
        return Judged(_not_judged(task, "error", "grader-error", MSG_RAISED.format(
            error=gradebook.visible(outcome.error + (f" while {outcome.phase}" if outcome.phase else "")))))
    return error_grade_judged(task, RuntimeError(outcome.text(budget)))


def error_grade_judged(task: Task, exc: BaseException) -> Judged:
    return Judged(error_grade(task, exc))


def grade_from_outcome(task: Task, outcome: sandbox.WorkerOutcome, budget: sandbox.Budget) -> Grade:
    """judged_from_outcome's grade."""
    return judged_from_outcome(task, outcome, budget).grade


def _remove_leftovers(tasks: list) -> None:
    """The temporary files of atomic writes in these tasks' output folders (their writers are dead)."""
    for task in tasks:
        remove_atomic_leftovers(Path(task.out) / PER_SUBMISSION / task.slot)


_STOP_REQUESTED = threading.Event()   # set by Ctrl-C or SIGTERM while grading, however the exception then travels


def _on_stop_signal(signum, frame):
    """Ctrl-C raises KeyboardInterrupt, SIGTERM Interrupted; both also set _STOP_REQUESTED, so that an interrupt a
    library turned into another exception (matplotlib's C code rendering a picture returns SystemError "...
    returned a result with an exception set") still stops the batch instead of becoming one submission's
    grader error (seen under load: exit 3 and the rest graded, instead of exit 2, interrupted)."""
    _STOP_REQUESTED.set()
    raise KeyboardInterrupt if signum == signal.SIGINT else Interrupted("SIGTERM")


def _interrupt_behind(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or Interrupted an exception stands for: one in its chain, or the stop flag set."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (KeyboardInterrupt, Interrupted)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return KeyboardInterrupt() if _STOP_REQUESTED.is_set() else None


class Batch:
    """The grades of one run: finished ones by index with the fingerprints their workers returned, and the four
    grades files written from them."""

    def __init__(self, tasks: list, out: Path, profile: Profile, skipped: list):
        self.tasks, self.out, self.profile, self.skipped = tasks, out, profile, skipped
        self.grades: dict = {}         # task index -> Grade
        self.prints: dict = {}         # task index -> (name, copies.Fingerprint) of each judged log
        self.written_at, self.write_s = 0.0, 0.0

    def add(self, task: Task, judged: Judged) -> None:
        self.grades[task.index] = judged.grade
        if judged.fingerprint is not None:
            self.prints[task.index] = (task.name, judged.fingerprint)
        if time.monotonic() - self.written_at > max(AGGREGATE_EVERY_S, 20 * self.write_s):
            with stop_signals_deferred():   # an interim write finishes before Ctrl-C or SIGTERM acts
                self.write(final=False)

    def ordered(self) -> list:
        """Every submission in DIR order; not (yet) graded ones as `incomplete`; then one `fail` row per entry of
        DIR that was not graded (skipped), with its reason."""
        return [*(self.grades.get(t.index) or _not_judged(t, "incomplete", "incomplete", MSG_INCOMPLETE)
                  for t in self.tasks),
                *(Grade.not_judged(name, "fail", "not-graded", f"not graded: {why}") for name, why in self.skipped)]

    def write(self, final: bool) -> None:
        """grades.json/.md/.csv/.html and the JUnit file, each replaced whole."""
        started = time.monotonic()
        grades = self.ordered()
        incomplete = len(self.grades) < len(self.tasks)
        name = self.profile.name
        write_text_atomic(self.out / "grades.json", gradebook.to_json(grades))
        write_text_atomic(self.out / "grades.md", gradebook.markdown(grades, name, incomplete and final, self.skipped))
        write_text_atomic(self.out / "grades.csv", gradebook.csv_text(grades, self.profile.ids))
        write_bytes_atomic(self.out / "grades-junit.xml", gradebook.junit_bytes(grades, name))
        pictures = gradebook.read_pictures(self.out, grades)
        write_text_atomic(self.out / "grades.html", gradebook.html_page(grades, name, pictures, incomplete and final))
        self.write_s = time.monotonic() - started   # interim writes take at most 1/20 of the time (large batches)
        self.written_at = time.monotonic()


def _budget(args) -> sandbox.Budget:
    return sandbox.Budget(float(getattr(args, "time_limit", sandbox.DEFAULT_TIME_S)),
                          int(getattr(args, "memory_limit", sandbox.DEFAULT_MEMORY_MB)))


def _jobs(requested: int) -> int:
    return requested if requested > 0 else usable_cores()


def main(args) -> int:
    """Grade every sub-folder of DIR; the exit code is one of the EXIT_* codes (module docstring)."""
    try:
        root, out, profile, tasks, skipped = _setup(args)
        lock = prepare_out(out)
    except UsageError as exc:
        print(f"error: {gradebook.visible(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    try:
        code = _grade(args, out, profile, tasks, skipped)
    finally:
        os.close(lock)
    if code == EXIT_INTERRUPTED and _jobs(args.jobs) > 1 and len(tasks) > 1:
        # The grades are written. Workers killed mid-task can leave the pool's result pipe half-written, and
        # interpreter exit joins the pool's thread reading it: it would wait forever. Exit now instead.
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)
    return code


def _setup(args):
    root = Path(args.submissions).expanduser()
    problem = not_a_folder(root, "grade")
    if problem:
        raise UsageError(problem)
    if args.jobs < 0:
        raise UsageError(f"--jobs {args.jobs}: give a number of processes (0 or none: one per core)")
    if not getattr(args, "time_limit", 1) > 0 or not getattr(args, "memory_limit", 1) > 0:
        raise UsageError("--time-limit and --memory-limit: give positive numbers (seconds, MB)")
    try:
        profile = _profile(args.criteria)
    except CriteriaError as exc:
        raise UsageError(f"--criteria {args.criteria}: {exc}")
    out = Path(args.out).expanduser() if args.out else default_out(root)
    folders, skipped = submission_folders(root, out)
    for folder in folders:
        if inside(folder, out) or inside(out, folder):
            raise UsageError(f"--out {out}: is, or is inside, or holds the submission folder {folder}; the grades "
                             "go elsewhere (the default: DIR-grades beside DIR)")
    if not folders:
        raise UsageError(f"{root}: no sub-folders; put each submission (its *.log, optionally its --save folder) in "
                         "a folder of its own")
    slots = {}
    tasks = []
    for i, folder in enumerate(folders):
        slot = slot_name(folder.name)
        while slot.lower() in slots:   # case-insensitive file systems: Alice and alice share a folder
            slot = f"{slot}-{i}"
        slots[slot.lower()] = folder
        tasks.append(Task(i, str(folder), display_name(folder.name), slot, str(out), args.criteria,
                          not getattr(args, "no_copy_detection", False)))
    return root, out, profile, tasks, skipped


def _grade(args, out: Path, profile, tasks: list, skipped: list) -> int:
    planned = [*OUTPUTS] + [f"{PER_SUBMISSION}/{t.slot}/{f}" for t in tasks for f in ("grade.json", "loss-curve.png")]
    batch = Batch(tasks, out, profile, skipped)
    from tqdm import tqdm

    _STOP_REQUESTED.clear()
    interrupted = False
    with stop_signals_to(_on_stop_signal):
        try:
            write_marker(out, planned)        # first: whatever is written next is listed, so a later run removes it
            warm(args.criteria)
            with tqdm(total=len(tasks), desc="grading", unit="submission", disable=args.no_progress,
                      file=sys.stderr) as bar:
                def done(task, grade):
                    batch.add(task, grade)
                    bar.update()

                frozen = gc.get_freeze_count()
                gc.freeze()          # what exists now is never scanned by a worker's collector: its pages stay shared
                try:
                    run_tasks(tasks, _jobs(args.jobs), done, _budget(args))
                finally:
                    if not frozen:   # a caller's own frozen heap (harness.base.imports) stays frozen
                        gc.unfreeze()
            if not getattr(args, "no_copy_detection", False):
                _mark_copies(batch)
        except (KeyboardInterrupt, Interrupted):
            interrupted = True            # what finished came back through the workers' pipes: nothing is read from OUT
        except OSError as exc:
            print(f"error: cannot write the grades into {out}: {gradebook.visible(str(exc))}", file=sys.stderr)
            return EXIT_GRADER_ERROR
    # A second Ctrl-C or SIGTERM (a scheduler's, before its SIGKILL) must not cut the final grades short.
    with stop_signals_to(signal.SIG_IGN):
        try:
            batch.write(final=True)
        except OSError as exc:
            print(f"error: cannot write the grades into {out}: {gradebook.visible(str(exc))}", file=sys.stderr)
            return EXIT_GRADER_ERROR
    return _summary(batch, out, interrupted)


def _mark_copies(batch: Batch) -> None:
    """After every grade: submissions whose logs are one run's (harness.judge.copies, on the fingerprints the
    workers returned; no submission's file is opened here) fail log-copy, both named."""
    from harness.judge import copies

    for index, grade in copies.annotate(batch.grades, batch.prints).items():
        batch.grades[index] = grade
        task = batch.tasks[index]
        write_text_atomic(_out_path(batch.out, f"{PER_SUBMISSION}/{task.slot}/grade.json"), grade.json_text)


def _summary(batch: Batch, out: Path, interrupted: bool) -> int:
    """One line: the submissions' verdicts, then every entry not graded with its reason; the exit code (an entry
    not graded is never exit 0)."""
    grades = [g for g in batch.ordered() if g.diagnosis_id != "not-graded"]
    by = {v: [g.submission for g in grades if g.verdict == v] for v in gradebook.VERDICTS}
    passed = len(by["pass"])
    line = f"{passed} of {len(grades)} submissions passed; grades in {out}/grades.md"
    for verdict, what in (("fail", "failed"), ("error", "grader error"), ("incomplete", "not graded (interrupted)")):
        if by[verdict]:
            shown = ", ".join(by[verdict][:50]) + (f" and {len(by[verdict]) - 50} more" if len(by[verdict]) > 50 else "")
            line += f"; {what}: {shown}"
    for name, why in batch.skipped[:50]:
        line += f"; not graded: {name} ({why})"
    if len(batch.skipped) > 50:
        line += f"; and {len(batch.skipped) - 50} more not graded"
    print(gradebook.visible(line))
    if interrupted:
        return EXIT_INTERRUPTED
    if by["error"]:
        return EXIT_GRADER_ERROR
    return EXIT_FAILED if by["fail"] or batch.skipped else EXIT_PASSED

