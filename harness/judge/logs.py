"""Megatron-LM training logs: parse them into records, and write lines exactly as Megatron does.

The formats follow Megatron-LM core_v0.16.1 (``training_log`` and ``evaluate_and_print_results`` in
megatron/training/training.py, ``report_memory`` in utils.py, ``save_checkpoint``/``load_checkpoint`` in
checkpointing.py). The suite's own trainer writes its log with the ``format_*`` functions below, so one parser
reads both. ``python -m harness.judge.logs LOG`` prints the parsed run as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

# Marker lines, verbatim (print_rank_0 in training.py / pretrain_bert.py). Megatron never prints "starting training".
MARKER_BUILDING_DATASETS = "> building train, validation, and test datasets ..."
MARKER_BUILDING_BERT_DATASETS = "> building train, validation, and test datasets for BERT ..."
MARKER_FINISHED_DATASETS = "> finished creating BERT datasets ..."
MARKER_AFTER_DATALOADERS = "[after dataloaders are built] datetime: "
MARKER_DONE_SETUP = "done with setup ..."
MARKER_TRAINING = "training ..."
MARKER_AFTER_TRAINING = "[after training is done] datetime: "

MARKERS = {
    "building_datasets": MARKER_BUILDING_DATASETS,
    "building_bert_datasets": MARKER_BUILDING_BERT_DATASETS,
    "finished_datasets": MARKER_FINISHED_DATASETS,
    "after_dataloaders": MARKER_AFTER_DATALOADERS,
    "done_setup": MARKER_DONE_SETUP,
    "training": MARKER_TRAINING,
    "after_training": MARKER_AFTER_TRAINING,
}
_PREFIX_MARKERS = {"after_dataloaders", "after_training"}   # followed by a timestamp

TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f"

# Iteration-line keys, in Megatron's order, with the record attribute and the value format.
ITERATION_FIELDS = (
    ("consumed samples", "consumed_samples", "{:12d}"),
    ("elapsed time per iteration (ms)", "elapsed_ms", "{:.1f}"),
    ("throughput per GPU (TFLOP/s/GPU)", "throughput", "{:.1f}"),
    ("learning rate", "learning_rate", "{:.6E}"),
    ("global batch size", "global_batch_size", "{:5d}"),
    ("lm loss", "lm_loss", "{:.6E}"),
    ("sop loss", "sop_loss", "{:.6E}"),
    ("loss scale", "loss_scale", "{:.1f}"),
    ("grad norm", "grad_norm", "{:.3f}"),
    ("number of skipped iterations", "skipped", "{:3d}"),
    ("number of nan iterations", "nan", "{:3d}"),
)
_FIELD_BY_KEY = {key: (attr, fmt) for key, attr, fmt in ITERATION_FIELDS}
_INT_ATTRS = {"consumed_samples", "global_batch_size", "skipped", "nan"}
_REQUIRED_KEYS = ("consumed samples", "elapsed time per iteration (ms)", "learning rate", "global batch size",
                  "loss scale")
_EXTRAS_BEFORE = "loss scale"          # where unknown keys go when a record has no recorded layout

# Bounds that keep memory independent of a log's size (a submitted log is untrusted; a course run has ~600 lines).
MAX_LINE_CHARS = 16384         # a longer line is cut there, the rest of it skipped
KEEP_CHARS = 2 << 20           # ParsedLog.lines keeps the log's first and last KEEP_CHARS characters of lines
MAX_RECORDS = 5_000            # per kind of record: the first and the last MAX_RECORDS are kept
MAX_PROBLEMS = 200
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_TS = r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]"
_ITERATION = re.compile(r"^\s*(?:" + _TS + r"\s*)?iteration\s+(?P<it>\d+)/\s*(?P<n>\d+)\s*\|(?P<rest>.*)$")
_VALIDATION = re.compile(r"^\s*validation(?:-\d+)? loss at iteration (?P<it>\d+)"
                         r"(?: on (?P<split>validation|test) set)? \|(?P<rest>.*)$")
_MEMORY = re.compile(r"^\s*\[Rank (?P<rank>\d+)\] (?P<label>\([^()]*\)) memory \(MB\)(?P<rest>(?: \|.*)?)$")
_SAVING = re.compile(r"^\s*(?:" + _TS + r" )?saving checkpoint at iteration\s+(?P<it>\d+) to (?P<path>.+) "
                     r"in (?P<fmt>\S+) format\s*$")
_SAVED = re.compile(r"^\s*(?:" + _TS + r" )?successfully saved checkpoint from iteration\s+(?P<it>\d+) "
                    r"to (?P<path>.+?) \[ t \d+/\d+, p \d+/\d+ \]\s*$")
_LOADING = re.compile(r"^\s*loading (?P<dist>distributed )?checkpoint from (?P<path>.+) at iteration (?P<it>\d+)\s*$")
_LOADED = re.compile(r"^\s*successfully loaded checkpoint from (?P<path>.+?) \[ t \d+/\d+, p \d+/\d+ \] "
                     r"at iteration (?P<it>\d+)\s*$")
_MEMORY_ITER = re.compile(r"(?:after (\d+) iterations|for iteration (\d+))")
# Megatron's `arguments` block (_print_args in megatron/training/arguments.py): every argument, sorted, dotted.
ARGUMENTS_BEGIN = "------------------------ arguments ------------------------"
ARGUMENTS_END = "-------------------- end of arguments ---------------------"
_ARGUMENT = re.compile(r"^\s+(?P<name>[A-Za-z_]\w*) \.* (?P<value>.*?)\s*$")


@dataclass(frozen=True)
class IterationRecord:
    """One ``iteration N/M | ...`` line: the per-interval averages Megatron logs every --log-interval."""

    iteration: int
    train_iters: int
    consumed_samples: int
    elapsed_ms: float
    learning_rate: float
    global_batch_size: int
    loss_scale: float
    throughput: float | None = None
    lm_loss: float | None = None          # None when every step of the interval was skipped
    sop_loss: float | None = None         # None likewise, or without the binary head
    grad_norm: float | None = None
    skipped: int | None = None            # None: the line has no such counter (not measured, never 0)
    nan: int | None = None
    timestamp: str | None = None
    line_no: int = 0
    extra: dict = field(default_factory=dict, hash=False)             # unknown keys -> raw value text
    field_order: tuple = field(default=(), compare=False, repr=False)  # keys as they appeared, for exact re-formatting


@dataclass(frozen=True)
class ValidationRecord:
    """One ``validation loss at iteration N ...`` line (periodic, or final on the validation/test set)."""

    iteration: int
    split: str                            # "periodic" | "validation" | "test"
    lm_loss: float | None
    lm_ppl: float | None
    sop_loss: float | None = None
    sop_ppl: float | None = None
    line_no: int = 0
    extra: dict = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class MemoryRecord:
    """One ``[Rank R] (...) memory (MB) | ...`` line from report_memory (torch allocator, not NVML)."""

    rank: int
    after_iterations: int | None
    allocated: float
    max_allocated: float
    reserved: float
    max_reserved: float
    line_no: int = 0
    label: str = ""                       # the parenthesised name, e.g. "(after 10 iterations)"
    device_used: float | None = None      # "total device memory used" (--log-device-memory-used)


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint save or load announced in the log."""

    event: str                            # "saving" | "saved" | "loading" | "loaded"
    iteration: int
    path: str
    fmt: str | None
    line_no: int = 0
    timestamp: str | None = None


@dataclass(frozen=True)
class ParsedLog:
    """Everything the parser recognised in one log, with 1-based line numbers into ``lines``."""

    markers: dict = field(hash=False)       # marker id -> first line number
    iterations: tuple
    validations: tuple
    memory: tuple
    checkpoints: tuple
    lines_total: int
    truncated_last_line: bool
    lines: tuple = field(default=(), repr=False)
    problems: tuple = ()
    arguments: dict | None = field(default=None, hash=False)  # the `arguments` block: name -> printed value
    arguments_line: int | None = None                        # where that block starts
    source: tuple = ()                                       # how the file was read (encoding, prefixes, ranks)

    @property
    def first_loss_record(self) -> IterationRecord | None:
        """The first iteration line with an lm loss (the course's "initial loss")."""
        return next((r for r in self.iterations if r.lm_loss is not None), None)

    @property
    def last_iteration(self) -> int | None:
        """The highest iteration logged, or None when no iteration line was found."""
        return self.iterations[-1].iteration if self.iterations else None

    @property
    def lm_losses(self) -> list:
        """[(iteration, lm loss)] for lines that carry an lm loss."""
        return [(r.iteration, r.lm_loss) for r in self.iterations if r.lm_loss is not None]

    def tail(self, n: int = 10) -> list:
        """The last ``n`` lines of the log, as written."""
        return list(self.lines[-n:]) if n > 0 else []


# ---------------------------------------------------------------- formatting


def _stamp(when: datetime | str | None) -> str:
    """Megatron's timestamp text; now when not given."""
    if isinstance(when, str):
        return when
    return (when or datetime.now()).strftime(TIMESTAMP_FORMAT)


def _field_text(key: str, value) -> str:
    """``key: value`` for one known iteration field."""
    return f"{key}: {_FIELD_BY_KEY[key][1].format(value)}"


def _layout(rec: IterationRecord) -> list:
    """Key order for a record: its recorded order, plus set fields and extras at Megatron's positions."""
    order = [k for k in rec.field_order if _present(rec, k)]
    for key, attr, _ in ITERATION_FIELDS:
        if key not in order and getattr(rec, attr) is not None:
            _insert_after_predecessor(order, key)
    for key in rec.extra:
        if key not in order:
            pos = order.index(_EXTRAS_BEFORE) if _EXTRAS_BEFORE in order else len(order)
            order.insert(pos, key)
    return order


def _present(rec: IterationRecord, key: str) -> bool:
    """Whether a record has a value to print for this key."""
    if key in rec.extra:
        return True
    spec = _FIELD_BY_KEY.get(key)
    return spec is not None and getattr(rec, spec[0]) is not None


def _insert_after_predecessor(order: list, key: str) -> None:
    """Insert a known key right after the closest known key that precedes it in Megatron's order."""
    known = [k for k, _, _ in ITERATION_FIELDS]
    before = known[:known.index(key)]
    pos = 0
    for i, present in enumerate(order):
        if present in before:
            pos = i + 1
    order.insert(pos, key)


def format_iteration(rec: IterationRecord, now: datetime | None = None) -> str:
    """The iteration line exactly as Megatron's training_log prints it (timestamp from rec, else now)."""
    line = f" [{_stamp(rec.timestamp or now)}]"
    line += " iteration {:8d}/{:8d} |".format(rec.iteration, rec.train_iters)
    for key in _layout(rec):
        text = f"{key}: {rec.extra[key]}" if key in rec.extra else _field_text(key, getattr(rec, _FIELD_BY_KEY[key][0]))
        line += f" {text} |"
    return line


def _perplexity(loss: float) -> float:
    """Megatron's PPL: exp of the loss capped at 20."""
    return math.exp(min(20, loss))


def format_validation(iteration: int, lm_loss: float, sop_loss: float | None = None, split: str = "periodic",
                      *, lm_ppl: float | None = None, sop_ppl: float | None = None) -> str:
    """One validation line as evaluate_and_print_results prints it (PPL computed when not given)."""
    prefix = f"iteration {iteration}" + ("" if split == "periodic" else f" on {split} set")
    line = f" validation loss at {prefix} | "
    for name, loss, ppl in (("lm loss", lm_loss, lm_ppl), ("sop loss", sop_loss, sop_ppl)):
        if loss is not None:
            line += "{} value: {:.6E} | ".format(name, loss)
            line += "{} PPL: {:.6E} | ".format(name, _perplexity(loss) if ppl is None else ppl)
    return line


def format_validation_block(iteration: int, lm_loss: float, sop_loss: float | None = None,
                            split: str = "periodic", *, lm_ppl: float | None = None,
                            sop_ppl: float | None = None) -> str:
    """The validation line between its two dash rules, three lines joined by newlines."""
    line = format_validation(iteration, lm_loss, sop_loss, split, lm_ppl=lm_ppl, sop_ppl=sop_ppl)
    rule = "-" * (len(line) + 1)
    return f"{rule}\n{line}\n{rule}"


def format_validation_record(rec: ValidationRecord) -> str:
    """A parsed validation line, written back with its own PPL values."""
    return format_validation(rec.iteration, rec.lm_loss, rec.sop_loss, rec.split, lm_ppl=rec.lm_ppl,
                             sop_ppl=rec.sop_ppl)


def format_memory(rank: int, after_iterations: int | None, allocated: float, max_allocated: float,
                  reserved: float, max_reserved: float, *, label: str | None = None,
                  device_used: float | None = None) -> str:
    """A report_memory line (values in MB = MiB, as torch.cuda reports them)."""
    name = label or f"(after {after_iterations} iterations)"
    line = f"[Rank {rank}] {name} memory (MB)"
    line += f" | allocated: {allocated:.2f} | max allocated: {max_allocated:.2f}"
    line += f" | reserved: {reserved:.2f} | max reserved: {max_reserved:.2f}"
    if device_used is not None:
        line += f" | total device memory used: {device_used:.2f}"
    return line


def format_memory_record(rec: MemoryRecord) -> str:
    """A parsed memory line, written back."""
    return format_memory(rec.rank, rec.after_iterations, rec.allocated, rec.max_allocated, rec.reserved,
                         rec.max_reserved, label=rec.label or None, device_used=rec.device_used)


def format_checkpoint_saving(iteration: int, path: str, fmt: str = "torch_dist",
                             when: datetime | str | None = None) -> str:
    """save_checkpoint's announcement line."""
    return f"[{_stamp(when)}] saving checkpoint at iteration {iteration:7d} to {path} in {fmt} format"


def format_checkpoint_saved(iteration: int, path: str, when: datetime | str | None = None,
                            tp: tuple = (1, 1), pp: tuple = (1, 1)) -> str:
    """save_checkpoint's success line (written after the tracker file)."""
    return (f"  [{_stamp(when)}] successfully saved checkpoint from iteration {int(iteration):7d} to {path} "
            f"[ t {tp[0]}/{tp[1]}, p {pp[0]}/{pp[1]} ]")


def format_checkpoint_loading(iteration: int, path: str, fmt: str = "torch_dist") -> str:
    """load_checkpoint's announcement line."""
    infix = "distributed " if fmt == "torch_dist" else ""
    return f" loading {infix}checkpoint from {path} at iteration {iteration}"


def format_checkpoint_loaded(iteration: int, path: str, tp: tuple = (1, 1), pp: tuple = (1, 1)) -> str:
    """load_checkpoint's success line."""
    return (f"  successfully loaded checkpoint from {path} [ t {tp[0]}/{tp[1]}, p {pp[0]}/{pp[1]} ] "
            f"at iteration {iteration}")


def format_arguments(values: dict) -> list:
    """Megatron's `arguments` block for {name: value}: sorted case-insensitively, names dotted to column 48."""
    rows = sorted((f"  {name} {'.' * (48 - len(name))} {value}" for name, value in values.items()), key=str.lower)
    return [ARGUMENTS_BEGIN, *rows, ARGUMENTS_END]


def format_datetime_marker(name: str, when: datetime | str | None = None) -> str:
    """print_datetime's line, e.g. ``[after dataloaders are built] datetime: ...`` (trailing space included)."""
    return f"[{name}] datetime: {_stamp(when)} "


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


def parse_lines(lines, truncated=False) -> ParsedLog:
    """Parse a log given as its lines (without newlines), read one at a time; `truncated` (or a function saying
    it once the lines are read): the last line had no newline, so it is flagged and kept, not parsed. Memory is
    bounded whatever the number of lines."""
    collector, kept, total = _Collector(), _KeptLines(), 0
    last = None
    for line_no, line in enumerate(lines, start=1):
        if last is not None:
            for segment in clean_segments(last[1]):
                collector.feed(segment, last[0])
        kept.add(line)
        last, total = (line_no, line), line_no
    truncated = bool(truncated() if callable(truncated) else truncated) and last is not None
    if last is not None and not truncated:
        for segment in clean_segments(last[1]):
            collector.feed(segment, last[0])
    c = collector
    problems = list(c.problems) + [f"{n} more {kind} records not kept (the log is too large to keep every one)"
                                   for kind, n in c.dropped.items()]
    return ParsedLog(markers=c.markers, iterations=tuple(c.iterations), validations=tuple(c.validations),
                     memory=tuple(c.memory), checkpoints=tuple(c.checkpoints), lines_total=total,
                     truncated_last_line=truncated, lines=kept.lines(), problems=tuple(problems),
                     arguments=c.arguments, arguments_line=c.arguments_line)


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
    """Parse (rank, line) pairs as harness.judge.logread.unwrap yields them; the last line is parsed only when the
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
    from harness.judge import logread

    info = logread.ReadInfo("(text)")
    return parse_items(logread.unwrap(logread.text_lines(text, info), info), [info])


def parse_log_file(path: str | Path) -> ParsedLog:
    """Parse a log file as any tool wrote it (see harness.judge.logread), streamed."""
    return parse_log_files([path])


def parse_log_files(paths, ranks=None) -> ParsedLog:
    """Parse several files as one log, their lines numbered on (stdout then stderr of one run, or the rank files
    of torchrun --log-dir, `ranks` giving each file's rank)."""
    from harness.judge import logread

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


def read_lines(path: str | Path, state: dict):
    """The lines of a file as it is read, decoded with undecodable bytes replaced, without their newline; a line
    longer than MAX_LINE_CHARS bytes is cut there and marked. state["truncated"]: the last line had no newline."""
    state["truncated"] = False
    with open(path, "rb") as fh:
        while raw := fh.readline(MAX_LINE_CHARS):
            ended = raw.endswith(b"\n")
            if not ended and len(raw) == MAX_LINE_CHARS:
                while (more := fh.readline(1 << 20)) and not more.endswith(b"\n"):
                    pass
                ended = bool(more)
                raw += b" [... line cut: longer than %d bytes]" % MAX_LINE_CHARS
            state["truncated"] = not ended
            yield (raw[:-1] if raw.endswith(b"\n") else raw).decode("utf-8", errors="replace")


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
    parser = argparse.ArgumentParser(prog="python -m harness.judge.logs", description="Parse a Megatron training log.")
    parser.add_argument("log", help="path to the training log")
    args = parser.parse_args(argv)
    json.dump(to_jsonable(parse_log_file(args.log)), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
