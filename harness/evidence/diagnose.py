"""Name the cause of a failed stage from its log, with the remedy a student can act on.

The causes are data, in one place: fixtures/failures/causes.toml, one ``[[cause]]`` per cause, tried in order (the
first that matches wins, so specific causes come before generic ones). An entry says what the failure must show:
its first error event (harness.evidence.failure_events: exception type, message, frames, program, signal), its
structure (harness.evidence.failure_structure: errno and the run's flag for the path it names, the package that
raised, the library the message names and its printed version, the environment variables and flags it names
checked against the run and Megatron-LM's releases, an OOM message's numbers, the CUDA versions, the stage the log
had reached, a preprocessing log or a training log), a line of the whole log, or a named condition on how the
stage ended (``CONDITIONS``: hung, exited 0 without outputs, diverged ...); its cause and remedy are templates
filled from all of these. This module evaluates; it knows no message.
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
from harness.evidence import failure_structure as fs

DATASET_MARKER = "> building train, validation, and test datasets for BERT ..."
DATASETS_DONE = "> finished creating BERT datasets ..."
EXPECTED_VOCAB_SIZE = 30522
# What Megatron logs as "padded vocab (size: N)": the WordPiece vocab, or it plus the [BOS]/[EOS] its BERT tokenizer adds.
HEALTHY_LOGGED_VOCAB_SIZES = (EXPECTED_VOCAB_SIZE, EXPECTED_VOCAB_SIZE + 2)
CAUSES_FILE = Path(__file__).resolve().parents[2] / "fixtures" / "failures" / "causes.toml"
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
    def event(self):
        """The run's first error event that is a cause (failure_events.first_cause), or None."""
        return fe.first_cause(self.events) if self.text else None

    @property
    def lines(self) -> list:
        """The text's lines, unwrapped as the events were read (failure_events.unwrap_lines)."""
        if "_lines" not in self.__dict__:
            self.__dict__["_lines"] = fe.unwrap_lines(self.text, styles=() if self.log is not None else None)
        return self.__dict__["_lines"]

    @property
    def reading(self) -> fs.Reading:
        """The failure's structure (harness.evidence.failure_structure), read once: carried on the parsed log when
        there is one."""
        def read(_=None):
            table = load_table()
            return fs.read(self.text, self.event, log=self.log, lines=self.lines, stages=table.stages,
                           roles=table.roles, syntaxes=table.syntaxes)
        if self.log is not None:
            return self.log.fact("failure structure", read)
        if "_reading" not in self.__dict__:
            self.__dict__["_reading"] = read()
        return self.__dict__["_reading"]

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

# What an entry may ask of the first error event, and of the failure's structure (failure_structure.Reading).
EVENT_FIELDS = ("type", "message", "anywhere", "frames", "raised_in", "program", "not_program", "signal")
STRUCTURE_FIELDS = ("errno_name", "path", "role", "package", "library", "stdlib", "version", "python", "torch",
                    "torch_cuda", "driver_cuda", "driver_too_old", "cuda_error", "env", "flag", "flag_state", "oom",
                    "reached", "log_kind", "syntax_python")


@dataclass(frozen=True)
class Rule:
    """One cause: where it applies, how it shows, what it means, what to do (an entry of causes.toml)."""

    id: str
    stages: tuple[str, ...] | None      # None: any stage; else stage names (prefix match: "train" fits "train-resume")
    pattern: str | None                 # searched line by line over the whole text (re.MULTILINE): `text`
    condition: Condition | None         # `when`: the named conditions, all of which must hold
    cause: str
    remedy: str
    kind: tuple = ()                    # the first error event's kinds (exception argparse launcher ...)
    event: tuple = ()                   # (field, compiled regex) on the first error event
    structure: tuple = ()               # (field, compiled regex, must match) on the failure's structure
    sources: tuple = ()
    when: tuple = ()

    @property
    def needs_event(self) -> bool:
        return bool(self.kind or self.event)


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


def _no_error(o: StageOutput) -> str | None:
    """No error event before the run was stopped: it stopped where it was, saying nothing."""
    return None if fe.before_stopped(o.events) else o.last_line


CONDITIONS: dict = {
    "preprocessing": _in_preprocess,
    "vocab-file-not-found": _vocab_file_not_found,
    "hung-building-bert-datasets": _hung_building_bert_datasets,
    "exit-zero-without-outputs": _exit_zero_without_outputs,
    "split-sentence-files": _split_sentence_files,
    "wrong-vocab-size": _wrong_vocab_size,
    "diverged": _diverged,
    "hung": _hung,
    "no-error": _no_error,
}


# ---- the table (fixtures/failures/causes.toml) ------------------------------------------------------------------

@dataclass(frozen=True)
class Table:
    """causes.toml compiled: the causes in order, what each signal means, the stages and the roles of paths."""

    rules: tuple
    signals: tuple = ()              # (name, meaning) pairs
    stages: tuple = ()               # {"name", "rx", "kind"}: Megatron-LM's progress lines, in pipeline order
    roles: tuple = ()                # {"name", "path", "frames", "kind"}: what a path is when the arguments do not say
    syntaxes: tuple = ()             # {"name", "rx", "python"}: the constructs, each with the Python that added it


_ENTRY_FIELDS = {"id", "cause", "remedy", "sources", "kind", "stages", "text", "when", *EVENT_FIELDS,
                 *STRUCTURE_FIELDS, *(f"not_{f}" for f in STRUCTURE_FIELDS)}


def rule_of(raw: dict) -> Rule:
    """One [[cause]] entry compiled; an unknown field, an unknown condition or an entry that matches everything is
    refused (a typo would otherwise match every failure)."""
    extra = set(raw) - _ENTRY_FIELDS
    unknown = [w for w in raw.get("when", ()) if w not in CONDITIONS]
    asks = extra or unknown or not ({"text", "when", "kind", *EVENT_FIELDS, *STRUCTURE_FIELDS} & set(raw))
    if asks or not raw.get("id") or not raw.get("cause") or not raw.get("remedy"):
        raise ValueError(f"causes.toml entry {raw.get('id')!r}: unknown fields {sorted(extra)} or conditions "
                         f"{unknown}, no id/cause/remedy, or nothing to match")
    when = tuple(raw.get("when", ()))
    condition = None if not when else CONDITIONS[when[0]] if len(when) == 1 else _all(*(CONDITIONS[w] for w in when))
    structure = tuple((f, re.compile(raw[f]), True) for f in STRUCTURE_FIELDS if f in raw) + \
        tuple((f, re.compile(raw[f"not_{f}"]), False) for f in STRUCTURE_FIELDS if f"not_{f}" in raw)
    return Rule(raw["id"], tuple(raw["stages"]) if raw.get("stages") else None, raw.get("text"), condition,
                raw["cause"], raw["remedy"], kind=tuple(raw.get("kind", ())),
                event=tuple((f, re.compile(raw[f])) for f in EVENT_FIELDS if f in raw), structure=structure,
                sources=tuple(raw.get("sources", ())), when=when)


@functools.lru_cache(maxsize=4)
def load_table(path: Path = CAUSES_FILE) -> Table:
    """causes.toml, compiled (cached: the file is read once per process)."""
    data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    stages = tuple({"name": s["name"], "rx": re.compile(s["line"]), "kind": s.get("kind", "training")}
                   for s in data.get("stage", ()))
    syntaxes = tuple({"name": s["name"], "rx": re.compile(s["source"]), "python": s["python"]}
                     for s in data.get("syntax", ()))
    return Table(tuple(map(rule_of, data.get("cause", ()))), tuple(sorted(data.get("signals", {}).items())),
                 stages, tuple(data.get("role", ())), syntaxes)


RULES: tuple = load_table().rules


# ---- matching --------------------------------------------------------------------------------------------------

def _applies(rule: Rule, stage: str) -> bool:
    """The rule covers this stage (prefix match on stage names)."""
    return rule.stages is None or any(stage.startswith(s) for s in rule.stages)


_SOURCE_LINE = re.compile(r"^(?:\[rank\d+\]:)?\s*(?:raise |File \")")


def _search(pattern: str, text: str) -> tuple[str, dict] | None:
    """The first line matching `pattern` (an exception line before a quoted `raise` line), and its named groups."""
    first = None
    for m in re.compile(pattern, re.MULTILINE).finditer(text):
        line = _line_of(text, m)
        hit = (line, {k: v for k, v in m.groupdict().items() if v is not None})
        if not _SOURCE_LINE.match(line):
            return hit
        first = first or hit
    return first


def _line_of(text: str, m: re.Match) -> str:
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start: end if end != -1 else len(text)].strip()


def _frames_text(ev: fe.Event) -> str:
    return "\n".join(f"{fe.short_path(f.file)}:{f.function}: {f.source}" for f in ev.frames)


def match_event(rule: Rule, ev: fe.Event | None) -> tuple | None:
    """(evidence line or None, named groups) when the event shows everything the rule asks of it, else None."""
    if ev is None:
        return None
    if rule.kind and ev.kind not in rule.kind:
        return None
    groups, evidence = {}, None
    innermost = f"{fe.short_path(ev.raised_in.file)}:{ev.raised_in.function}" if ev.raised_in else ""
    values = {"type": ev.type or "", "signal": ev.signal or "", "frames": _frames_text(ev), "raised_in": innermost,
              "message": ev.detail, "anywhere": ev.text}
    for name, rx in rule.event:
        if name in ("program", "not_program"):
            if not ev.program or bool(rx.search(ev.program)) != (name == "program"):
                return None
            continue
        m = rx.search(values[name])
        if m is None:
            return None
        groups.update({k: v for k, v in m.groupdict().items() if v is not None})
        if name in ("message", "anywhere") and evidence is None:
            own = "\n".join((ev.evidence, *ev.continuation))
            mine = rx.search(own) if name == "anywhere" else None     # a line of its own before one printed before
            evidence = _line_of(own, mine) if mine else _line_of(values[name], m)
            if evidence == ev.message.strip():        # the event's own line: quoted whole, with its type
                evidence = ev.evidence
    return evidence, groups


def match_structure(rule: Rule, reading: fs.Reading) -> dict | None:
    """The named groups when the failure's structure shows what the rule asks of it, else None."""
    groups = {}
    for name, rx, must in rule.structure:
        value = reading.value(name)
        m = rx.search(value) if value is not None else None
        if (m is not None) != must:
            return None
        if m is not None:
            groups.update({k: v for k, v in m.groupdict().items() if v is not None})
    return groups


def _words_line(reading: fs.Reading, needle: str | None) -> str | None:
    """The line of the words the reading looked at that names `needle` (a flag, a variable)."""
    if needle:
        for line in reading.words.splitlines():
            if needle in line:
                return line.strip()
    return None


def match(rule: Rule, o: StageOutput) -> tuple[str, dict] | None:
    """(evidence, template fields) when the rule holds for this outcome, else None. The evidence is the line that
    proves it: the whole-text pattern's line, else the event's matching line, else the line naming the flag the
    rule is about, else the condition's, else the event's own line, else the last line."""
    groups, lines = {}, {}
    if rule.condition is not None:
        got = rule.condition(o)
        if not got:
            return None
        lines["condition"], more = got if isinstance(got, tuple) else (got, {})
        groups.update(more)
    if rule.structure:
        got = match_structure(rule, o.reading)
        if got is None:
            return None
        groups.update(got)
        if any(name.startswith(("flag", "env")) for name, _, _ in rule.structure):
            reading = o.reading
            lines["words"] = _words_line(reading, reading.flag.name if reading.flag else
                                         reading.env[0] if reading.env else None)
    if rule.needs_event:
        got = match_event(rule, o.event)
        if got is None:
            return None
        lines["event"], more = got
        groups.update(more)
    if rule.pattern is not None:
        got = _search(rule.pattern, o.text)
        if not got:
            return None
        lines["pattern"], more = got
        groups.update(more)
    own = o.event.evidence if o.event is not None and (rule.needs_event or rule.structure) else None
    evidence = next((line for line in (lines.get("pattern"), lines.get("event"), lines.get("words"),
                                       lines.get("condition"), own) if line), o.last_line)
    return evidence, groups


_OPTIONAL = re.compile(r"<<(.*?)>>", re.DOTALL)


def _fill(template: str, fields: dict) -> str:
    """Replace {name} placeholders only (remedies quote Python code with braces); a <<...>> segment is kept only when
    every field it names is known."""
    def optional(m: re.Match) -> str:
        names = re.findall(r"\{(\w+)\}", m[1])
        return m[1] if all(fields.get(n) not in (None, "") for n in names) else ""
    template = _OPTIONAL.sub(optional, template)
    return re.sub(r"\{(\w+)\}", lambda m: str(fields.get(m[1], "?")), template)


def _fields(o: StageOutput, rule: Rule, evidence: str, groups: dict, signals: dict) -> dict:
    """Everything a cause/remedy template may name: how the stage ended, the first error event, the structure."""
    how = "(stalled: no output)" if o.stalled else "(timed out)" if o.timed_out else ""
    duration = f"{o.duration_s:.0f} s" if o.duration_s is not None else "an unknown time"
    fields = dict(stage=o.stage, how=how, duration=duration, last_line=o.last_line, evidence=evidence,
                  returncode=o.returncode, message=evidence)
    ev = o.event if (rule.needs_event or rule.structure) else None
    if ev is not None:
        program = ev.program or "the program"
        chain = " -> ".join(fe.short_path(f.file) for f in ev.frames if f.function == "<module>")
        fields.update(program=program, who=program if ev.rank is None else f"{program} (rank {ev.rank})",
                      type=ev.type or "", short_type=ev.short_type or ev.kind,
                      message=(ev.message or ev.evidence)[:300],
                      first=ev.continuation[0].strip()[:200] if ev.continuation else "",
                      where=ev.raised_in.where() if ev.raised_in else "a line with no traceback frame",
                      module=ev.module or "", rank="?" if ev.rank is None else str(ev.rank),
                      exit_code="?" if ev.exit_code is None else str(ev.exit_code), signal=ev.signal or "",
                      meaning=signals.get(ev.signal or "", "see the signal's description (man 7 signal)"),
                      chain=chain or program, evidence=evidence[:300])
    if rule.structure:
        reading = o.reading
        for name in ("errno", "errno_name", "strerror", "path", "role", "role_how", "package", "library", "version",
                     "python", "torch", "torch_cuda", "driver_cuda", "cuda_error", "env", "flag", "flag_state",
                     "flag_new", "flag_release", "flag_near", "oom_total", "oom_free", "oom_own", "oom_other",
                     "oom_tried", "oom_gpu", "oom_processes", "reached", "log_kind", "syntax_feature",
                     "syntax_python"):
            value = reading.value(name)
            if value is not None:
                fields[name] = value
    fields.update(groups)
    if "arg" in groups:
        fields["flag"] = "--" + groups["arg"].replace("_", "-")
    if "parent" in groups:
        fields["top"] = groups["parent"].split(".")[0]
    if "by" in groups:
        fields["by_package"] = fs.package_of(groups["by"]) or fe.short_path(groups["by"])
    return fields


def diagnose(stage: str, returncode: int | None, text: str, timed_out: bool = False, stalled: bool = False, *,
             missing_outputs: Sequence[str | os.PathLike] = (), duration_s: float | None = None,
             argv: Sequence[str] = (), rules: Iterable[Rule] | None = None,
             iterations: Sequence | None = None, log=None) -> Diagnosis | None:
    """The cause of this stage's outcome, or None when it is unknown: the first entry of causes.toml (`rules`: a
    subset of RULES, in order) that holds. `iterations`: the text's parsed iteration records, when the caller has
    them (else a condition that needs them parses the text). `log`: the parsed log whose kept lines the text is,
    when the caller has it: its iteration records, its failure events, its structure and whether it diverged are
    then read from it, each computed once per log (ParsedLog.fact)."""
    if log is not None and iterations is None:
        iterations = log.iterations
    outcome = StageOutput(stage, returncode, text or "", timed_out, stalled, tuple(map(str, missing_outputs)),
                          duration_s, tuple(map(str, argv)), None if iterations is None else tuple(iterations), log)
    signals = dict(load_table().signals)
    for rule in RULES if rules is None else rules:
        if not _applies(rule, stage):
            continue
        found = match(rule, outcome)
        if found:
            evidence, groups = found
            fields = _fields(outcome, rule, evidence, groups, signals)
            return Diagnosis(rule.id, _fill(rule.cause, fields), _fill(rule.remedy, fields), evidence)
    return None


def missing_files(paths: Iterable[str | os.PathLike]) -> list[str]:
    """The expected outputs that do not exist (feed to diagnose(missing_outputs=...))."""
    return [str(p) for p in paths if not os.path.exists(p)]
