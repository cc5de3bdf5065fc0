"""A student's submission (a training log, optionally its --save folder) turned into evidence and judged.

The one judging path for recorded runs: `pytest -m gpu --from-log LOG [--checkpoint-dir DIR]` and
`python -m harness grade DIR` both call ``judge_submission``, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path, PurePath

from harness.judge import criteria
from harness.evidence.recipe import DEFAULT_RECIPE, detect_recipe, load_recipe
from harness.evidence.records import RunEvidence
from harness.judge.profiles import FAIL, PASS, Profile, Verdict

LOG_SUFFIXES = (".log", ".txt", ".out", ".err")
STDERR_SUFFIX = ".err"
LOOK_LINES = 5000                     # lines read to tell a log from another text file


@dataclass(frozen=True)
class Submission:
    """One folder of a batch: its logs and, when present, its --save folder."""

    name: str
    log: Path | None              # the first log file (the judged ones are in the grade's provenance)
    save_dir: Path | None
    problem: str = ""             # why the folder cannot be judged (no log ...)
    logs: tuple = ()              # every log found: each a tuple of (file, rank or None) read as one log


def is_save_dir(path: Path) -> bool:
    """A Megatron --save folder: it has the tracker file or iter_NNNNNNN/ folders."""
    return (path / "latest_checkpointed_iteration.txt").is_file() or any(path.glob("iter_[0-9]*"))


def _log_suffix(path: Path) -> str:
    """The suffix that says what a file is, under a .gz."""
    return PurePath(path.name.removesuffix(".gz")).suffix


def _stem(path: Path) -> str:
    return PurePath(path.name.removesuffix(".gz")).stem


def find_submission(folder: Path) -> Submission:
    """The logs (every *.log, slurm-*.out, and any .txt/.out/.err holding Megatron lines, compressed or not; a
    stdout file and the .err of the same name, or torchrun --log-dir's stdout.log/stderr.log per rank folder, are
    read as one log) and the --save folder. Which log is judged, or how several are stitched, is decided when they
    are read (harness.evidence.stitch)."""
    # one iterative, bounded walk that follows no link (harness.base.paths.walk_entries): a link is never a log of
    # its own (one that stays inside, latest.log -> train.log, is read as its target, which the walk lists)
    from harness.base.paths import walk_entries

    entries = list(walk_entries(folder))
    dirs = [folder, *sorted(p for p, kind in entries if kind == "dir")]
    saves = {d for d in dirs if is_save_dir(d)}
    files = sorted(p for p, kind in entries if kind == "file" and _log_suffix(p) in LOG_SUFFIXES
                   and not any(parent in saves for parent in p.parents if folder in parent.parents))
    save = next((d for d in dirs if d in saves), None)
    units = _units(files)
    logs = [u for u in units if any(_log_suffix(f) == ".log" or f.name.startswith("slurm-") for f, _ in u)
            or any(_looks_like_log(f) for f, _ in u)]
    if not logs:
        return Submission(folder.name, None, save, f"no training log (*.log) in {folder}")
    return Submission(folder.name, logs[0][0][0], save, logs=tuple(logs))


def _units(files: list) -> list:
    """Files grouped into logs: X.out + X.err; torchrun --log-dir's <rank>/stdout.log + stderr.log, the rank
    folders of one attempt together (each file's rank from its folder)."""
    units, used = [], set()
    for f in files:
        if f in used or _log_suffix(f) == STDERR_SUFFIX and _partner(f, files):
            continue
        if _stem(f) in ("stdout", "stderr") and f.parent.name.isdigit():
            ranks = sorted((d for d in f.parent.parent.iterdir() if d.is_dir() and d.name.isdigit()),
                           key=lambda d: int(d.name))
            unit = []
            for d in ranks:
                for g in (x for x in files if x.parent == d and _stem(x) in ("stdout", "stderr")):
                    unit.append((g, (int(d.name),)))
            unit.sort(key=lambda u: (u[1], _stem(u[0]) != "stdout"))
            used.update(g for g, _ in unit)
            units.append(tuple(unit))
            continue
        err = _partner(f, files, stdout=f)
        used.update([f] + ([err] if err else []))
        units.append(((f, None), (err, None)) if err else ((f, None),))
    return units


def _partner(path: Path, files: list, stdout: Path | None = None) -> Path | None:
    """The .err beside a stdout file of the same name (or, for an .err, whether it has such a stdout file)."""
    if stdout is None:
        return next((f for f in files if f.parent == path.parent and _stem(f) == _stem(path)
                     and _log_suffix(f) != STDERR_SUFFIX), None)
    if _log_suffix(stdout) == STDERR_SUFFIX:
        return None
    return next((f for f in files if f.parent == stdout.parent and _stem(f) == _stem(stdout)
                 and _log_suffix(f) == STDERR_SUFFIX), None)


def _looks_like_log(path: Path) -> bool:
    """The file holds a Megatron iteration line or dataset marker (its first LOOK_LINES lines, read as any tool
    wrote them: compressed, UTF-16 ...)."""
    from itertools import islice

    from harness.evidence import logread

    info = logread.ReadInfo(str(path))
    for _, line in islice(logread.unwrap(logread.read_lines(path, info), info), LOOK_LINES):
        if " iteration " in line or "> building train, validation, and test datasets" in line:
            return True
    return False


def _name(unit: tuple, root: Path | None) -> str:
    """A log's name in the grade: its file(s), relative to the submission folder."""
    def rel(p: Path) -> str:
        try:
            return str(p.relative_to(root)) if root else p.name
        except ValueError:
            return p.name
    return "+".join(rel(f) for f, _ in unit)


def read_logs(log, save_dir: Path | None = None) -> tuple:
    """(units, save_dir, root) for a log file, a submission folder, or units from find_submission."""
    if isinstance(log, (str, Path)):
        path = Path(log)
        if path.is_dir():
            sub = find_submission(path)
            return list(sub.logs), save_dir or sub.save_dir, path
        return [((path, None),)], save_dir, None
    units = [tuple(u) for u in log]
    root = units[0][0][0].parent if len(units) == 1 else _common_root([f for u in units for f, _ in u])
    return units, save_dir, root


def _common_root(files: list) -> Path:
    from os.path import commonpath

    return Path(commonpath([str(f.parent) for f in files]))


def evidence(log, save_dir: Path | None = None) -> RunEvidence:
    """What a submission's log(s) (and its --save folder, inspected on CPU) can show; the rest stays not measured.

    `log`: a log file, a submission folder, or Submission.logs. Several logs are stitched into one run or one of
    them is chosen (harness.evidence.stitch); the evidence's provenance says which, and how each was read.
    """
    from harness.evidence import logs as logparse
    from harness.evidence import stitch

    units, save_dir, root = read_logs(log, save_dir)
    if not units:
        raise FileNotFoundError(f"no training log in {log}")
    parts = [(_name(u, root), logparse.parse_log_files([f for f, _ in u], [r for _, r in u])) for u in units]
    choice = stitch.choose(parts)
    first = units[[n for n, _ in parts].index(choice.names[0])][0][0]
    ev = RunEvidence(run_dir=str(first.parent), log=choice.log, log_path=str(first),
                              provenance=choice.notes, provenance_failures=choice.failures)
    if save_dir is not None:
        from harness.evidence.checkpoints.inspector import inspect_save_dir
        from harness.evidence.checkpoints.model_shapes import model_for_flags

        recipe_id, _ = detect_recipe(ev.log)
        variant = load_recipe().variants[recipe_id or DEFAULT_RECIPE]
        ev = replace(ev, checkpoints=inspect_save_dir(save_dir, model_for_flags(variant.flags)))  # a-h64: 64 wide
    return ev


PROVENANCE_ID = "log-provenance"
PROVENANCE_LABEL = "the submitted logs are one run"
PROVENANCE_EXPECTED = ("one log, or the logs of one run: each resumed log loads a checkpoint an earlier log saved, no "
                       "iteration missing between them, overlapping iterations agree")


def provenance_verdict(ev: RunEvidence) -> Verdict:
    """Which log(s) were judged and how they were read; a failure names what makes the logs not one run."""
    measured = "; ".join(ev.provenance) or "one log, read as written"
    where = ev.log_path or ev.run_dir
    if not ev.provenance_failures:
        message = criteria.PASS_TEMPLATE.format(label=PROVENANCE_LABEL, criterion_id=PROVENANCE_ID,
                                                measured=measured, expected=PROVENANCE_EXPECTED)
        return Verdict(PROVENANCE_ID, PROVENANCE_LABEL, PASS, measured, PROVENANCE_EXPECTED, where,
                                message)
    causes = "; ".join(f"[{fid}] {cause}" for fid, cause, _ in ev.provenance_failures)
    fixes = "; ".join(dict.fromkeys(fix for _, _, fix in ev.provenance_failures))
    message = criteria.FAILURE_TEMPLATE.format(status="FAIL", label=PROVENANCE_LABEL, criterion_id=PROVENANCE_ID,
                                               measured=f"{causes} ({measured})", expected=PROVENANCE_EXPECTED,
                                               where=where, artifacts=ev.run_dir, tail="    (see measured)",
                                               remedy=fixes)
    return Verdict(PROVENANCE_ID, PROVENANCE_LABEL, FAIL, f"{causes} ({measured})",
                            PROVENANCE_EXPECTED, where, message)


def judge_recorded(profile: Profile, ev: RunEvidence) -> criteria.Judgement:
    """The Judgement of a recorded run: not-measured criteria are listed, never passed; the last verdict says which
    logs were judged (log-provenance), and fails when the submitted logs are not one run; log-consistent
    (harness.judge.consistency) fails when the log contradicts itself (an edited log)."""
    from harness.judge import consistency

    j = criteria.judge(profile, ev, live=False)
    found = j.diagnosis if j.diagnosis is None or j.diagnosis.cause_id not in {v.criterion_id for v in j.verdicts} \
        else None                     # a cause of its own, not a failed verdict standing in for one
    verdicts = (*j.verdicts, provenance_verdict(ev),
                consistency.verdict(ev.log, ev.log_path or ev.run_dir, ev.run_dir, found))
    # no FAIL without a root cause: when only log-provenance or log-consistent failed, that finding is the root cause
    return replace(j, verdicts=verdicts, diagnosis=j.diagnosis or criteria.finding_cause(verdicts))


def judge_submission(profile: Profile, log: Path, save_dir: Path | None = None) -> criteria.Judgement:
    """judge_recorded() on a log (or a folder of one run's logs) and its optional --save folder."""
    return judge_recorded(profile, evidence(log, save_dir))
