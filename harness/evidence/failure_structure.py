"""A failure read by its structure: what the run's first error event says, mapped onto the run itself.

harness.evidence.failure_events finds the error events; this module reads the first one (and the log around it) for
what a cause depends on, whatever the message's wording:

- the errno (``[Errno 28]``, ``errno: 98``, ``... (24)``, or the C library's own text for it, ``No space left on
  device``) and the path the message names, mapped to the run's own flag for it (``--save``, ``--load``,
  ``--data-path``, ``--vocab-file``, ``--data-cache-path`` ... from the log's arguments block), or to /dev/shm, a
  cache folder, or what the traceback was doing (a save, a load, the tokenizer) when the block does not say;
- the package of the frame that raised (``site-packages/<pkg>/``, ``megatron/``), the library the message names
  (``module 'numpy' has no attribute``, ``cannot import name 'x' from 'transformers.y'``), whether that library is
  Python's own, and the versions the log prints for it (``torch 2.1.0+cpu``, ``numpy==2.0.1``, a
  ``python3.8/site-packages`` path);
- the environment variables and the flags the message (or the lines just before its traceback) names, each flag
  checked against the run's arguments block and every Megatron-LM release's argument parser
  (fixtures/failures/megatron-flags.json, derived from the releases' sources by ``python -m harness catalogue
  flags``): renamed (to which flag, in which release), removed, added after the run's release, never a flag (and
  the closest one), or a flag the run did not pass that the message names as the fix;
- the numbers of a CUDA out-of-memory message (total, free, this process's own use): whether another process holds
  the GPU; the CUDA error the message names; the CUDA version of the driver and of torch's build;
- the stage the log had reached when it failed (the last of Megatron-LM's own progress lines before the error, or
  before its end), and whether that is a preprocessing tool's output or a training run's.

What each combination means is data (fixtures/failures/causes.toml); this module only reads.
"""

from __future__ import annotations

import difflib
import errno as _errno
import functools
import json
import os
import re
import sys
from dataclasses import dataclass, field

from harness.base.paths import FIXTURES
from harness.evidence import failure_events as fe

FLAGS_FILE = FIXTURES / "failures" / "megatron-flags.json"
BEFORE_TRACEBACK = 10                # lines printed just before a traceback that belong to its message
LAST_WORDS = 6                       # a log with no error event: its last lines are what it said when it stopped
MAX_SCAN = 400_000                   # characters of a message looked at

# The C library's text for each errno (Linux's), longest first, without the ones too vague to mean an errno when
# they appear in a message without its number.
_VAGUE = {_errno.EINVAL, _errno.EFAULT, _errno.EAGAIN, _errno.EINTR, _errno.ENOSYS, _errno.EPERM, _errno.ESRCH,
          _errno.ERANGE, _errno.EDOM, _errno.ENOEXEC, _errno.EBADF, _errno.ECHILD, _errno.EBUSY}
_STRERROR = sorted(((os.strerror(n), n) for n in range(1, 134) if n not in _VAGUE and n in _errno.errorcode
                    and not os.strerror(n).startswith("Unknown error")), key=lambda p: -len(p[0]))
_STRERROR_RX = re.compile("|".join(re.escape(s) for s, _ in _STRERROR))
_STRERROR_CODE = {s: n for s, n in _STRERROR}
_ERRNO_NUMBER = re.compile(r"\[Errno (-?\d{1,4})\]|\berrno:? ?(-?\d{1,4})\b|\berror code:? ?(\d{1,4})\b")
_CODE_AFTER_TEXT = re.compile(r" \((\d{1,4})\)")
_QUOTED_PATH = re.compile(r"""['"`<](?P<p>(?:[A-Za-z]:)?[~./\\]?[\w.~@+-]{0,200}"""
                          r"""(?:[/\\][\w.~@+ -]{0,200}){0,40})['"`>]""")
_BARE_PATH = re.compile(r"(?<![\w:/])(?P<p>/[\w.~@+-]{1,200}(?:/[\w.~@+-]{0,200}){0,40})")
_SIZE = r"(?P<{0}>\d+(?:\.\d+)?) ?(?P<{0}_unit>[KMGT]i?B|bytes)"
_OOM_TOTAL = re.compile(r"total capacit?y of " + _SIZE.format("total") + " of which " + _SIZE.format("free") +
                        r" is free|" + _SIZE.format("total2") + " total capacity")
_OOM_OLD_FREE = re.compile(_SIZE.format("free") + " free")
_OOM_OWN = re.compile(r"this process has " + _SIZE.format("own") + " memory in use")
_OOM_RESERVED = re.compile(_SIZE.format("reserved") + " reserved in total by PyTorch")
_OOM_TRIED = re.compile(r"Tried to allocate " + _SIZE.format("tried"))
_OOM_GPU = re.compile(r"\bGPU (?P<gpu>\d{1,3})\b")
_OOM_PROCESS = re.compile(r"Process (?P<pid>\d{1,9}) has " + _SIZE.format("size") + " memory in use")
_UNITS = {"B": 1 / 2**30, "bytes": 1 / 2**30, "KiB": 1 / 2**20, "KB": 1 / 2**20, "MiB": 1 / 2**10, "MB": 1 / 2**10,
          "GiB": 1.0, "GB": 1.0, "TiB": 2.0**10, "TB": 2.0**10}
_ENV_TOKEN = re.compile(r"(?<![\w-])\$?\{?([A-Z][A-Z0-9]{1,40}(?:_[A-Z0-9]{1,40}){0,6})\}?(?![\w-])")
_ENV_CONTEXT = re.compile(r"(?i)environ|\benv(?:ironment)?\b|env://|\bnot set\b|\bunset\b|\bset (?:the )?\$?[A-Z]")
# the raising frame reads the environment: os.environ, getenv, a helper named for it (_env_error, _env_rendezvous_...)
_ENV_CODE = re.compile(r"(?i)environ|getenv|(?:^|_)env(?:_|\b)")
_IMPORT_STATEMENT = re.compile(r"^\s*from ([\w.]{1,200}) import|^\s*import ([\w.]{1,200})")
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]{0,80}")
# a flag offered as the fix: an imperative before it ("Specify --no-load-rng", "use --ckpt-format", "or --finetune")
_SUGGESTED = re.compile(r"(?i)(?:\b(?:specify|use|using|pass|passing|set|setting|try|add|adding|enable|consider|"
                        r"provide|supply|with|or)\W{1,3}(?:the\s+)?(?:(?:flag|option|argument)\s+)?[`'\"]?)$")
_SYNTAX_FILE = re.compile(r'^\s*File "(?P<file>[^"]{1,500})", line \d{1,7}\s*$')
_LIBRARY = re.compile(r"module '(?P<a>[\w.]{1,200})' has no attribute|"
                      r"cannot import name '\w+' from '(?P<b>[\w.]{1,200})'|"
                      r"No module named '(?P<c>\w{1,100})\.[\w.]{1,200}'|"
                      r"(?P<d>\w{1,100})\.\w+ (?:is|was) (?:removed|deprecated)")
_CUDA_ERROR = re.compile(r"CUDA (?:driver )?error: (?P<e>[^\n]{1,200}?)(?:\n|$|\.? ?CUDA kernel errors)|"
                         r"cuda runtime error \(\d+\) : (?P<old>[^\n]{1,200}?) at |(?P<name>cudaError\w{1,60})|"
                         r"CUDA call failed lazily at initialization with error: (?P<lazy>[^\n]{1,200})")
_DRIVER_FOUND = re.compile(r"driver on your system is too old \(found version (?P<v>\d{4,6})\)")
# nvidia-smi's header: the highest CUDA the driver supports; torch.utils.collect_env: the CUDA torch was built with
_DRIVER_SMI = re.compile(r"Driver Version: \S{1,20}\s{1,40}CUDA Version: (?P<v>\d{1,2}\.\d)")
_TORCH_BUILT = re.compile(r"CUDA used to build PyTorch: (?P<v>\d{1,2}\.\d|None)")
_CU = re.compile(r"\+cu(?P<cu>\d{2,3})\b|\bCUDA(?: Version| version|:)? ?(?P<v>\d{2}\.\d)\b|(?P<cpu>\+cpu)\b")
_PYTHON = re.compile(r"python(?P<v>3\.\d{1,2})\b|\bPython (?:version:? ?)?(?P<v2>3\.\d{1,2})(?:\.\d+)?\b|"
                     r"cpython-3(?P<v3>\d{1,2})")
_ALIASES = {"torch": "(?:py)?torch", "python": "python"}
_TRACEBACK = "Traceback (most recent call last)"


@dataclass(frozen=True)
class Flag:
    """A flag a message names, checked against the run's arguments and Megatron-LM's releases."""

    name: str
    state: str                 # renamed removed newer unknown fix (a switch offered as the fix that the run did not
                               # turn on) given named
    new: str | None = None     # renamed: the flag it became
    release: str | None = None  # renamed/removed/newer: the release where that happened
    near: str | None = None    # unknown: the closest flag of any release


@dataclass(frozen=True)
class Reading:
    """What a failure's structure says (each field None when the log does not show it)."""

    errno: int | None = None
    errno_name: str | None = None
    strerror: str | None = None
    path: str | None = None
    role: str | None = None            # the run's flag (or place) the path is: --save, /dev/shm, the cache, ...
    role_how: str | None = None        # how the role was found: the arguments block, the traceback, the path
    package: str | None = None         # the package of the frame that raised
    library: str | None = None         # the library the message names (the top-level package)
    stdlib: bool = False               # that library is Python's own
    version: str | None = None         # the version the log prints for that library
    python: str | None = None
    world_size: str | None = None      # as the arguments block prints it
    torch: str | None = None
    torch_cuda: str | None = None      # "12.1", "cpu"
    driver_cuda: str | None = None     # the CUDA version the driver supports (torch's "too old" message, nvidia-smi)
    driver_too_old: bool = False       # torch says so, or the driver's CUDA is below the one torch was built for
    cuda_error: str | None = None
    env: tuple = ()
    flags: tuple = ()                  # Flag of each flag named
    flag: Flag | None = None           # the one that explains the failure (the first renamed/removed/... one)
    oom: str | None = None             # other-process, own
    oom_numbers: dict = field(default_factory=dict)
    syntax_feature: str | None = None  # a SyntaxError's source line uses this construct ([[syntax]] of causes.toml)
    syntax_python: str | None = None   # ... which Python has had since this version
    reached: str | None = None         # the stage the log had reached (causes.toml's [[stage]] names)
    log_kind: str | None = None        # training, preprocess
    words: str = ""                    # the message the reading looked at, with the lines before its traceback

    def value(self, name: str) -> str | None:
        """A field as the text data entries match and templates quote."""
        if name.startswith("flag_"):
            got = getattr(self.flag, name[5:], None) if self.flag else None
            return None if got is None else str(got)
        if name == "flag":
            return self.flag.name if self.flag else None
        if name.startswith("oom_"):
            got = self.oom_numbers.get(name[4:])
            return None if got is None else (f"{got:.2f} GiB" if isinstance(got, float) else str(got))
        got = getattr(self, name, None)
        if isinstance(got, tuple):
            return " ".join(got) or None
        if isinstance(got, bool):
            return "yes" if got else None
        return None if got is None else str(got)


# ---- tables --------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=2)
def flags_table(path=FLAGS_FILE) -> dict:
    """fixtures/failures/megatron-flags.json (an empty table when it is absent)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        return {"releases": [], "flags": {}, "renamed": {}}


# ---- the reading -----------------------------------------------------------------------------------------------

def arguments_of(text: str, log=None) -> dict:
    """The run's arguments block: name -> printed value (the parsed log's, else read from the text)."""
    if log is not None and log.arguments is not None:
        return log.arguments
    from harness.evidence.logformat import ARGUMENTS_BEGIN, ARGUMENTS_END, _ARGUMENT

    at = text.find(ARGUMENTS_BEGIN)
    if at == -1:
        return {}
    end = text.find(ARGUMENTS_END, at)
    out = {}
    for line in text[at: end if end != -1 else at + 200_000].splitlines()[1:2000]:
        if m := _ARGUMENT.match(line):
            out.setdefault(m["name"], m["value"])
    return out


def _gib(m: re.Match, name: str) -> float | None:
    if m is None or m[name] is None:
        return None
    return float(m[name]) * _UNITS.get(m[f"{name}_unit"], 1.0)


def oom_numbers(text: str) -> tuple:
    """(other-process | own | None, numbers): a CUDA OOM message's own numbers, and whether the memory the GPU lacks
    is held by another process (total - free - this process's use, well above a CUDA context's share)."""
    if "out of memory" not in text and "OutOfMemoryError" not in text:
        return None, {}
    total_m = _OOM_TOTAL.search(text)
    if total_m is None:
        return None, {}
    total = _gib(total_m, "total") or _gib(total_m, "total2")
    free = _gib(total_m, "free") if total_m["free"] else _gib(_OOM_OLD_FREE.search(text), "free")
    own_m, reserved_m = _OOM_OWN.search(text), _OOM_RESERVED.search(text)
    own = _gib(own_m, "own") if own_m else _gib(reserved_m, "reserved")
    numbers = {"total": total, "free": free, "own": own, "tried": _gib(_OOM_TRIED.search(text), "tried")}
    gpu = _OOM_GPU.search(text)
    numbers["gpu"] = gpu["gpu"] if gpu else "?"
    others = [(m["pid"], _gib(m, "size")) for m in _OOM_PROCESS.finditer(text)]
    if total is None or free is None or own is None:
        return None, numbers
    other = max(0.0, total - free - own)
    numbers["other"] = other
    if others:
        numbers["processes"] = ", ".join(f"pid {pid} {size:.2f} GiB" for pid, size in others[:6])
    # this process's own use excludes its CUDA context (~0.5 GiB) in the old message (PyTorch's reserve only)
    margin = max(1.0, 0.1 * total) if own_m else max(2.0, 0.2 * total)
    return ("other-process" if other > margin else "own"), numbers


def _errno_of(words: str) -> tuple:
    """(errno, its name, its text) from a message: its number, else the C library's text for one."""
    m = _ERRNO_NUMBER.search(words)
    text = _STRERROR_RX.search(words)
    code = None
    if m:
        code = int(next(g for g in m.groups() if g is not None))
    elif text:
        code = _STRERROR_CODE[text[0]]
        after = _CODE_AFTER_TEXT.match(words, text.end())
        if after and int(after[1]) in _errno.errorcode:
            code = int(after[1])
    if code is None or code not in _errno.errorcode:
        return None, None, None
    return code, _errno.errorcode[code], os.strerror(code)


def _path_of(words: str) -> str | None:
    """The first path a message names (quoted, or a bare absolute path)."""
    for rx in (_QUOTED_PATH, _BARE_PATH):
        for m in rx.finditer(words):
            p = m["p"].strip()
            if ("/" in p or "\\" in p or re.search(r"\.\w{1,6}$", p)) and not p.startswith("http") and len(p) > 1:
                return p
    return None


def _same_place(path: str, value: str) -> bool:
    """The path is the argument's path or lies under it (or the argument, a prefix, starts the path)."""
    value = value.strip().strip("[]'\" ")
    if not value or value == "None" or not path:
        return False
    path, value = os.path.normpath(path), os.path.normpath(value)
    return path == value or path.startswith(value.rstrip("/") + "/") or (len(value) > 3 and path.startswith(value))


def role_of(path: str | None, ev, args: dict, roles: tuple, log_kind: str | None, reached: str | None = None) -> tuple:
    """(role, how found): the run's flag whose value the path is (the arguments block), else the first [[role]] of
    causes.toml whose path or frames pattern holds, else the first whose stage is the one the log had reached."""
    if path and args:
        for name, value in args.items():
            if value and ("/" in value or "\\" in value) and _same_place(path, value):
                return "--" + name.replace("_", "-"), "the run's arguments block"
    frames = "\n".join(f"{f.file}:{f.function}: {f.source}" for f in (ev.frames if ev is not None else ()))
    for role in roles:
        if role.get("kind") and role["kind"] != log_kind:
            continue
        if path and role.get("path") and re.search(role["path"], path):
            return role["name"], "its path"
        if frames and role.get("frames") and re.search(role["frames"], frames):
            return role["name"], "the traceback"
    for role in roles:
        if reached and role.get("reached") and re.fullmatch(role["reached"], reached):
            return role["name"], "the stage the log had reached"
    return None, None


def package_of(path: str | None) -> str | None:
    """The package a file belongs to: site-packages/<pkg>/..., megatron/..., else None (the program's own code)."""
    if not path:
        return None
    path = path.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            head = path.split(marker, 1)[1].split("/", 1)[0]
            head = re.sub(r"\.(?:py|pyd|so|egg|dist-info|egg-info)$", "", head)
            return re.sub(r"\.cpython-.*$|\.abi3$|-\d[\w.]*(?:-py[\d.]+)?$", "", head) or None
    short = fe.short_path(path)
    if short.startswith("megatron/"):
        return "megatron"
    if re.search(r"/lib/python3\.\d+/[\w.]+\.py$", path) or re.search(r"/lib/python3\.\d+/\w+/", path):
        return "python"
    return None


def version_printed(text: str, library: str) -> str | None:
    """The version the log prints for a library: `numpy==2.0.1`, `torch 2.1.0+cpu`, `torch version: 2.1`,
    `numpy-1.24.0.dist-info`."""
    if not library:
        return None
    name = _ALIASES.get(library) or re.escape(library).replace(r"\_", "[_-]").replace(r"\-", "[_-]")
    rx = re.compile(rf"(?i)(?<![\w.-]){name}(?:==|\s*[:=]\s*|\s+version\s*:?\s*|-|\s+)v?(?P<v>\d{{1,4}}\.\d{{1,4}}"
                    rf"(?:\.\d{{1,6}})?(?:[a-z]{{1,5}}\d{{0,4}})?(?:\+[\w.]{{1,20}})?)(?!\w)(?!\.\d)")
    m = rx.search(text[:MAX_SCAN]) or rx.search(text[-MAX_SCAN:])
    return m["v"] if m else None


def python_version(text: str, ev) -> str | None:
    for f in (ev.frames if ev is not None else ()):
        if m := _PYTHON.search(f.file):
            return m["v"] or m["v2"] or ("3." + m["v3"] if m["v3"] else None)
    m = _PYTHON.search(text[:MAX_SCAN])
    return (m["v"] or m["v2"] or ("3." + m["v3"] if m["v3"] else None)) if m else None


def _flag_state(name: str, args: dict, refused: bool, suggested: bool) -> Flag:
    table = flags_table()
    releases, flags, renamed = table.get("releases", []), table.get("flags", {}), table.get("renamed", {})
    info = flags.get(name)
    if name in renamed and (info is None or refused):
        return Flag(name, "renamed", new=renamed[name][0], release=renamed[name][1])
    if info is None and not refused:
        return Flag(name, "named")
    if info is None:
        near = difflib.get_close_matches(name, list(flags), 1, 0.75)
        return Flag(name, "unknown", near=near[0] if near else None)
    last, first = info["last"], info["first"]
    if refused:
        if releases and last < len(releases) - 1:
            return Flag(name, "removed", release=releases[last + 1])
        if releases and first > 0:
            return Flag(name, "newer", release=releases[first])
        return Flag(name, "known")
    if info.get("given") is None:          # a flag with a value: whether the run's value was the wrong one is unknown
        return Flag(name, "named")
    printed = args.get(info["dest"]) if args else None
    if printed is not None and printed.strip() == str(info["given"]):
        return Flag(name, "given")
    return Flag(name, "fix" if suggested else "named")       # a switch the run did not turn on


_ORDER = ("renamed", "removed", "newer", "unknown", "fix", "known", "named", "given")


def flags_named(words: str, args: dict, refused: frozenset = frozenset()) -> tuple:
    """(every flag named, the one that explains the failure); `refused`: the flags the parser refused."""
    seen, out = set(), []
    for m in _FLAG.finditer(words):
        name = m[0].rstrip("-.")
        if name not in seen and len(seen) < 12:
            seen.add(name)
            suggested = bool(_SUGGESTED.search(words[max(0, m.start() - 40): m.start()]))
            out.append(_flag_state(name, args, name in refused, suggested))
    best = min(out, key=lambda f: _ORDER.index(f.state), default=None)
    return tuple(out), best


def env_named(words: str, ev) -> tuple:
    """The environment variables a message names: ALL_CAPS names said to be environment variables (or looked up
    in os.environ by the frame that raised)."""
    raised = ev.raised_in if ev is not None else None
    in_environ = raised is not None and (raised.file.endswith("/os.py") or bool(_ENV_CODE.search(
        f"{raised.function} {raised.source}")))
    if not (in_environ or _ENV_CONTEXT.search(words)):
        return ()
    names = []
    for m in _ENV_TOKEN.finditer(words):
        name = m[1]
        if ("_" in name or in_environ or re.search(rf"(?:variable|env)\W{{1,3}}{name}\b|\b{name}\W{{1,3}}"
                                                  r"(?:is )?(?:not set|expected|unset)", words)) \
                and name not in names and not name.startswith(("CUDA_ERROR", "NCCL_ERROR", "ERROR")):
            names.append(name)
    return tuple(names[:6])


def stage_of(lines: list, upto: int, stages: tuple) -> tuple:
    """(stage, kind) of the last of [[stage]]'s progress lines before line index `upto`."""
    found = (None, None)
    for _, line in lines[:upto]:
        if len(line) > 400:
            continue
        for st in stages:
            if st["rx"].search(line):
                found = (st["name"], st.get("kind", "training"))
                break
    return found


def _version_tuple(version: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def _words_before_traceback(lines: list, at: int) -> list:
    """The lines printed just before the traceback that ends at line `at` (a program that prints why, then raises)."""
    start = at
    for i in range(at - 1, max(-1, at - fe.MAX_FRAMES * 3), -1):
        if _TRACEBACK in lines[i][1]:
            start = i
            break
    return [line for _, line in lines[max(0, start - BEFORE_TRACEBACK): start] if line.strip()]


def syntax_of(event, syntaxes: tuple) -> tuple | None:
    """(construct, the Python that introduced it) of a SyntaxError's source line: the line printed above its caret
    (or the last context line), matched against causes.toml's [[syntax]] table."""
    context = [line for line in event.context if line.strip()]
    source = next((context[i - 1] for i in range(len(context) - 1, 0, -1) if re.fullmatch(r"\s*\^+\s*", context[i])),
                  context[-1] if context else "")
    for syntax in syntaxes:
        if syntax["rx"].search(source):
            return syntax["name"], syntax["python"]
    return None


def read(text: str, event, *, log=None, lines: list | None = None, stages: tuple = (), roles: tuple = (),
         syntaxes: tuple = ()) -> Reading:
    """The structure of a failure: its first error event `event` (None: the log's last lines), mapped onto the
    run's arguments, the releases' flags and the stage the log had reached."""
    text = text or ""
    lines = lines if lines is not None else fe.unwrap_lines(text, styles=() if log is not None else None)
    at = event.line_no if event is not None else len(lines)
    if event is not None:
        words = "\n".join([*_words_before_traceback(lines, at), *event.context[-3:], event.evidence,
                           *event.continuation])[:MAX_SCAN]
    else:
        words = "\n".join([line for _, line in lines if line.strip()][-LAST_WORDS:])[:MAX_SCAN]
    own = "\n".join([event.evidence, *event.continuation]) if event is not None else words
    args = arguments_of(text, log)
    stage, log_kind = stage_of(lines, at, stages)
    if event is not None and event.program and "preprocess" in event.program:
        log_kind = "preprocess"
    code, name, strerror = _errno_of(own) if own else (None, None, None)
    if code is None:
        code, name, strerror = _errno_of(words)
    path = _path_of(own)
    role, how = role_of(path, event, args, roles, log_kind, stage)
    library_m = _LIBRARY.search(own)
    library = next((g for g in library_m.groups() if g), None).split(".")[0] if library_m else None
    if library is None and event is not None and event.short_type in ("ImportError", "ModuleNotFoundError") \
            and event.raised_in is not None and (imported := _IMPORT_STATEMENT.match(event.raised_in.source)):
        library = (imported[1] or imported[2]).split(".")[0] or None      # the import statement that failed
    syntax = syntax_of(event, syntaxes) if event is not None and event.short_type == "SyntaxError" else None
    package = package_of(event.raised_in.file) if event is not None and event.raised_in else None
    if event is not None and event.short_type in ("SyntaxError", "IndentationError", "TabError"):
        file = next((m["file"] for line in reversed(event.context) if (m := _SYNTAX_FILE.match(line))), None)
        package = package_of(file) or package
        path = path or file
    oom, numbers = oom_numbers(own)
    cuda = _CUDA_ERROR.search(own)
    driver = _DRIVER_FOUND.search(own) or _DRIVER_FOUND.search(text[:MAX_SCAN])
    smi = _DRIVER_SMI.search(text[:MAX_SCAN])
    torch = version_printed(text, "torch")
    cu = _CU.search(torch or "") or None
    built = _TORCH_BUILT.search(text[:MAX_SCAN])
    unrecognized = re.search(r"unrecognized arguments: (.*)", own) if event is not None and event.kind == "argparse" \
        else None
    refused = frozenset(m[0].rstrip("-.") for m in _FLAG.finditer(unrecognized[1])) if unrecognized else frozenset()
    flags, flag = flags_named(words, args, refused)
    torch_cuda = ("cpu" if cu["cpu"] else f"{cu['cu'][:-1]}.{cu['cu'][-1]}" if cu["cu"] else cu["v"]) if cu else \
        ("cpu" if built["v"] == "None" else built["v"]) if built else None
    driver_cuda = f"{int(driver['v']) // 1000}.{int(driver['v']) % 1000 // 10}" if driver else smi["v"] if smi else None
    too_old = driver is not None or (driver_cuda is not None and torch_cuda not in (None, "cpu")
                                     and _version_tuple(driver_cuda) < _version_tuple(torch_cuda))
    return Reading(
        errno=code, errno_name=name, strerror=strerror, path=path, role=role, role_how=how, package=package,
        library=library, stdlib=bool(library and library in sys.stdlib_module_names),
        version=version_printed(text, library or package) if (library or package) else None,
        python=python_version(text, event), world_size=args.get("world_size"),
        torch=torch, torch_cuda=torch_cuda, driver_cuda=driver_cuda, driver_too_old=too_old,
        cuda_error=(next(g for g in cuda.groups() if g).strip() if cuda else None),
        env=env_named(own if event is not None else words, event), flags=flags, flag=flag, oom=oom,
        oom_numbers=numbers, reached=stage, log_kind=log_kind, words=words,
        syntax_feature=syntax[0] if syntax else None, syntax_python=syntax[1] if syntax else None)
