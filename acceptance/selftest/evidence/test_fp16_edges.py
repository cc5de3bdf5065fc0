"""Edges of harness.evidence.fp16's divergence rules, with the reference profile's `after` iteration and skip fraction:
a whole interval skipped just after `after` (and not at it), one skip short of a whole interval, the skip fraction
exactly at and just above the limit, and no counted interval at all."""

from __future__ import annotations

from dataclasses import replace

from harness.evidence import fp16, logs
from harness.base.paths import RECORDED_LOGS
from harness.judge.profiles import load_profile

GOOD = logs.parse_log_file(RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log")
REFERENCE = load_profile("reference")
AFTER = REFERENCE.by_id("no-nan").params["after"]
MOST = REFERENCE.by_id("skips-early-only").params["max_fraction"]
LATE = [r for r in GOOD.iterations if r.iteration > AFTER]
INTERVAL = LATE[1].iteration - LATE[0].iteration


def with_skips(skips: dict) -> tuple:
    """The recorded run's iteration lines with these skip counters ({iteration: skipped}), losses kept."""
    return tuple(replace(r, skipped=skips.get(r.iteration, 0), nan=0) for r in GOOD.iterations)


def test_the_recorded_run_does_not_diverge():
    assert fp16.divergence(with_skips({}), AFTER) is None
    assert fp16.fully_skipped_after(with_skips({}), AFTER) is None


def test_a_whole_interval_skipped_after_the_search_is_divergence():
    first = LATE[0]
    its = with_skips({first.iteration: INTERVAL})
    found = fp16.fully_skipped_after(its, AFTER)
    assert found is not None and found.iteration == first.iteration
    what, r = fp16.divergence(its, AFTER)
    assert r.iteration == first.iteration and f"ending at iteration {first.iteration} was skipped" in what
    assert fp16.fully_skipped_after(with_skips({first.iteration: INTERVAL - 1}), AFTER) is None


def test_a_whole_interval_ending_at_after_is_not_divergence():
    assert any(r.iteration == AFTER for r in GOOD.iterations)
    assert fp16.fully_skipped_after(with_skips({AFTER: INTERVAL}), AFTER) is None
    assert fp16.divergence(with_skips({AFTER: INTERVAL}), AFTER) is None


def test_an_interval_without_a_loss_after_the_search_is_divergence():
    target = LATE[2]
    its = tuple(replace(r, lm_loss=None) if r.iteration == target.iteration else r for r in with_skips({}))
    assert fp16.fully_skipped_after(its, AFTER).iteration == target.iteration


def _spread(k: int) -> dict:
    """k skips spread over the intervals after AFTER, the earliest ones first."""
    n = len(LATE)
    return {r.iteration: k // n + (1 if i < k % n else 0) for i, r in enumerate(LATE)}


def test_skip_fraction_exactly_at_the_limit_is_not_divergence_and_just_above_is():
    steps = LATE[-1].iteration - AFTER
    k = next(k for k in range(steps + 1) if k / steps > MOST) - 1     # the most skips within the limit
    spread, more = _spread(k), _spread(k + 1)
    assert sum(spread.values()) == k and max(more.values()) < INTERVAL
    assert fp16.divergence(with_skips(spread), AFTER, MOST) is None
    what, r = fp16.divergence(with_skips(more), AFTER, MOST)
    assert r.iteration == LATE[0].iteration and f"{k + 1} of {steps} steps after iteration {AFTER}" in what
    count = fp16.skips_after(with_skips(more), AFTER)
    assert (count.skipped, count.steps, count.first.iteration) == (k + 1, steps, LATE[0].iteration)


def test_no_counted_interval_counts_nothing():
    its = with_skips({})
    count = fp16.skips_after(its, its[-1].iteration)
    assert (count.skipped, count.steps, count.first, count.fraction) == (0, 0, None, 0.0)
    count = fp16.skips_after(its, AFTER)
    assert count.skipped == 0 and count.first is None and count.steps == its[-1].iteration - AFTER
