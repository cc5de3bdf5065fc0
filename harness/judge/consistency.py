"""Is a log consistent with itself? Checks from the log alone (no GPU) that a real Megatron-LM log always passes.

A Megatron-LM log is redundant (formats and counters of core_v0.16.1, megatron/training/training.py
``training_log``, ``evaluate_and_print_results``; optimizer_param_scheduler.py; grad_scaler.py), so an edited or
generated log rarely stays consistent. Each check names the line that breaks it:

- ``ppl``: each validation line's PPL is exp(min(20, loss)) of its own loss;
- ``consumed-samples``: consumed samples = iteration x global batch size (no batch-size ramp-up);
- ``arguments``: the arguments block agrees with the rest of the log: the global batch size and ``iteration N/ M``
  of each iteration line, ``> setting random seeds to N``, the dataset config's ``random_seed=``/``sequence_length=``,
  ``setting number of microbatches to constant N``, ``using world size: ...``, the logged iterations (multiples of
  --log-interval) and validations (multiples of --eval-interval);
- ``learning-rate``: the printed learning rate is the schedule of the arguments block after the iterations that were
  not skipped (fp16 skips hold the scheduler back), continued across resumed legs (a resumed log alone: one count
  of skips before the resume must fit all its lines);
- ``loss-scale``: the dynamic loss scale halves exactly where skips are counted (after --hysteresis of them) and
  doubles after --loss-scale-window clean steps;
- ``timestamps``: timestamps never go back, and between two iteration lines with no evaluation or checkpoint save
  between them (Megatron stops its interval timer for those) they advance by the printed elapsed time per iteration
  times the iterations;
- ``throughput``: throughput x elapsed time is one constant (the model's FLOPs per iteration) over the log.

Megatron's first iteration line of each process (``is_first_iteration``) does not reset its counters or its timer:
the next line's skip count and elapsed time include it. Tolerances come from the print precision (E-notation with 6
decimals: half a unit in the 7th significant digit; elapsed ms with 1 decimal, an average over the interval;
timestamps to microseconds) plus the measured scatter of real logs (TIMESTAMP_SLACK_MS, docs/trust.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime

from harness.evidence.logformat import TIMESTAMP_FORMAT, OutOfRange, ParsedLog
from harness.evidence.logs import is_reference_trainer
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, Verdict

CHECK_ID = "log-consistent"
LABEL = "the log is consistent with itself (not edited)"
EXPECTED = ("every printed value agrees with the others: PPL = exp(loss), consumed samples = iteration x batch, the "
            "learning rate and loss scale follow the arguments' schedule and skips, timestamps follow elapsed times, "
            "the arguments block agrees with the other lines")
CHECKS = ("ppl", "consumed-samples", "arguments", "learning-rate", "loss-scale", "timestamps", "throughput")
# Measured over the 33 real Megatron-LM logs with iteration lines in the repository (test_consistency.py measures
# it again): wall clock minus interval timer between two iteration lines with nothing between them lies in
# [-8.3, +19.1] ms on an H200 (the largest on the first interval, which prints the memory report); 30 ms + 1% of
# the interval keeps a margin and still catches a timestamp moved by a tenth of a second.
TIMESTAMP_SLACK_MS = 30.0
TIMESTAMP_SLACK_FRACTION = 0.01
MAX_BREAKS = 20
INVALID_SCHEDULE = "the arguments block's learning-rate schedule is not finite (nan or inf)"
_SEEDS = re.compile(r"> setting random seeds to (\d+) \.\.\.")
_DATASET_SEED = re.compile(r"Config\(random_seed=(\d+), sequence_length=(\d+)")
_MICROBATCHES = re.compile(r"setting number of microbatches to constant (\d+)")
_WORLD = re.compile(r"using world size: (\d+), data-parallel size: (\d+), .*tensor-model-parallel size: (\d+), "
                    r"pipeline-model-parallel size: (\d+)")


@dataclass(frozen=True)
class Break:
    """One inconsistency: which check, the line (1-based, into ParsedLog.lines) and what disagrees."""

    check: str
    line: int
    message: str


@dataclass(frozen=True)
class Consistency:
    """The checks run on one log: those that could run, those that could not (with why), and what broke."""

    checked: tuple
    skipped: tuple               # (check, why)
    breaks: tuple                # Break, first MAX_BREAKS in line order

    @property
    def ok(self) -> bool:
        return not self.breaks


def half_unit(value: float, digits: int = 6) -> float:
    """Half a unit in the last digit of ``{:.6E}``: the largest print rounding of value."""
    if value == 0 or not math.isfinite(value):
        return 0.0
    return 0.5 * 10 ** (math.floor(math.log10(abs(value))) - digits)


def _e(value: float) -> str:
    return f"{value:.6E}"


# ---------------------------------------------------------------- legs of a run


def legs(log: ParsedLog) -> list:
    """[(resumed-at iteration, [iteration records])]: one leg per process; a ``successfully loaded checkpoint ...
    at iteration L`` line starts a leg at the first iteration line past L. Decided by iteration numbers, never by
    line numbers: torchrun's rank files put the load lines (rank 0) and the iteration lines (the last rank) in
    different files."""
    loads = sorted({c.iteration for c in log.checkpoints if getattr(c, "event", "") == "loaded" and c.iteration > 0})
    out, prev = [], None
    for rec in log.iterations:
        crossed = [L for L in loads if (prev is None or prev.iteration <= L) and L < rec.iteration]
        if crossed or not out:
            out.append((crossed[-1] if crossed else 0, [rec]))
        else:
            out[-1][1].append(rec)
        prev = rec
    return out


def _first_unreset(leg_start: int, recs: list) -> bool:
    """Whether the leg's first line is Megatron's first-iteration line, which resets no counter and no timer."""
    return bool(recs) and recs[0].iteration == leg_start + 1


def intervals(leg_start: int, recs: list, unreset_first: bool = True) -> list:
    """[(record, iterations since the last reset, skipped among them, elapsed ms of the timer since the previous
    line)] for one leg; the line after the first-iteration line accounts for its counts (with unreset_first False,
    for the suite's trainer, only for its skip count: its timer restarts at iteration 1)."""
    out, prev_it, carry_n, carry_skip, carry_ms = [], leg_start, 0, 0, 0.0
    unreset = _first_unreset(leg_start, recs)
    for i, rec in enumerate(recs):
        if i == 1 and not unreset_first:
            carry_n, carry_ms = 0, 0.0
        n = rec.iteration - prev_it + carry_n
        skipped = rec.skipped or 0
        timer_ms = rec.elapsed_ms * n - carry_ms
        own_skip = skipped - carry_skip
        out.append((rec, rec.iteration - prev_it, own_skip, timer_ms))
        if i == 0 and unreset:
            carry_n, carry_skip, carry_ms = n, skipped, rec.elapsed_ms * n
        else:
            carry_n, carry_skip, carry_ms = 0, 0, 0.0
        prev_it = rec.iteration
    return out


# ---------------------------------------------------------------- the checks


def _check_ppl(log: ParsedLog, breaks: list) -> None:
    for v in log.validations:
        for what, loss, ppl in (("lm loss", v.lm_loss, v.lm_ppl), ("sop loss", v.sop_loss, v.sop_ppl)):
            if loss is None or ppl is None:
                continue
            # Python's min(20, loss): a nan (or inf) loss gives exp(20) = 4.851652E+08, as Megatron prints it
            capped = loss if loss < 20 else 20.0
            want = math.exp(capped)
            # loss off by up to half a unit moves exp(loss) by that fraction; PPL's own rounding adds its half unit
            tol = want * math.expm1(half_unit(capped)) + half_unit(want) + half_unit(ppl)
            if not abs(ppl - want) <= tol * 1.01 + 1e-300:
                breaks.append(Break("ppl", v.line_no, f"validation at iteration {v.iteration} prints {what} value "
                                    f"{_e(loss)} and PPL {_e(ppl)}; exp(min(20, {_e(loss)})) = {_e(want)}: the loss "
                                    "or its PPL was edited"))


def _check_consumed(log: ParsedLog, breaks: list, skipped: list) -> None:
    gbs = log.argument("global_batch_size")
    if log.argument("rampup_batch_size") is not None or not isinstance(gbs, int):
        skipped.append(("consumed-samples", "the batch size ramps up (or the arguments block has no global batch "
                                            "size): consumed samples are not iteration x batch"))
        return
    for rec in log.iterations:
        want = rec.iteration * gbs
        if rec.consumed_samples != want:
            breaks.append(Break("consumed-samples", rec.line_no, f"iteration {rec.iteration} prints consumed samples "
                                f"{rec.consumed_samples}; iteration x global batch size ({gbs}) = {want}"))


def _check_arguments(log: ParsedLog, breaks: list) -> None:
    gbs, train_iters = log.argument("global_batch_size"), log.argument("train_iters")
    ramp = log.argument("rampup_batch_size") is not None
    li, ei = log.argument("log_interval"), log.argument("eval_interval")
    for start, recs in legs(log):
        for i, rec in enumerate(recs):
            if isinstance(gbs, int) and not ramp and rec.global_batch_size != gbs:
                breaks.append(Break("arguments", rec.line_no, f"iteration {rec.iteration} prints global batch size "
                                    f"{rec.global_batch_size}; the arguments block says {gbs}"))
            if isinstance(train_iters, int) and rec.train_iters != train_iters:
                breaks.append(Break("arguments", rec.line_no, f"iteration {rec.iteration} prints 'iteration "
                                    f"{rec.iteration}/ {rec.train_iters}'; the arguments block says train_iters "
                                    f"{train_iters}"))
            first = i == 0 and rec.iteration == start + 1
            if isinstance(li, int) and li > 0 and rec.iteration % li and not first:
                breaks.append(Break("arguments", rec.line_no, f"iteration {rec.iteration} is logged; with "
                                    f"log_interval {li} in the arguments block Megatron logs multiples of {li} (and "
                                    "the first iteration of each run)"))
    if isinstance(ei, int) and ei > 0:
        for v in log.validations:
            if v.split == "periodic" and v.iteration % ei:
                breaks.append(Break("arguments", v.line_no, f"validation at iteration {v.iteration}; with "
                                    f"eval_interval {ei} in the arguments block Megatron validates at multiples of {ei}"))
    _check_echoes(log, breaks)


def _check_echoes(log: ParsedLog, breaks: list) -> None:
    """Lines that print an argument again: the seed, the sequence length, the micro-batches, the parallel sizes."""
    seed, seq = log.argument("seed"), log.argument("seq_length")
    gbs, mbs, dp = log.argument("global_batch_size"), log.argument("micro_batch_size"), log.argument("data_parallel_size")
    sizes = [("world size", "world_size"), ("data-parallel size", "data_parallel_size"),
             ("tensor-model-parallel size", "tensor_model_parallel_size"),
             ("pipeline-model-parallel size", "pipeline_model_parallel_size")]
    for line_no, line in enumerate(log.lines, start=1):
        if "seed" in line and (m := _SEEDS.search(line)) and seed is not None and int(m[1]) != seed:
            breaks.append(Break("arguments", line_no, f"the log prints '> setting random seeds to {m[1]}'; the "
                                                      f"arguments block says seed {seed}"))
        if "random_seed=" in line and (m := _DATASET_SEED.search(line)):
            if seed is not None and int(m[1]) != seed:
                breaks.append(Break("arguments", line_no, f"the dataset config prints random_seed={m[1]}; the "
                                                          f"arguments block says seed {seed}"))
            if seq is not None and int(m[2]) != seq:
                breaks.append(Break("arguments", line_no, f"the dataset config prints sequence_length={m[2]}; the "
                                                          f"arguments block says seq_length {seq}"))
        if "microbatches" in line and (m := _MICROBATCHES.search(line)) and all(
                isinstance(x, int) and x > 0 for x in (gbs, mbs, dp)) and int(m[1]) * mbs * dp != gbs:
            ratio = str(gbs // (mbs * dp)) if gbs % (mbs * dp) == 0 else f"{gbs}/{mbs * dp}"
            breaks.append(Break("arguments", line_no, f"the log prints {m[1]} micro-batches; the arguments block "
                                f"gives global batch {gbs} / (micro batch {mbs} x data-parallel {dp}) = {ratio}"))
        if "using world size" in line and (m := _WORLD.search(line)):
            for (label, name), value in zip(sizes, m.groups()):
                want = log.argument(name)
                if want is not None and int(value) != want:
                    breaks.append(Break("arguments", line_no, f"the log prints {label}: {value}; the arguments block "
                                                              f"says {name} {want}"))


# ---------------------------------------------------------------- the learning-rate schedule and the loss scale


@dataclass(frozen=True)
class Schedule:
    """OptimizerParamScheduler.get_lr (core_v0.16.1) on the host, with the arguments block's values; steps count
    samples, as get_optimizer_param_scheduler passes them."""

    max_lr: float
    min_lr: float
    init_lr: float
    warmup: float
    decay: float
    style: str
    wsd_decay: float | None = None
    wsd_style: str = "exponential"

    @classmethod
    def from_log(cls, log: ParsedLog) -> "Schedule | str":
        """The schedule of the log's arguments block, or why it cannot be rebuilt from the block."""
        gbs, iters = log.argument("global_batch_size"), log.argument("train_iters")
        lr, style = log.argument("lr"), log.argument("lr_decay_style")
        if not isinstance(gbs, int) or not isinstance(iters, int) or not isinstance(lr, (int, float)):
            return "the arguments block has no global_batch_size, train_iters or lr"
        if log.argument("rampup_batch_size") is not None:
            return "the batch size ramps up"
        if style not in ("linear", "cosine", "constant", "inverse-square-root", "WSD"):
            return f"lr_decay_style {style!r} is not one Megatron-LM core_v0.16.1 implements"
        try:                                   # a submitted block may hold any text: numbers past float's range
            decay = (log.argument("lr_decay_iters") or iters) * gbs
            fraction = log.argument("lr_warmup_fraction")
            warmup = fraction * decay if fraction is not None else (log.argument("lr_warmup_iters") or 0) * gbs
            wsd = log.argument("lr_wsd_decay_iters")
            sched = cls(float(lr), float(log.argument("min_lr") or 0.0), float(log.argument("lr_warmup_init") or 0.0),
                        float(warmup), float(decay), style, None if wsd is None else float(wsd * gbs),
                        str(log.argument("lr_wsd_decay_style") or "exponential"))
        except (TypeError, ValueError, OverflowError):
            return "the arguments block's schedule values are not numbers"
        if not all(math.isfinite(x) for x in (sched.max_lr, sched.min_lr, sched.init_lr, sched.warmup, sched.decay)):
            return INVALID_SCHEDULE
        return sched

    def lr(self, samples: float) -> float:
        """The learning rate after `samples` samples of successful steps."""
        if self.warmup > 0 and samples <= self.warmup:
            return self.init_lr + (self.max_lr - self.init_lr) * float(samples) / float(self.warmup)
        if self.style == "constant":
            return self.max_lr
        if samples > self.decay:
            return self.min_lr
        if self.style == "inverse-square-root":
            return max(self.min_lr, self.max_lr * max(self.warmup, 1) ** 0.5 / max(samples, 1) ** 0.5)
        ratio = float(samples - self.warmup) / float(self.decay - self.warmup)
        if self.style == "linear":
            coeff = 1.0 - ratio
        elif self.style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        else:                                                   # WSD
            start = self.decay - (self.wsd_decay or 0.0)
            if samples <= start or not self.wsd_decay:
                coeff = 1.0
            else:
                r = (samples - start) / self.wsd_decay
                coeff = {"linear": 1.0 - r, "cosine": 0.5 * (math.cos(math.pi * r) + 1.0),
                         "minus_sqrt": 1.0 - math.sqrt(r)}.get(self.wsd_style, 2.0 * 0.5 ** r - 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)


def _check_schedule(log: ParsedLog, breaks: list, skipped: list) -> None:
    """The learning rate after the steps that were not skipped, leg after leg. A resumed leg continues the
    checkpoint's step count: known when the previous leg logged its resume iteration; otherwise (a resumed log
    alone) every count of skips before the resume is a candidate, and the leg's lines must all agree with one."""
    sched = Schedule.from_log(log)
    if sched == INVALID_SCHEDULE and log.iterations:     # a run that trained printed finite rates: an edited block
        breaks.append(Break("learning-rate", log.arguments_line or 0, f"{sched}, yet iteration "
                            f"{log.iterations[0].iteration} prints learning rate {_e(log.iterations[0].learning_rate)}:"
                            " the arguments block was edited"))
        return
    if isinstance(sched, str):
        skipped.append(("learning-rate", sched))
        return
    if any(r.skipped is None for r in log.iterations):
        skipped.append(("learning-rate", "iteration lines without a skipped-iterations counter"))
        return
    gbs = log.argument("global_batch_size")
    skips_at = {0: 0}                     # iteration -> skipped steps up to it (at reset lines and leg ends)
    for start, recs in legs(log):
        bases = {skips_at[start]} if start in skips_at else set(range(start + 1))
        own_total = 0
        for rec, n, own_skip, _ in intervals(start, recs):
            own_total += own_skip
            tol = lambda want: half_unit(want) + half_unit(rec.learning_rate) + 1e-12 * sched.max_lr  # noqa: E731
            fits = {b for b in bases if abs(rec.learning_rate - sched.lr((rec.iteration - b - own_total) * gbs))
                    <= tol(sched.lr((rec.iteration - b - own_total) * gbs)) * 1.01}
            if not fits:
                b = min(bases)
                base = b + own_total
                want = sched.lr((rec.iteration - base) * gbs)
                known = len(bases) == 1
                breaks.append(Break("learning-rate", rec.line_no, f"iteration {rec.iteration} prints learning rate "
                                    f"{rec.learning_rate:.1E}; the schedule of the arguments block gives {want:.1E} "
                                    f"there ({rec.iteration - base} steps, {base} skipped; {_e(rec.learning_rate)} "
                                    f"printed, {_e(want)} expected)"
                                    + ("" if known else f"; no count of skips before the resume at {start} fits "
                                                        "this line and the ones before it") + ": the log was edited"))
                break
            bases = fits
            if len(bases) == 1:
                skips_at[rec.iteration] = next(iter(bases)) + own_total


@dataclass
class _Scaler:
    """DynamicGradScaler's state as far as the log determines it: the growth tracker as a range, the hysteresis
    tracker None once unknown."""

    scale: float
    growth: tuple
    hyst: int | None


SCALER_ARGUMENTS = ("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis")


def _scaler_args(log: ParsedLog):
    """(dynamic?, initial scale, min scale, window, hysteresis)."""
    fp16, fixed = log.argument("fp16") is True, log.argument("loss_scale")
    dynamic = fp16 and fixed is None
    initial = float(fixed) if fixed is not None else (float(log.argument("initial_loss_scale") or 2 ** 32)
                                                      if fp16 else 1.0)
    return (dynamic, initial, float(log.argument("min_loss_scale") or 1.0), int(log.argument("loss_scale_window") or 1000),
            int(log.argument("hysteresis") or 2))


def _advance(st: _Scaler, n: int, k: int, window: int, hysteresis: int, min_scale: float) -> set:
    """The loss scales an interval of n steps with k skips can end on (one when the log determines it); st moves."""
    lo, hi = st.growth
    clean = n - k
    if k == 0:
        grows = {(lo + clean) // window, (hi + clean) // window}
        options = {st.scale * 2 ** g for g in range(min(grows), max(grows) + 1)}
        st.growth = ((lo + clean) % window if len(grows) == 1 else 0, (hi + clean) % window if len(grows) == 1
                     else window - 1)
        if max(grows) > 0:
            st.hyst = hysteresis if min(grows) > 0 else None
        return options
    if hi + clean < window and clean < window and st.hyst is not None:
        scale = st.scale
        for j in range(1, k + 1):
            if st.hyst - j <= 0:
                scale = max(scale * 0.5, min_scale)
        st.hyst -= k
        st.growth = (0, clean)
        return {scale}
    st.hyst, st.growth = None, (0, min(clean, window - 1))
    out, scale = {st.scale}, st.scale
    for _ in range(k):                            # undetermined: anything from no backoff to one per skip, or a growth
        scale = max(scale * 0.5, min_scale)
        out.add(scale)
    return out | {s * 2 for s in out}


def _check_loss_scale(log: ParsedLog, breaks: list, skipped: list) -> None:
    out_of_range = [v.why for n in SCALER_ARGUMENTS if isinstance(v := log.argument(n), OutOfRange)]
    try:
        dynamic, initial, min_scale, window, hysteresis = _scaler_args(log)
    except (TypeError, ValueError, OverflowError) as exc:   # a submitted block may hold any text
        out_of_range = out_of_range or [str(exc)]
    if out_of_range:
        skipped.append(("loss-scale", "the arguments block's loss-scale values are out of range (" +
                        "; ".join(out_of_range) + ")"))
        return
    if not dynamic:
        for rec in log.iterations:
            if rec.loss_scale != initial:
                breaks.append(Break("loss-scale", rec.line_no, f"iteration {rec.iteration} prints loss scale "
                                    f"{rec.loss_scale:.1f}; the arguments block fixes it at {initial:.1f}"))
        return
    states = {0: _Scaler(initial, (0, 0), hysteresis)}
    if any(r.skipped is None for r in log.iterations):
        skipped.append(("loss-scale", "iteration lines without a skipped-iterations counter"))
        return
    for start, recs in legs(log):
        # a resumed log alone: the scaler's state at the resume is not in it; its first line sets the scale, the
        # trackers stay unknown until the log determines them
        prev = states.get(start)
        st = _Scaler(prev.scale, prev.growth, prev.hyst) if prev else None
        for rec, n, own_skip, _ in intervals(start, recs):
            if st is None:
                st = _Scaler(rec.loss_scale, (0, window - 1), None)
                states[rec.iteration] = _Scaler(st.scale, st.growth, st.hyst)
                continue
            options = _advance(st, n, own_skip, window, hysteresis, min_scale)
            if not any(abs(rec.loss_scale - s) <= max(0.05, 1e-9 * s) for s in options):
                want = " or ".join(f"{s:.1f}" for s in sorted(options))
                breaks.append(Break("loss-scale", rec.line_no, f"iteration {rec.iteration} prints loss scale "
                                    f"{rec.loss_scale:.1f} after {own_skip} skipped of {n} steps; the scaler "
                                    f"(window {window}, hysteresis {hysteresis}) gives {want}: a skip count or the "
                                    "loss scale was edited"))
            st.scale = rec.loss_scale
            states[rec.iteration] = _Scaler(st.scale, st.growth, st.hyst)


# ---------------------------------------------------------------- timestamps and throughput


def _when(text: str | None) -> datetime | None:
    try:
        return datetime.strptime(text, TIMESTAMP_FORMAT) if text else None
    except ValueError:
        return None


def timer_intervals(log: ParsedLog):
    """(previous record, record, wall ms between their timestamps, the interval timer's ms, paused?) for each pair
    of consecutive iteration lines of one leg; paused: an evaluation or a checkpoint save lies between them."""
    # Megatron evaluates and saves after logging iteration N: both pause the timer between N's line and the next
    pauses = sorted({v.iteration for v in log.validations} | {c.iteration for c in log.checkpoints
                                                              if getattr(c, "event", "") in ("saving", "saved")})
    # the reference trainer restarts its interval timer at iteration 1 and after each line it logs, where Megatron's
    # keeps running, so its wall clock runs ahead of its timer (by up to 6% measured): only wall >= timer holds
    trainer = is_reference_trainer(log)
    for start, recs in legs(log):
        spans = intervals(start, recs, unreset_first=not trainer)
        for prev, (rec, _, _, timer_ms) in zip(recs, spans[1:]):
            a, b = _when(prev.timestamp), _when(rec.timestamp)
            if a is not None and b is not None:
                yield (prev, rec, (b - a).total_seconds() * 1000.0, timer_ms,
                       trainer or any(prev.iteration <= p < rec.iteration for p in pauses))


def _check_timestamps(log: ParsedLog, breaks: list) -> None:
    """Iteration lines' timestamps never go back; a checkpoint save at iteration N is stamped between N's line and
    the next one; between two lines of one leg with no evaluation or save between them the wall clock advances by
    the interval timer's time."""
    stamped = [(r, _when(r.timestamp)) for r in log.iterations]
    stamped = [s for s in stamped if s[1] is not None]
    for (ra, a), (rb, b) in zip(stamped, stamped[1:]):
        if b < a:
            breaks.append(Break("timestamps", rb.line_no, f"iteration {rb.iteration} is stamped "
                                f"{b.strftime(TIMESTAMP_FORMAT)}, before iteration {ra.iteration} "
                                f"({a.strftime(TIMESTAMP_FORMAT)}): the log was edited or reordered"))
    for c in log.checkpoints:
        when = _when(getattr(c, "timestamp", None))
        if when is None or c.event not in ("saving", "saved"):
            continue
        before = [(r, t) for r, t in stamped if r.iteration <= c.iteration]
        after = [(r, t) for r, t in stamped if r.iteration > c.iteration]
        if before and when < before[-1][1] or after and when > after[0][1]:
            breaks.append(Break("timestamps", c.line_no, f"the checkpoint save at iteration {c.iteration} is stamped "
                                f"{when.strftime(TIMESTAMP_FORMAT)}, outside the iteration lines around it "
                                f"({before[-1][1].strftime(TIMESTAMP_FORMAT) if before else '-'} .. "
                                f"{after[0][1].strftime(TIMESTAMP_FORMAT) if after else '-'}): the log was edited"))
    for prev, rec, wall, timer_ms, paused in timer_intervals(log):
        rounding = 0.05 * (rec.iteration - prev.iteration + 1)    # elapsed ms printed to 0.1, an average
        slack = TIMESTAMP_SLACK_MS + TIMESTAMP_SLACK_FRACTION * timer_ms + rounding
        if wall < timer_ms - slack or (not paused and wall > timer_ms + slack):
            breaks.append(Break("timestamps", rec.line_no, f"iteration {rec.iteration} is stamped {wall:.1f} ms "
                                f"after iteration {prev.iteration}; its elapsed time per iteration "
                                f"({rec.elapsed_ms:.1f} ms) gives {timer_ms:.1f} ms for the interval"
                                + ("" if paused else " (no evaluation or save between them)")
                                + f", +/- {slack:.1f} ms: the timestamp or the elapsed time was edited"))


def _check_throughput(log: ParsedLog, breaks: list) -> None:
    """throughput = FLOPs per iteration / elapsed: each line bounds that constant; all bounds must overlap."""
    bounds = []
    for rec in log.iterations:
        if rec.throughput is None or rec.elapsed_ms <= 0 or rec.throughput <= 0:
            continue
        bounds.append(((rec.throughput - 0.05) * (rec.elapsed_ms - 0.05), (rec.throughput + 0.05) * (rec.elapsed_ms
                                                                                                      + 0.05), rec))
    if len(bounds) < 2:
        return
    lo, hi = max(b[0] for b in bounds), min(b[1] for b in bounds)
    if lo <= hi * (1 + 1e-9):
        return
    # name the line whose bound is farthest from the others' consensus
    mid = sorted(x for b in bounds for x in b[:2])[len(bounds)]
    rec = max(bounds, key=lambda b: max(b[0] - mid, mid - b[1]))[2]
    breaks.append(Break("throughput", rec.line_no, f"iteration {rec.iteration} prints throughput {rec.throughput:.1f} "
                        f"TFLOP/s at {rec.elapsed_ms:.1f} ms per iteration: {rec.throughput * rec.elapsed_ms:.1f} "
                        f"TFLOP-ms per iteration, where the log's other lines agree on about {mid:.1f}: the "
                        "throughput or the elapsed time was edited"))


# ---------------------------------------------------------------- the whole log


def check_log(log: ParsedLog) -> Consistency:
    """Every check that the log's contents allow; a check that cannot run says why (never a pass in disguise)."""
    breaks, skipped = [], []
    _check_ppl(log, breaks)
    if not log.arguments:
        skipped += [(c, "the log has no arguments block") for c in
                    ("consumed-samples", "arguments", "learning-rate", "loss-scale")]
    else:
        _check_consumed(log, breaks, skipped)
        _check_arguments(log, breaks)
        _check_schedule(log, breaks, skipped)
        _check_loss_scale(log, breaks, skipped)
    _check_timestamps(log, breaks)
    _check_throughput(log, breaks)
    skipped = tuple(dict.fromkeys(skipped))
    names = {c for c, _ in skipped}
    return Consistency(tuple(c for c in CHECKS if c not in names), skipped,
                       tuple(sorted(breaks, key=lambda b: (b.line, b.check))[:MAX_BREAKS]))


def verdict(log: ParsedLog | None, where: str = "", artifacts: str = "", cause=None):
    """The ``log-consistent`` verdict: FAIL naming the first broken lines (after the run's root cause, when the
    judgement found one: `cause` is its Diagnosis); PASS listing the checks run (and those the log does not
    allow); not measurable when there is no log."""
    from harness.judge import criteria

    if log is None or not log.iterations and not log.validations:
        measured = "no iteration or validation line to check"
        return Verdict(CHECK_ID, LABEL, NOT_MEASURABLE, measured, EXPECTED, where,
                                f"NOT MEASURABLE: {LABEL} [{CHECK_ID}]: {measured}")
    result = check_log(log)
    not_run = "; ".join(f"{c} not checked: {why}" for c, why in result.skipped)
    if result.ok:
        measured = f"{len(result.checked)} checks consistent ({', '.join(result.checked)})" + (
            f"; {not_run}" if not_run else "")
        return Verdict(CHECK_ID, LABEL, PASS, measured, EXPECTED, where,
                                criteria.PASS_TEMPLATE.format(label=LABEL, criterion_id=CHECK_ID, measured=measured,
                                                              expected=EXPECTED))
    first = result.breaks[0]
    more = len(result.breaks) - 1
    measured = (f"line {first.line}: {first.message}" + (f" (and {more} more inconsistent line"
                                                          f"{'s' if more > 1 else ''}: "
                                                          + "; ".join(f"line {b.line} [{b.check}]"
                                                                      for b in result.breaks[1:6]) + ")"
                                                          if more else ""))
    tail = "\n".join(f"    | {log.lines[b.line - 1]}" for b in result.breaks[:3] if 0 < b.line <= len(log.lines))
    message = criteria.FAILURE_TEMPLATE.format(
        status="FAIL", label=LABEL, criterion_id=CHECK_ID, measured=measured, expected=EXPECTED,
        where=f"{where} line {first.line}", artifacts=artifacts or where, tail=tail or "    (see measured)",
        remedy="submit the log exactly as the run wrote it (a log is graded as written; an edited one is not "
               "trusted)")
    if cause is not None:
        head, _, rest = message.partition("\n")
        message = head + "\n" + criteria.ROOT_CAUSE_TEMPLATE.format(cause_id=cause.cause_id, cause=cause.cause,
                                                                    remedy=cause.remedy) + rest
    return Verdict(CHECK_ID, LABEL, FAIL, measured, EXPECTED, f"{where} line {first.line}", message)
