"""A student's submission (a training log, optionally its --save folder) turned into evidence and judged.

The one judging path for recorded runs: `pytest -m gpu --from-log LOG [--checkpoint-dir DIR]` and
`python -m harness grade DIR` both call ``judge_submission``, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from harness.judge import criteria

LOG_SUFFIXES = (".log", ".txt", ".out")


@dataclass(frozen=True)
class Submission:
    """One folder of a batch: its log and, when present, its --save folder."""

    name: str
    log: Path | None
    save_dir: Path | None
    problem: str = ""             # why the folder cannot be judged (no log, several candidates ...)


def is_save_dir(path: Path) -> bool:
    """A Megatron --save folder: it has the tracker file or iter_NNNNNNN/ folders."""
    return (path / "latest_checkpointed_iteration.txt").is_file() or any(path.glob("iter_[0-9]*"))


def find_submission(folder: Path) -> Submission:
    """The log (a *.log file; else the one .txt/.out with Megatron iteration lines) and the --save folder."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in LOG_SUFFIXES
                   and not any(is_save_dir(parent) for parent in p.parents if folder in parent.parents))
    logs = [p for p in files if p.suffix == ".log"] or [p for p in files if _looks_like_log(p)]
    save = next((d for d in sorted([folder, *folder.rglob("*")]) if d.is_dir() and is_save_dir(d)), None)
    if not logs:
        return Submission(folder.name, None, save, f"no training log (*.log) in {folder}")
    if len(logs) > 1:
        logs.sort(key=lambda p: (not _looks_like_log(p), -p.stat().st_size))
    return Submission(folder.name, logs[0], save)


def _looks_like_log(path: Path) -> bool:
    """The file holds a Megatron iteration line or dataset marker (read at most 4 MB)."""
    with path.open(errors="replace") as fh:
        head = fh.read(4 << 20)
    return " iteration " in head or "> building train, validation, and test datasets" in head


def evidence(log: Path, save_dir: Path | None = None) -> criteria.RunEvidence:
    """What a log (and its --save folder, inspected on CPU) can show; the rest stays not measured."""
    ev = criteria.evidence_from_log_file(log)
    if save_dir is not None:
        from harness.judge.checkpoints import course_model, inspect_save_dir

        recipe_id, _ = criteria.detect_recipe(ev.log)
        variant = criteria.load_recipe().variants[recipe_id or criteria.DEFAULT_RECIPE]
        ev = replace(ev, checkpoints=inspect_save_dir(save_dir, course_model(variant.flags.get("bert_binary_head",
                                                                                                True))))
    return ev


def judge_recorded(profile: criteria.Profile, ev: criteria.RunEvidence) -> criteria.Judgement:
    """The Judgement of a recorded run: not-measured criteria are listed, never passed."""
    return criteria.judge(profile, ev, live=False)


def judge_submission(profile: criteria.Profile, log: Path, save_dir: Path | None = None) -> criteria.Judgement:
    """judge_recorded() on a log and its optional --save folder."""
    return judge_recorded(profile, evidence(log, save_dir))
