"""Megatron-LM training logs: parse them into records, and write lines exactly as Megatron does.

The formats follow Megatron-LM core_v0.16.1 (``training_log`` and ``evaluate_and_print_results`` in
megatron/training/training.py, ``report_memory`` in utils.py, ``save_checkpoint``/``load_checkpoint`` in
checkpointing.py). The suite's own trainer writes its log with the ``format_*`` functions of harness.evidence.logformat
(the marker lines, the records and the writers; importable from here too), so one parser reads both.
``python -m harness log LOG`` prints the parsed run as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path

# the marker lines, the records and the writers live in harness.evidence.logformat; importable from here too
from harness.evidence.logformat import (  # noqa: F401
    ARGUMENTS_BEGIN, ARGUMENTS_END, CheckpointRecord, IterationRecord, KEEP_CHARS, MARKERS,
    MAX_PROBLEMS, MAX_RECORDS,
    MemoryRecord, ParsedLog, ValidationRecord, _ANSI, _ARGUMENT, _FIELD_BY_KEY, _INT_ATTRS, _ITERATION, _LOADED, _LOADING, _MEMORY,
    _MEMORY_ITER, _PREFIX_MARKERS, _REQUIRED_KEYS, _SAVED, _SAVING, _VALIDATION)


# ---------------------------------------------------------------- parsing


def _number(text: str, as_int: bool):
    """int or float from a field value; accepts nan/inf spellings."""
    text = text.strip()
    return int(text) if as_int else float(text)


def _split_fields(rest: str) -> list:
    """[(key, raw value)] from ``| key: value | key: value |`` text."""
    pairs = []
    for part in rest.split("|"):
        part = part.strip()
        if part:
            key, _, value = part.partition(": ")
            pairs.append((key.strip(), value))
    return pairs


def parse_iteration_line(line: str, line_no: int = 0) -> IterationRecord | None:
    """An IterationRecord, or None when the line is not an iteration line (raises ValueError if malformed)."""
    m = _ITERATION.match(line)
    if not m:
        return None
    values, extra, order = {}, {}, []
    for key, raw in _split_fields(m["rest"]):
        order.append(key)
        if key in _FIELD_BY_KEY:
            attr = _FIELD_BY_KEY[key][0]
            values[attr] = _number(raw, attr in _INT_ATTRS)
        else:
            extra[key] = raw
    missing = [k for k in _REQUIRED_KEYS if _FIELD_BY_KEY[k][0] not in values]
    if missing:
        raise ValueError(f"iteration line without {', '.join(repr(k) for k in missing)}")
    return IterationRecord(iteration=int(m["it"]), train_iters=int(m["n"]), timestamp=m["ts"], line_no=line_no,
                           extra=extra, field_order=tuple(order), **values)


def parse_validation_line(line: str, line_no: int = 0) -> ValidationRecord | None:
    """A ValidationRecord, or None when the line is not a validation line."""
    m = _VALIDATION.match(line)
    if not m:
        return None
    values, extra = {}, {}
    for key, raw in _split_fields(m["rest"]):
        name, _, what = key.rpartition(" ")
        attr = {"lm loss": "lm", "sop loss": "sop"}.get(name)
        if attr and what in ("value", "PPL"):
            values[f"{attr}_{'loss' if what == 'value' else 'ppl'}"] = float(raw)
        else:
            extra[key] = raw
    return ValidationRecord(iteration=int(m["it"]), split=m["split"] or "periodic", line_no=line_no, extra=extra,
                            lm_loss=values.get("lm_loss"), lm_ppl=values.get("lm_ppl"),
                            sop_loss=values.get("sop_loss"), sop_ppl=values.get("sop_ppl"))


def parse_memory_line(line: str, line_no: int = 0) -> MemoryRecord | None:
    """A MemoryRecord, or None when the line is not a report_memory line."""
    m = _MEMORY.match(line)
    if not m:
        return None
    values = {k.strip(): float(v) for k, _, v in (p.partition(": ") for p in m["rest"].split("|")[1:]) if k.strip()}
    if not {"allocated", "max allocated", "reserved", "max reserved"} <= set(values):
        raise ValueError(f"memory line without allocated/reserved values: {line[:120]!r}")
    it = _MEMORY_ITER.search(m["label"])
    after = int(it[1] or it[2]) if it else None
    return MemoryRecord(rank=int(m["rank"]), after_iterations=after, allocated=values["allocated"],
                        max_allocated=values["max allocated"], reserved=values["reserved"],
                        max_reserved=values["max reserved"], line_no=line_no, label=m["label"],
                        device_used=values.get("total device memory used"))


def parse_checkpoint_line(line: str, line_no: int = 0) -> CheckpointRecord | None:
    """A CheckpointRecord for save/load lines, else None."""
    if m := _SAVING.match(line):
        return CheckpointRecord("saving", int(m["it"]), m["path"], m["fmt"], line_no, m["ts"])
    if m := _SAVED.match(line):
        return CheckpointRecord("saved", int(m["it"]), m["path"], None, line_no, m["ts"])
    if m := _LOADING.match(line):
        return CheckpointRecord("loading", int(m["it"]), m["path"], "torch_dist" if m["dist"] else None, line_no)
    if m := _LOADED.match(line):
        return CheckpointRecord("loaded", int(m["it"]), m["path"], None, line_no)
    return None


def marker_of(line: str) -> str | None:
    """The marker id a line is, or None."""
    text = line.strip()
    for marker_id, marker in MARKERS.items():
        if marker_id in _PREFIX_MARKERS:
            if text.startswith(marker.strip()):
                return marker_id
        elif text == marker:
            return marker_id
    return None


def clean_segments(line: str) -> list:
    """The pieces of one physical line a terminal would show: ANSI codes removed, split at carriage returns."""
    return [seg for seg in _ANSI.sub("", line).split("\r") if seg.strip()]


class _Collector:
    """Mutable accumulator used while scanning; frozen into a ParsedLog at the end."""

    def __init__(self):
        """Empty lists; markers keep their first line."""
        self.markers, self.iterations, self.validations = {}, [], []
        self.memory, self.checkpoints, self.problems = [], [], []
        self.arguments, self.arguments_line, self._in_arguments = None, None, False
        self.dropped = {}                 # kind -> records dropped from the middle (a huge log)

    @classmethod
    def merged(cls, parts: list) -> "_Collector":
        """One collector holding every part's records, in line order."""
        if len(parts) == 1:
            return parts[0]
        out = cls()
        for name in ("iterations", "validations", "memory", "checkpoints"):
            setattr(out, name, sorted((r for p in parts for r in getattr(p, name)), key=lambda r: r.line_no))
        for p in parts:
            for marker, line_no in p.markers.items():
                out.markers[marker] = min(line_no, out.markers.get(marker, line_no))
            if out.arguments is None and p.arguments is not None:
                out.arguments, out.arguments_line = p.arguments, p.arguments_line
            out.problems.extend(p.problems)
        return out

    def _feed_arguments(self, segment: str, line_no: int) -> bool:
        """Collect the first `arguments` block; True when the segment belonged to it."""
        text = segment.strip()
        if text == ARGUMENTS_BEGIN.strip() and self.arguments is None:
            self.arguments, self.arguments_line, self._in_arguments = {}, line_no, True
            return True
        if not self._in_arguments:
            return False
        m = _ARGUMENT.match(segment)
        if m:
            if len(self.arguments) < MAX_RECORDS:
                self.arguments.setdefault(m["name"], m["value"])
            return True
        self._in_arguments = False
        return text == ARGUMENTS_END.strip()

    def _keep(self, kind: str, records: list, rec) -> None:
        """Append; past 3 x MAX_RECORDS drop the middle, keeping the first and the last MAX_RECORDS."""
        records.append(rec)
        if len(records) >= 3 * MAX_RECORDS:
            self.dropped[kind] = self.dropped.get(kind, 0) + len(records) - 2 * MAX_RECORDS
            del records[MAX_RECORDS:len(records) - MAX_RECORDS]

    def feed(self, segment: str, line_no: int) -> None:
        """Classify one cleaned segment of a line."""
        if self._feed_arguments(segment, line_no):
            return
        marker = marker_of(segment)
        if marker:
            self.markers.setdefault(marker, line_no)
            return
        try:  # a malformed line (e.g. two ranks' lines interleaved in one merged log) is a problem, never a crash
            if rec := parse_iteration_line(segment, line_no):
                self._keep("iteration", self.iterations, rec)
            elif rec := parse_validation_line(segment, line_no):
                self._keep("validation", self.validations, rec)
            elif rec := parse_memory_line(segment, line_no):
                self._keep("memory", self.memory, rec)
            elif rec := parse_checkpoint_line(segment, line_no):
                self._keep("checkpoint", self.checkpoints, rec)
        except ValueError as exc:
            if len(self.problems) < MAX_PROBLEMS:
                self.problems.append(f"line {line_no}: {exc}")
            else:
                self.dropped["problem"] = self.dropped.get("problem", 0) + 1


class _KeptLines:
    """The lines ParsedLog keeps: all of a normal log; of a huge one its first and last KEEP_CHARS characters."""

    def __init__(self):
        self.head, self.tail, self.head_chars, self.tail_chars, self.skipped = [], deque(), 0, 0, 0

    def add(self, line: str) -> None:
        if self.head_chars < KEEP_CHARS:
            self.head.append(line)
            self.head_chars += len(line) + 1
            return
        self.tail.append(line)
        self.tail_chars += len(line) + 1
        while self.tail_chars > KEEP_CHARS and len(self.tail) > 1:
            self.tail_chars -= len(self.tail.popleft()) + 1
            self.skipped += 1

    def lines(self) -> tuple:
        gap = [f"[... {self.skipped} lines not kept: the log is larger than {2 * KEEP_CHARS >> 20} MB ...]"]
        return tuple(self.head + (gap if self.skipped else []) + list(self.tail))


def _merge(collectors: dict) -> tuple:
    """(main collector, iteration collector, note) of a log whose lines came from several ranks.

    Rank 0's lines are judged (with the launcher's own, unprefixed ones); Megatron prints iteration and validation
    lines on the last rank, so they come from rank 0 when it has them, else from the highest rank that has them.
    """
    ranks = sorted(r for r in collectors if r is not None)
    if len(ranks) <= 1:
        main = _Collector.merged([collectors[k] for k in collectors])
        return main, main, None
    main = _Collector.merged([collectors[k] for k in (None, ranks[0]) if k in collectors])
    with_iterations = [r for r in ranks if collectors[r].iterations]
    source = ranks[0] if ranks[0] in with_iterations or not with_iterations else with_iterations[-1]
    label = lambda r: ".".join(map(str, r))  # noqa: E731 - rank (srun's, torchrun's) as text
    note = (f"{len(ranks)} ranks interleaved ({', '.join(label(r) for r in ranks)}): rank {label(ranks[0])}'s lines "
            f"judged" + ("" if source == ranks[0] else
                         f", iteration and validation lines from rank {label(source)}, the last rank that prints "
                         "them (Megatron prints them on the last rank)"))
    main.memory = sorted((m for c in collectors.values() for m in c.memory), key=lambda m: m.line_no)
    main.problems = [p for c in collectors.values() for p in c.problems]
    return main, collectors[source], note


def parse_items(items, read_infos=(), notes=()) -> ParsedLog:
    """Parse (rank, line) pairs as harness.evidence.logread.unwrap yields them; the last line is parsed only when the
    readers say it ended with its newline (read_infos' truncated_last_line is read once the items ran out)."""
    collectors, kept, total, last = {}, _KeptLines(), 0, None
    for line_no, (rank, line) in enumerate(items, start=1):
        if last is not None:
            _feed(collectors, *last)
        last, total = (rank, line, line_no), line_no
        kept.add(line)
    truncated = bool(read_infos) and read_infos[-1].truncated_last_line
    if last is not None and not truncated:
        _feed(collectors, *last)
    main, it, rank_note = _merge(collectors or {None: _Collector()})
    source = tuple(n for info in read_infos for n in info.notes()) + tuple(notes) + ((rank_note,) if rank_note else ())
    dropped = {k: n for c in collectors.values() for k, n in c.dropped.items()}
    problems = list(main.problems) + [f"{n} more {kind} records not kept (the log is too large to keep every one)"
                                      for kind, n in dropped.items()]
    return ParsedLog(markers=main.markers, iterations=tuple(it.iterations), validations=tuple(it.validations),
                     memory=tuple(main.memory), checkpoints=tuple(main.checkpoints), lines_total=total,
                     truncated_last_line=truncated, lines=kept.lines(), problems=tuple(problems),
                     arguments=main.arguments, arguments_line=main.arguments_line, source=source)


def _feed(collectors: dict, rank, line: str, line_no: int) -> None:
    """One complete line to its rank's collector."""
    collector = collectors.get(rank) or collectors.setdefault(rank, _Collector())
    for segment in clean_segments(line):
        collector.feed(segment, line_no)


def parse_log(text: str) -> ParsedLog:
    """Parse a whole log held in memory; a last line without its newline is flagged and not parsed."""
    from harness.evidence import logread

    info = logread.ReadInfo("(text)")
    return parse_items(logread.unwrap(logread.text_lines(text, info), info), [info])


def parse_log_file(path: str | Path) -> ParsedLog:
    """Parse a log file as any tool wrote it (see harness.evidence.logread), streamed."""
    return parse_log_files([path])


def parse_log_files(paths, ranks=None) -> ParsedLog:
    """Parse several files as one log, their lines numbered on (stdout then stderr of one run, or the rank files
    of torchrun --log-dir, `ranks` giving each file's rank)."""
    from harness.evidence import logread

    infos, streams = [], []
    for i, path in enumerate(paths):
        info = logread.ReadInfo(str(path))
        infos.append(info)
        rank = ranks[i] if ranks else None
        streams.append(logread.unwrap(logread.read_lines(path, info), info, rank))
    notes = ()
    if len(paths) > 1:
        notes = (f"{len(paths)} files read as one log, in this order: {', '.join(Path(p).name for p in paths)}",)
    return parse_items((item for stream in streams for item in stream), infos, notes)


# ---------------------------------------------------------------- what the log proves about the run's end

# Megatron-LM core_v0.16.1 ends a run (training.py, pretrain -> train -> evaluate_and_print_results): the last
# iteration line is --train-iters, the final save (when --save is set) is followed by its `successfully saved` line,
# then `validation loss at iteration N on validation set | ...` and `... on test set | ...`. A Python traceback,
# torchrun's ChildFailedError / a non-zero `exitcode`, or a signal report after that is no normal end.
_AFTER_END_FAILURES = (
    ("a Python traceback", re.compile(r"Traceback \(most recent call last\)")),
    ("torchrun's ChildFailedError", re.compile(r"ChildFailedError")),
    ("a launcher's non-zero exitcode", re.compile(r"\bexitcode\s*:\s*-?[1-9]\d*")),
    ("a signal", re.compile(r"Signal \d+ \(SIG\w+\) received")),
)
# The setup markers in the order Megatron prints them, each with what the run was doing once it printed it.
_SETUP_PHASES = (
    ("building_datasets", "building datasets"),
    ("building_bert_datasets", "building datasets"),
    ("finished_datasets", "building the data loaders"),
    ("after_dataloaders", "finishing setup"),
    ("done_setup", "starting the training loop"),
    ("training", "the first training iterations"),
)
_EVALUATING = re.compile(r"^\s*Evaluating (?:on \d+ samples|iter \d+/\d+)")


@dataclass(frozen=True)
class RunEnd:
    """How a log ends: complete (Megatron's normal end) or where it stopped and what was in flight."""

    complete: bool
    stopped: str                      # e.g. "killed during the checkpoint save at iteration 200"
    where: str                        # "iteration 200, log line 923"
    last_line: str                    # the last non-blank line, as written (cut to 200 characters)
    missing: tuple = ()               # the end's parts the log lacks, in words
    iteration: int | None = None      # the last iteration line's iteration
    train_iters: int | None = None


def save_argument(log: ParsedLog) -> str | None:
    """The `save` value of the arguments block ('None' when the run had no --save); None when not printed."""
    return None if log.arguments is None else log.arguments.get("save")


def saves_enabled(log: ParsedLog) -> bool | None:
    """Whether the run saved checkpoints: from the arguments block, else from a save line; None when unknown."""
    save = save_argument(log)
    if save is not None:
        return save.strip() != "None"
    return True if any(c.event in ("saving", "saved") for c in log.checkpoints) else None


def is_reference_trainer(log: ParsedLog) -> bool:
    """A log of the suite's own trainer (python -m harness train): its arguments block has the trainer's own
    ``inject_nan_at``. It prints its lines the way Megatron does; its timer and its memory differ (CUDA graphs)."""
    return "inject_nan_at" in (log.arguments or {})


def completed_saves(log: ParsedLog) -> dict:
    """iteration -> (saving line, saved line or None) of each save the log began, in order."""
    saves = {}
    for c in log.checkpoints:
        if c.event == "saving":
            saves.setdefault(c.iteration, [c.line_no, None])
        elif c.event == "saved":
            saves.setdefault(c.iteration, [None, None])[1] = c.line_no
    return {it: tuple(v) for it, v in saves.items()}


def log_interval(log: ParsedLog) -> int | None:
    """--log-interval from the arguments block, else the most common step between iteration lines (the first line
    excluded: Megatron prints each process's first iteration, 1 or the one after its checkpoint, off the interval);
    None with fewer than two lines to measure."""
    printed = log.int_argument("log_interval")
    if printed is not None:
        return printed
    its = [r.iteration for r in (log.iterations[1:] if len(log.iterations) >= 3 else log.iterations)]
    steps = [b - a for a, b in zip(its, its[1:]) if b > a]
    return max(set(steps), key=lambda s: (steps.count(s), -s)) if steps else None


@dataclass(frozen=True)
class Reach:
    """The run's last iteration as its log proves it: ONE rule (run_reach) for every criterion that names an
    iteration (the final loss, the golden final loss and curve, the run's end, the saves, the skips, the resume).

    Megatron-LM (core_v0.16.1, training.py) prints an iteration line when ``iteration % log_interval == 0`` (and for
    the first iteration of each process), evaluates after the step of each multiple of --eval-interval, saves after
    the step of each multiple of --save-interval, and at the end evaluates on the validation and test sets at the
    iteration it reached; a resumed run's ``loading checkpoint ... at iteration N`` is where its state started. So a
    --log-interval 7 run's last line is 196 while its final save and evaluations say it reached 200, and a rerun
    that loaded iteration 200 reached 200 having trained nothing."""

    iteration: int | None             # None: the log proves no iteration (no line, save, evaluation or load)
    train_iters: int | None           # --train-iters: the arguments block's, else the iteration lines'
    interval: int                     # --log-interval (the arguments block's, else measured; 1 when unknown)
    interval_known: bool = True       # printed, or measured between iteration lines
    proofs: tuple = ()                # (iteration, what, log line) of the evidence that reaches `iteration`
    start: int = 0                    # the iteration the run's state started from: its checkpoint load, else 0
    last_line: object = None          # the last iteration line (IterationRecord), or None

    @property
    def complete(self) -> bool:
        """The run reached --train-iters."""
        return None not in (self.iteration, self.train_iters) and self.iteration >= self.train_iters

    def printed(self, at: int | None = None) -> int | None:
        """The iteration of the last line Megatron prints at or before `at` (default: the reach): the highest
        multiple of --log-interval after the run's start; None when it prints none there."""
        at = self.iteration if at is None else at
        if at is None:
            return None
        it = at - at % self.interval
        return it if it > self.start else None

    def line(self, log: ParsedLog, at: int | None = None):
        """The iteration line that stands for iteration `at` (default: the reach): the last line of the log interval
        that ends at or before it (at - interval < line <= at), after the run's start; None when there is none."""
        at = self.iteration if at is None else at
        if at is None:
            return None
        return next((r for r in reversed(log.iterations)
                     if at - self.interval < r.iteration <= at and r.iteration > self.start), None)

    def missing_lines(self, log: ParsedLog, upto: int | None = None) -> tuple:
        """The iterations up to `upto` (default: the reach) whose line Megatron prints and the log lacks, after its
        last iteration line (or its start): lines cut or removed from a log whose end proves the run got there."""
        upto = self.iteration if upto is None else upto
        if upto is None or not self.interval_known:
            return ()
        after = max(self.start, self.last_line.iteration if self.last_line is not None else 0)
        first = after - after % self.interval + self.interval
        return tuple(range(first, upto + 1, self.interval))

    def says(self) -> str:
        """`iteration 200 (the final evaluation on the test set, log line 1144)`: the reach and its strongest proof."""
        if self.iteration is None:
            return "no iteration (no iteration line, save, evaluation or checkpoint load)"
        _, what, line = self.proofs[0]          # the strongest: the last printed line of the highest iteration
        return f"iteration {self.iteration} ({what}" + (f", log line {line})" if line else ")")


def _proofs(log: ParsedLog) -> list:
    """(iteration, what, line) for each line that proves the run's state reached an iteration."""
    out = [(r.iteration, "its last iteration line", r.line_no) for r in log.iterations[-1:]]
    for v in log.validations:
        what = ("the periodic evaluation" if v.split == "periodic"
                else f"the final evaluation on the {v.split} set")
        out.append((v.iteration, what, v.line_no))
    for c in log.checkpoints:
        what = {"saving": "a checkpoint save begun", "saved": "a completed checkpoint save",
                "loading": "the checkpoint it loaded", "loaded": "the checkpoint it loaded"}[c.event]
        out.append((c.iteration, what, c.line_no))
    return out


def run_reach(log: ParsedLog, tracker: int | None = None) -> Reach:
    """The last iteration the log proves the run reached (see Reach), from the final validation/test lines, the last
    iteration line, the periodic evaluations, the saves and the checkpoint it loaded, capped by --train-iters; with
    `tracker` (the --save folder's latest_checkpointed_iteration.txt) also by its completed save. Only what the log
    prints after its last iteration line can reach further than that line (a log holding two runs is judged by the
    last). Computed once per log (ParsedLog.fact)."""
    base = log.fact("run_reach", _run_reach)
    if tracker is None or base.train_iters is not None and tracker > base.train_iters or \
            base.iteration is not None and tracker <= base.iteration:
        return base
    proofs = ((tracker, "the --save folder's tracker (latest_checkpointed_iteration.txt)", 0),) + base.proofs
    return replace(base, iteration=tracker, proofs=proofs)


def _run_reach(log: ParsedLog) -> Reach:
    """run_reach, computed from the log alone."""
    last = log.iterations[-1] if log.iterations else None
    n = log.int_argument("train_iters") or (last.train_iters if last else None)
    known = log_interval(log)
    interval = known or 1
    loads = [c for c in log.checkpoints if c.event in ("loading", "loaded") and c.iteration > 0]
    before = [c for c in loads if last is None or c.line_no < last.line_no]   # the last leg's load (stitched logs)
    start = before[-1].iteration if before else 0
    proofs = [p for p in _proofs(log) if (n is None or p[0] <= n) and (last is None or p[2] >= last.line_no)]
    if not proofs:
        return Reach(None, n, interval, known is not None, (), start, last)
    top = max(p[0] for p in proofs)
    ordered = tuple(sorted(proofs, key=lambda p: (-p[0], -p[2])))
    return Reach(top, n, interval, known is not None, ordered, start, last)


def _last_line(log: ParsedLog) -> tuple:
    """(line number, text) of the last non-blank line kept."""
    for i in range(len(log.lines) - 1, -1, -1):
        if log.lines[i].strip():
            return log.lines_total - (len(log.lines) - 1 - i), log.lines[i].strip()[:200]
    return 0, "(empty log)"


def run_end(log: ParsedLog) -> RunEnd:
    """Megatron-LM's normal end, read from the log (see _AFTER_END_FAILURES); else where the run stopped. Computed
    once per log and carried on it (ParsedLog.fact): the root cause and the exit-code criterion read the same end."""
    return log.fact("run_end", _run_end)


def _run_end(log: ParsedLog) -> RunEnd:
    """run_end, computed: where the run got to is run_reach's answer (the one rule)."""
    line_no, last_text = _last_line(log)
    reach = run_reach(log)
    last, n, it = reach.last_line, reach.train_iters, reach.iteration
    at = lambda i, ln: f"iteration {i}, log line {ln}"  # noqa: E731
    if it is None or n is None or last is None and not reach.complete:
        reached = [(log.markers[m], what, m) for m, what in _SETUP_PHASES if m in log.markers]
        ended = log.arguments is not None and any(t.strip() == ARGUMENTS_END.strip() for t in log.lines)
        doing = (f"while {max(reached)[1]}" if reached else
                 "after printing its arguments, before building the datasets" if ended else
                 "while printing its arguments" if log.arguments is not None
                 else "before Megatron-LM printed its arguments")
        loaded = f" (it had loaded the checkpoint of iteration {reach.start})" if reach.start else ""
        return RunEnd(False, f"stopped before training started, {doing}{loaded} (last line: {last_text})",
                      f"log line {line_no}", last_text, ("any iteration line",), it, n)
    saves = completed_saves(log)
    proof_line = reach.proofs[0][2] if reach.proofs else line_no
    tail_events = [(r.line_no, "iteration", r) for r in log.iterations[-1:]] + \
                  [(v.line_no, "validation", v) for v in log.validations[-2:]] + \
                  [(c.line_no, "checkpoint", c) for c in log.checkpoints[-2:]]
    final_val = next((v for v in log.validations if v.split == "validation" and v.iteration == it), None)
    final_test = next((v for v in log.validations if v.split == "test" and v.iteration == it), None)
    open_save = next((i for i, (s, d) in saves.items() if s is not None and d is None), None)
    if open_save is not None:
        return RunEnd(False, f"killed during the checkpoint save at iteration {open_save} (its `saving checkpoint` "
                             "line has no `successfully saved` line after it)",
                      at(open_save, saves[open_save][0]), last_text, ("the save's `successfully saved` line",),
                      it, n)
    if it < n:
        last_event = max(tail_events, key=lambda e: e[0])
        doing = ""
        if it in saves and saves[it][1] is not None and any(
                "exiting program at iteration" in t for t in log.lines[-40:]):
            doing = (f", where it exited after its checkpoint save (--exit-interval / --exit-duration-in-mins: "
                     "a first leg, to be resumed with --load)")
        elif last_event[1] == "validation" and last_event[2].iteration == it:
            doing = f", after its evaluation at iteration {it}"
        elif any(_EVALUATING.match(t) for t in log.lines[-40:]):
            doing = f", during the evaluation at iteration {it}"
        return RunEnd(False, f"stopped at iteration {it} of {n}{doing}", at(it, proof_line), last_text,
                      (f"iterations {it + 1}-{n}",), it, n)
    missing = []
    # Megatron saves at --train-iters only when this process trained up to it (a rerun that loaded it saves nothing)
    final_save = saves_enabled(log) and reach.start < n
    if final_save and (n not in saves or saves[n][1] is None):
        missing.append(f"the final save's `successfully saved checkpoint from iteration {n}` line")
    if final_val is None:
        missing.append(f"`validation loss at iteration {n} on validation set`")
    if final_test is None:
        missing.append(f"`validation loss at iteration {n} on test set`")
    if missing:
        what = "before the final save" if final_save and n not in saves else "during the final evaluation"
        return RunEnd(False, f"stopped {what}, after iteration {n} of {n}", at(n, proof_line), last_text,
                      tuple(missing), n, n)
    end_line = max(final_val.line_no, final_test.line_no)
    after = log.lines[max(0, len(log.lines) - (log.lines_total - end_line)):]
    for what, pattern in _AFTER_END_FAILURES:
        hit = next((t for t in after if pattern.search(t)), None)
        if hit:
            return RunEnd(False, f"failed after its final evaluation: {what} ({hit.strip()[:160]})",
                          f"after log line {end_line}", last_text, ("an end without errors",), n, n)
    saved = "final save, " if final_save else "no --save, " if not saves_enabled(log) else ""
    trained = "" if reach.start < n else f" (it loaded the checkpoint of iteration {reach.start} and trained none)"
    return RunEnd(True, f"completed: iteration {n} of {n}{trained}, {saved}final evaluations on the validation and "
                        "test sets", f"log line {end_line}", last_text, (), n, n)


def to_jsonable(parsed: ParsedLog) -> dict:
    """The parsed run as plain data (raw lines left out), for the CLI and reports."""
    data = asdict(parsed)
    data.pop("lines")
    for rec in data["iterations"]:
        rec.pop("field_order")
    data["first_loss_record"] = asdict(parsed.first_loss_record) if parsed.first_loss_record else None
    data["last_iteration"] = parsed.last_iteration
    return data


def main(argv: list | None = None) -> int:
    """CLI: print the parsed log as JSON."""
    parser = argparse.ArgumentParser(prog="python -m harness log", description="Parse a Megatron training log.")
    parser.add_argument("log", help="path to the training log")
    args = parser.parse_args(argv)
    json.dump(to_jsonable(parse_log_file(args.log)), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
