"""Every band and tolerance of harness.judge.criteria.KINDS judged exactly on, just inside and just outside each
edge, on both sides, and the failure message checked to print the bound actually applied.

The bounds are read from the committed profiles and golden files (fixtures/criteria/, fixtures/golden/), never typed
here. Losses are put into parsed logs as exact floats (not through the log's 7 printed digits), so "just outside"
is the next float past the edge. fixtures/edges/golden_dyadic_lm_loss.json is the population golden rounded to
multiples of 2^-6: there mean +/- tol is exact, so a value lies exactly on the tolerance (a `<=` turned into `<`
shows); the real golden file is also judged at its floating-point edge.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.judge import criteria, memory_golden
from harness.evidence import logs
from harness.judge.profiles import (Criterion, FAIL, Golden, GoldenSeries, KINDS, load_golden, load_profile, PASS, Profile, Verdict)
from harness.evidence.records import MemoryReport, RankMemory, RunEvidence
from harness.base.paths import FIXTURES, RECORDED_LOGS
from harness.evidence.logformat import IterationRecord, MARKER_TRAINING, ParsedLog, format_iteration

REFERENCE = load_profile("reference")
MEGATRON = load_profile("megatron-lm")
DYADIC = load_golden(FIXTURES / "edges" / "golden_dyadic_lm_loss.json")
RECORDED = dict(logs.parse_log_file(RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log").lm_losses)
INTERVAL = sorted(RECORDED)[1] - sorted(RECORDED)[0]       # the recorded run's --log-interval
UP, DOWN = math.inf, -math.inf


def criterion(profile: Profile, cid: str, **override) -> Criterion:
    """A criterion as the profile defines it, with some parameters overridden."""
    c = profile.by_id(cid)
    return replace(c, params={**c.params, **override})


def log_with(losses: dict, train_iters: int | None = None, skipped: dict | None = None) -> ParsedLog:
    """A parsed Megatron log with these exact lm losses ({iteration: loss}) and skip counters."""
    its = sorted(losses)
    train_iters = train_iters or its[-1]
    lines = [MARKER_TRAINING]
    for it in its:
        lines.append(format_iteration(IterationRecord(
            iteration=it, train_iters=train_iters, consumed_samples=16 * it, elapsed_ms=90.0, learning_rate=1e-4,
            global_batch_size=16, loss_scale=65536.0, lm_loss=1.0, sop_loss=0.69, skipped=(skipped or {}).get(it, 0),
            nan=0, timestamp="2026-01-01 00:00:00.000000")))
    parsed = logs.parse_log("\n".join(lines) + "\n")
    assert [r.iteration for r in parsed.iterations] == its
    return replace(parsed, iterations=tuple(replace(r, lm_loss=losses[r.iteration]) for r in parsed.iterations))


def verdict(c: Criterion, ev: RunEvidence, golden=None) -> Verdict:
    """The one verdict of a one-criterion profile."""
    profile = Profile(name="edges", path="edges.toml", description="", criteria=(c,), golden=golden)
    return criteria.judge(profile, ev).verdicts[0]


def curve(value_at_last: float | None = None, upto: int | None = None) -> dict:
    """The recorded run's losses, optionally cut at `upto` and with another final value."""
    its = [it for it in sorted(RECORDED) if upto is None or it <= upto]
    losses = {it: RECORDED[it] for it in its}
    if value_at_last is not None:
        losses[its[-1]] = value_at_last
    return losses


def edge_values(lo: float, hi: float) -> list:
    """(value, inside?) exactly on, just inside and just outside both edges."""
    return [(lo, True), (math.nextafter(lo, UP), True), (math.nextafter(lo, DOWN), False),
            (hi, True), (math.nextafter(hi, DOWN), True), (math.nextafter(hi, UP), False)]


def off_by_tolerance(mean: float, d: float, side: float) -> tuple[float, float]:
    """(the farthest float v on `side` of mean with |v - mean| <= d, the next float past it). d <= |mean| / 2 keeps
    v within a factor 2 of mean, where v - mean is exact (Sterbenz), so the search is a few steps."""
    assert 0 < d <= abs(mean) / 2, (mean, d)
    v = mean + side * d
    while abs(v - mean) > d:
        v = math.nextafter(v, mean)
    while abs(math.nextafter(v, side * UP) - mean) <= d:
        v = math.nextafter(v, side * UP)
    return v, math.nextafter(v, side * UP)


def failed_naming(v: Verdict, *texts: str) -> None:
    """The verdict failed and its message prints each text."""
    assert v.status == FAIL, v.message
    for text in texts:
        assert text in v.message, f"{text!r} not in:\n{v.message}"


# ---------------------------------------------------------------- lo/hi bands


@pytest.mark.parametrize("profile, cid", [(REFERENCE, "first-loss"), (load_profile("course"), "first-loss")])
def test_first_loss_band_edges(profile, cid):
    c = criterion(profile, cid)
    lo, hi = c.params["lo"], c.params["hi"]
    first = min(RECORDED)
    for value, inside in edge_values(lo, hi):
        v = verdict(c, RunEvidence(run_dir="edge", log=log_with({**curve(), first: value})))
        if inside:
            assert v.status == PASS, (value, v.message)
        else:
            failed_naming(v, f"[{lo}, {hi}]", f"at iteration {first}")


@pytest.mark.parametrize("profile, cid", [(REFERENCE, "final-loss"), (load_profile("course"), "final-loss")])
def test_final_loss_band_edges(profile, cid):
    """Catches `lo <= value <= hi` turned into `lo <= value < hi` (or `lo < value`): the edges themselves pass."""
    c = criterion(profile, cid)
    lo, hi = c.params["lo"], c.params["hi"]
    last = max(RECORDED)
    for value, inside in edge_values(lo, hi):
        v = verdict(c, RunEvidence(run_dir="edge", log=log_with(curve(value))))
        if inside:
            assert v.status == PASS, (value, v.message)
        else:
            failed_naming(v, f"[{lo}, {hi}]", f"at iteration {last}")


def test_final_loss_band_value_exactly_on_hi_passes():
    """The planted bug `lo <= value < hi`: a final loss exactly on the band's upper edge must pass."""
    c = criterion(REFERENCE, "final-loss")
    assert verdict(c, RunEvidence(run_dir="edge", log=log_with(curve(c.params["hi"])))).status == PASS


def test_final_loss_band_needs_the_last_line_to_be_train_iters():
    c = criterion(REFERENCE, "final-loss")
    assert c.params["require_complete"]
    last = max(RECORDED)
    inside = (c.params["lo"] + c.params["hi"]) / 2
    stopped = verdict(c, RunEvidence(run_dir="edge", log=log_with(curve(inside), train_iters=last + INTERVAL)))
    failed_naming(stopped, f"stops at iteration {last} of {last + INTERVAL}")
    assert verdict(c, RunEvidence(run_dir="edge", log=log_with(curve(inside), train_iters=last))).status == PASS


def _nvml(peak: float, gpu: str, ranks: tuple = ()) -> MemoryReport:
    return MemoryReport(method="nvml-process", peak_mib=peak, samples=10, interval_ms=100.0, gpu_name=gpu,
                        ranks=ranks)


def test_memory_band_mib_edges():
    c = criterion(MEGATRON, "gpu-memory")
    assert c.kind == "memory_band_mib"
    lo, hi = c.params["lo"], c.params["hi"]
    for value, inside in edge_values(lo, hi):
        v = verdict(c, RunEvidence(run_dir="edge", memory=_nvml(value, "NVIDIA H200")))
        if inside:
            assert v.status == PASS, (value, v.message)
        else:
            failed_naming(v, f"[{lo}, {hi}] MiB")


def test_memory_band_mib_judges_every_rank_on_one_gpu():
    """A single GPU seen with its own rank entry: the rank's peak is judged too, edges included."""
    c = criterion(MEGATRON, "gpu-memory")
    lo, hi = c.params["lo"], c.params["hi"]
    ok = verdict(c, RunEvidence(run_dir="edge", memory=_nvml(lo, "NVIDIA H200", (RankMemory(0, hi),))))
    assert ok.status == PASS, ok.message
    bad = verdict(c, RunEvidence(run_dir="edge", memory=_nvml(lo, "NVIDIA H200",
                                                                (RankMemory(0, math.nextafter(hi, UP)),))))
    failed_naming(bad, f"[{lo}, {hi}] MiB")


def test_memory_own_band_edges():
    c = criterion(REFERENCE, "gpu-memory")
    assert c.kind == "memory_own_band"
    doc, _ = memory_golden.select("NVIDIA H200")
    lo, hi = doc["own_band_mib"]["lo"], doc["own_band_mib"]["hi"]
    context = doc["samples"][sorted(doc["samples"])[0]]["context_mib"]
    for value, inside in edge_values(lo, hi):
        ev = RunEvidence(run_dir="edge", memory=_nvml(value + context, doc["gpu"]),
                         extra={"summary": {"torch_max_reserved_mib": value}})
        v = verdict(c, ev)
        if inside:
            assert v.status == PASS, (value, v.message)
        else:
            failed_naming(v, f"[{lo}, {hi}] MiB")


# ---------------------------------------------------------------- golden tolerances


def _golden_last(golden: Golden) -> tuple[int, float, float]:
    series = golden.metrics["lm loss"]
    it = series.iterations[-1]
    return (it, *series.at(it))


@pytest.mark.parametrize("golden", [REFERENCE.golden, DYADIC], ids=["population", "dyadic"])
@pytest.mark.parametrize("side", [UP, DOWN], ids=["above", "below"])
def test_golden_final_loss_edges(golden, side):
    c = criterion(REFERENCE, "golden-final-loss")
    it, mean, tol = _golden_last(golden)
    d = tol * c.params["tol_scale"]
    on, outside = off_by_tolerance(mean, d, 1 if side == UP else -1)
    losses = {i: golden.metrics["lm loss"].at(i)[0] for i in golden.metrics["lm loss"].iterations}
    for value, ok in ((on, True), (math.nextafter(on, mean), True), (outside, False)):
        v = verdict(c, RunEvidence(run_dir="edge", log=log_with({**losses, it: value})), golden)
        if ok:
            assert v.status == PASS, (value, v.message)
        else:
            failed_naming(v, f"{mean:.4f} +/- {d:.4f} at iteration {it}")
    if golden is DYADIC:   # exactly on: |value - mean| == tol
        assert abs(on - mean) == d


def test_golden_final_loss_message_prints_the_scaled_tolerance():
    base = criterion(REFERENCE, "golden-final-loss")
    scale = 2 * base.params["tol_scale"]
    c = criterion(REFERENCE, "golden-final-loss", tol_scale=scale)
    it, mean, tol = _golden_last(DYADIC)
    losses = {i: DYADIC.metrics["lm loss"].at(i)[0] for i in DYADIC.metrics["lm loss"].iterations}
    on = verdict(c, RunEvidence(run_dir="edge", log=log_with({**losses, it: mean + tol * scale})), DYADIC)
    assert on.status == PASS, on.message
    out = verdict(c, RunEvidence(run_dir="edge", log=log_with({**losses, it: math.nextafter(mean + tol * scale, UP)})),
                  DYADIC)
    failed_naming(out, f"+/- {tol * scale:.4f}")


def _curve_off(golden: Golden, offsets: dict, drop=()) -> dict:
    """The golden means, each moved by offsets[it] (exact arithmetic on the dyadic file), some iterations left out."""
    series = golden.metrics["lm loss"]
    return {it: m + offsets.get(it, 0.0) for it, m in zip(series.iterations, series.mean) if it not in drop}


@pytest.mark.parametrize("side", [1, -1], ids=["above", "below"])
def test_golden_curve_tolerance_edges(side):
    """max_misses + 1 points at the edge: exactly on passes, the next float past it fails (so a doubled or
    halved tolerance shows); the message prints the tolerance applied at the worst point."""
    c = criterion(REFERENCE, "golden-curve")
    series, scale, allowed = DYADIC.metrics["lm loss"], c.params["tol_scale"], c.params["max_misses"]
    picked = series.iterations[-(allowed + 1):]
    tol = {it: t * scale for it, t in zip(series.iterations, series.tol)}
    on = _curve_off(DYADIC, {it: side * tol[it] for it in picked})
    assert all(abs(on[it] - series.at(it)[0]) == tol[it] for it in picked)
    v = verdict(c, RunEvidence(run_dir="edge", log=log_with(on)), DYADIC)
    assert v.status == PASS and v.measured.startswith("0 miss(es)"), v.message
    inside = {it: math.nextafter(on[it], series.at(it)[0]) if it in picked else on[it] for it in on}
    assert verdict(c, RunEvidence(run_dir="edge", log=log_with(inside)), DYADIC).status == PASS
    outside = {it: math.nextafter(on[it], side * UP) if it in picked else on[it] for it in on}
    v = verdict(c, RunEvidence(run_dir="edge", log=log_with(outside)), DYADIC)
    worst = max(picked, key=lambda it: abs(outside[it] - series.at(it)[0]) / tol[it])
    failed_naming(v, f"{allowed + 1} miss(es) of {len(series.iterations)}", f"at most {allowed} miss(es)",
                  f"{series.at(worst)[0]:.4f} +/- {tol[worst]:.4f}")


@pytest.mark.parametrize("side", [1, -1], ids=["above", "below"])
def test_golden_curve_tolerance_edges_on_the_population_golden(side):
    c = criterion(REFERENCE, "golden-curve")
    golden = REFERENCE.golden
    series, scale, allowed = golden.metrics["lm loss"], c.params["tol_scale"], c.params["max_misses"]
    picked = series.iterations[-(allowed + 1):]
    inside, outside = dict(zip(series.iterations, series.mean)), dict(zip(series.iterations, series.mean))
    for it in picked:
        mean, tol = series.at(it)
        inside[it], outside[it] = off_by_tolerance(mean, tol * scale, side)
    assert verdict(c, RunEvidence(run_dir="edge", log=log_with(inside)), golden).status == PASS
    v = verdict(c, RunEvidence(run_dir="edge", log=log_with(outside)), golden)
    failed_naming(v, f"{allowed + 1} miss(es)")


def test_golden_curve_doubled_tol_scale_is_applied_and_printed():
    """tol_scale doubled: 1.5 x tol passes, just past 2 x tol fails, and the message prints 2 x tol (the planted
    bug doubled the tolerance while the message still printed the old one)."""
    base = criterion(REFERENCE, "golden-curve")
    scale = 2 * base.params["tol_scale"]
    c = criterion(REFERENCE, "golden-curve", tol_scale=scale)
    series, allowed = DYADIC.metrics["lm loss"], c.params["max_misses"]
    picked = series.iterations[:allowed + 1]
    tol = dict(zip(series.iterations, series.tol))
    within = _curve_off(DYADIC, {it: 0.75 * scale * tol[it] for it in picked})
    assert verdict(c, RunEvidence(run_dir="edge", log=log_with(within)), DYADIC).status == PASS
    past = {it: math.nextafter(v, UP) if it in picked else v
            for it, v in _curve_off(DYADIC, {it: scale * tol[it] for it in picked}).items()}
    v = verdict(c, RunEvidence(run_dir="edge", log=log_with(past)), DYADIC)
    worst = max(picked, key=lambda it: (past[it] - series.at(it)[0]) / (scale * tol[it]))
    failed_naming(v, f"+/- {scale * tol[worst]:.4f}")
    assert f"+/- {tol[worst]:.4f}" not in v.message.replace(f"+/- {scale * tol[worst]:.4f}", "")


def test_golden_curve_profile_tolerance_is_not_doubled():
    """With the profile's own tol_scale a point just past 1 x tol is a miss: a doubled tolerance would pass it."""
    c = criterion(REFERENCE, "golden-curve")
    series, allowed = DYADIC.metrics["lm loss"], c.params["max_misses"]
    picked = series.iterations[:allowed + 1]
    tol = {it: t * c.params["tol_scale"] for it, t in zip(series.iterations, series.tol)}
    past = {it: math.nextafter(v, UP) if it in picked else v
            for it, v in _curve_off(DYADIC, {it: tol[it] for it in picked}).items()}
    v = verdict(c, RunEvidence(run_dir="edge", log=log_with(past)), DYADIC)
    failed_naming(v, f"+/- {tol[picked[0]]:.4f}")


@pytest.mark.parametrize("how", ["far-off", "missing"])
def test_golden_curve_max_misses_edges(how):
    """max_misses - 1 and max_misses misses pass, max_misses + 1 fail; a missing iteration is a miss too."""
    c = criterion(REFERENCE, "golden-curve")
    series, allowed = DYADIC.metrics["lm loss"], c.params["max_misses"]
    assert allowed >= 1
    for misses in (allowed - 1, allowed, allowed + 1):
        picked = series.iterations[1:1 + misses]
        if how == "far-off":
            losses = _curve_off(DYADIC, {it: 10 * max(series.tol) for it in picked})
        else:
            losses = _curve_off(DYADIC, {}, drop=picked)
        v = verdict(c, RunEvidence(run_dir="edge", log=log_with(losses, train_iters=series.iterations[-1])), DYADIC)
        if misses <= allowed:
            assert v.status == PASS, v.message
        else:
            failed_naming(v, f"{misses} miss(es) of {len(series.iterations)}", f"at most {allowed} miss(es)")


# ---------------------------------------------------------------- resume tolerance


@pytest.mark.parametrize("side", [1, -1], ids=["above", "below"])
def test_resume_matches_tolerance_edges(side):
    c = criterion(REFERENCE, "resume-matches")
    tol = c.params["tol"]
    losses = curve()
    it = sorted(losses)[len(losses) // 2]
    base = losses[it]
    on, outside = off_by_tolerance(base, tol, side)
    for value, ok in ((on, True), (math.nextafter(on, base), True), (outside, False)):
        ev = RunEvidence(run_dir="edge", log=log_with(losses), resume_log=log_with({it: value}))
        v = verdict(c, ev)
        if ok:
            assert v.status == PASS, (value, v.message)
        else:
            failed_naming(v, f"within {tol} of the uninterrupted run", f"iteration {it}")


@pytest.mark.parametrize("side", [1, -1], ids=["above", "below"])
def test_resume_matches_exactly_tol_apart_passes(side):
    """|resumed - uninterrupted| == tol exactly (2 tol and tol are exact floats apart): a pass."""
    c = criterion(REFERENCE, "resume-matches")
    tol = c.params["tol"]
    base, value = (tol, 2 * tol) if side == 1 else (2 * tol, tol)
    assert abs(value - base) == tol
    it = INTERVAL
    ev = RunEvidence(run_dir="edge", log=log_with({it: base}), resume_log=log_with({it: value}))
    assert verdict(c, ev).status == PASS
    ev = RunEvidence(run_dir="edge", log=log_with({it: base}),
                     resume_log=log_with({it: math.nextafter(value, side * UP)}))
    failed_naming(verdict(c, ev), f"within {tol}")


# ---------------------------------------------------------------- skips_only_before


def _exact_fraction(fraction: float, interval: int) -> tuple[int, int]:
    """(skipped, steps): steps a multiple of the log interval, skipped / steps == fraction exactly."""
    for steps in range(interval, 100 * interval + 1, interval):
        k = round(fraction * steps)
        if k / steps == fraction and k + 1 <= steps:
            return k, steps
    raise AssertionError(f"no whole number of skips is exactly {fraction} of a multiple of {interval} steps")


def _skips_log(after: int, steps: int, skipped: int, early: int = 0) -> ParsedLog:
    """Lines every INTERVAL up to after + steps; `skipped` skips spread over the intervals after `after`,
    `early` skips in the interval ending at `after`."""
    its = list(range(INTERVAL, after + steps + 1, INTERVAL))
    late = [it for it in its if it > after]
    counts = {it: skipped // len(late) + (1 if i < skipped % len(late) else 0) for i, it in enumerate(late)}
    counts[after] = early
    return log_with({it: RECORDED.get(it, 9.0) for it in its}, skipped=counts)


def test_skips_only_before_max_fraction_edges():
    c = criterion(REFERENCE, "skips-early-only")
    after, most = c.params["iteration"], c.params["max_fraction"]
    assert after % INTERVAL == 0 and most > 0
    k, steps = _exact_fraction(most, INTERVAL)
    for skipped, ok in ((k, True), (k - 1, True), (k + 1, False)):
        v = verdict(c, RunEvidence(run_dir="edge", log=_skips_log(after, steps, skipped)))
        if ok:
            assert v.status == PASS, (skipped, v.message)
        else:
            failed_naming(v, f"at most {most:.1%} of the steps after iteration {after}",
                          f"after it {skipped} of {steps} steps ({skipped / steps:.1%})")


def test_skips_only_before_iteration_edge():
    """Skips in the interval ending exactly at `iteration` are before it; one interval later they count (with the
    kind's default max_fraction: none at all)."""
    default = KINDS["skips_only_before"].optional["max_fraction"]
    c = criterion(REFERENCE, "skips-early-only", max_fraction=default)
    after = c.params["iteration"]
    on = verdict(c, RunEvidence(run_dir="edge", log=_skips_log(after, 4 * INTERVAL, 0, early=INTERVAL - 1)))
    assert on.status == PASS, on.message
    late = verdict(c, RunEvidence(run_dir="edge", log=_skips_log(after, 4 * INTERVAL, 1)))
    failed_naming(late, f"ending at or before iteration {after}", f"after it 1 of {4 * INTERVAL} steps")


# ---------------------------------------------------------------- decreasing_trend


def _dyadic(x: float) -> float:
    return round(x * 64) / 64


def _trend_log(means: list, window: int) -> ParsedLog:
    """Windows of `window` equal values, one window per mean (so the windowed means are exactly these)."""
    values = [m for m in means for _ in range(window)]
    return log_with({INTERVAL * (i + 1): v for i, v in enumerate(values)})


def test_decreasing_trend_min_drop_edges():
    c = criterion(REFERENCE, "loss-decreases")
    window, min_drop = c.params["window_iters"] // INTERVAL, c.params["min_drop"]  # windows in iterations
    low = _dyadic(RECORDED[max(RECORDED)])
    step = 2.0 ** -30
    for top, ok in ((low + min_drop, True), (low + min_drop + step, True), (low + min_drop - step, False)):
        means = [top, (top + low) / 2, low]
        v = verdict(c, RunEvidence(run_dir="edge", log=_trend_log(means, window)))
        if ok:
            assert v.status == PASS, (top, v.message)
        else:
            failed_naming(v, f">= {min_drop}", f"at most {c.params['max_increases']} rise(s)")


def test_decreasing_trend_max_increases_edges():
    c = criterion(REFERENCE, "loss-decreases")
    window, min_drop, most = c.params["window_iters"] // INTERVAL, c.params["min_drop"], c.params["max_increases"]
    low = _dyadic(RECORDED[max(RECORDED)])
    bump = 2.0 ** -6
    for rises, ok in ((most - 1, True), (most, True), (most + 1, False)):
        means = [low + 2 * min_drop] + [low, low + bump] * rises + [low]
        v = verdict(c, RunEvidence(run_dir="edge", log=_trend_log(means, window)))
        if ok:
            assert v.status == PASS, (rises, v.message)
        else:
            failed_naming(v, f"{rises} rise(s) over {len(means)} window means", f"at most {most} rise(s)")


def test_decreasing_trend_needs_two_windows():
    c = criterion(REFERENCE, "loss-decreases")
    window = c.params["window_iters"] // INTERVAL          # windows in iterations: this many log intervals
    low = _dyadic(RECORDED[max(RECORDED)])
    values = {INTERVAL * (i + 1): low + c.params["min_drop"] * (2 * window - i) for i in range(2 * window)}
    assert verdict(c, RunEvidence(run_dir="edge", log=log_with(values))).status == PASS
    short = dict(list(values.items())[:2 * window - 1])
    failed_naming(verdict(c, RunEvidence(run_dir="edge", log=log_with(short))),
                  f"{2 * window - 1} logged lm loss value(s) over iterations {INTERVAL}-{INTERVAL * (2 * window - 1)}, "
                  f"need {2 * c.params['window_iters']} iterations")


# ---------------------------------------------------------------- properties: any band


FINITE = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def band_and_value(draw):
    """(lo, hi, value, inside?) for any band: a value inside, on an edge, or outside."""
    a, b = draw(FINITE), draw(FINITE)
    lo, hi = min(a, b), max(a, b)
    where = draw(st.sampled_from(["lo", "hi", "inside", "below", "above"]))
    if where == "lo":
        return lo, hi, lo, True
    if where == "hi":
        return lo, hi, hi, True
    if where == "inside":
        return lo, hi, draw(st.floats(min_value=lo, max_value=hi)), True
    if where == "below":
        return lo, hi, draw(st.floats(max_value=math.nextafter(lo, DOWN), min_value=-2e6)), False
    return lo, hi, draw(st.floats(min_value=math.nextafter(hi, UP), max_value=2e6)), False


@settings(max_examples=150, deadline=None)
@given(case=band_and_value(), cid=st.sampled_from(["first-loss", "final-loss"]))
def test_any_loss_band_passes_inside_and_fails_outside(case, cid):
    lo, hi, value, inside = case
    c = criterion(REFERENCE, cid, lo=lo, hi=hi)
    losses = curve()
    losses[min(losses) if cid == "first-loss" else max(losses)] = value
    v = verdict(c, RunEvidence(run_dir="edge", log=log_with(losses)))
    assert v.status == (PASS if inside else FAIL), v.message
    if not inside:
        assert f"[{lo}, {hi}]" in v.message


@settings(max_examples=100, deadline=None)
@given(case=band_and_value())
def test_any_memory_band_passes_inside_and_fails_outside(case):
    lo, hi, value, inside = case
    c = criterion(MEGATRON, "gpu-memory", lo=lo, hi=hi)
    v = verdict(c, RunEvidence(run_dir="edge", memory=_nvml(value, "NVIDIA H200")))
    assert v.status == (PASS if inside else FAIL), v.message


@settings(max_examples=100, deadline=None)
@given(base=st.floats(min_value=1.0, max_value=12.0), tol=st.floats(min_value=1e-6, max_value=1.0),
       frac=st.floats(min_value=0.0, max_value=1.0), side=st.sampled_from([1, -1]), outside=st.booleans())
def test_any_resume_tolerance_passes_inside_and_fails_outside(base, tol, frac, side, outside):
    assume(tol <= base / 2)
    c = criterion(REFERENCE, "resume-matches", tol=tol)
    on, past = off_by_tolerance(base, tol, side)
    value = past + side * frac * tol if outside else base + side * frac * (on - base) * side
    ev = RunEvidence(run_dir="edge", log=log_with({INTERVAL: base}), resume_log=log_with({INTERVAL: value}))
    assert verdict(c, ev).status == (FAIL if outside else PASS)


@settings(max_examples=100, deadline=None)
@given(mean=st.floats(min_value=1.0, max_value=12.0), tol=st.floats(min_value=1e-4, max_value=1.0),
       scale=st.floats(min_value=0.25, max_value=4.0), frac=st.floats(min_value=0.0, max_value=1.0),
       side=st.sampled_from([1, -1]), outside=st.booleans())
def test_any_golden_tolerance_passes_inside_and_fails_outside(mean, tol, scale, frac, side, outside):
    golden = Golden(path="any.json", provenance={},
                             metrics={"lm loss": GoldenSeries((INTERVAL,), (mean,), (tol,))})
    assume(tol * scale <= mean / 2)
    on, past = off_by_tolerance(mean, tol * scale, side)
    value = past + side * frac * tol if outside else mean + frac * (on - mean)
    ev = RunEvidence(run_dir="edge", log=log_with({INTERVAL: value}))
    for cid in ("golden-final-loss", "golden-curve"):
        c = criterion(REFERENCE, cid, tol_scale=scale, **({"max_misses": 0} if cid == "golden-curve" else {}))
        v = verdict(c, ev, golden)
        assert v.status == (FAIL if outside else PASS), (cid, v.message)
        if outside:
            assert f"+/- {tol * scale:.4f}" in v.message
