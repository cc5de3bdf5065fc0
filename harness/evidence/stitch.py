"""Several logs in one submission: stitch the logs of one resumed run, or say which one log was judged and why.

A run stopped by ``--exit-interval`` / ``--exit-duration-in-mins``, preempted, or crashed after a save, then
resumed with ``--load``, leaves one log per attempt. Megatron-LM (core_v0.16.1, checkpointing.py) prints, when it
saves, ``successfully saved checkpoint from iteration N to DIR [ t 1/1, p 1/1 ]``, and when it resumes,
`` loading distributed checkpoint from DIR at iteration N`` and ``successfully loaded checkpoint from DIR [ t 1/1,
p 1/1 ] at iteration N``. The logs are ordered by their first iteration (never by file name); each resumed log must
load a checkpoint that an earlier log saved. The stitched log keeps the earlier log up to the resume iteration and
the resumed log from there on. Named failures (each cause first, then the fix):

- ``resume-unknown-checkpoint``: a log resumes from a checkpoint no earlier log saved (another run's), or starts
  past the first iteration with no ``loading checkpoint`` line at all;
- ``resume-gap``: iterations missing between the logs;
- ``resume-overlap-disagrees``: an iteration logged by both logs whose losses differ beyond print resolution;
- ``rerun-of-finished-run``: the one log submitted loaded the checkpoint of --train-iters (a rerun into the --save
  folder of a finished run): it trained nothing, and the log of the training is missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import PurePath

from harness.evidence.logformat import ParsedLog

PRINTED_DIGITS = 6                    # Megatron prints losses as {:.6E}: 7 significant digits


@dataclass(frozen=True)
class Choice:
    """What is judged: one log (possibly stitched), where it came from, and what is wrong with the set."""

    log: ParsedLog
    names: tuple                      # the logs judged, in run order
    notes: tuple = ()                 # provenance, in words
    failures: tuple = ()              # (failure id, cause, fix)


def _resume(log: ParsedLog):
    """The checkpoint record a log resumed from (its first load line), or None."""
    loads = [c for c in log.checkpoints if c.event in ("loading", "loaded") and c.iteration > 0]
    return loads[0] if loads else None


def _rerun(name: str, log: ParsedLog, load) -> tuple | None:
    """A run started again after it had finished: it loaded the checkpoint of --train-iters (Megatron-LM then trains
    no iteration, prints no iteration line and evaluates: core_v0.16.1 training.py, `while iteration <
    args.train_iters`), most often a rerun into its own --save folder. (failure,) or None."""
    n = log.int_argument("train_iters")
    if n is None or load.iteration < n or any(r.iteration > load.iteration for r in log.iterations):
        return None
    save = log.arguments.get("save") if log.arguments else None
    own = ", its own --save folder" if save and _same_dir(save, load.path) else ""
    return (("rerun-of-finished-run",
             f"{name} is a rerun of a finished run: it loaded the checkpoint of iteration {load.iteration} from "
             f"{load.path}{own}, where --train-iters is {n}, so it trained no iteration (no iteration line) and only "
             f"evaluated; the log of the run that trained iterations 1-{load.iteration} was not submitted",
             "submit the log of the run that trained (its output from the first iteration to the last); to train "
             "again, give the new run a fresh --save folder (a --load or --save folder holding a finished run makes "
             "Megatron-LM resume it, and there is nothing left to train)"),)


def _same_dir(a: str, b: str) -> bool:
    return PurePath(a.strip().rstrip("/")) == PurePath(b.strip().rstrip("/"))


def _interval(log: ParsedLog) -> int:
    """--log-interval from the arguments block, else the usual step between iteration lines (10)."""
    printed = log.int_argument("log_interval")
    if printed is not None:
        return printed
    steps = [b.iteration - a.iteration for a, b in zip(log.iterations[1:], log.iterations[2:])]
    return min(steps) if steps else 10


def _agree(a: float | None, b: float | None) -> bool:
    """Equal as Megatron prints them, give or take one unit in the last printed digit."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return (a is None) == (b is None) and (a is None or repr(a) == repr(b))
    scale = 10 ** (math.floor(math.log10(max(abs(a), abs(b), 1e-300))) - PRINTED_DIGITS)
    return abs(a - b) <= scale * 1.0001


def _span(log: ParsedLog) -> str:
    return f"iterations {log.iterations[0].iteration}-{log.last_iteration}" if log.iterations else "no iteration line"


def choose(parts: list) -> Choice:
    """The log to judge from [(name, ParsedLog)]: the one log, the stitched run, or the one chosen (with why)."""
    if len(parts) == 1:
        name, log = parts[0]
        load = _resume(log)
        failures = () if load is None else (_rerun(name, log, load) or (
            ("resume-unknown-checkpoint", f"{name} resumes from {load.path} at iteration {load.iteration}, but no log "
             f"of the run before the resume was submitted: iterations 1-{load.iteration} are in no log",
             "submit every log of the run (the one that saved the checkpoint too), in one folder"),))
        return Choice(log, (name,), tuple(log.source), failures)
    runs = sorted(((n, lg) for n, lg in parts if lg.iterations),
                  key=lambda p: (p[1].iterations[0].iteration, _resume(p[1]) is not None, p[0]))
    if not runs:
        name, log = max(parts, key=lambda p: (p[1].lines_total, p[0]))
        why = (f"{len(parts)} logs, none with an iteration line: judged {name}, the longest; ignored "
               + ", ".join(n for n, _ in parts if n != name))
        return Choice(log, (name,), (*log.source, why))
    chain, failures = _chain(runs)
    if len(chain) == 1:
        name, log = chain[0]
        others = [f"{n} ({_span(lg)})" for n, lg in parts if n != name]
        why = (f"{len(parts)} logs, not one resumed run: judged {name}, whose iteration lines reach furthest "
               f"({log.last_iteration}); ignored {', '.join(others)}")
        return Choice(log, (name,), (*log.source, why), tuple(failures))
    stitched, notes, more = _stitch(chain)
    ignored = [f"{n} ({_span(lg)}; not part of this run)" for n, lg in parts if n not in {c[0] for c in chain}]
    if ignored:
        notes.append(f"ignored {', '.join(ignored)}")
    return Choice(stitched, tuple(n for n, _ in chain), tuple(notes), tuple(failures + more))


def _chain(runs: list) -> tuple:
    """The logs of the run that reaches furthest, in run order, linked by their resume records; and failures."""
    end = max(range(len(runs)), key=lambda i: (runs[i][1].last_iteration, i))
    chain, failures, i = [runs[end]], [], end
    while True:
        name, log = runs[i]
        load = _resume(log)
        earlier = [j for j in range(i) if runs[j][1].iterations[0].iteration < log.iterations[0].iteration]
        if load is None:
            if log.iterations[0].iteration > 1 and earlier:
                j = earlier[-1]
                failures.append(("resume-unknown-checkpoint",
                                 f"{name} starts at iteration {log.iterations[0].iteration} but has no 'loading "
                                 f"checkpoint ... at iteration N' line, so which checkpoint it resumed from cannot be "
                                 f"checked against {runs[j][0]}", "submit the resumed run's complete log, from its first line"))
                chain.insert(0, runs[j])
                i = j
                continue
            break
        saved_by = [j for j in earlier if any(c.event == "saved" and c.iteration == load.iteration
                                              and _same_dir(c.path, load.path) for c in runs[j][1].checkpoints)]
        if not saved_by:
            failures.append(("resume-unknown-checkpoint",
                             f"{name} resumes from {load.path} at iteration {load.iteration}, a checkpoint that no "
                             f"earlier log saved (another run's, or its log is missing)",
                             "submit the log of the run that saved it, or resume from a checkpoint of this run "
                             "(--load its --save folder)"))
            break
        i = saved_by[-1]
        chain.insert(0, runs[i])
    return chain, failures


def _stitch(chain: list) -> tuple:
    """One ParsedLog of the chained logs (line numbers run on through the logs in order), notes, failures."""
    notes, failures = [], []
    iterations, validations, memory, checkpoints, problems, lines = [], [], [], [], [], []
    markers, offset, ranges = {}, 0, []
    for k, (name, log) in enumerate(chain):
        shift = lambda r: replace(r, line_no=r.line_no + offset)  # noqa: E731, B023 - offset of this log
        load = _resume(log) if k else None
        if k:
            prev_name, prev = chain[k - 1]
            start = load.iteration if load else prev.last_iteration
            failures += _compare(prev_name, prev, name, log, start)
            kept_until = start
            iterations = [r for r in iterations if r.iteration <= kept_until]
            validations = [v for v in validations if v.iteration <= kept_until]
            if load is not None:
                folder = f"iter_{load.iteration:07d}"
                notes.append(f"resumed at iteration {load.iteration} from {folder} saved by {prev_name} "
                             f"({load.path}), in {name}")
        iterations += [shift(r) for r in log.iterations]
        validations += [shift(v) for v in log.validations]
        memory += [shift(m) for m in log.memory]
        checkpoints += [shift(c) for c in log.checkpoints]
        problems += [f"{name}: {p}" for p in log.problems]
        for marker, line_no in log.markers.items():
            markers.setdefault(marker, line_no + offset)
        notes += list(log.source)
        lines += log.lines
        ranges.append(f"{name} lines {offset + 1}-{offset + log.lines_total}")
        offset += log.lines_total
    notes.insert(0, f"{len(chain)} logs of one run, stitched by iteration: {', '.join(n for n, _ in chain)} "
                    f"(line numbers run on: {'; '.join(ranges)})")
    first, last = chain[0][1], chain[-1][1]
    stitched = ParsedLog(markers=markers, iterations=tuple(iterations), validations=tuple(validations),
                         memory=tuple(memory), checkpoints=tuple(checkpoints), lines_total=offset,
                         truncated_last_line=last.truncated_last_line, lines=tuple(lines), problems=tuple(problems),
                         arguments=first.arguments,
                         arguments_line=first.arguments_line, source=tuple(notes))
    return stitched, notes, failures


def _compare(prev_name: str, prev: ParsedLog, name: str, log: ParsedLog, start: int) -> list:
    """Failures between a log and the one resumed after it: a gap, or overlapping iterations that disagree."""
    failures = []
    first = log.iterations[0].iteration
    if first - start > _interval(log):
        failures.append(("resume-gap",
                         f"iterations {start + 1}-{first - 1} are in none of the logs ({prev_name} ends "
                         f"at {prev.last_iteration}, {name} resumes at {start} but its first iteration line is "
                         f"{first})", "submit every log of the run, each complete"))
    earlier = {r.iteration: r for r in prev.iterations}
    for rec in log.iterations:
        old = earlier.get(rec.iteration)
        if old is None:
            continue
        for what in ("lm_loss", "sop_loss"):
            a, b = getattr(old, what), getattr(rec, what)
            if not _agree(a, b):
                failures.append(("resume-overlap-disagrees",
                                 f"iteration {rec.iteration} is in {prev_name} and {name} with different "
                                 f"{what.replace('_', ' ')}es ({a} and {b}): these are not one run resumed from its "
                                 "checkpoint", "submit the logs of one run only"))
                break
    return failures
