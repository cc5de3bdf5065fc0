"""Recorded-log mutants: a good Megatron log broken on purpose, to prove each criterion catches its failure.

Each mutant is a pure function from log text to log text; iteration lines are rewritten with harness.evidence.logs'
formatters, so everything but the intended change stays byte-identical. ``MUTANTS`` lists them with the
criteria each must fail (for the megatron-lm profile); ``python -m harness mutants`` prints the matrix (harness.judge.mutant_matrix).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Callable

from harness.evidence import logs
from harness.base.paths import RECORDED_LOGS
from harness.evidence.logformat import MARKERS, format_iteration

RECORDED_LOG = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
DATASET_MARKERS = ("building_datasets", "building_bert_datasets", "finished_datasets")


@dataclass(frozen=True)
class Mutant:
    """One deliberate breakage: what it does, and exactly which criteria must fail because of it."""

    name: str
    description: str
    transform: Callable[[str], str]
    expected_failures: frozenset


def _rewrite_iterations(text: str, change: Callable) -> str:
    """Apply change(record) -> record to every iteration line; other lines stay byte-identical."""
    lines = text.split("\n")
    for rec in logs.parse_log(text).iterations:
        new = change(rec)
        if new is not rec:
            lines[rec.line_no - 1] = format_iteration(new)
    return "\n".join(lines)


def _iteration_line_no(text: str, iteration: int) -> int:
    """1-based line number of an iteration's log line (KeyError if the log has none)."""
    for rec in logs.parse_log(text).iterations:
        if rec.iteration == iteration:
            return rec.line_no
    raise KeyError(f"no iteration line for iteration {iteration}")


def _marker_line_no(text: str, marker_id: str) -> int:
    """1-based line number of a marker line."""
    return logs.parse_log(text).markers[marker_id]


def lr_zero(text: str, noise: float = 0.002, seed: int = 0) -> str:
    """Flat loss, as with --lr 0: every lm loss becomes the first logged value plus tiny noise."""
    first = logs.parse_log(text).first_loss_record
    rng = random.Random(seed)

    def flat(rec):
        """Replace one loss by the first one plus noise."""
        if rec.lm_loss is None or rec.line_no == first.line_no:
            return rec
        return replace(rec, lm_loss=first.lm_loss + rng.uniform(-noise, noise))

    return _rewrite_iterations(text, flat)


def nan_at(iteration: int) -> Callable[[str], str]:
    """From `iteration` on the lm loss is nan; the line at `iteration` counts one nan iteration."""
    def transform(text: str) -> str:
        """The log with nan losses from `iteration` on."""
        def poison(rec):
            """nan loss from `iteration` on, one nan counted at `iteration`."""
            if rec.iteration < iteration or rec.lm_loss is None:
                return rec
            return replace(rec, lm_loss=math.nan, nan=1 if rec.iteration == iteration else rec.nan)
        return _rewrite_iterations(text, poison)
    return transform


def truncated(at_line: int, keep_chars: int = 0) -> Callable[[str], str]:
    """Cut the log before line `at_line` (1-based); keep_chars > 0 leaves that many characters of it, no newline."""
    def transform(text: str) -> str:
        """The log cut before `at_line`."""
        lines = text.split("\n")
        head = "\n".join(lines[:at_line - 1]) + "\n"
        return head + lines[at_line - 1][:keep_chars] if keep_chars else head
    return transform


def truncated_before_marker(marker_id: str) -> Callable[[str], str]:
    """Cut the log just before a marker line (e.g. before `training ...`: the run died in setup)."""
    return lambda text: truncated(_marker_line_no(text, marker_id))(text)


def truncated_mid_iteration(iteration: int, keep_chars: int = 60) -> Callable[[str], str]:
    """Cut the log in the middle of an iteration line (the process was killed while printing)."""
    return lambda text: truncated(_iteration_line_no(text, iteration), keep_chars)(text)


def stopped_at(iteration: int) -> Callable[[str], str]:
    """Drop everything after the iteration line (validations, checkpoints, final evaluation included)."""
    return lambda text: truncated(_iteration_line_no(text, iteration) + 1)(text)


def no_dataset_lines(text: str) -> str:
    """Remove the three dataset-building lines."""
    wanted = {MARKERS[m] for m in DATASET_MARKERS}
    return "\n".join(line for line in text.split("\n") if line.strip() not in wanted)


def loss_too_high(text: str, shift: float = 1.5) -> str:
    """Raise the final lm loss (last iteration line) by `shift`."""
    last = logs.parse_log(text).iterations[-1].iteration
    return _rewrite_iterations(text, lambda r: replace(r, lm_loss=r.lm_loss + shift) if r.iteration == last else r)


def skips_late(iteration: int = 120, per_interval: int = 5) -> Callable[[str], str]:
    """`per_interval` of every 10 steps skipped from the interval ending at `iteration` on, long after the
    loss-scale search: the gradients keep overflowing (an occasional skip is normal fp16 loss scaling and does not
    fail; a whole interval skipped is divergence, no-nan's)."""
    return lambda text: _rewrite_iterations(text, lambda r: replace(r, skipped=per_interval)
                                            if r.iteration >= iteration else r)


def build_mutant_table() -> list:
    """The mutants and the megatron-lm criteria each must fail, no more, no fewer."""
    curve = {"final-loss", "golden-final-loss", "golden-curve"}
    return [
        Mutant("lr_zero", "flat loss (lr 0): every lm loss = the first one +/- 0.002", lr_zero,
               frozenset({"loss-decreases", *curve})),
        Mutant("nan_at_100", "lm loss nan from iteration 100, one nan iteration counted", nan_at(100),
               frozenset({"no-nan", "loss-decreases", *curve})),
        Mutant("truncated_before_training", "log ends just before `training ...` (died in setup)",
               truncated_before_marker("training"),
               frozenset({"training-started", "first-loss", "loss-decreases", "no-nan", "skips-early-only", *curve,
                          "exit-code", "checkpoints-saved", "gpu-memory"})),
        Mutant("truncated_mid_200", "log cut in the middle of the iteration 200 line", truncated_mid_iteration(200),
               frozenset({"final-loss", "golden-final-loss", "exit-code", "checkpoints-saved"})),
        Mutant("stopped_at_150", "nothing after the iteration 150 line", stopped_at(150),
               frozenset({*curve, "exit-code", "checkpoints-saved"})),
        Mutant("no_dataset_lines", "the three dataset-building lines removed", no_dataset_lines,
               frozenset({"datasets-built"})),
        Mutant("loss_too_high", "final lm loss + 1.5", loss_too_high, frozenset({"final-loss", "golden-final-loss"})),
        Mutant("skips_late", "half the steps skipped in every interval from 111 to 200", skips_late(120),
               frozenset({"skips-early-only"})),
    ]


MUTANTS = build_mutant_table()
