"""A Gradescope autograder: grade one submission laid out as Gradescope lays it out, write results.json.

    python -m harness gradescope [--submission DIR] [--results FILE] [--criteria PROFILE] [--weights FILE]
    python -m harness gradescope ...                      (the same, as a subcommand)

Gradescope puts the student's files under /autograder/submission and reads /autograder/results/results.json
(https://gradescope-autograders.readthedocs.io/en/latest/specs/). The submission is judged exactly as
`python -m harness grade` judges one sub-folder (harness.cli.grade.judge_one), and each criterion of the profile
becomes one Gradescope test: name, score, max_score, status ("passed"/"failed"), output (the root cause first),
visibility, number and tags. Points per criterion are data (fixtures/gradescope/weights.toml). A criterion that
is not measured scores 0 of its max_score (its output says why): never a silent pass.

Whatever happens (no log, a broken log, a link out of the submission, a bug in the suite), a valid results.json is
written with score 0 and the reason, and the exit code is 0 (the verdict is in results.json, where Gradescope reads
it); failing to write results.json exits 3 (grader error), a bad option 4 (usage error; harness.cli.args).
Paths default to Gradescope's and can be moved with flags or GRADESCOPE_SUBMISSION / GRADESCOPE_RESULTS /
GRADESCOPE_CRITERIA / GRADESCOPE_WEIGHTS.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import tomllib
import traceback
from dataclasses import dataclass
from pathlib import Path

from harness.base import sandbox
from harness.base.errors import HarnessError, Interrupted
from harness.judge.grade_record import Grade, as_dict
from harness.report.gradebook import visible
from harness.base.paths import FIXTURES, stop_signals_to, write_text_atomic
from harness.judge.profiles import NOT_MEASURABLE, PASS, Profile, load_profile
from harness.cli.args import EXIT_GRADER_ERROR, Parser, add_time_limit

EXIT_CODES_HELP = ("exit codes: 0 results.json written, whatever the score (the verdict is in it, where Gradescope "
                   "reads it; 1 and 2 are never used); 3 grader error (results.json could not be written); 4 usage "
                   "error")

GRADESCOPE_ROOT = Path("/autograder")
WEIGHTS_DIR = FIXTURES / "gradescope"
DEFAULT_WEIGHTS = WEIGHTS_DIR / "weights.toml"
VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")
WEIGHT_KEYS = {"total", "visibility", "stdout_visibility", "points"}
BUILTIN_PROFILES = ("reference", "course", "megatron-lm")
STATUS_PASSED, STATUS_FAILED = "passed", "failed"
ROOT_CAUSE_LINES = ("  ROOT CAUSE [", "  fix first: ")
NOT_JUDGED = "{reason}\n\nNOT JUDGED: {label} [{id}]: no criterion can be judged until the problem above is fixed"
STAFF_NOTE = ("the autograder itself failed ({error}); this is not a verdict on your work: tell the course staff "
              "(the traceback is in the autograder's stdout)")


class GradescopeError(HarnessError, ValueError):
    """The autograder's own configuration is wrong (weights file, profile); the message names the file and fix."""


@dataclass(frozen=True)
class Weights:
    """Points per criterion, the assignment's total, and what students see."""

    path: str
    points: dict                     # criterion id -> points (>= 0)
    total: float | None              # rescale so the profile's points sum to this; None: points are the scores
    visibility: str = "visible"
    stdout_visibility: str = "hidden"

    def max_scores(self, profile: Profile) -> dict:
        """criterion id -> max_score for this profile; every criterion must have points."""
        missing = [cid for cid in profile.ids if cid not in self.points]
        if missing:
            raise GradescopeError(f"{self.path}: profile {profile.name!r} has criteria without points: "
                                  f"{', '.join(missing)}. Fix: add `<id> = N` under [points] (0 lists it ungraded)")
        raw = {cid: float(self.points[cid]) for cid in profile.ids}
        weight = sum(raw.values())
        if weight <= 0:
            raise GradescopeError(f"{self.path}: every criterion of profile {profile.name!r} has 0 points. Fix: give "
                                  "the criteria that count points under [points]")
        scale = 1.0 if self.total is None else self.total / weight
        return {cid: w * scale for cid, w in raw.items()}


def load_weights(path: str | os.PathLike = DEFAULT_WEIGHTS) -> Weights:
    """Read and check a weights file (GradescopeError naming the file, the key and the fix)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise GradescopeError(f"{path}: cannot read the weights file ({exc}). Fix: pass --weights FILE, a TOML file "
                              f"like {DEFAULT_WEIGHTS}") from None
    unknown = sorted(set(raw) - WEIGHT_KEYS)
    if unknown:
        raise GradescopeError(f"{path}: unknown key(s) {', '.join(unknown)}. Fix: use only {', '.join(sorted(WEIGHT_KEYS))}")
    points = raw.get("points")
    if not isinstance(points, dict) or not points:
        raise GradescopeError(f"{path}: no [points] table. Fix: one `<criterion id> = N` line per criterion")
    known = {cid for name in BUILTIN_PROFILES for cid in load_profile(name).ids}
    for cid, value in points.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise GradescopeError(f"{path}: [points] {cid} = {value!r}. Fix: a number >= 0")
    typos = sorted(set(points) - known)
    if typos:
        raise GradescopeError(f"{path}: [points] names no such criterion: {', '.join(typos)}. Fix: use the ids of "
                              f"fixtures/criteria/*.toml ({', '.join(sorted(known))})")
    total = raw.get("total")
    if total is not None and (not isinstance(total, (int, float)) or isinstance(total, bool) or total <= 0):
        raise GradescopeError(f"{path}: total = {total!r}. Fix: the assignment's points, a number > 0")
    for key in ("visibility", "stdout_visibility"):
        if raw.get(key, "visible") not in VISIBILITIES:
            raise GradescopeError(f"{path}: {key} = {raw[key]!r}. Fix: one of {', '.join(VISIBILITIES)}")
    return Weights(str(path), dict(points), None if total is None else float(total),
                   raw.get("visibility", "visible"), raw.get("stdout_visibility", "hidden"))


# ---------------------------------------------------------------- a grade -> results.json


def _without_root_cause(message: str) -> str:
    """A verdict message with its embedded ROOT CAUSE block removed (the test's output puts it first instead)."""
    return "\n".join(line for line in message.split("\n") if not line.startswith(ROOT_CAUSE_LINES))


def _root_cause(grade: dict) -> str:
    """'ROOT CAUSE [id]: cause' and its fix, or '' for a run with no diagnosis."""
    if not grade.get("diagnosis_id"):
        return grade.get("diagnosis") or ""
    fix = (grade.get("diagnosis") or "").removeprefix(grade.get("diagnosis_cause") or "").lstrip(": ")
    return f"ROOT CAUSE [{grade['diagnosis_id']}]: {grade['diagnosis_cause']}" + (f"\nfix first: {fix}" if fix else "")


def _test_output(grade: dict, c: dict, max_score: float) -> str:
    """Root cause first (for a criterion that did not pass), then what was measured and expected, then the remedy."""
    if c["status"] == PASS:
        return c["message"]
    head = []
    cause = _root_cause(grade)
    if cause:
        head.append(cause)
    if c["status"] == NOT_MEASURABLE:
        graded = f"0 of {max_score:g} points" if max_score else "not graded (0 points)"
        head.append(f"NOT MEASURED ({graded}; never counted as a pass): "
                    f"{c['measured'].removeprefix('not measured: ')}")
    return "\n\n".join([*head, _without_root_cause(c["message"])])


def _test(number: int, label: str, cid: str, score: float, max_score: float, status: str, output: str,
          visibility: str, tags: list) -> dict:
    return {"number": str(number), "name": f"{label} [{cid}]", "score": round(score, 4),
            "max_score": round(max_score, 4), "status": status, "output": output, "visibility": visibility,
            "tags": tags}


def results(grade, profile: Profile, weights: Weights, execution_time: float) -> dict:
    """Gradescope's results.json for one grade (harness.judge.grade_record.Grade, or its to_dict())."""
    grade = as_dict(grade)
    maxima = weights.max_scores(profile)
    by_id = {c["id"]: c for c in grade.get("criteria") or []}
    tests, earned = [], 0.0
    reason = _root_cause(grade) or "the submission was not judged"
    for number, crit in enumerate(profile.criteria, 1):
        c, max_score = by_id.get(crit.id), maxima[crit.id]
        if c is None:       # not judged at all (no log, an unsafe or broken submission): failed, with the reason
            tests.append(_test(number, crit.label, crit.id, 0.0, max_score, STATUS_FAILED,
                               NOT_JUDGED.format(label=crit.label, id=crit.id, reason=reason),
                               weights.visibility, [crit.id, "not-judged"]))
            continue
        passed = c["status"] == PASS
        earned += max_score if passed else 0.0
        tags = [crit.id] + (["not-measured"] if c["status"] == NOT_MEASURABLE else [])
        tags += [f"consequence-of:{c['consequence_of']}"] if c.get("consequence_of") else []
        tests.append(_test(number, c.get("label") or crit.label, crit.id, max_score if passed else 0.0, max_score,
                           STATUS_PASSED if passed else STATUS_FAILED, _test_output(grade, c, max_score),
                           weights.visibility, tags))
    return {"score": round(earned, 2), "execution_time": int(round(execution_time)),
            "output": summary(grade, tests, profile.name), "visibility": weights.visibility,
            "stdout_visibility": weights.stdout_visibility, "tests": tests}


def summary(grade: dict, tests: list, profile_name: str) -> str:
    """The whole submission in a few lines: the root cause first, then the counts."""
    graded = [t for t in tests if t["max_score"] > 0]
    passed = sum(t["status"] == STATUS_PASSED for t in graded)
    not_measured = [t["tags"][0] for t in tests if "not-measured" in t["tags"]]
    lines = [_root_cause(grade)] if (grade.get("diagnosis") or grade.get("diagnosis_id")) else []
    lines.append(f"{passed} of {len(graded)} graded criteria passed (profile {profile_name!r}, recipe "
                 f"{grade.get('recipe') or '?'}).")
    if not_measured:
        lines.append("Not measured from what was submitted (no points, never a pass): " + ", ".join(not_measured))
        lost = [t for t in tests if "not-measured" in t["tags"] and t["max_score"] > 0]
        if lost:   # why a passing log-only submission scores 90: the points its files cannot earn
            lines.append(f"{sum(t['max_score'] for t in lost):g} of the points are for criteria the submitted files "
                         "cannot show (" + ", ".join(t["tags"][0] for t in lost) + "; each test says what is "
                         "missing, e.g. the --save folder): submit it, or a log-only assignment gives them 0 points "
                         "in its weights file.")
    return "\n".join(lines)


def failure_results(reason: str, execution_time: float, profile: Profile | None = None,
                    weights: Weights | None = None) -> dict:
    """results.json for a submission that could not be judged: score 0, the reason, every criterion failed."""
    grade = Grade("", diagnosis=reason)
    if profile is not None and weights is not None:
        try:
            data = results(grade, profile, weights, execution_time)
            data["output"] = reason
            return data
        except GradescopeError:
            pass
    return {"score": 0.0, "execution_time": int(round(execution_time)), "output": reason, "visibility": "visible",
            "stdout_visibility": "hidden",
            "tests": [{"number": "1", "name": "submission could be graded", "score": 0.0, "max_score": 0.0,
                       "status": STATUS_FAILED, "output": reason, "visibility": "visible", "tags": ["not-judged"]}]}


# ---------------------------------------------------------------- the submission folder


def links_out_of(root: Path) -> list[str]:
    """Symbolic links under root that point out of it (or at a folder, which could loop): 'link -> target'."""
    base, found = root.resolve(), []
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(folder, name)
            if path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(base) or target.is_dir():
                    found.append(f"{path.relative_to(root)} -> {os.readlink(path)}")
    return found


def submission_problem(submission: Path) -> str | None:
    """Why the submission folder cannot be judged at all, or None."""
    if not submission.is_dir():
        return (f"no submission folder at {submission}: nothing was uploaded. Upload your training log (*.log) "
                "and, when the assignment asks for it, your --save folder")
    unsafe = links_out_of(submission)
    if unsafe:
        return ("the submission contains symbolic links that point out of it or at a folder: "
                f"{'; '.join(visible(u) for u in unsafe[:5])}"
                f"{f' and {len(unsafe) - 5} more' if len(unsafe) > 5 else ''}. Upload the files themselves, not links")
    return None


def grade_submission(submission: Path, profile: Profile, weights: Weights, started: float,
                     budget: sandbox.Budget | None = None) -> dict:
    """results.json for the submission folder (any problem becomes a score-0 result with the reason). The folder
    is judged in a bounded worker (harness.base.sandbox): over its time or memory budget, or raising anything, it
    scores 0 with what happened, and this process still writes results.json."""
    from harness.cli import grade as grader

    problem = submission_problem(submission)
    if problem:
        return failure_results(problem, time.monotonic() - started, profile, weights)
    with tempfile.TemporaryDirectory(prefix="gradescope-") as work:
        task = grader.Task(0, str(submission), grader.display_name(submission.name),
                           grader.slot_name(submission.name), work, profile.path, fingerprint=False)
        budget = budget or sandbox.Budget()
        from harness.judge import submission as _submission  # noqa: F401 - imported before the fork
        from harness.report import plot

        plot._pyplot()
        grade = grader.grade_from_outcome(task, sandbox.run_one(task, grader.judge_in_worker, budget), budget)
    if grade.diagnosis_id in ("grader-limit", "grader-error") and not grade.criteria:
        return failure_results(grade.diagnosis, time.monotonic() - started, profile, weights)
    return results(grade, profile, weights, time.monotonic() - started)


def add_arguments(parser) -> None:
    env = os.environ.get
    parser.add_argument("--submission", default=env("GRADESCOPE_SUBMISSION", str(GRADESCOPE_ROOT / "submission")),
                        metavar="DIR", help="the student's files (default: /autograder/submission, "
                                            "or $GRADESCOPE_SUBMISSION)")
    parser.add_argument("--results", default=env("GRADESCOPE_RESULTS", str(GRADESCOPE_ROOT / "results" / "results.json")),
                        metavar="FILE", help="where results.json goes (default: /autograder/results/results.json, "
                                             "or $GRADESCOPE_RESULTS)")
    parser.add_argument("--criteria", default=env("GRADESCOPE_CRITERIA", "reference"), metavar="PROFILE",
                        help="criteria profile: reference (default), course, megatron-lm, or a .toml path")
    parser.add_argument("--weights", default=env("GRADESCOPE_WEIGHTS", str(DEFAULT_WEIGHTS)), metavar="FILE",
                        help=f"points per criterion (default: {DEFAULT_WEIGHTS.relative_to(FIXTURES.parent)})")
    add_time_limit(parser, sandbox.DEFAULT_TIME_S, "wall-clock (and CPU) time for judging", old=("--timeout",))
    parser.add_argument("--memory-limit", type=int, default=sandbox.DEFAULT_MEMORY_MB, metavar="MB",
                        help=f"address space of the judging worker in MB (default {sandbox.DEFAULT_MEMORY_MB})")
    parser.epilog = EXIT_CODES_HELP


def _on_stop(signum, frame):
    raise Interrupted(signal.Signals(signum).name)   # Gradescope's own timeout sends SIGTERM: results.json is still written


def _print(text: str) -> None:
    """To stdout with every quoted byte escaped (terminal escapes, undecodable names): never raw, never failing."""
    for line in str(text).splitlines() or [""]:
        print(visible(line))


def main(args) -> int:
    """Write results.json whatever happens; exit 1 only when it cannot be written."""
    started = time.monotonic()
    out = Path(args.results)
    profile = weights = None
    try:
        profile = load_profile(args.criteria)
        weights = load_weights(args.weights)
        weights.max_scores(profile)
        budget = sandbox.Budget(float(getattr(args, "time_limit", sandbox.DEFAULT_TIME_S)),
                                int(getattr(args, "memory_limit", sandbox.DEFAULT_MEMORY_MB)))
        with stop_signals_to(_on_stop):
            data = grade_submission(Path(args.submission), profile, weights, started, budget)
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM's Interrupted
        data = failure_results(f"not judged: the autograder was stopped ({type(exc).__name__} {exc}) before it "
                               "finished; this is not a verdict on your work: submit again or tell the course staff",
                               time.monotonic() - started, profile, weights)
    except BaseException as exc:   # noqa: BLE001 - the student must get a results.json, the staff the traceback
        _print(traceback.format_exc())
        data = failure_results(STAFF_NOTE.format(error=visible(f"{type(exc).__name__}: {exc}")),
                               time.monotonic() - started, profile, weights)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        print(visible(f"error: cannot write {out} ({exc}); pass --results FILE in a writable folder"), file=sys.stderr)
        return EXIT_GRADER_ERROR
    _print(f"score {data['score']}: results in {out}")
    _print(data["output"])
    return 0


if __name__ == "__main__":
    parser = Parser(prog="python -m harness gradescope", description=__doc__.split("\n")[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
