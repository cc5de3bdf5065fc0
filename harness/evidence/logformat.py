"""The lines of a Megatron-LM training log as data: marker lines, the records, and the writers.

The formats follow Megatron-LM core_v0.16.1 (``training_log`` and ``evaluate_and_print_results`` in
megatron/training/training.py, ``report_memory`` in utils.py, ``save_checkpoint``/``load_checkpoint`` in
checkpointing.py). The suite's own trainer writes its log with the ``format_*`` functions here, and
harness.evidence.logs parses them back (every name here is importable from there too).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime

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
                    r"to (?P<path>.+?) \[ t \d+/\d+(?:, \w+ \d+/\d+)* \]\s*$")
_LOADING = re.compile(r"^\s*loading (?P<dist>distributed )?checkpoint from (?P<path>.+) at iteration (?P<it>\d+)\s*$")
_LOADED = re.compile(r"^\s*successfully loaded checkpoint from (?P<path>.+?) \[ t \d+/\d+(?:, \w+ \d+/\d+)* \] "
                     r"at iteration (?P<it>\d+)\s*$")
_MEMORY_ITER = re.compile(r"(?:after (\d+) iterations|for iteration (\d+))")
# Megatron's `arguments` block (_print_args in megatron/training/arguments.py): every argument, sorted, dotted.
ARGUMENTS_BEGIN = "------------------------ arguments ------------------------"
ARGUMENTS_END = "-------------------- end of arguments ---------------------"
_ARGUMENT = re.compile(r"^\s+(?P<name>[A-Za-z_]\w*) \.* (?P<value>.*?)\s*$")
PRINTED_NUMBER_CHARS = 40     # no number Megatron-LM prints is longer: a longer value stays text, never a huge number


def printed_value(text: str | None):
    """A value as Megatron-LM printed it in its arguments block (`str()` of a Python value) read back: bool, int,
    float, None (`None`, or nothing printed), else the text itself. The one reader of printed values: the recipe, the
    consistency checks and the log's evidence all read the block through it (ParsedLog.argument)."""
    if text is None:
        return None
    text = text.strip()
    if text == "None":
        return None
    if len(text) > PRINTED_NUMBER_CHARS:
        return text
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class OutOfRange(str):
    """An arguments-block value printed as a number outside the range its argument can take (a batch size of 0,
    a NaN hysteresis, 10^20 iterations): kept as its text, with `why`, so that no check computes with it (a
    division by zero, range(10^20)); the criteria and checks that read it see no number, and the recipe's
    comparison with the course's value (on the printed text) fails the log for it."""

    why: str = ""


# Counts and intervals Megatron-LM takes as positive whole numbers (0 allowed where it means "none"); a value
# past COUNT_MAX is no run one GPU makes in a course (and loops over it would never end)
COUNT_MAX = 10 ** 7
COUNT_ARGUMENTS = {
    **dict.fromkeys(("global_batch_size", "micro_batch_size", "train_iters", "log_interval", "eval_interval",
                     "seq_length", "data_parallel_size", "hysteresis", "loss_scale_window", "num_layers",
                     "hidden_size", "ffn_hidden_size", "num_attention_heads", "max_position_embeddings",
                     "encoder_seq_length", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                     "save_interval", "lr_decay_iters", "world_size"), 1),
    **dict.fromkeys(("eval_iters", "lr_warmup_iters", "lr_wsd_decay_iters", "exit_interval", "num_workers"), 0),
}
INT_MAX = 2 ** 63


def bounded_value(name: str, value):
    """`value` (printed_value's) when it is inside the range argument `name` can take, else OutOfRange text: a
    count or interval (COUNT_ARGUMENTS) must be a whole number from its minimum to COUNT_MAX, any other int within
    +-2^63, any float finite. Text, bools and None pass unchanged."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    why = None
    if isinstance(value, float) and not math.isfinite(value):
        why = "not a finite number"
    elif name in COUNT_ARGUMENTS:
        if not isinstance(value, int):
            why = "not a whole number"
        elif not COUNT_ARGUMENTS[name] <= value <= COUNT_MAX:
            why = f"outside {COUNT_ARGUMENTS[name]}..{COUNT_MAX:,}"
    elif isinstance(value, int) and abs(value) > INT_MAX:
        why = "outside +-2^63"
    if why is None:
        return value
    out = OutOfRange(repr(value) if isinstance(value, float) else str(value))
    out.why = f"{name} is {out}: {why}"
    return out


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

    def argument(self, name: str):
        """The arguments block's value of `name` as Python value (printed_value, then bounded_value: a number out
        of its argument's range comes back as OutOfRange text, never as a number to compute with); None when the
        block does not print it (or there is no block) or prints None. Read once per name and log (fact)."""
        return self.fact(("argument", name),
                         lambda log: bounded_value(name, printed_value((log.arguments or {}).get(name))))

    def int_argument(self, name: str) -> int | None:
        """argument(name) when it is an int (never a bool), else None."""
        value = self.argument(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def fact(self, key, compute):
        """A fact about this log (its run's end, the recipe it ran, whether it diverged, its failure events, an
        argument's value): compute(self) the first time `key` is asked for, then carried on the log, so each is
        computed once per log however many criteria, causes and checks read it. A parsed log is never changed (an
        edited one is a new ParsedLog, dataclasses.replace, which starts with no facts); the facts are kept outside
        the fields, so equality, asdict and the JSON of a log do not see them."""
        facts = self.__dict__.setdefault("_facts", {})
        if key not in facts:
            facts[key] = compute(self)
        return facts[key]


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
