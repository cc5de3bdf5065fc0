"""fp16 dynamic loss scaling as a Megatron log shows it, and what separates it from divergence.

An overflowing fp16 gradient makes Megatron skip the step and halve the loss scale (after `hysteresis` overflows);
`number of nan iterations` counts the skipped steps whose loss itself was inf/nan (megatron/training/training.py,
training_log: it is only ever counted for a skipped step). So a skip, or a "nan iteration", is what loss scaling is
for: every run skips its first 17-18 steps while the scale comes down from 2^32, and healthy runs overflow now and
then later (seen in real Megatron-LM runs: one skip at iteration 41-50 with the course's flags; 5-7 % of the steps
after the search with the FAQ's --micro-batch-size 1, the scale settling as low as 8).

Divergence is something else, and each of these names it:
- a non-finite loss on an iteration line (a step that was NOT skipped produced nan/inf: the weights are gone);
- a whole log interval skipped after the search (no loss logged: every step overflowed, however far the scale
  came down);
- skipped steps that keep coming after the search (judged as a fraction of the steps after it).
A low loss scale alone is not divergence: a healthy --micro-batch-size 1 run (real Megatron-LM, H200) brought its
scale down to Megatron's minimum of 1 by iteration 180 with one skip per interval, its loss still falling to 8.09.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SkipCount:
    """Skipped steps after the loss-scale search, from the logs' interval counters."""

    skipped: int
    steps: int                      # steps covered by the counted intervals
    first: object | None = None     # the first IterationRecord with a skip after the search

    @property
    def fraction(self) -> float:
        return self.skipped / self.steps if self.steps else 0.0


def skips_after(iterations, after: int) -> SkipCount:
    """Skips in the log intervals that start after iteration `after` (each line's counter covers its interval)."""
    counted = [r for r in iterations if r.iteration > after and r.skipped is not None]
    if not counted:
        return SkipCount(0, 0)
    late = [r for r in counted if r.skipped > 0]
    return SkipCount(sum(r.skipped for r in counted), counted[-1].iteration - after, late[0] if late else None)


def non_finite_loss(iterations):
    """The first iteration line with a nan/inf lm or sop loss, else None."""
    return next((r for r in iterations if any(v is not None and not math.isfinite(v)
                                              for v in (r.lm_loss, r.sop_loss))), None)


def fully_skipped_after(iterations, after: int):
    """The first iteration line after `after` whose whole interval was skipped (no loss logged), else None."""
    previous = None
    for r in iterations:
        length = r.iteration - previous.iteration if previous is not None else r.iteration
        previous = r
        if r.iteration > after and (r.lm_loss is None or (r.skipped is not None and r.skipped >= length > 0)):
            return r
    return None


def divergence(iterations, after: int = 40, max_skip_fraction: float | None = None) -> tuple[str, object] | None:
    """(what shows the divergence, the iteration line) or None for a run that did not diverge."""
    bad = non_finite_loss(iterations)
    if bad is not None:
        return (f"non-finite loss on an iteration line that was not skipped (lm loss {bad.lm_loss}, sop loss "
                f"{bad.sop_loss}) at iteration {bad.iteration}", bad)
    stuck = fully_skipped_after(iterations, after)
    if stuck is not None:
        return (f"every step of the interval ending at iteration {stuck.iteration} was skipped (loss scale "
                f"{stuck.loss_scale:g}): the gradients overflow however far the fp16 loss scale comes down", stuck)
    if max_skip_fraction is not None:
        count = skips_after(iterations, after)
        if count.fraction > max_skip_fraction:
            return (f"{count.skipped} of {count.steps} steps after iteration {after} skipped ({count.fraction:.0%} "
                    f"> {max_skip_fraction:.0%}): the gradients keep overflowing", count.first)
    return None


def log_divergence(log, after: int = 40, max_skip_fraction: float | None = None) -> tuple[str, object] | None:
    """divergence() of a parsed log's iteration lines, computed once per log and `after` (ParsedLog.fact): the root
    cause, the diagnosis table and the no-nan criterion read the same answer."""
    return log.fact(("divergence", after, max_skip_fraction),
                    lambda parsed: divergence(parsed.iterations, after, max_skip_fraction))
