"""Reading a failure as a structure: the error events in a log, and the first one of the run.

A failed run's log is several programs' output in one stream (preprocessing, the launcher, each worker rank), each
line possibly wrapped by a launcher or logger (``[rank0]:``, ``[default0]:``, ``0: ``, ``(head, rank=0, pid=N)``,
``(MegatronPolicyWorker pid=N)``, timestamps, a logger's ``[N]`` counter, ``stderr: ``). ``events`` takes the
wrapping off each line (harness.evidence.logread's wrapper patterns, plus the ones only error text carries) and reads:

- a Python traceback: its frames (file, line, function, source line), the exception type and message (with the
  lines that continue it: NCCL's ``Last error:`` text, ``Missing key(s)`` lists), the program (the frame that runs
  ``<module>``), the rank that printed it; also a traceback cut short in a post (frames, or an exception line alone)
  and a bare ``No module named 'x'`` or ``[Errno 2] ...`` line;
- argparse's ``usage:`` / ``prog: error: ...``;
- the launcher: torchrun's ``ChildFailedError`` summary (program, failed rank, exit code, signal),
  ``failed (exitcode: N) local_rank: R``, deepspeed's ``exits with return code = N``, ``Received N death signal``;
- NCCL's own text (``NCCL WARN``, ``NCCL error``, ``Duplicate GPU detected``, the watchdog's timeout);
- ``terminate called after throwing an instance of 'X'`` with its ``what():``;
- a signal (``Caught signal 7 (Bus error ...)``, ``Fatal Python error: Bus error``, ``Segmentation fault``);
- a logged error (``ERROR:logger:message``, ``ERROR: message``).

``first_error`` is the first event of the run that is a cause, not a consequence: a launcher's report of a failed
worker counts only when no worker event is in the log. Everything is bounded: a line is looked at once, a
traceback keeps at most MAX_FRAMES frames and a message MAX_CONTINUATION lines.
"""

from __future__ import annotations

import posixpath
import re
import signal as _signal
from dataclasses import dataclass

from harness.evidence import logread

MAX_FRAMES = 64
MAX_CONTINUATION = 12
MAX_LINE = 4000                     # a line is cut to this before any pattern looks at it
MAX_PREFIX = 300                    # a wrapper learned from a traceback's own line is at most this long
TRACEBACK_HEAD = "Traceback (most recent call last)"

# Prefixes that error text carries even when the rest of the log has none (so not left to logread's detection).
_ALWAYS = (
    logread.WRAPPERS["torchrun-prefix"],                                        # [rank0]: [default0]: [0]:
    logread.WRAPPERS["iso-timestamp"], logread.WRAPPERS["datetime-stamp"], logread.WRAPPERS["clock-stamp"],
    re.compile(r"\((?:[\w.:-]{1,80}[ ,] ?)?(?:rank=(?P<rank>\d{1,6}), )?pid=\d{1,9}(?:, ip=[\d.:a-f]{1,45})?\) "),
    re.compile(r"\[\d{1,9}\] "),                                                # a logger's counter: [80746]
    re.compile(r"(?:stdout|stderr): "),
)

FRAME = re.compile(r'^\s*File "(?P<file>[^"]{1,500})", line (?P<line>\d{1,7}),? in (?P<func>\S{1,200})')
EXCEPTION = re.compile(r"^\s{0,24}(?P<type>(?:[A-Za-z_]\w{0,80}\.){0,8}[A-Za-z_]\w{0,80}(?:Error|Exception|Exit|"
                       r"Interrupt|Failure))(?::\s?(?P<msg>.*))?$")
BARE_MODULE = re.compile(r"^\s*(?P<msg>No module named '[\w.]{1,200}')\s*$")
BARE_ERRNO = re.compile(r"^\s*(?P<msg>\[Errno (?P<errno>\d{1,4})\] .*)$")
# IPython / Jupyter tracebacks: `ImportError    Traceback (most recent call last)`, then `<ipython-input-2-4dd6> in
# <module>()` or `~/x/site-packages/y.py in f(a)` (IPython 8: `File ~/y.py:12, in f(a)`, `Cell In[3], line 5`), the
# failing line under each marked `---> 14 code`
IPY_HEADER = re.compile(r"^(?P<type>[\w.]{1,120})\s{2,}Traceback \(most recent call last\)")
IPY_FRAME = re.compile(r"^(?:File )?(?P<file><ipython-input-[\w-]{1,80}>|[~/\w.:\\-][^\s:]{0,500}\.py|Cell In ?\[\d*\])"
                       r"(?::(?P<line>\d{1,7}))?,? "
                       r"(?:line (?P<line2>\d{1,7})|in (?P<func>[\w<>.]{1,200})(?:\(.{0,300}\))?)\s*$")
IPY_ARROW = re.compile(r"^-*> ?(?P<line>\d{1,7})\s(?P<source>.{0,500})$")
USAGE = re.compile(r"^usage: (?P<prog>\S{1,200})")
ARGPARSE = re.compile(r"^(?P<prog>[\w./-]{1,200}): error: (?P<msg>.+)$")
LAUNCH_FAILED = re.compile(r"failed \(exitcode: (?P<code>-?\d{1,4})\) local_rank: (?P<rank>\d{1,6}) \(pid: \d+\)")
DEEPSPEED_EXIT = re.compile(r"exits with return code = (?P<code>-?\d{1,4})")
DEATH_SIGNAL = re.compile(r"Received (?:Signals\.)?(?P<sig>\w{1,12}) death signal")
CHILD_FAILED = re.compile(r"ChildFailedError")
CHILD_PROGRAM = re.compile(r"^(?P<prog>\S{1,300}) FAILED\s*$")
CHILD_RANK = re.compile(r"^\s*rank\s*: (?P<rank>\d{1,6})")
CHILD_EXIT = re.compile(r"^\s*exitcode\s*: (?P<code>-?\d{1,4})")
CHILD_SIGNAL = re.compile(r"Signal (?P<num>\d{1,3}) \((?P<name>SIG\w+)\) received")
NCCL = re.compile(r"NCCL WARN|NCCL error|Duplicate GPU detected|Watchdog caught collective operation timeout|"
                  r"nccl(?:InvalidUsage|SystemError|InternalError|UnhandledCudaError|RemoteError)\b")
TERMINATE = re.compile(r"^terminate called after throwing an instance of '(?P<type>[^']{1,200})'")
WHAT = re.compile(r"^\s*what\(\):\s*(?P<msg>.*)$")
CAUGHT_SIGNAL = re.compile(r"Caught signal (?P<num>\d{1,3}) \((?P<name>[^:)]{1,60})")
FATAL = re.compile(r"^Fatal Python error: (?P<name>.+)$")
NATIVE_DEATH = re.compile(r"^\s*(?P<name>Segmentation fault|Bus error|Killed|Aborted)(?: \(core dumped\))?\s*$")
LOGGED = re.compile(r"^ERROR:(?:(?P<logger>[\w.]{1,120}):)?\s?(?P<msg>.+)$")
# PyTorch's C++ (glog-style) error line: [E socket.cpp:435] ... or [E1022 08:39:31.155 ProcessGroupNCCL.cpp:607] ...
CPP_ERROR = re.compile(r"^\[E(?:\d{4} [\d:.]{8,20})? ?[\w./-]{1,120}:\d{1,6}\] (?P<msg>.+)$")
# A framework logger's error line with its level letter: [NeMo E 2025-08-21 16:49:17 common:586] ...
LEVEL_ERROR = re.compile(r"^\[(?:[\w-]{1,40} )?E \d{4}-\d\d-\d\d [\d:,.]{8,15} [\w.-]{1,120}:\d{1,6}\] (?P<msg>.+)$")
# A debugger's rendering of an uncaught exception: "Exception has occurred: RuntimeError", the message next line.
DEBUGGER = re.compile(r"^Exception has occurred: (?P<type>[\w.]{1,120})")
_CONTINUATION_STOP = re.compile(r"^(?:Traceback \(most recent call last\)|During handling of the above|The above "
                                r"exception|(?:INFO|WARNING|ERROR|DEBUG)[: ]|\[?\d{4}-\d\d-\d\d|> |\s*File \")")
REPO_FOLDERS = ("Megatron-LM", "Megatron-LLM", "Megatron-DeepSpeed", "gpt-neox", "NeMo", "Pai-Megatron-Patch",
                "megatron-lm", "Megatron-Bridge")
NCCL_CODE = re.compile(r"^\s*nccl[A-Z]\w{0,40}:")
SIGNAL_NAMES = {"Bus error": "SIGBUS", "Segmentation fault": "SIGSEGV", "Killed": "SIGKILL", "Aborted": "SIGABRT"}


@dataclass(frozen=True)
class Frame:
    """One traceback frame: where code ran, and the source line printed under it."""

    file: str
    line: int | None
    function: str | None
    source: str = ""

    def where(self) -> str:
        at = f"{short_path(self.file)}:{self.line}" if self.line is not None else short_path(self.file)
        return f"{at} in {self.function}" if self.function else at


@dataclass
class Event:
    """One error event: what kind, what it says, where it was raised, which program and rank printed it."""

    kind: str                          # exception argparse launcher nccl terminate signal logged
    type: str | None                   # the exception type as printed (dotted), the signal's name, ...
    message: str                       # the event's own line, after the type
    line_no: int                       # index of the event's line in the unwrapped log
    evidence: str                      # that line, unwrapped
    frames: tuple = ()
    program: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None          # SIGKILL, SIGBUS, ... (a launcher's negative exit code, a native death)
    continuation: tuple = ()           # the lines that continue the message
    context: tuple = ()                # lines printed just before the event (NCCL WARN lines, make output)
    innermost_first: bool = False      # frames that follow it are printed innermost first (a debugger's view)

    @property
    def short_type(self) -> str:
        return (self.type or "").rsplit(".", 1)[-1]

    @property
    def detail(self) -> str:
        """The message and its continuation (what cause patterns search)."""
        return "\n".join((self.message, *self.continuation))

    @property
    def text(self) -> str:
        """Everything the event shows: context, line, continuation, frames (for cause patterns on the whole)."""
        frames = [f'File "{f.file}", line {f.line}, in {f.function}\n{f.source}' for f in self.frames]
        own = (self.evidence,) if self.message in self.evidence else (self.evidence, self.message)
        return "\n".join((*self.context, *own, *self.continuation, *frames))

    @property
    def raised_in(self) -> Frame | None:
        """The innermost frame (where the exception was raised)."""
        return self.frames[-1] if self.frames else None

    @property
    def module(self) -> str | None:
        """The innermost frame's file as a module-ish path (megatron/core/datasets/utils.py)."""
        return short_path(self.frames[-1].file) if self.frames else None

    @property
    def is_consequence(self) -> bool:
        """A launcher's report of a worker that failed (the worker's own event, when present, is the cause)."""
        return self.kind == "launcher" and self.type != "death-signal"


def short_path(path: str) -> str:
    """A frame's file without the machine's prefix: from the package folder on (site-packages/, megatron/, tools/)."""
    path = posixpath.normpath(path.replace("\\", "/")) if path else path
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    for checkout in REPO_FOLDERS:                 # a checkout's own folder: the path inside it
        at = path.lower().find("/" + checkout.lower() + "/")
        if at != -1:
            return path[at + len(checkout) + 2:]
    for root in ("megatron/", "tools/", "examples/", "torch/", "apex/", "transformer_engine/"):
        at = path.rfind("/" + root)
        if at != -1:
            return path[at + 1:]
    return path.rsplit("/", 1)[-1] if path.startswith("/") else path.lstrip("./")


def _program_of(frames) -> str | None:
    """The program a traceback ran: the outermost frame that runs a module's top level."""
    for f in frames:
        if f.function == "<module>" and not f.file.startswith("<"):
            return short_path(f.file)
    return None


def unwrap_lines(text: str, styles: tuple | None = None) -> list:
    """(rank, line) for each line: any launcher/logger prefix taken off, the rank it named (or None). `styles`: the
    wrapping the lines carry (logread.WRAPPERS keys), when the caller knows it; None: detected on the first lines."""
    raw = text.splitlines()
    if styles is None:
        styles = logread.detect_wrappers(raw[: logread.DETECT_LINES])
    detected = tuple(logread.WRAPPERS[s] for s in styles)
    out = []
    for line in raw:
        line, rank = line[:MAX_LINE], None
        for _ in range(logread.MAX_WRAPPERS + 2):
            # a prefix may follow a single space (the one a previous prefix, or logread's own unwrapping, left:
            # "[rank0]: [rank2]:   File ..."); two or more spaces are a traceback's indentation
            at = 1 if line.startswith(" ") and not line.startswith("  ") else 0
            for pattern in detected + _ALWAYS:
                m = pattern.match(line, at)
                if m and m.end() > at:
                    got = m.groupdict().get("rank")
                    if got is not None:                  # the innermost prefix's rank: the worker's own
                        rank = int(got)
                    line = line[m.end():]
                    break
            else:
                break
        out.append((rank, line.rstrip("\r")))
    return _strip_traceback_prefixes(out)


def _strip_traceback_prefixes(lines: list) -> list:
    """Whatever precedes `Traceback (most recent call last)` on its line, when the next line starts with the same
    text, is a wrapper no pattern knows (a job runner's `[177/train/578 (pid 28936)] [uuid] `): it is taken off every
    line that starts with it."""
    prefixes = []
    for i, (_, line) in enumerate(lines[:-1]):
        at = line.find(TRACEBACK_HEAD)
        if 0 < at <= MAX_PREFIX and line[:at].strip() and lines[i + 1][1].startswith(line[:at]) \
                and line[:at] not in prefixes and len(prefixes) < 4:
            prefixes.append(line[:at])
    if not prefixes:
        return lines
    out = []
    for rank, line in lines:
        for prefix in prefixes:
            if line.startswith(prefix):
                line = line[len(prefix):]
                break
        out.append((rank, line))
    return out


def _signal_name(code: int | None) -> str | None:
    """SIGKILL for exit code -9 (a process killed by a signal), else None."""
    if code is None or code >= 0:
        return None
    try:
        return _signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _continuation(lines, start: int, through_blank: bool = False) -> tuple:
    """The lines after an event line that continue its message: up to a blank line (or, for a native crash whose
    backtrace follows a blank line, through blank lines) or the next event."""
    out = []
    for _, line in lines[start: start + MAX_CONTINUATION]:
        if not line.strip():
            if through_blank:
                continue
            break
        if _CONTINUATION_STOP.match(line) or FRAME.match(line) or FATAL.match(line) or \
                (EXCEPTION.match(line) and not NCCL_CODE.match(line)):   # NCCL's result code continues the message
            break
        out.append(line)
    return tuple(out)


def _context(lines, at: int, n: int = 6) -> tuple:
    """The lines printed just before an event (non-blank, at most n)."""
    return tuple(line for _, line in lines[max(0, at - n): at] if line.strip())


def events(text: str, styles: tuple | None = None) -> list:
    """Every error event in the log, in order (`styles`: as unwrap_lines takes them)."""
    lines = unwrap_lines(text or "", styles)
    out: list = []
    frames: list = []
    usage_prog = None
    header = None                      # the line where the traceback being read began
    child: Event | None = None
    i = 0
    while i < len(lines):
        rank, line = lines[i]
        stripped = line.strip()
        if child is not None:              # inside torchrun's ChildFailedError summary
            if m := CHILD_PROGRAM.match(stripped):
                child.program = short_path(m["prog"])
            elif m := CHILD_RANK.match(line):
                child.rank = int(m["rank"])
            elif m := CHILD_EXIT.match(line):
                child.exit_code = int(m["code"])
                child.signal = child.signal or _signal_name(child.exit_code)
            elif m := CHILD_SIGNAL.search(line):
                child.signal = m["name"]
            elif stripped.startswith("=====") and child.exit_code is not None:
                child = None
        if m := FRAME.match(line):
            source = lines[i + 1][1].strip() if i + 1 < len(lines) and not FRAME.match(lines[i + 1][1]) else ""
            if source.startswith("^") or EXCEPTION.match(source or "x:"):
                source = ""
            if len(frames) < MAX_FRAMES:
                frames.append(Frame(m["file"], int(m["line"]), m["func"], source))
        elif stripped.startswith(TRACEBACK_HEAD) or IPY_HEADER.match(stripped):
            _cut_traceback(out, frames, header, lines)
            frames, header = [], i
        elif header is not None and (m := IPY_FRAME.match(stripped)) and len(frames) < MAX_FRAMES:
            frames.append(Frame(m["file"], int(m["line"] or m["line2"] or 0) or None, m["func"] or "<module>", ""))
        elif header is not None and frames and not frames[-1].source and (m := IPY_ARROW.match(stripped)):
            frames[-1] = Frame(frames[-1].file, int(m["line"]), frames[-1].function, m["source"].strip())
        elif m := USAGE.match(stripped):
            usage_prog = m["prog"]
        elif m := ARGPARSE.match(stripped):
            out.append(Event("argparse", "error", m["msg"].strip(), i, line.strip(), program=short_path(m["prog"]),
                             rank=rank))
        elif m := TERMINATE.match(stripped):
            what = next((w["msg"] for _, nxt in lines[i + 1: i + 3] if (w := WHAT.match(nxt))), "")
            out.append(Event("terminate", m["type"], what, i, stripped, rank=rank, signal="SIGABRT",
                             continuation=_continuation(lines, i + 2)))
        elif (m := LAUNCH_FAILED.search(line)) or (m := DEEPSPEED_EXIT.search(line)):
            code = int(m["code"])
            out.append(Event("launcher", "worker-failed", stripped, i, stripped, exit_code=code,
                             signal=_signal_name(code), rank=int(m["rank"]) if "rank" in m.groupdict() else None))
        elif m := DEATH_SIGNAL.search(line):
            sig = m["sig"]
            name = _signal_name(-int(sig)) if sig.isdigit() else sig
            out.append(Event("launcher", "death-signal", stripped, i, stripped, signal=name))
        elif CHILD_FAILED.search(line) and (EXCEPTION.match(line) or "ChildFailedError:" in line):
            child = Event("launcher", "ChildFailedError", "", i, stripped, frames=tuple(frames))
            out.append(child)
            frames = []
        elif (m := CAUGHT_SIGNAL.search(line)) or (m := FATAL.match(stripped)) or (m := NATIVE_DEATH.match(line)):
            name = m["name"].strip()
            sig = SIGNAL_NAMES.get(name.split(":")[0].strip(), None)
            if "num" in m.groupdict() and m["num"]:
                sig = _signal_name(-int(m["num"])) or sig
            out.append(Event("signal", sig or name, name, i, stripped, signal=sig, rank=rank,
                             continuation=_continuation(lines, i + 1, through_blank=True),
                             context=_context(lines, i)))
        elif (m := EXCEPTION.match(line)) or (m := BARE_MODULE.match(line)) or (m := BARE_ERRNO.match(line)):
            groups = m.groupdict()
            kind_type = groups.get("type") or ("ModuleNotFoundError" if "No module named" in m["msg"] else
                                               "OSError")
            message = (groups.get("msg") or "").strip()
            prev = out[-1] if out else None
            if "ChildFailedError" in kind_type or (prev is not None and i - prev.line_no <= MAX_CONTINUATION
                                                   and line in prev.continuation):
                i += 1                     # a launcher's report, or a line continuing the previous event
                continue
            if kind_type.endswith("SignalException"):       # torchrun's own handler: the launcher got a signal
                got = re.search(r"got signal: (\d{1,3})", message)
                out.append(Event("launcher", "death-signal", message, i, stripped, frames=tuple(frames),
                                 signal=_signal_name(-int(got[1])) if got else None))
                frames = []
                i += 1
                continue
            ev = Event("exception", kind_type, message, i, stripped, frames=tuple(frames), rank=rank,
                       continuation=_continuation(lines, i + 1), context=_context(lines, i))
            ev.program = _program_of(ev.frames)
            # A post whose exception line came before its frames (stderr interleaving): a later traceback with no
            # exception line of its own belongs to this one.
            out.append(ev)
            frames, header = [], None
        elif NCCL.search(line):
            prev = out[-1] if out else None
            if not (prev is not None and prev.kind in ("nccl", "exception") and i - prev.line_no <= MAX_CONTINUATION
                    and line in prev.continuation):
                out.append(Event("nccl", "NCCL", stripped, i, stripped, rank=rank,
                                 continuation=_continuation(lines, i + 1), context=_context(lines, i)))
        elif m := DEBUGGER.match(stripped):
            nxt = lines[i + 1][1].strip() if i + 1 < len(lines) else ""
            message = "" if FRAME.match(nxt) else nxt
            ev = Event("exception", m["type"], message, i, f"{m['type']}: {message}" if message else m["type"],
                       rank=rank, context=_context(lines, i), innermost_first=True)
            out.append(ev)
            frames = []
            i += 1 if message else 0
        elif (m := CPP_ERROR.match(stripped)) or (m := LEVEL_ERROR.match(stripped)):
            out.append(Event("logged", "logger-error", m["msg"].strip(), i, stripped, rank=rank,
                             continuation=_continuation(lines, i + 1), context=_context(lines, i)))
        elif m := LOGGED.match(stripped):
            out.append(Event("logged", m["logger"] or "ERROR", m["msg"].strip(), i, stripped, rank=rank,
                             continuation=_continuation(lines, i + 1), context=_context(lines, i)))
        i += 1
    if not _attach_orphan_frames(out, frames):
        _cut_traceback(out, frames, header, lines)
    out.sort(key=lambda e: e.line_no)           # a cut traceback is known only at the next one, or at the end
    for ev in out:
        if ev.kind == "argparse" and ev.program is None and usage_prog:
            ev.program = usage_prog
    return out


def _attach_orphan_frames(out: list, frames: list) -> bool:
    """Frames left at the end with no exception line after them belong to the last frameless exception (a post
    that printed the exception before its traceback); True when they found one."""
    if not frames:
        return False
    for ev in reversed(out):
        if ev.kind == "exception" and not ev.frames:
            ev.frames = tuple(reversed(frames)) if ev.innermost_first else tuple(frames)
            ev.program = _program_of(ev.frames)
            return True
    return False


def _cut_traceback(out: list, frames: list, header: int | None, lines: list) -> None:
    """A traceback that began with its `Traceback (most recent call last)` line and stops before its exception line
    (a post cut short, a process killed while printing): an event whose message is its last frame's source line,
    the statement that raised (`raise _env_error("MASTER_ADDR")`), when that line is a raise."""
    if header is None or not frames or not frames[-1].source.startswith("raise "):
        return
    raised = re.match(r"raise ([\w.]{1,120})", frames[-1].source)
    name = raised[1] if raised and re.search(r"(?:Error|Exception|Exit|Interrupt)$", raised[1]) else "exception"
    ev = Event("exception", name, frames[-1].source, header, frames[-1].source, frames=tuple(frames),
               rank=lines[header][0], context=_context(lines, header))
    ev.program = _program_of(ev.frames)
    out.append(ev)


def before_stopped(found: list) -> list:
    """The events up to the first signal that stopped the run from outside (a launcher's death signal): what a
    stopped process prints while it is torn down is not a cause of its own."""
    for n, ev in enumerate(found):
        if ev.kind == "launcher" and ev.type == "death-signal":
            return found[:n]
    return found


def log_events(log) -> list:
    """events() of a parsed log's kept lines, computed once per log and carried on it (ParsedLog.fact). harness.evidence.
    logread took each file's wrapping off as it read it (its one detection, per file), so no wrapping is detected
    again here: the prefixes error text carries anyway (_ALWAYS) are still taken off."""
    return log.fact("failure events", lambda parsed: events("\n".join(parsed.lines), styles=()))


def first_error(text: str) -> Event | None:
    """The run's first error event that is a cause (a launcher report only when nothing else failed)."""
    return first_cause(events(text))


def first_cause(found: list) -> Event | None:
    """first_error of events already found."""
    causes = [e for e in found if not e.is_consequence]
    if causes:
        return causes[0]
    return found[0] if found else None


def program_of_log(text: str) -> str | None:
    """The program a log names for itself (a traceback's <module> frame, argparse's prog, torchrun's FAILED line)."""
    for ev in events(text):
        if ev.program:
            return ev.program
    return None
