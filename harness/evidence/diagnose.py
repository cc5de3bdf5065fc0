"""Name the known cause of a failed stage from its log, with the remedy a student can act on.

The rules are a data table (``RULES``), checked in order; the first match wins, so specific causes come before
generic ones (CUDA OOM before "no GPU", a JSON error before "preprocess wrote nothing", anything before the
generic hang). A rule has a regex searched line by line, a condition on the stage's outcome, or both; its
cause and remedy are templates filled from the regex's named groups and the outcome.
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from harness.evidence import failure_events as fe

DATASET_MARKER = "> building train, validation, and test datasets for BERT ..."
DATASETS_DONE = "> finished creating BERT datasets ..."
EXPECTED_VOCAB_SIZE = 30522
# What Megatron logs as "padded vocab (size: N)": the WordPiece vocab, or it plus the [BOS]/[EOS] its BERT tokenizer adds.
HEALTHY_LOGGED_VOCAB_SIZES = (EXPECTED_VOCAB_SIZE, EXPECTED_VOCAB_SIZE + 2)

JSONL_ONE_LINER = ("python -c \"import json,sys; [print(json.dumps({'text': l.strip()})) for l in open(sys.argv[1]) "
                   "if l.strip()]\" sample.txt > sample.jsonl")
COURSE_OOM_REMEDY = "lower --micro-batch-size to 2 or 1, or --hidden-size to 64"


@dataclass(frozen=True)
class Diagnosis:
    """A recognised failure: rule id, cause, remedy, and the log line that proves it."""

    cause_id: str
    cause: str
    remedy: str
    evidence: str

    def summary(self) -> str:
        """`cause: remedy` on one line (the course's wording for OOM)."""
        return f"{self.cause}: {self.remedy}"


@dataclass(frozen=True)
class StageOutput:
    """What a condition may look at: how the stage ended and what it printed."""

    stage: str
    returncode: int | None
    text: str
    timed_out: bool = False
    stalled: bool = False
    missing_outputs: tuple[str, ...] = ()
    duration_s: float | None = None
    argv: tuple[str, ...] = ()
    iterations: tuple | None = None      # the text's iteration records when the caller already parsed them
    log: object = None                   # the parsed log whose kept lines the text is (its facts are read from it)

    @property
    def events(self) -> list:
        """The text's failure events (harness.evidence.failure_events), found once: carried on the parsed log when
        there is one, else on this output."""
        if self.log is not None:
            return fe.log_events(self.log)
        if "_events" not in self.__dict__:
            self.__dict__["_events"] = fe.events(self.text)
        return self.__dict__["_events"]

    @property
    def last_line(self) -> str:
        """The last non-blank line of output (what a hang stopped at)."""
        for line in reversed(self.text.splitlines()):
            if line.strip():
                return line.strip()
        return "(no output)"

    @property
    def hung(self) -> bool:
        """Killed by the timeout or the stall watchdog."""
        return self.timed_out or self.stalled


# A condition returns the evidence line when it holds (optionally with template fields), else None.
Condition = Callable[[StageOutput], "str | tuple[str, dict] | None"]


@dataclass(frozen=True)
class Rule:
    """One known failure: where it applies, how it shows, what it means, what to do."""

    id: str
    stages: tuple[str, ...] | None      # None: any stage; else stage names (prefix match: "train" fits "train-resume")
    pattern: str | None                 # searched line by line (re.MULTILINE); named groups fill the templates
    condition: Condition | None
    cause: str
    remedy: str


# ---- conditions ------------------------------------------------------------------------------------------------

def _in_preprocess(o: StageOutput) -> str | None:
    """The stage is preprocessing, or the traceback runs through Megatron's preprocess tool."""
    return "preprocess" if o.stage.startswith("preprocess") or "preprocess_data" in o.text else None


_PYTHON_ERROR = re.compile(r"^(?:\[rank\d+\]:\s*)?(?P<error>[A-Za-z_.]*(?:Error|Exception)\b(?::.*)?)$", re.MULTILINE)


def first_python_error(text: str) -> str | None:
    """The first exception line in the text, its launcher/logger prefix taken off (harness.evidence.failure_events);
    a launcher's ChildFailedError is not the cause."""
    return first_exception(fe.events(text))


def first_exception(found: list) -> str | None:
    """first_python_error of events already found (failure_events.log_events of a parsed log)."""
    return next((e.evidence for e in found if e.kind == "exception"), None)


def _hung_building_bert_datasets(o: StageOutput) -> str | None:
    """Killed while the BERT dataset build (sample index) was running: the marker came and the finish did not."""
    if not o.hung or DATASET_MARKER not in o.text:
        return None
    after = o.text.split(DATASET_MARKER)[-1]
    # an error (behind any launcher prefix) is a cause of its own; what a run prints while a watchdog's signal tears
    # it down is not
    if DATASETS_DONE in after or fe.before_stopped(fe.events(after)):
        return None
    return DATASET_MARKER


def _exit_zero_without_outputs(o: StageOutput) -> str | None:
    """Exited 0 but some expected output file is missing."""
    if o.returncode == 0 and o.missing_outputs:
        return "missing after exit 0: " + ", ".join(o.missing_outputs)
    return None


def _split_sentence_files(o: StageOutput) -> str | None:
    """The command asked for --split-sentences, or the log names a sentence-split *_ss.jsonl (issue #1052)."""
    if "--split-sentences" in o.argv:
        return "--split-sentences in: " + " ".join(o.argv)
    found = re.search(r"\S*_ss(?:_\d+)?\.json\S*", o.text)
    return found.group(0) if found else None


def _vocab_file_not_found(o: StageOutput) -> tuple[str, dict] | None:
    """A FileNotFoundError whose path is a vocab file or raised while loading one: by its traceback's frames (a
    tokenizer or vocab frame) when the log shows them; else by a load_vocab call named in the text. (A training
    log always says `building ... tokenizer`, so that word alone does not make any missing file a vocab file.)"""
    for m in re.finditer(r"^.*FileNotFoundError: .*?'(?P<path>[^']+)'.*$", o.text, re.MULTILINE):
        if "vocab" in m["path"].lower():
            return m.group(0).strip(), {"path": m["path"]}
        event = next((e for e in o.events if e.short_type == "FileNotFoundError" and m["path"] in e.message),
                     None)
        if event is not None and event.frames:
            if any(re.search(r"(?i)tokeniz|vocab", f"{f.file} {f.function}") for f in event.frames):
                return m.group(0).strip(), {"path": m["path"]}
        elif "load_vocab" in o.text or (o.stage.startswith("preprocess") and "tokeniz" in o.text.lower()):
            return m.group(0).strip(), {"path": m["path"]}
    return None


def _wrong_vocab_size(o: StageOutput) -> str | None:
    """Megatron padded a vocabulary that is not the 30522-token BERT one."""
    m = re.search(r"^.*padded vocab \(size: (?P<size>\d+)\).*$", o.text, re.MULTILINE)
    return m.group(0).strip() if m and int(m["size"]) not in HEALTHY_LOGGED_VOCAB_SIZES else None


def _diverged(o: StageOutput) -> str | None:
    """The iteration lines show divergence (harness.evidence.fp16): a non-finite loss, or a whole interval skipped."""
    from harness.evidence import fp16, logs

    if o.log is not None:
        found = fp16.log_divergence(o.log)
    else:
        iterations = o.iterations
        if iterations is None:
            iterations = logs.parse_log(o.text).iterations if " iteration " in o.text else ()
        found = fp16.divergence(iterations)
    return found[0] if found else None


def _hung(o: StageOutput) -> str | None:
    """Any timeout or stall."""
    return o.last_line if o.hung else None


def _all(*conditions: Condition) -> Condition:
    """All conditions hold; the evidence is the last one's."""
    def both(o: StageOutput) -> str | None:
        evidence = None
        for condition in conditions:
            evidence = condition(o)
            if not evidence:
                return None
        return evidence
    return both


# ---- the table -------------------------------------------------------------------------------------------------

_TE_REMEDY = ("run with the suite's reference trainer (no Transformer Engine needed), or install Transformer Engine "
              "matching your torch/CUDA, or patch pretrain_bert.py to import only bert_layer_local_spec and pass "
              "--spec local --attention-backend local --no-persist-layer-norm --no-masked-softmax-fusion "
              "--no-gradient-accumulation-fusion")

RULES: tuple[Rule, ...] = (
    Rule("cuda-oom", None, r"torch\.OutOfMemoryError|CUDA out of memory|CUDA error: out of memory", None,
         "CUDA out of memory", COURSE_OOM_REMEDY),
    Rule("transformer-engine", None,
         r"^\w*(?:Import|ModuleNotFound)Error:.*(?:[Tt]ransformer[_ ][Ee]ngine|bert_layer_with_transformer_engine_spec)",
         None,
         "Megatron-LM's pretrain_bert.py (core_v0.15.x and core_v0.16.x) imports bert_layer_with_transformer_engine_spec at import time and "
         "fails without Transformer Engine, even with --spec local", _TE_REMEDY),
    Rule("old-api", None,
         r"No module named '(?P<module>megatron\.(?:initialize|model|arguments|global_vars|checkpointing|mpu|"
         r"training_utils|fused_kernels|tokenizer|optimizer|data|utils)(?:\.\w+)*)'",
         None,
         "the seed script imports {module}, an API that was moved long ago: megatron.initialize/arguments/"
         "checkpointing now live in megatron.training, the model classes in megatron.core.models "
         "(megatron.model became megatron.legacy.model)",
         "use `from megatron.training import initialize_megatron, get_args, pretrain` and "
         "`from megatron.core.models.bert.bert_model import BertModel`, or run the suite's reference trainer"),
    Rule("megatron-lm-missing", None, r"No module named '(?P<module>megatron\.(?:training|legacy)(?:\.\w+)*)'", None,
         "{module} belongs to the Megatron-LM repository; the megatron-core wheel ships only megatron.core",
         "put a Megatron-LM checkout (tag core_v0.16.1) on PYTHONPATH (--megatron-lm PATH), or run the suite's "
         "reference trainer"),
    Rule("megatron-core-missing", None,
         r"No module named '(?P<module>megatron|megatron\.core)'|"
         r"megatron-core (?P<version>\S+) is (?:too old|older than|not in the supported range)|"
         r"cannot import name '\w+' from 'megatron\.core[\w.]*'",
         None,
         "megatron-core is missing, too old or too new for this code (supported: >= 0.16.1, < 0.20)",
         "pip install 'megatron-core>=0.16.1,<0.20' (on Python 3.11 use 0.16.1), or put a Megatron-LM checkout "
         "on PYTHONPATH; `python -m harness doctor` shows what is installed"),
    Rule("psutil-missing", None, r"No module named 'psutil'", None,
         "torch_dist checkpoint saving needs psutil: without it the async writer process dies and the save hangs",
         "pip install psutil (or save with --ckpt-format torch)"),
    Rule("nltk-punkt", None, r"Resource\s+\S*(?P<res>punkt(?:_tab)?)\S*\s+not found|No module named 'nltk'", None,
         "--split-sentences needs NLTK and its punkt sentence data (nltk >= 3.9 wants punkt_tab); offline the "
         "preprocess pool restarts its worker forever",
         "on a machine with internet: python -c \"import nltk; nltk.download('punkt_tab')\" and copy nltk_data, or "
         "split sentences yourself and drop --split-sentences"),
    Rule("hf-hub-offline", None,
         r"(?:couldn't connect to 'https://huggingface\.co'|We couldn't connect to|"
         r"Can't load tokenizer for 'bert-large-uncased'|OfflineModeIsEnabled|LocalEntryNotFoundError|"
         r"outgoing traffic has been disabled|huggingface\.co[^\n]*(?:Temporary failure in name resolution|"
         r"Name or service not known|Failed to resolve)|(?:Temporary failure in name resolution|"
         r"Name or service not known)[^\n]*huggingface\.co)",
         None,
         "BertWordPieceLowerCase in tools/preprocess_data.py (0.15.x and later) goes through HF AutoTokenizer"
         "('bert-large-uncased') and needs the Hugging Face hub, and this machine is offline",
         "pass --legacy-tokenizer with --vocab-file PATH, or provide a local bert-large-uncased tokenizer folder"),
    Rule("data-missing", None,
         # no `^.*` / `.*$` around it: _search quotes the whole line anyway, and `^.*(?:...)` backtracked over
         # every position of every line (minutes on a long log)
         r"\.idx and \.bin files cannot be found at the path prefix|"
         r"FileNotFoundError: [^\n]*?'[^'\n]+\.(?:bin|idx)'|\S\.bin/\.idx not found|\S\.bin/\.idx did not appear within|"
         r"preprocessing of \S+ failed \(\S+\.failed\): nothing to train on", None,
         "the training data was not found: --data-path names no preprocessed .bin/.idx pair ({evidence})",
         "pass --data-path PREFIX, the --output-prefix of preprocessing plus its suffix (e.g. "
         "data/corpus_text_sentence), without .bin/.idx; run preprocessing first if it is missing"),
    Rule("vocab-missing", None, None, _vocab_file_not_found,
         "tokenizer initialisation failed: vocab file not found: {path}",
         "pass --vocab-file with an existing 30522-line BERT uncased vocab, e.g. "
         "fixtures/vocab/bert-base-uncased-vocab.txt (absolute paths are safest with torchrun)"),
    Rule("vocab-missing", None, r"(?:VocabError|^error): (?P<path>.+?): vocab file not found", None,
         "tokenizer initialisation failed: vocab file not found: {path}",
         "pass --vocab-file with an existing 30522-line BERT uncased vocab, e.g. "
         "fixtures/vocab/bert-base-uncased-vocab.txt"),
    Rule("vocab-wrong", None,
         r"^(?:\[rank\d+\]: )?(?:[\w.]*\.)?VocabError: (?P<message>.*)$|"
         r"^error: (?P<path>.+?): (?P<problem>not a BERT WordPiece vocab|wrong vocab size).*$|"
         r"vocab(?:ulary)? size mismatch.*$|vocab(?:ulary)? size (?P<size>\d+) (?:!=|does not match).*$",
         None,
         "the vocabulary is not the 30522-token BERT uncased WordPiece vocab: {message}",
         "use fixtures/vocab/bert-base-uncased-vocab.txt (sha256 07eced37...) for both preprocessing and "
         "training, and re-preprocess into a fresh prefix"),
    Rule("empty-split", None, r"IndexError: index -1 is out of bounds for axis 0 with size 0", None,
         "a dataset split is empty: --split 980,10,10 gives validation and test 1% of the documents each, so "
         "with fewer than about 76 documents one of them gets none and Megatron's sample-index build fails",
         "use more documents (100 or more is safe with 980,10,10), or a coarser --split such as 90,5,5"),
    Rule("missing-text-key", None, r"KeyError: '(?P<key>[^']*)'", _in_preprocess,
         "input must be JSON lines with a 'text' key (KeyError: '{key}')",
         "write one JSON object per line with the document under 'text' (or pass --json-keys KEY); convert plain "
         "text with the suite's harness.data.corpus module or: " + JSONL_ONE_LINER),
    Rule("not-json", None,
         r"^\W*(?:\[rank\d+\]: )?(?:json\.decoder\.)?JSONDecodeError: .*$|"
         r"input must be JSON lines with a 'text' key, found plain text|: invalid JSON: ", _in_preprocess,
         "input must be JSON lines with a 'text' key (JSONDecodeError: the input file is not JSON lines; "
         "without --split-sentences the tool then hangs and leaves a .bin without .idx)",
         "convert it with the suite's harness.data.corpus module or: " + JSONL_ONE_LINER),
    Rule("megatron-helpers", None,
         r"helpers_cpp[\w.-]*\.so: (?:file too short|invalid ELF header)|No module named "
         r"'megatron\.core\.datasets\.helpers_cpp'", None,
         "Megatron's C++ dataset helpers (megatron/core/datasets/helpers_cpp) are missing or half-written: each run "
         "compiles them into the checkout on first use, and runs started together race on that file",
         "build them once before starting runs: make -C megatron/core/datasets (in the Megatron-LM checkout)"),
    Rule("one-sentence-docs", None, None, _hung_building_bert_datasets,
         "Megatron's BERT sample-index build spins forever (no error) when documents have a single sentence and "
         "the binary (sentence-order) head is on",
         "documents need >= 2 sentences: split sentences / group lines (e.g. 10 lines per document, one "
         "sentence per line), or --bert-no-binary-head"),
    Rule("one-sentence-docs", None,
         r"(?i)(?:one|1|single)[- ]sentence (?:per )?doc\w*|fewer than 2 sentences|< ?2 sentences",
         None,
         "documents need >= 2 sentences for BERT's binary head; with one sentence per document Megatron's "
         "sample-index build hangs",
         "documents need >= 2 sentences: split sentences / group lines, or --bert-no-binary-head"),
    Rule("no-gpu", None,
         r"Torch not compiled with CUDA enabled|No CUDA GPUs are available|CUDA driver initialization failed|"
         r"CUDA is not available: no GPU visible to torch|"
         r"Found no NVIDIA driver|NVIDIA driver on your system is too old|CUDA unknown error",
         None,
         "no usable CUDA GPU: torch cannot initialise CUDA",
         "run on a machine with an NVIDIA GPU and driver and a CUDA build of torch (`python -m harness doctor` "
         "checks all of it); CPU-only checks run with `pytest` without -m gpu"),
    Rule("no-gpu", None,
         r"ProcessGroupNCCL is only supported|ProcessGroupNCCL\S* (?!Warning)\w*Error|NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|"
         r"ncclInvalidUsage|NCCL is not available|Distributed package doesn't have NCCL",
         None,
         "NCCL could not initialise (--distributed-backend nccl needs a CUDA GPU and a torch built with NCCL)",
         "check the GPU with `python -m harness doctor`; set NCCL_DEBUG=INFO for details; a CPU run needs "
         "--distributed-backend gloo"),
    Rule("preprocess-split-sentences", ("preprocess",), None,
         _all(_exit_zero_without_outputs, _split_sentence_files),
         "Megatron's preprocess_data.py with --split-sentences and the default --partitions 1 only wrote the "
         "sentence-split *_ss.jsonl and exited 0 without .bin/.idx (Megatron-LM issue #1052)",
         "run the identical command a second time (it then encodes the _ss file), or split sentences yourself "
         "and drop --split-sentences"),
    Rule("preprocess-no-output", ("preprocess",), None, _exit_zero_without_outputs,
         "the preprocessing tool exited 0 without writing its outputs ({evidence})",
         "read the log above for a traceback printed by a worker; check --input, --output-prefix and --json-keys"),
    Rule("vocab-wrong", None, None, _wrong_vocab_size,
         "Megatron built a vocabulary of the wrong size ({evidence}); BERT uncased has 30522 tokens",
         "pass --vocab-file fixtures/vocab/bert-base-uncased-vocab.txt and check the tokenizer type"),
    # a top-level name only: a dotted one means its parent package imported (Python names the first part it cannot
    # find), so it is another version of that package, not a pip package (causes.toml's project-module-missing)
    Rule("missing-module", None, r"ModuleNotFoundError: No module named '(?P<module>\w+)'", None,
         "the Python package '{module}' is not installed, and the code that ran imports it (e.g. Megatron-LM "
         "0.16.1's megatron.training imports megatron.rl, which needs pydantic, even for tools/preprocess_data.py)",
         "pip install {module} (or the checkout's own requirements); `python -m harness doctor` lists what the "
         "suite itself needs"),
    Rule("nan", None, None, _diverged,
         "training diverged: {evidence} (an occasional fp16 overflow skip, or Megatron's 'nan iterations' count of "
         "one, is loss scaling at work, not divergence)",
         "lower --lr, keep --clip-grad 1.0, or train with --bf16 instead of --fp16"),
    Rule("timeout", None, None, _hung,
         "stage '{stage}' hung {how} after {duration} with no known cause; last line: {last_line}",
         "rerun with a longer --stage-timeout only if it was making progress; otherwise read the log for the "
         "step it stopped at"),
)


# ---- matching --------------------------------------------------------------------------------------------------

def _applies(rule: Rule, stage: str) -> bool:
    """The rule covers this stage (prefix match on stage names)."""
    return rule.stages is None or any(stage.startswith(s) for s in rule.stages)


_SOURCE_LINE = re.compile(r"^(?:\[rank\d+\]:)?\s*(?:raise |File \")")


def _search(pattern: str, text: str) -> tuple[str, dict] | None:
    """The first line matching `pattern` (an exception line before a quoted `raise` line), and its named groups."""
    first = None
    for m in re.compile(pattern, re.MULTILINE).finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        line = text[start: end if end != -1 else len(text)].strip()
        hit = (line, {k: v for k, v in m.groupdict().items() if v is not None})
        if not _SOURCE_LINE.match(line):
            return hit
        first = first or hit
    return first


def _match(rule: Rule, o: StageOutput) -> tuple[str, dict] | None:
    """Evidence and template fields when the rule holds, else None."""
    found: str | tuple[str, dict] | None = None
    if rule.condition is not None:
        found = rule.condition(o)
        if not found:
            return None
    if rule.pattern is not None:
        found = _search(rule.pattern, o.text)
        if not found:
            return None
    return found if isinstance(found, tuple) else (found, {})


def _fill(template: str, fields: dict) -> str:
    """Replace {name} placeholders only (remedies quote Python code with braces)."""
    return re.sub(r"\{(\w+)\}", lambda m: str(fields.get(m[1], "?")), template)


def _fields(o: StageOutput, evidence: str, groups: dict) -> dict:
    """Everything a cause/remedy template may name."""
    how = "(stalled: no output)" if o.stalled else "(timed out)" if o.timed_out else ""
    duration = f"{o.duration_s:.0f} s" if o.duration_s is not None else "an unknown time"
    fields = dict(stage=o.stage, how=how, duration=duration, last_line=o.last_line, evidence=evidence,
                     returncode=o.returncode, message=evidence)
    fields.update(groups)
    return fields


# ---- causes as data (fixtures/failures/causes.toml), matched on the run's first error event --------------------

CAUSES_FILE = Path(__file__).resolve().parents[2] / "fixtures" / "failures" / "causes.toml"
_MATCH_FIELDS = ("type", "message", "anywhere", "frames", "raised_in", "program", "not_program", "signal")


@dataclass(frozen=True)
class Cause:
    """One entry of causes.toml: what an error event must show, and what it means."""

    id: str
    cause: str
    remedy: str
    sources: tuple = ()
    kind: tuple = ()
    type: re.Pattern | None = None
    message: re.Pattern | None = None
    anywhere: re.Pattern | None = None
    frames: re.Pattern | None = None
    raised_in: re.Pattern | None = None
    program: re.Pattern | None = None
    not_program: re.Pattern | None = None
    signal: re.Pattern | None = None


@dataclass(frozen=True)
class Causes:
    """The table: entries tried before RULES, entries tried after them, and what each signal means."""

    before: tuple = ()
    after: tuple = ()
    signals: tuple = ()              # (name, meaning) pairs


NO_CAUSES = Causes()


def _cause(raw: dict) -> Cause:
    extra = set(raw) - {"id", "cause", "remedy", "sources", "kind", *_MATCH_FIELDS}
    if extra or not raw.get("id") or not raw.get("cause") or not raw.get("remedy"):
        raise ValueError(f"causes.toml entry {raw.get('id')!r}: unknown fields {sorted(extra)} or no id/cause/remedy")
    rx = {k: re.compile(raw[k]) for k in _MATCH_FIELDS if k in raw}
    return Cause(raw["id"], raw["cause"], raw["remedy"], tuple(raw.get("sources", ())), tuple(raw.get("kind", ())),
                 **rx)


@functools.lru_cache(maxsize=4)
def load_causes(path: Path = CAUSES_FILE) -> Causes:
    """causes.toml, compiled (cached: the file is read once per process)."""
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    return Causes(tuple(map(_cause, data.get("cause", ()))), tuple(map(_cause, data.get("class", ()))),
                  tuple(sorted(data.get("signals", {}).items())))


def _frames_text(ev: fe.Event) -> str:
    return "\n".join(f"{fe.short_path(f.file)}:{f.function}: {f.source}" for f in ev.frames)


def _line_of(text: str, m: re.Match) -> str:
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start: end if end != -1 else len(text)].strip()


def match_cause(cause: Cause, ev: fe.Event) -> tuple | None:
    """(evidence line, named groups) when the event shows everything the entry asks for, else None."""
    if cause.kind and ev.kind not in cause.kind:
        return None
    if cause.program is not None and not (ev.program and cause.program.search(ev.program)):
        return None
    if cause.not_program is not None and (not ev.program or cause.not_program.search(ev.program)):
        return None
    groups, evidence = {}, None
    innermost = f"{fe.short_path(ev.raised_in.file)}:{ev.raised_in.function}" if ev.raised_in else ""
    for attr, value in (("type", ev.type or ""), ("signal", ev.signal or ""), ("frames", _frames_text(ev)),
                        ("raised_in", innermost),
                        ("message", ev.detail), ("anywhere", ev.text)):
        pattern = getattr(cause, attr)
        if pattern is None:
            continue
        m = pattern.search(value)
        if m is None:
            return None
        groups.update({k: v for k, v in m.groupdict().items() if v is not None})
        if attr in ("message", "anywhere") and evidence is None:
            evidence = _line_of(value, m)
    return (evidence or ev.evidence), groups


def _event_fields(ev: fe.Event, evidence: str, groups: dict, signals: dict) -> dict:
    """Everything a causes.toml template may name."""
    program = ev.program or "the program"
    chain = " -> ".join(fe.short_path(f.file) for f in ev.frames if f.function == "<module>")
    fields = dict(program=program, who=program if ev.rank is None else f"{program} (rank {ev.rank})",
                  type=ev.type or "", short_type=ev.short_type or ev.kind,
                  message=(ev.message or ev.evidence)[:300], first=(ev.continuation[0].strip()[:200]
                                                                   if ev.continuation else ""),
                  where=ev.raised_in.where() if ev.raised_in else "a line with no traceback frame",
                  module=ev.module or "", rank="?" if ev.rank is None else str(ev.rank),
                  exit_code="?" if ev.exit_code is None else str(ev.exit_code), signal=ev.signal or "",
                  meaning=signals.get(ev.signal or "", "see the signal's description (man 7 signal)"),
                  chain=chain or program, evidence=evidence[:300])
    fields.update(groups)
    if "arg" in groups:
        fields["flag"] = "--" + groups["arg"].replace("_", "-")
    if "parent" in groups:
        fields["top"] = groups["parent"].split(".")[0]
    return fields


def diagnose_event(ev: fe.Event | None, entries: Iterable[Cause], signals: dict | None = None) -> Diagnosis | None:
    """The first entry that matches the event, filled from it; None when none does (or there is no event)."""
    if ev is None:
        return None
    for cause in entries:
        found = match_cause(cause, ev)
        if found:
            evidence, groups = found
            fields = _event_fields(ev, evidence, groups, dict(signals or ()))
            return Diagnosis(cause.id, _fill(cause.cause, fields), _fill(cause.remedy, fields), evidence)
    return None


def diagnose(stage: str, returncode: int | None, text: str, timed_out: bool = False, stalled: bool = False, *,
             missing_outputs: Sequence[str | os.PathLike] = (), duration_s: float | None = None,
             argv: Sequence[str] = (), rules: Iterable[Rule] = RULES,
             iterations: Sequence | None = None, causes: Causes | None = None, log=None) -> Diagnosis | None:
    """The cause of this stage's outcome, or None when it is unknown. The run's first error event
    (harness.evidence.failure_events) is matched against causes.toml's [[cause]] entries, then the rules are tried
    in order, then causes.toml's [[class]] entries (what the event's class of error means). `iterations`: the
    text's parsed iteration records, when the caller has them (else a rule that needs them parses the text).
    `log`: the parsed log whose kept lines the text is, when the caller has it: its iteration records, its failure
    events and whether it diverged are then read from it, each computed once per log (ParsedLog.fact).
    `causes`: another table (NO_CAUSES: the rules alone)."""
    if log is not None and iterations is None:
        iterations = log.iterations
    outcome = StageOutput(stage, returncode, text or "", timed_out, stalled, tuple(map(str, missing_outputs)), duration_s,
                      tuple(map(str, argv)), None if iterations is None else tuple(iterations), log)
    table = load_causes() if causes is None else causes
    event = fe.first_cause(outcome.events) if outcome.text and (table.before or table.after) else None
    found = diagnose_event(event, table.before, table.signals)
    if found is not None:
        return found
    for rule in rules:
        if not _applies(rule, stage):
            continue
        found = _match(rule, outcome)
        if found:
            evidence, groups = found
            fields = _fields(outcome, evidence, groups)
            return Diagnosis(rule.id, _fill(rule.cause, fields), _fill(rule.remedy, fields), evidence)
    return diagnose_event(event, table.after, table.signals)


def missing_files(paths: Iterable[str | os.PathLike]) -> list[str]:
    """The expected outputs that do not exist (feed to diagnose(missing_outputs=...))."""
    return [str(p) for p in paths if not os.path.exists(p)]
