"""The criterion kinds: one checker per entry of harness.judge.profiles.KINDS, each RunEvidence -> Finding.

Missing evidence is "not-measurable", never a pass; every checker says what it measured, what it expected and
where in the log it looked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from harness.judge import bands, log_evidence
from harness.evidence import fp16, logs
from harness.evidence.records import RunEvidence
from harness.judge.layouts import layout_of
from harness.evidence.recipe import DEFAULT_RECIPE, detect_recipe, load_recipe, recipe_deviations
from harness.judge.profiles import (FAIL, KINDS, NOT_MEASURABLE, PASS, Criterion, Golden, GoldenSeries, _layout_bands, metric_series)
from harness.evidence.logformat import MARKERS


@dataclass(frozen=True)
class Finding:
    """What a checker found, before it is dressed as a Verdict."""

    status: str
    measured: str
    expected: str
    where: str
    missing: bool = False             # failed because the run never got that far (absent evidence)
    grader: bool = False              # not judged: the suite's own limitation (never the student's failure)


def _missing(measured: str, expected: str, where: str) -> Finding:
    """A failure for absent evidence: with a root cause, reported as its consequence."""
    return Finding(FAIL, measured, expected, where, missing=True)


def _fmt(value: float | None) -> str:
    """A loss for messages."""
    return "none" if value is None else f"{value:.4f}"


def _at(it: int, line_no: int) -> str:
    """A 'where' for a log line."""
    return f"iteration {it}, log line {line_no}"


def _log_end(log) -> str:
    """A 'where' for something absent from the whole log."""
    cut = ", last line cut off" if log.truncated_last_line else ""
    return f"whole log ({log.lines_total} lines{cut})"


def _unmeasured(reason: str, expected: str, where: str = "-") -> Finding:
    """Missing evidence: never a pass."""
    return Finding(NOT_MEASURABLE, f"not measured: {reason}", expected, where)


def _no_log(expected: str) -> Finding:
    """The run has no training log to read."""
    return _unmeasured("no training log", expected)


def _check_marker_present(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """Every marker line present."""
    wanted = c.params["markers"]
    expected = "log lines: " + "; ".join(repr(MARKERS[m].strip()) for m in wanted)
    if ev.log is None:
        return _no_log(expected)
    missing = [m for m in wanted if m not in ev.log.markers]
    if missing:
        found = [f"{m} (line {ev.log.markers[m]})" for m in wanted if m in ev.log.markers]
        measured = "missing " + "; ".join(repr(MARKERS[m].strip()) for m in missing)
        return _missing(measured + (f"; found {', '.join(found)}" if found else ""), expected, _log_end(ev.log))
    lines = [ev.log.markers[m] for m in wanted]
    return Finding(PASS, "found at log line(s) " + ", ".join(map(str, lines)), expected, f"log line {lines[0]}")


def _check_exit_code(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """The run completed: exit code and no timeout (a live run), and the log's normal end (harness.evidence.logs.run_end:
    the last iteration is --train-iters, the final save finished, the final evaluations on the validation and test
    sets printed, no traceback or launcher failure after them)."""
    expected = (f"the run completed: the log's normal end (last iteration = --train-iters, the final save's "
                f"`successfully saved` line, `validation loss ... on validation set` and `... on test set`, no "
                f"traceback or launcher failure after them)" + (
                    f"; exit code {c.params['expected']}, no timeout" if ev.exit_code is not None or ev.timed_out
                    else ""))
    if ev.timed_out:
        return Finding(FAIL, f"timed out (exit code {ev.exit_code})", expected, "process end")
    code = "" if ev.exit_code is None else f"exit code {ev.exit_code}; "
    if ev.exit_code is not None and ev.exit_code != c.params["expected"]:
        return Finding(FAIL, f"exit code {ev.exit_code}", expected, "process end")
    if ev.log is None:
        return _unmeasured(code + "no training log to show the run's end", expected)
    end = logs.run_end(ev.log)
    if not end.complete:
        missing = f"; missing: {'; '.join(end.missing)}" if end.missing else ""
        return Finding(FAIL, f"{code}{end.stopped}{missing}", expected, end.where)
    return Finding(PASS, code + end.stopped, expected, end.where)


def _check_ran_on_gpu(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """The trainer ran on the expected device: as the trainer recorded it (a live run), and as the log proves it
    (CUDA allocator reports, the NCCL process group, device arguments; gloo-only or CPU lines refute it)."""
    want = c.params["expected"]
    expected = f"device {want}" + (" (the log's CUDA memory report lines, NCCL process-group lines or device "
                                   "arguments)" if want == "cuda" else "")
    proofs, refutes = log_evidence.gpu_evidence(ev.log) if ev.log is not None else ([], [])
    where = f"log line {ev.log.arguments_line or 1}" if ev.log is not None else "trainer start"
    if ev.device is not None:
        status = PASS if ev.device == want and not (want == "cuda" and refutes) else FAIL
        seen = "; ".join(([f"refuted by {'; '.join(refutes)}"] if refutes and want == "cuda" else []) + proofs[:1])
        return Finding(status, f"device {ev.device}" + (f" ({seen})" if seen else ""), expected, "trainer start")
    if ev.log is None:
        return _unmeasured("the trainer's device was not recorded and there is no training log", expected)
    if want != "cuda":
        return _unmeasured(f"a log proves a CUDA run only; device {want} is not shown by it", expected)
    if refutes:
        return Finding(FAIL, "not on the GPU: " + "; ".join(refutes), expected, where)
    if proofs:
        return Finding(PASS, "; ".join(proofs), expected, where)
    return _unmeasured("the log has no CUDA memory report line (`[Rank N] ... memory (MB) | allocated`), no NCCL "
                       "process-group line and no device argument", expected, _log_end(ev.log))


def _check_first_loss_band(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """The first logged loss lies in the band."""
    lo, hi, metric = c.params["lo"], c.params["hi"], c.params["metric"]
    expected = f"first logged {metric} in [{lo}, {hi}]"
    if ev.log is None:
        return _no_log(expected)
    series = metric_series(ev.log, metric)
    if not series:
        return _missing(f"no line with {metric} ({len(ev.log.iterations)} iteration lines)", expected,
                        _log_end(ev.log))
    it, value, line_no = series[0]
    if c.params["by_iteration"] and it > c.params["by_iteration"]:
        return _unmeasured(f"the first {metric} is logged at iteration {it} ({_fmt(value)}, the mean of its log "
                           f"interval of {logs.log_interval(ev.log)}), after iteration {c.params['by_iteration']}, "
                           "the last one this band holds for: golden-curve judges it", expected, _at(it, line_no))
    return Finding(PASS if lo <= value <= hi else FAIL, f"{_fmt(value)} at iteration {it}", expected,
                   _at(it, line_no))


def _check_decreasing_trend(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """Windowed means fall by min_drop overall with few rises: robust to per-line noise. Windows are in iterations
    (window_iters) when the profile says so, whatever the run's --log-interval; else ~window logged values."""
    window, min_drop, max_rises, metric = (c.params[k] for k in ("window", "min_drop", "max_increases", "metric"))
    width = c.params["window_iters"]
    expected = (f"first minus last window mean of {metric} >= {min_drop} (windows of "
                + (f"~{width} iterations" if width else f"~{window} logged values")
                + f"), at most {max_rises} rise(s) between consecutive window means")
    if ev.log is None:
        return _no_log(expected)
    series = metric_series(ev.log, metric)
    interval = logs.log_interval(ev.log) or 1
    if width and (not series or series[-1][0] - series[0][0] + interval < 2 * width):
        span = f"iterations {series[0][0]}-{series[-1][0]}" if series else "no iteration"
        return _missing(f"{len(series)} logged {metric} value(s) over {span}, need {2 * width} iterations",
                        expected, _log_end(ev.log))
    if not width and len(series) < 2 * window:
        return _missing(f"only {len(series)} logged {metric} value(s), need {2 * window}", expected,
                        _log_end(ev.log))
    where = f"iterations {series[0][0]}-{series[-1][0]}, log lines {series[0][2]}-{series[-1][2]}"
    bad = next(((it, v, ln) for it, v, ln in series if not math.isfinite(v)), None)
    if bad:
        return Finding(FAIL, f"non-finite {metric} {bad[1]} at iteration {bad[0]}", expected, _at(bad[0], bad[2]))
    chunks = (log_evidence.iteration_windows(series, width, interval) if width else
              log_evidence.value_windows([v for _, v, _ in series], window))
    means = [sum(w) / len(w) for w in chunks]
    drop, rises = means[0] - means[-1], sum(b > a for a, b in zip(means, means[1:]))
    measured = (f"drop {drop:.4f} ({means[0]:.4f} -> {means[-1]:.4f}), {rises} rise(s) over {len(means)} "
                f"window means")
    return Finding(PASS if drop >= min_drop and rises <= max_rises else FAIL, measured, expected, where)


def _at_iteration(c: Criterion, ev: RunEvidence, at: int, expected: str):
    """(point, run) of the metric the run printed for iteration `at` (the one rule: log_evidence.at_iteration), or
    (Finding, run) saying why there is none."""
    run = log_evidence.reach(ev)
    got = log_evidence.at_iteration(ev.log, run, at, c.params["metric"])
    if got.status == "ok":
        return got.point, run
    if got.status == "not-printed":
        return _unmeasured(got.measured, expected, got.where), run
    if got.status == "lines-missing":     # the log proves the run got there: the line was taken out of it
        return Finding(FAIL, got.measured, expected, got.where), run
    return _missing(got.measured, expected, got.where), run


def _check_final_loss_band(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """The loss the run printed for its last iteration lies in the band: the line of the log interval that ends at
    --train-iters (require_complete), else at the iteration the log proves the run reached."""
    lo, hi, metric = c.params["lo"], c.params["hi"], c.params["metric"]
    expected = f"{metric} in [{lo}, {hi}] on the last iteration line" + (
        ", of the log interval that ends at --train-iters" if c.params["require_complete"] else "")
    if ev.log is None:
        return _no_log(expected)
    run = log_evidence.reach(ev)
    at = run.train_iters if c.params["require_complete"] else run.iteration
    if at is None:
        return _missing("no iteration line in the log", expected, _log_end(ev.log))
    point, run = _at_iteration(c, ev, at, expected)
    if isinstance(point, Finding):
        return point
    it, value, line_no = point
    return Finding(PASS if lo <= value <= hi else FAIL,
                   f"{_fmt(value)} at iteration {it}{log_evidence.stands_for(point, at, run)}", expected,
                   _at(it, line_no))


def _golden_series(c: Criterion, golden: Golden) -> GoldenSeries:
    """The golden series a criterion compares with."""
    return golden.metrics[c.params["metric"]]


def _no_golden(c: Criterion) -> Finding:
    """The profile has no golden values for the run's recipe."""
    return _unmeasured("this profile has no golden values for the run's recipe", f"{c.params['metric']} golden values")


def _golden_source(golden: Golden, ev: RunEvidence) -> str:
    """The golden file and the GPU it was calibrated on; a run on another GPU kind is judged by the same bands, and
    the text says they were calibrated elsewhere (no other GPU kind has been measured)."""
    from harness.judge.memory_golden import slug

    made_on = golden.provenance.get("gpu")
    text = Path(golden.path).name + (f", calibrated on {made_on}" if made_on else "")
    here = ev.memory.gpu_name if ev.memory is not None else None
    if made_on and here and slug(here) != slug(made_on):
        text += f"; this run's GPU ({here}) has no golden values of its own: judged by these, calibrated elsewhere"
    return text


def _check_golden_final_loss(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """The loss the run printed for the golden's last iteration (the line of the log interval ending there) agrees
    with what the golden series expects of that line."""
    if golden is None:
        return _no_golden(c)
    series, metric, scale = _golden_series(c, golden), c.params["metric"], c.params["tol_scale"]
    it = series.iterations[-1]
    mean, tol = series.at(it)
    expected = f"{metric} {mean:.4f} +/- {tol * scale:.4f} at iteration {it} ({_golden_source(golden, ev)})"
    if ev.log is None:
        return _no_log(expected)
    point, run = _at_iteration(c, ev, it, expected)
    if isinstance(point, Finding):
        return point
    at, value, line_no = point
    if metric != "validation lm loss" and (at != it or run.interval != log_evidence.golden_step(series)):
        line = next(r for r in ev.log.iterations if r.line_no == line_no)   # its mean over another interval
        mean, tol = log_evidence.interval_expectation(series, at, run.interval, line.skipped) or (mean, tol)
        expected += (f"; for its line at {at}, the mean over its --log-interval {run.interval}: {mean:.4f} +/- "
                     f"{tol * scale:.4f}")
    ok = bands.within(value, mean, tol * scale)
    return Finding(PASS if ok else FAIL, f"{_fmt(value)} (off by {abs(value - mean):.4f})"
                   + log_evidence.stands_for(point, it, run), expected, _at(at, line_no))


def _check_golden_curve(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """Each line the run printed near what the golden expects of it (the golden's mean over that line's own log
    interval: any --log-interval); a few misses (noise) allowed. A line the run's --log-interval prints in the golden's
    range and the log lacks is a miss: not reached (a consequence of where the run stopped), or taken out of a log
    whose end proves the run got there."""
    if golden is None:
        return _no_golden(c)
    series, metric, scale, allowed = (_golden_series(c, golden), c.params["metric"], c.params["tol_scale"],
                                      c.params["max_misses"])
    first, last = series.iterations[0], series.iterations[-1]
    expected = (f"|{metric} - golden| <= tol at each line in iterations {first}-{last} ({len(series.iterations)} "
                f"golden points, {_golden_source(golden, ev)}; a line over another --log-interval against the "
                f"golden's mean over its interval), at most {allowed} miss(es)")
    if ev.log is None:
        return _no_log(expected)
    run = log_evidence.reach(ev)
    interval = run.interval if run.interval_known else log_evidence.golden_step(series) or 1
    lines = {r.iteration: r for r in ev.log.iterations}
    found = {i: (v, ln) for i, v, ln in metric_series(ev.log, metric)}
    per_line = metric != "validation lm loss"    # iteration lines are interval means; validations are not
    judged, off = [], []
    for it, (value, line_no) in sorted(found.items()):
        if per_line and it % interval and run.interval_known:   # a process's first line, off its interval: the next
            continue                                              # line covers its step again
        want = (log_evidence.interval_expectation(series, it, interval, lines[it].skipped) if per_line
                else series.at(it))
        if want is None:
            continue
        judged.append(it)
        m, t = want
        if not bands.within(value, m, t * scale):        # nan counts as a miss
            off.append((abs(value - m) / (t * scale) if t else math.inf, it, value, m, t * scale))
    wanted = list(range(-(-first // interval) * interval, last + 1, interval)) if per_line else \
        list(series.iterations)
    blank = [it for it in wanted if it in lines and it not in found]   # printed, every step of it skipped
    absent = [it for it in wanted if it not in lines and it not in found]
    reached = run.iteration or 0
    cut = [it for it in absent if run.start < it <= reached and run.interval_known]   # printed, not in the log
    misses = len(off) + len(blank) + len(absent)
    parts = [f"{misses} miss(es) of {len(judged) + len(blank) + len(absent)}"]
    if per_line and run.interval_known and interval != log_evidence.golden_step(series):
        parts.append(f"each line against the golden's mean over its --log-interval {interval}")
    where = _log_end(ev.log)
    if off:
        _, it, v, m, t = max(off, key=lambda o: o[0] if math.isfinite(o[0]) else math.inf)
        parts.append(f"worst at iteration {it}: {_fmt(v)} vs {m:.4f} +/- {t:.4f}")
        where = _at(it, found[it][1])
    if blank:
        parts.append("no " + metric + " (every step skipped) at iteration(s) " + log_evidence.few(blank))
    if absent:
        parts.append("missing iteration(s) " + log_evidence.few(absent)
                     + (f" (the log proves the run reached {run.says()}: {len(cut)} of them cut from the log)"
                        if cut else ""))
    return Finding(PASS if misses <= allowed else FAIL, "; ".join(parts), expected, where,
                   missing=misses > allowed and len(absent) - len(cut) > allowed)


def _check_no_nan(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """The run did not diverge: finite losses, and no whole log interval skipped after the loss-scale search."""
    after = c.params["after"]
    expected = (f"every logged loss finite and no log interval after iteration {after} skipped whole (an occasional "
                "overflow skip is normal fp16 loss scaling)")
    if ev.log is None:
        return _no_log(expected)
    if not ev.log.iterations:
        return _missing("no iteration line in the log", expected, _log_end(ev.log))
    found = fp16.log_divergence(ev.log, after)
    if found:
        what, r = found
        return Finding(FAIL, what, expected, _at(r.iteration, r.line_no))
    lowest = min((r.loss_scale for r in ev.log.iterations if r.loss_scale is not None), default=None)
    nan_skips = sum(r.nan or 0 for r in ev.log.iterations if r.iteration != 1)
    return Finding(PASS, f"finite losses in {len(ev.log.iterations)} iteration lines; lowest loss scale "
                         f"{_scale(lowest)}; {nan_skips} overflowed step(s) counted as 'nan iterations' (skipped, "
                         "as fp16 loss scaling does)", expected, _log_end(ev.log))


def _scale(value) -> str:
    """A loss scale for messages."""
    return "not logged" if value is None else f"{value:g}"


def _check_skips_only_before(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """Skipped steps after the initial fp16 loss-scale search stay at most max_fraction of the steps after it."""
    limit, most = c.params["iteration"], c.params["max_fraction"]
    expected = (f"skipped iterations only in log intervals ending at or before iteration {limit}" if most == 0 else
                f"at most {most:.1%} of the steps after iteration {limit} skipped (fp16 overflows now and then)")
    if ev.log is None:
        return _no_log(expected)
    if not ev.log.iterations:
        return _missing("no iteration line in the log", expected, _log_end(ev.log))
    uncounted = _without_counter(ev.log, "skipped", "number of skipped iterations")
    if uncounted:
        return _unmeasured(uncounted, expected, _log_end(ev.log))
    early, count = log_evidence.skips_split(ev.log, limit, log_evidence.reach(ev).interval)
    measured = (f"{early} skipped up to iteration {limit}; after it {count.skipped} of {count.steps} steps "
                f"({count.fraction:.1%})")
    if count.skipped and count.fraction > most:
        r = count.first
        return Finding(FAIL, measured + f"; first in the interval ending at iteration {r.iteration}", expected,
                       _at(r.iteration, r.line_no))
    return Finding(PASS, measured, expected, _log_end(ev.log))


def _without_counter(log, attr: str, key: str) -> str | None:
    """Why a counter cannot be judged (iteration lines without it), or None when every line has it."""
    absent = [r for r in log.iterations if getattr(r, attr) is None]
    if not absent:
        return None
    return (f"{len(absent)} of {len(log.iterations)} iteration lines have no '{key}' counter "
            f"(first at log line {absent[0].line_no}); an absent counter is not 0")


def _no_checkpoints(expected: str) -> Finding:
    """The run's --save directory was not inspected."""
    return _unmeasured("no checkpoint directory inspected", expected)


def _suite_cannot_read(report, expected: str) -> Finding | None:
    """The inspector met what this suite cannot read yet (a release's new class): not judged, never the student's."""
    unreadable = getattr(report, "unreadable", "")
    if not unreadable:
        return None
    return Finding(NOT_MEASURABLE, f"not judged: {unreadable}", expected, report.save_dir, grader=True)


def _check_checkpoint_iterations(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """Each iter_NNNNNNN/ exists and holds recognisable weights, and the log shows each save completed; from the log
    alone, its completed saves (or its `save ... None`) decide."""
    wanted = log_evidence.wanted_saves(c.params["iterations"], ev.log)
    expected = " and ".join(f"iter_{i:07d}/" for i in wanted) + " with weights; in the log a `saving checkpoint " \
        "at iteration N` line followed by `successfully saved checkpoint from iteration N` for each"
    report = ev.checkpoints
    from_log = log_evidence.log_saves(ev.log, wanted) if ev.log is not None else (None, "no training log", "-", False)
    ok, measured, where, absent = from_log
    save_lines = ev.log is not None and any(r.event in ("saving", "saved") for r in ev.log.checkpoints)
    if report is not None and (ev.log is None or not save_lines and logs.save_argument(ev.log) != "None"):
        ok = None                     # a folder without the log's save lines is judged by the folder
    if ok is False:
        if absent:                    # the log stops before that save: a consequence of where it stopped
            return _missing(f"log: {measured}", expected, where)
        return Finding(FAIL, f"log: {measured}", expected, where)
    if report is None:
        if ok:
            return Finding(PASS, f"log: {measured} (no --save folder submitted: judged from the log)", expected,
                           where)
        return _unmeasured(f"no checkpoint directory inspected and {measured}", expected, where)
    if report.format is None and _suite_cannot_read(report, expected):
        return _suite_cannot_read(report, expected)
    missing = [i for i in wanted if i not in report.iterations]
    found = ", ".join(f"iter_{i:07d}" for i in report.iterations) or "none"
    if missing:
        return _missing(f"missing {', '.join(f'iter_{i:07d}/' for i in missing)} (found: {found})", expected,
                        report.save_dir)
    if report.format is None:
        return Finding(FAIL, f"found {found} but no weights files recognised", expected, report.save_dir)
    return Finding(PASS, f"found {found} ({report.format})" + (f"; log: {measured}" if ok else ""), expected,
                   report.save_dir)


def _check_tracker_equals(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """latest_checkpointed_iteration.txt names the last checkpoint."""
    expected = f"latest_checkpointed_iteration.txt = {c.params['value']}"
    report = ev.checkpoints
    if report is None:
        return _no_checkpoints(expected)
    status = PASS if report.tracker == c.params["value"] else FAIL
    return Finding(status, f"tracker = {report.tracker}", expected, report.save_dir)


def _check_checkpoint_loads(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """The newest checkpoint loads and matches the model's shapes."""
    expected = "newest checkpoint loads on CPU, parameter names and shapes match the model"
    report = ev.checkpoints
    if report is None:
        return _no_checkpoints(expected)
    if _suite_cannot_read(report, expected):
        return _suite_cannot_read(report, expected)
    ok = report.loaded and report.shapes_ok
    measured = f"loaded={report.loaded}, shapes_ok={report.shapes_ok}, {report.num_parameters} parameters"
    if report.problems:
        measured += "; " + "; ".join(report.problems)
    return Finding(PASS if ok else FAIL, measured, expected, report.save_dir)


def _check_resume_matches(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """The first loss after resuming agrees with the uninterrupted run at the same iteration."""
    tol, metric = c.params["tol"], c.params["metric"]
    expected = f"first {metric} after resume within {tol} of the uninterrupted run at the same iteration"
    if ev.resume_log is None or ev.log is None:
        return _unmeasured("no resumed run" if ev.resume_log is None else "no training log", expected)
    resumed = metric_series(ev.resume_log, metric)
    if not resumed:  # name how the resumed run's log ends: its own error is the root cause, not the source's log
        tail = [line.strip()[:160] for line in ev.resume_log.lines if line.strip()][-3:]
        ends = f"; its log ends: {' / '.join(tail)}" if tail else "; its log is empty"
        return _missing(f"the resumed run logged no {metric}{ends}", expected,
                        "resumed run's " + _log_end(ev.resume_log))
    base = {i: v for i, v, _ in metric_series(ev.log, metric)}
    # the first line over the same steps as the uninterrupted run's: a resumed process's first iteration line (off its
    # --log-interval) is one step's loss, and the next line covers that step again (Megatron does not reset after it)
    interval = logs.log_interval(ev.resume_log) or 1
    on_schedule = [p for p in resumed if p[0] % interval == 0] or resumed
    it, value, line_no = next((p for p in on_schedule if p[0] in base), on_schedule[0])
    where = f"resumed run: {_at(it, line_no)}"
    if it not in base:
        return Finding(FAIL, f"{_fmt(value)} at iteration {it}, but the uninterrupted run has no {metric} there",
                       expected, where)
    diff = abs(value - base[it])
    return Finding(PASS if diff <= tol else FAIL, f"{_fmt(value)} vs {_fmt(base[it])} (off by {diff:.4f})",
                   expected, where)


def _check_memory_band_mib(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """Peak GPU memory as NVML saw it lies in the band of the run's layout: lo/hi on 1 GPU, else the layout file's.
    A recorded log (no NVML trace) with `log_band`: Megatron's own max reserved in the band derived from real logs."""
    if ev.memory is None and ev.log is not None and c.params["log_band"]:
        return _log_memory_band(c, ev)
    out = _nvml_in_layout_band(c, ev, (c.params["lo"], c.params["hi"]))
    top = log_evidence.peak(ev.log) if ev.log is not None else None
    if top is not None and out.status != NOT_MEASURABLE:
        out = Finding(out.status, f"{out.measured}; Megatron's own report: max reserved {top.max_reserved:g} MB, "
                                  f"max allocated {top.max_allocated:g} MB (log line {top.line_no})",
                      out.expected, out.where, out.missing)
    return out


def _log_memory_band(c: Criterion, ev: RunEvidence) -> Finding:
    """A recorded log's own memory report lines in their band (log_evidence.judge_log_memory)."""
    status, measured, expected, where = log_evidence.judge_log_memory(ev.log, c.params["log_band"])
    return Finding(status, measured, expected, where, missing=status == FAIL and not where.startswith("log line"))


def _no_nvml_peak(c: Criterion, mem, expected: str) -> Finding:
    """Not measured: NVML gave no peak (and why)."""
    reason = "no NVML memory trace" if mem is None else f"{mem.method}: {mem.reason or 'no peak'}"
    return _unmeasured(reason + (" (needs a live GPU run)" if c.needs == "gpu-live" else ""), expected)


def _nvml_in_layout_band(c: Criterion, ev: RunEvidence, one_gpu: tuple | None) -> Finding:
    """NVML's peak per GPU in its layout's band: `one_gpu` (lo, hi) on one GPU, else the `layouts` file's band."""
    layout, how = layout_of(ev)
    if layout is None:
        return _unmeasured(f"the run's parallel layout is unknown ({how}), so no band applies",
                           "peak GPU memory in the band of the run's layout")
    if layout.world_size == 1:
        lo, hi, source = *one_gpu, "the 1-GPU band"
    else:
        band = _layout_bands(c.params["layouts"]).get(layout) if c.params["layouts"] else None
        if band is None:
            known = ", ".join(b.layout.name() for b in _layout_bands(c.params["layouts"]).values()) \
                if c.params["layouts"] else "none"
            where = f"layouts file {c.params['layouts']}" if c.params["layouts"] else "this profile"
            return _unmeasured(f"no memory band is calibrated for {layout.name()} in {where} (calibrated: {known}); "
                               "measure that layout's per-rank peaks on the GPU and add them",
                               f"peak GPU memory per GPU in the band of {layout.name()}", f"layout from {how}")
        lo, hi, source = band.lo, band.hi, f"{c.params['layouts']} {band.key}"
    expected = (f"peak GPU memory per GPU in [{lo}, {hi}] MiB for {layout.name()} ({source}; NVML, includes CUDA "
                f"context)")
    mem = ev.memory
    if mem is None or mem.peak_mib is None:
        return _no_nvml_peak(c, mem, expected)
    peaks = [mem.peak_mib] + [r.peak_mib for r in mem.ranks]   # every rank is judged; the worst decides
    status = PASS if all(lo <= peak <= hi for peak in peaks) else FAIL
    measured = f"{mem.peak_mib:.0f} MiB ({mem.method}, {mem.samples} samples)"
    if len(mem.ranks) > 1:
        measured = (f"highest {measured}; per rank: "
                    + "; ".join(f"{r.label()} {r.peak_mib:.0f} MiB" for r in mem.ranks))
    return Finding(status, measured, expected, f"GPU {mem.gpu_name or '?'}, {layout.name()} (layout from {how})")


def _check_memory_own_band(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """The training's own memory (allocator peak reserved) in this GPU kind's band; the context is reported. A
    recorded log (no NVML trace) with `log_band`: its own report lines' max reserved in their band."""
    from harness.judge import memory_golden

    if ev.memory is None and ev.log is not None and c.params["log_band"]:
        return _log_memory_band(c, ev)
    layout, how = layout_of(ev)
    if layout is None or layout.world_size > 1:  # several GPUs (or an unknown split): each rank's NVML band
        return _nvml_in_layout_band(c, ev, None)
    mem = ev.memory
    doc, why = memory_golden.select(mem.gpu_name if mem else None)
    if doc is None:
        return _unmeasured(why, "the training's own peak GPU memory in a calibrated band")
    lo, hi = doc["own_band_mib"]["lo"], doc["own_band_mib"]["hi"]
    expected = (f"the training's own peak memory (torch allocator, max reserved) in [{lo}, {hi}] MiB ({why}); "
                "the CUDA context of this machine is reported, not judged")
    summary = ev.extra.get("summary") or {}
    expected += memory_golden.version_note(doc, summary.get("versions"))
    own = summary.get("torch_max_reserved_mib")
    if mem is None or mem.peak_mib is None:
        return _no_nvml_peak(c, mem, expected)
    if own is None:
        return _unmeasured("the trainer recorded no allocator peak (summary.json: torch_max_reserved_mib)", expected)
    context = mem.peak_mib - own
    measured = (f"own {own:.0f} MiB + context {context:.0f} MiB = {mem.peak_mib:.0f} MiB total on "
                f"{mem.gpu_name or 'this GPU'} ({mem.method}; the course says about 2-4 GB in total)")
    return Finding(PASS if lo <= own <= hi else FAIL, measured, expected,
                   f"GPU {mem.gpu_name or '?'}, {layout.name()}")


def _check_recipe_matches(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """Every training flag in the log's `arguments` block has the course's value; --seed is only reported."""
    recipe = load_recipe(c.params["recipe"])
    rid, how = detect_recipe(ev.log, recipe)
    expected = (f"the course's training flags ({len(recipe.expected(rid))} judged, recipe "
                f"{rid or DEFAULT_RECIPE}: {recipe.variants[rid or DEFAULT_RECIPE].title})")
    if ev.log is None:
        return _no_log(expected)
    if ev.log.arguments is None:
        return _unmeasured("the log has no `arguments` block (Megatron-LM prints it at start-up), so the flags "
                           "cannot be compared", expected, _log_end(ev.log))
    failing, reported, absent = recipe_deviations(recipe, ev.log.arguments, rid)
    where = f"arguments block at log line {ev.log.arguments_line}"
    notes = ([f"reported, not judged: {'; '.join(reported)}"] if reported else []) + (
        [f"not printed: {', '.join(absent)}"] if absent else [])
    if failing:
        return Finding(FAIL, f"{len(failing)} deviation(s): " + "; ".join(failing + notes), expected, where)
    return Finding(PASS, "; ".join([f"no deviation ({how})"] + notes), expected, where)
def _check_cuda_graph_used(c: Criterion, ev: RunEvidence, golden) -> Finding:
    """The reference trainer recorded that the captured graph ran; a capture error is the measurement."""
    expected = "whole step captured in one CUDA graph and replayed (summary.json: cuda_graphs true)"
    summary = ev.extra.get("summary") or {}
    if "cuda_graphs" not in summary:
        return _unmeasured("the trainer wrote no summary.json (or not the reference trainer)", expected)
    if summary["cuda_graphs"]:
        return Finding(PASS, "CUDA graph captured and replayed", expected, "trainer setup")
    if summary.get("cuda_graph_error"):
        return Finding(FAIL, f"capture failed, the run fell back to the eager step: {summary['cuda_graph_error']}",
                       expected, "trainer setup (log line 'WARNING: CUDA graph capture failed')")
    why = (f"the run failed during {summary['failed_in']} before capture: {summary.get('error')}"
           if summary.get("failed_in") == "setup" else f"eager step on device {summary.get('device')}")
    return Finding(FAIL, f"no CUDA graph: {why}", expected, "trainer setup")


CHECKERS = {kind: globals()[f"_check_{kind}"] for kind in KINDS}
