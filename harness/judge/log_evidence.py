"""What a Megatron-LM log proves about the device, the memory and the checkpoints of its run.

Megatron-LM core_v0.16.1 prints, on a GPU run, its CUDA allocator statistics (``report_memory`` in
megatron/training/utils.py: ``[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max reserved: 364.00``),
torch's NCCL process group speaks in its own lines (``ProcessGroupNCCL.cpp``), and the arguments block names the
device choices (``distributed_backend``, the reference trainer's ``device``). Its saves print ``saving checkpoint at
iteration N ...`` and, once written, ``successfully saved checkpoint from iteration N ...``; ``save ... None`` in the
arguments block is a run without ``--save``. The memory band for the log's ``max reserved`` is derived from the real
logs kept in fixtures (``python -m harness log-evidence derive``), one band per model/micro-batch variant.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.judge import bands
from harness.evidence import logs
from harness.base.paths import GOLDEN_DIR
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, metric_series

MEMORY_BANDS = "megatron_log_memory_h200.json"
BAND_RULE = {"k_std": 3.0, "rel_tol_floor": 0.10}   # the memory bands' rule: tol = max(3 std, 10% of mean)
# every real Megatron-LM log kept in fixtures (the reference trainer's log is not Megatron-LM's: left out)
REAL_LOG_GLOBS = ("fixtures/logs/population/*.log*", "fixtures/logs/runs-h200/*.log*", "fixtures/logs/core_v*.log")
COURSE_VARIANT = {"hidden_size": "128", "micro_batch_size": "4"}
_NCCL = re.compile(r"ProcessGroupNCCL|NCCL INFO|NCCL version|\bnccl\b.*\binitiali[sz]ed", re.IGNORECASE)
_CPU = re.compile(r"(?:using|running on|device[:=])\s*(?:the\s+)?cpu\b", re.IGNORECASE)
SCAN_LINES = 20000                                   # lines scanned for device evidence (bounded)


def gpu_evidence(log) -> tuple:
    """(proofs, refutations) of a GPU run, each a list of texts naming the log line."""
    proofs, refutes = [], []
    if log.memory:
        m = log.memory[0]
        proofs.append(f"Megatron's CUDA allocator report `[Rank {m.rank}] {m.label} memory (MB) | allocated: "
                      f"{m.allocated:g} ...` (log line {m.line_no}, {len(log.memory)} such lines)")
    nccl = next(((i, t) for i, t in enumerate(log.lines[:SCAN_LINES], start=1) if _NCCL.search(t)), None)
    if nccl:
        proofs.append(f"the NCCL process group speaks (log line {nccl[0]}: {nccl[1].strip()[:80]!r})")
    device, backend = log.argument("device"), log.argument("distributed_backend")
    if device == "cuda":
        proofs.append(f"arguments block: device cuda (log line {log.arguments_line})")
    if device == "cpu":
        refutes.append(f"arguments block: device cpu (log line {log.arguments_line})")
    if backend == "gloo" and not log.memory:
        refutes.append(f"arguments block: distributed_backend gloo and no CUDA memory report (log line "
                       f"{log.arguments_line})")
    cpu = next(((i, t) for i, t in enumerate(log.lines[:SCAN_LINES], start=1) if _CPU.search(t)), None)
    if cpu and not log.memory:
        refutes.append(f"a CPU line (log line {cpu[0]}: {cpu[1].strip()[:80]!r})")
    return proofs, refutes


# ---------------------------------------------------------------- memory: Megatron's own report


def memory_variant(log) -> tuple:
    """(band key, how): the model width and micro batch the log's memory depends on."""
    hidden, mbs = log.argument("hidden_size"), log.argument("micro_batch_size")
    if log.arguments is None or hidden is None or mbs is None:
        hidden, mbs, how = COURSE_VARIANT["hidden_size"], COURSE_VARIANT["micro_batch_size"], \
            "no arguments block: the course's --hidden-size 128 --micro-batch-size 4 assumed"
    else:
        how = f"arguments block: hidden_size {hidden}, micro_batch_size {mbs}"
    return f"hidden{hidden}-mbs{mbs}", how


def _training_report(m) -> bool:
    """A report of the training steps (`(after K iterations)`), not one around a checkpoint save (a save adds its
    buffers, and a run without --save never prints those)."""
    return m.label.startswith("(after ") and "iteration" in m.label and "save" not in m.label


def peak(log):
    """The training's memory report with the highest max reserved (every rank's), or None."""
    return max((m for m in log.memory if _training_report(m)), key=lambda m: (m.max_reserved, -m.line_no),
               default=None)


def derive_memory_bands(paths: list) -> dict:
    """The bands document: per variant the max reserved of each real log, band [min - tol, max + tol]."""
    samples: dict = {}
    for path in paths:
        log = logs.parse_log_file(path)
        top = peak(log)
        if top is None:
            continue
        key, _ = memory_variant(log)
        samples.setdefault(key, {})[Path(path).name] = top.max_reserved
    out = {}
    for key, runs in sorted(samples.items()):
        b = bands.compute_band(list(runs.values()), BAND_RULE["rel_tol_floor"], BAND_RULE["k_std"])
        lo, hi = min(runs.values()) - b.tol, max(runs.values()) + b.tol
        out[key] = {"lo": round(lo, 1), "hi": round(hi, 1), "mean": round(b.mean, 2), "std": round(b.std, 2),
                    "tol": round(b.tol, 2), "n": b.n, "samples": runs}
    return {"schema": 1, "what": "Megatron-LM's own `max reserved` (MB, torch's CUDA allocator) from its report_memory "
                                  "lines of the training steps (`(after K iterations)`; the lines around a checkpoint "
                                  "save are left out: a run without --save has none), the highest of each log",
            "band_rule": "band [min - tol, max + tol], tol = max(3 std, 10% of the mean): the rule of the "
                         "reference trainer's memory band",
            "provenance": {"gpu": "NVIDIA H200", "logs": sorted(Path(p).name for p in paths),
                           "made_by": "python -m harness log-evidence derive"},
            "bands": out}


def real_logs(root: Path | None = None) -> list:
    """The real Megatron-LM logs the bands are derived from."""
    root = root or Path(__file__).resolve().parents[2]
    return sorted(p for g in REAL_LOG_GLOBS for p in glob.glob(str(root / g)))


_BANDS: dict = {}


def memory_bands(name: str = MEMORY_BANDS) -> dict:
    """The derived bands (fixtures/golden/<name>), read once."""
    if name not in _BANDS:
        _BANDS[name] = json.loads((GOLDEN_DIR / name).read_text())
    return _BANDS[name]


def judge_log_memory(log, band_file: str) -> tuple:
    """(status, measured, expected, where) of a recorded log's memory: the highest max reserved of its training
    steps' report lines (`[Rank N] (after K iterations) memory (MB) | ...`) in its band. A Megatron-LM log: the band
    of its model/micro-batch variant derived from every real Megatron-LM log kept (`band_file`); the reference
    trainer's log (its arguments block shows it): the trainer's own allocator band (harness.judge.memory_golden, the
    same quantity its summary.json records), for the course's variant. No such line: FAIL (Megatron prints one
    after the first log interval: the run never got there); no band for the variant: not measured."""
    from harness.judge import memory_golden

    key, how = memory_variant(log)
    top = peak(log)
    if logs.is_reference_trainer(log):
        doc, why = memory_golden.select(None)
        own = doc["own_band_mib"] if doc is not None else None
        course = key == "hidden{hidden_size}-mbs{micro_batch_size}".format(**COURSE_VARIANT)
        band = {"lo": own["lo"], "hi": own["hi"]} if own and course else None
        expected = (f"the reference trainer's own peak (max reserved in its `memory (MB)` report lines) in its "
                    f"band ({how}; {why}, calibrated for the course's variant); NVML's device-wide view needs a live "
                    "run")
        derived = "the course's hidden128-mbs4" if own else "none"
    else:
        doc = memory_bands(band_file)
        band = doc["bands"].get(key)
        expected = (f"Megatron's own peak (max reserved in its `memory (MB)` report lines) in its band ({how}; "
                    f"{band_file}: {doc['band_rule']}); NVML's device-wide view (the course's 2-4 GB) needs a live "
                    "run")
        derived = ", ".join(doc["bands"])
    whole = f"whole log ({log.lines_total} lines)"
    if band is None:
        return (NOT_MEASURABLE, f"not measured: no memory band is derived for {key} (derived: {derived}): run that "
                                "variant on the GPU and derive its band", expected, whole)
    expected = expected.replace("in its band", f"in [{band['lo']}, {band['hi']}] MB", 1)
    if top is None:
        return (FAIL, "the log has no `[Rank N] ... memory (MB) | allocated ... | max reserved ...` line (Megatron "
                      "prints it after the first log interval)", expected, whole)
    where = f"log line {top.line_no} (`[Rank {top.rank}] {top.label} memory (MB)`)"
    measured = f"max reserved {top.max_reserved:g} MB, max allocated {top.max_allocated:g} MB"
    return (PASS if band["lo"] <= top.max_reserved <= band["hi"] else FAIL), measured, expected, where


# ---------------------------------------------------------------- checkpoints: the log's save lines


def log_saves(log, wanted: list) -> tuple:
    """(ok, measured, where, absent): whether the log shows a completed save for each wanted iteration.

    ok is None when the log cannot tell (no arguments block and no save line: the run's output may be elsewhere).
    absent: a save missing only because the log stops before that iteration (a consequence, not its own failure).
    """
    save = logs.save_argument(log)
    where = f"arguments block at log line {log.arguments_line}" if log.arguments_line else "whole log"
    if save is not None and save == "None":
        interval = log.argument("save_interval")
        return (False, "the arguments block says `save ... None`: the run had no --save, so Megatron-LM saved no "
                       "checkpoint" + (f" (--save-interval {interval} without --save saves nothing)"
                                       if interval not in (None, "") else "") + "; the course's command lacks --save: add `--save DIR` (e.g. "
                       "--save checkpoints/bert) to it", where, False)
    saves = logs.completed_saves(log)
    if save is None and not saves:
        return None, "the log has no arguments block and no checkpoint save line", "whole log", False
    run = logs.run_reach(log)          # saves before its start are another log's; after its reach, never reached
    first, last = run.start, run.iteration or 0
    done = [it for it in wanted if it in saves and None not in saves[it]]
    begun = [it for it in wanted if it in saves and saves[it][1] is None]
    orphan = [it for it in wanted if it in saves and saves[it][0] is None]
    never = [it for it in wanted if it not in saves]
    found = ", ".join(f"{it}" + ("" if s and d else " (begun, not finished)" if s else " (finished, never begun)")
                      for it, (s, d) in sorted(saves.items()))
    if not begun and not never and not orphan:
        lines = ", ".join(str(saves[it][1]) for it in wanted)
        return True, f"completed saves at iteration(s) {', '.join(map(str, done))} (`successfully saved` at log " \
                     f"line(s) {lines})", f"log line {saves[wanted[0]][1]}", False
    parts = []
    if begun:
        parts.append("save(s) begun but never finished at iteration(s) " + ", ".join(map(str, begun)) +
                     " (`saving checkpoint` without `successfully saved`)")
    if orphan:
        parts.append("`successfully saved` without its `saving checkpoint` line at iteration(s) " +
                     ", ".join(map(str, orphan)) + " (Megatron prints both: the log was altered or cut)")
    if never:
        parts.append("no `saving checkpoint at iteration` line for " + ", ".join(map(str, never)))
    at = saves[begun[0]][0] if begun else saves[orphan[0]][1] if orphan else None
    return (False, "; ".join(parts) + f" (saves in the log: {found or 'none'}; --save {save or '(not printed)'})",
            f"log line {at}" if at else "whole log",
            not begun and not orphan and all(it > last or it <= first for it in never))


def wanted_saves(iterations: list, log) -> list:
    """The iterations the run must have saved: the profile's, and those the run's own --save-interval and
    --train-iters make Megatron save (every multiple of the interval, and the last iteration)."""
    wanted = set(iterations)
    if log is None:
        return sorted(wanted)
    interval, last = log.int_argument("save_interval"), log.int_argument("train_iters")
    if interval is None or last is None:
        return sorted(wanted)
    if interval > 0 and logs.saves_enabled(log):
        wanted |= set(range(interval, last + 1, interval)) | {last}
    return sorted(wanted)



# ---------------------------------------------------------------- the iteration the run reached: one rule


def reach(ev):
    """logs.run_reach of the evidence's log (the one rule for "the run's last iteration as the log proves it"), with
    the --save folder's tracker when a folder was inspected; None without a log."""
    if ev.log is None:
        return None
    return logs.run_reach(ev.log, ev.checkpoints.tracker if ev.checkpoints is not None else None)


@dataclass(frozen=True)
class AtIteration:
    """What the log prints for the run at one iteration (the line of the log interval that ends there), or why not.

    status: "ok" (point is (iteration, value, line)); "stopped" (the run never got there: a consequence of where it
    stopped); "not-printed" (its --log-interval prints no line there: nothing to judge); "lines-missing" (the log
    proves the run got there, yet lacks the line Megatron prints for it: cut or edited); "no-value" (the line has no
    value of the metric: every step of its interval was skipped)."""

    status: str
    point: tuple | None
    measured: str
    where: str


def at_iteration(log, run, at: int, metric: str) -> AtIteration:
    """The `metric` the run printed for iteration `at` as `run` (logs.Reach) reads the log: the line of the log
    interval ending at or before `at` (a --log-interval 7 run's line 196 stands for 200 once its final save and
    evaluations prove it reached 200)."""
    whole = f"whole log ({log.lines_total} lines{', last line cut off' if log.truncated_last_line else ''})"
    last = f"iteration {run.last_line.iteration}, log line {run.last_line.line_no}" if run.last_line else whole
    if not log.iterations and not run.start:
        return AtIteration("stopped", None, "no iteration line in the log", whole)
    if run.iteration is None or run.iteration < at:
        cut = "; the log's last line is cut off" if log.truncated_last_line else ""
        beyond = run.iteration is not None and (run.last_line is None or run.iteration > run.last_line.iteration)
        how = f" ({run.proofs[0][1]}, log line {run.proofs[0][2]})" if beyond else ""   # what proves it got further
        return AtIteration("stopped", None, f"the log stops at iteration {run.iteration} of {run.train_iters}{how}"
                                            f"{cut}", last)
    if run.start >= at:
        return AtIteration("stopped", None, f"the run loaded the checkpoint of iteration {run.start} and trained no "
                                            f"iteration up to {at} (no iteration line after its load)", whole)
    printed = run.printed(at)
    if printed is None:
        return AtIteration("not-printed", None, f"with --log-interval {run.interval} Megatron prints no iteration "
                                                f"line in iterations {run.start + 1}-{at}", whole)
    line = run.line(log, at)
    if line is None:
        gone = run.missing_lines(log, at)
        span = f"{gone[0]}-{gone[-1]}" if len(gone) > 1 else str(gone[0]) if gone else str(printed)
        return AtIteration("lines-missing", None, f"the log proves the run reached {run.says()}, but lacks the "
                           f"iteration line Megatron prints at {printed} (--log-interval {run.interval}): its "
                           f"line(s) of iteration(s) {span} are missing (a cut or edited log)", whole)
    found = {i: (v, ln) for i, v, ln in metric_series(log, metric)}
    where = f"iteration {line.iteration}, log line {line.line_no}"
    if line.iteration not in found:
        return AtIteration("no-value", None, f"no {metric} on the iteration line at {line.iteration} (every step of "
                                             "its log interval was skipped)", where)
    value, line_no = found[line.iteration]
    return AtIteration("ok", (line.iteration, value, line_no), "", where)


def stands_for(point: tuple, at: int, run) -> str:
    """` (the last line of a --log-interval 7 run, which reached 200: ...)` when the point is not at `at` itself."""
    if point[0] == at:
        return ""
    return (f" (its last line before {at}: with --log-interval {run.interval} Megatron prints none at {at}; the run "
            f"reached {run.says()})")


def golden_step(series) -> int | None:
    """The golden runs' --log-interval: the step between the golden's iterations (None for a single point)."""
    its = series.iterations
    return min((b - a for a, b in zip(its, its[1:])), default=None)


def interval_expectation(series, it: int, interval: int, skipped: int = 0) -> tuple | None:
    """(mean, tol) the golden series expects of a line at iteration `it` that prints the mean over the steps of its
    log interval (it - interval, it] that were not skipped (`skipped`, its counter: fp16's skipped steps come first).

    Each golden point is the mean over its own interval (the golden runs' --log-interval, the step between its
    iterations), so it stands at the centre of that interval, except the first, which follows fp16's loss-scale
    search and so stands at its own iteration; between them the golden curve is linear, beyond them flat. The line's
    expectation is that curve's mean over the line's steps, its tolerance likewise. A line at a golden iteration over
    the golden's own interval gets exactly that point's values; a line none of whose steps the golden covers, None.
    (Measured on the real --log-interval 1 runs of both recipes, every interval 1-50 rebuilt from them: at most 0.46
    of the tolerance from this expectation, the single steps' noise included.)"""
    its = series.iterations
    step = golden_step(series) or interval
    exact = series.at(it)
    if exact is not None and interval == step:
        return exact
    first_step = it - interval + 1 + max(0, min(skipped or 0, interval - 1))
    if it <= its[0] - step or first_step > its[-1]:
        return None
    centers = [its[0]] + [g - (step - 1) / 2 for g in its[1:]]

    def curve(values, x):
        if x <= centers[0]:
            return values[0]
        for c0, c1, v0, v1 in zip(centers, centers[1:], values, values[1:]):
            if x <= c1:
                return v0 + (v1 - v0) * (x - c0) / (c1 - c0)
        return values[-1]

    steps = range(first_step, it + 1)
    return (sum(curve(series.mean, x) for x in steps) / len(steps),
            sum(curve(series.tol, x) for x in steps) / len(steps))


def skips_split(log, limit: int, interval: int) -> tuple:
    """(skipped steps up to `limit`, fp16.SkipCount of those after it) from the iteration lines' counters, each line's
    counter covering the steps since the previous line (Megatron resets it after each line it prints, except after a
    process's first iteration line, which the next line counts again: those extra lines are left out). A line whose
    interval straddles `limit` (the line at 50 of a --log-interval 50 run) has its skips counted before `limit` as far
    as its steps there go (fp16's loss-scale search comes first): the same run counts the same at any interval."""
    from harness.evidence import fp16

    lines = [r for i, r in enumerate(log.iterations)
             if r.iteration % interval == 0 and r.iteration != 1 or i == len(log.iterations) - 1]
    early = after = steps = 0
    first, previous = None, 0
    for r in lines:
        start, n = previous + 1, r.skipped or 0
        previous = r.iteration
        if r.iteration <= limit:
            early += n
            continue
        before = max(0, min(n, limit - start + 1))
        early, after, steps = early + before, after + n - before, steps + r.iteration - max(start, limit + 1) + 1
        if n - before and first is None:
            first = r
    return early, fp16.SkipCount(after, steps, first)


# ---------------------------------------------------------------- loss windows in iterations


def iteration_windows(series: list, width: int, interval: int) -> list:
    """The values in consecutive windows of about `width` iterations: each logged point stands for the `interval`
    iterations it ends, so a run logged at any --log-interval gets the same windows (span // width of them)."""
    first, last = series[0][0], series[-1][0]
    covered = last - first + interval
    count = covered // width
    chunks = [[] for _ in range(count)]
    for it, value, _ in series:
        chunks[min(count - 1, (it - first) * count // covered)].append(value)
    return [w for w in chunks if w]


def value_windows(values: list, window: int) -> list:
    """Consecutive chunks covering all values, len(values) // window of them, sizes differing by at most one."""
    count = len(values) // window
    size, extra = divmod(len(values), count)
    chunks, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        chunks.append(values[start:end])
        start = end
    return chunks


def few(its: list) -> str:
    """Iterations for a message: the first eight."""
    return ", ".join(map(str, its[:8])) + (" ..." if len(its) > 8 else "")


def main(argv: list | None = None) -> int:
    """CLI: `derive` the memory bands from the real logs (writes fixtures/golden/<MEMORY_BANDS>)."""
    parser = argparse.ArgumentParser(prog="python -m harness log-evidence")
    parser.add_argument("command", choices=["derive"])
    parser.add_argument("--out", default=str(GOLDEN_DIR / MEMORY_BANDS))
    args = parser.parse_args(argv)
    doc = derive_memory_bands(real_logs())
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}: " + ", ".join(f"{k} [{b['lo']}, {b['hi']}] MB ({b['n']} logs)"
                                              for k, b in doc["bands"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
