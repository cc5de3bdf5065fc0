"""fp16 dynamic loss scaling as a Megatron log shows it, and what separates it from divergence.

An overflowing fp16 gradient makes Megatron skip the step and halve the loss scale (after `hysteresis` overflows);
`number of nan iterations` counts the skipped steps whose loss itself was inf/nan (megatron/training/training.py,
training_log: it is only ever counted for a skipped step). So a skip, or a "nan iteration", is what loss scaling is
for: every run skips its first 17-18 steps while the scale comes down from 2^32, and healthy runs overflow now and
then later (seen in real Megatron-LM runs: one skip at iteration 41-50 with the course's flags; 5-7 % of the steps
after the search with the FAQ's --micro-batch-size 1, the scale settling as low as 8).

Divergence is something else, and each of these names it:
- a non-finite loss on an iteration line (a step that was NOT skipped produced nan/inf: the weights are gone);
- the loss scale collapsing to its minimum (every step overflows, whatever the scale);
- skipped steps that keep coming after the search (judged as a fraction of the steps after it).
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


def scale_collapse(iterations, floor: float):
    """The first iteration line whose loss scale is at or below `floor`, else None."""
    return next((r for r in iterations if r.loss_scale is not None and r.loss_scale <= floor), None)


def divergence(iterations, collapse_loss_scale: float = 1.0, after: int = 40,
               max_skip_fraction: float | None = None) -> tuple[str, object] | None:
    """(what shows the divergence, the iteration line) or None for a run that did not diverge."""
    bad = non_finite_loss(iterations)
    if bad is not None:
        return (f"non-finite loss on an iteration line that was not skipped (lm loss {bad.lm_loss}, sop loss "
                f"{bad.sop_loss}) at iteration {bad.iteration}", bad)
    low = scale_collapse(iterations, collapse_loss_scale)
    if low is not None:
        return (f"the fp16 loss scale collapsed to {low.loss_scale:g} (<= {collapse_loss_scale:g}) at iteration "
                f"{low.iteration}: every step overflows", low)
    if max_skip_fraction is not None:
        count = skips_after(iterations, after)
        if count.fraction > max_skip_fraction:
            return (f"{count.skipped} of {count.steps} steps after iteration {after} skipped ({count.fraction:.0%} "
                    f"> {max_skip_fraction:.0%}): the gradients keep overflowing", count.first)
    return None
