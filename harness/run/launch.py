"""Run one pipeline stage as a subprocess: a log file, a result object, and no process left behind.

The torchtitan rule: a timeout never reaches the caller as an exception; it is ``returncode=-1`` with
``timed_out=True``. The child starts in its own session, so the whole process group (torchrun, its workers,
Megatron's async checkpoint writer) is killed on timeout, on stall, and when the caller is interrupted.

Follow the trainer's process tree (for the NVML sampler) through ``on_start``::

    started = {}
    with NvmlSampler(lambda: started.get("pid")) as sampler:
        result = run_stage(spec, run_dir, on_start=lambda popen: started.update(pid=popen.pid))
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, TextIO

import psutil

# the helpers the trainer shares with the launcher live below both (harness.base.proc); importable from here too
from harness.base.errors import Interrupted
from harness.base.proc import _alive, pid_alive  # noqa: F401

TAIL_LINES = 50            # lines kept in StageResult.tail (torchtitan shows 50)
MESSAGE_TAIL_LINES = 20    # lines quoted in a failure message
KILL_GRACE_S = 5.0         # SIGTERM, then this long, then SIGKILL
PID_SCAN_INTERVAL_S = 0.25
POLL_S = 0.05
NOT_STARTED = 127          # returncode when the program could not be started (a shell's "command not found")
READER_JOIN_S = 5.0       # after the root exits, wait this long for orphans to close the pipe
_NO_LINE = object()

DATASET_MARKER = "> building train, validation, and test datasets for BERT ..."

# Message templates: the self-tests match these, so wording changes in one place.
FAILED_EXIT = "stage '{name}' failed: exit code {returncode} after {duration:.1f} s"
FAILED_TIMEOUT = "stage '{name}' failed: timed out after {duration:.1f} s (limit {limit:g} s); process group killed"
FAILED_STALL = ("stage '{name}' failed: stalled, no output for {stall:g} s{after} "
                "(after {duration:.1f} s in total); process group killed")
FAILED_INTERRUPT = "stage '{name}' failed: interrupted by the caller after {duration:.1f} s; process group killed"
ARTIFACTS = "artifacts kept in {run_dir} (log: {log_path})"

@dataclass(frozen=True)
class StageSpec:
    """What to run for one stage: an argument list (never a shell string) and its limits."""

    name: str
    argv: tuple[str, ...]
    timeout_s: float
    env: Mapping[str, str] | None = None      # merged over base_env; PYTHONUNBUFFERED=1 unless set
    base_env: Mapping[str, str] | None = None  # None: os.environ when the stage starts
    cwd: str | os.PathLike | None = None
    stall_timeout_s: float | None = None      # kill when no new output line for this long
    stall_after_marker: str | None = None     # ... counted only once a line containing this appeared
    stall_quiet_marker: str | None = None     # ... and not while the last line contains this

    def __post_init__(self):
        """Refuse a shell string and freeze argv as a tuple."""
        if isinstance(self.argv, (str, bytes)):
            raise TypeError(f"StageSpec {self.name!r}: argv must be a list of arguments, not a shell string")
        object.__setattr__(self, "argv", tuple(str(a) for a in self.argv))
        if not self.argv:
            raise ValueError(f"StageSpec {self.name!r}: argv is empty")
        if not self.timeout_s > 0:
            raise ValueError(f"StageSpec {self.name!r}: timeout_s must be > 0, got {self.timeout_s!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise ValueError(f"StageSpec name {self.name!r} must be usable as a file name ([A-Za-z0-9_.-])")


@dataclass(frozen=True)
class StageResult:
    """How one stage ended; never raised, always returned."""

    name: str
    argv: tuple[str, ...]
    returncode: int               # -1 on timeout, stall or interrupt
    timed_out: bool
    stalled: bool
    interrupted: bool
    duration_s: float
    log_path: Path
    run_dir: Path
    tail: tuple[str, ...]         # last TAIL_LINES lines of the merged output
    pids_seen: tuple[int, ...]    # every pid seen in the stage's process tree; its root always (a forked stage
                                  # may be gone before the first look)
    timeout_s: float = 0.0
    stall_timeout_s: float | None = None
    stall_after_marker: str | None = None
    started_at: float | None = None   # time.monotonic() when the stage started (None: not recorded)

    @property
    def ok(self) -> bool:
        """True when the stage exited 0 on its own."""
        return self.returncode == 0 and not (self.timed_out or self.stalled or self.interrupted)

    def headline(self) -> str:
        """One line: which stage failed and how."""
        if self.stalled:
            after = f" once {self.stall_after_marker!r} appeared" if self.stall_after_marker else ""
            return FAILED_STALL.format(name=self.name, stall=self.stall_timeout_s or 0, after=after,
                                       duration=self.duration_s)
        if self.timed_out:
            return FAILED_TIMEOUT.format(name=self.name, duration=self.duration_s, limit=self.timeout_s)
        if self.interrupted:
            return FAILED_INTERRUPT.format(name=self.name, duration=self.duration_s)
        return FAILED_EXIT.format(name=self.name, returncode=self.returncode, duration=self.duration_s)

    def failure_message(self) -> str:
        """What failed, the command, where the artifacts are, the last log lines and (if known) the remedy."""
        lines = [self.headline(), "command: " + " ".join(self.argv),
                 ARTIFACTS.format(run_dir=self.run_dir, log_path=self.log_path),
                 f"last {min(MESSAGE_TAIL_LINES, len(self.tail))} log lines:"]
        lines += ["  | " + line for line in self.tail[-MESSAGE_TAIL_LINES:]]
        diagnosis = self._diagnosis()
        if diagnosis is not None:
            lines += [f"likely cause [{diagnosis.cause_id}]: {diagnosis.cause}", f"remedy: {diagnosis.remedy}"]
        return "\n".join(lines)

    def _diagnosis(self):
        """The diagnose table's verdict on the full log, or None."""
        from harness.evidence.diagnose import diagnose  # late: diagnose is optional for the launcher

        return diagnose(self.name, self.returncode, _read_log(self.log_path), timed_out=self.timed_out,
                        stalled=self.stalled, duration_s=self.duration_s, argv=self.argv)


def _read_log(path: Path, limit: int = 4_000_000) -> str:
    """The last `limit` bytes of a log, decoded leniently; empty when missing."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - limit))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def current_pids(handle) -> frozenset[int]:
    """Live pids of a process tree: `handle` is a pid, a Popen, or a StageResult (its pids still alive)."""
    if handle is None:
        return frozenset()
    if isinstance(handle, StageResult):
        return frozenset(pid for pid in handle.pids_seen if pid_alive(pid))
    pid = getattr(handle, "pid", handle)
    try:
        root = psutil.Process(int(pid))
        kids = root.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError, TypeError):
        return frozenset()
    return frozenset([root.pid] + [k.pid for k in kids])


class _Tree:
    """Every process seen under the stage's root, kept as psutil objects so pid reuse cannot fool us."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pgid = popen.pid           # start_new_session=True: leader pid == pgid
        self.seen: dict[int, psutil.Process] = {}
        self.scan()

    def scan(self) -> None:
        """Record the root and its current descendants."""
        try:
            root = psutil.Process(self.popen.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            self.seen.setdefault(proc.pid, proc)

    def live(self) -> list[psutil.Process]:
        """Seen processes still running (escaped the group or not)."""
        return [p for p in self.seen.values() if _alive(p)]

    def signal_all(self, sig: int) -> None:
        """Send `sig` to the process group and to every seen process still alive."""
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for proc in self.live():
            try:
                proc.send_signal(sig)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass

    def group_alive(self) -> bool:
        """Some non-zombie process is still in the stage's process group."""
        for proc in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(proc.pid) == self.pgid and _alive(proc):
                    return True
            except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
                continue
        return False

    def kill(self, grace_s: float) -> None:
        """SIGTERM everything, wait up to `grace_s`, then SIGKILL what is left; reap the root."""
        self.scan()
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self.popen.poll()
            if not self.live() and not self.group_alive():
                break
            time.sleep(POLL_S)
        else:
            self.signal_all(signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        """Wait for the root so it leaves no zombie."""
        try:
            self.popen.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def _reader(stream, lines: queue.Queue) -> None:
    """Read the child's merged output line by line into a queue; None marks end of output."""
    try:
        for raw in iter(stream.readline, b""):
            lines.put(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
    finally:
        lines.put(None)


def _child_env(env: Mapping[str, str] | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """base (default os.environ) plus the stage's variables; Python children unbuffered so lines arrive live."""
    merged = dict(os.environ if base is None else base)
    merged.update(env or {})
    merged.setdefault("PYTHONUNBUFFERED", "1")
    return merged


class _Watch:
    """Deadline and stall bookkeeping for one running stage."""

    def __init__(self, spec: StageSpec, start: float):
        self.spec = spec
        self.deadline = start + spec.timeout_s
        self.armed = spec.stall_after_marker is None
        self.quiet = False
        self.last_line_at = start

    def saw_line(self, line: str, now: float) -> None:
        """A new output line resets the stall clock and may arm it or stop it (until the next line)."""
        self.last_line_at = now
        self.quiet = self.spec.stall_quiet_marker is not None and self.spec.stall_quiet_marker in line
        if not self.armed and self.spec.stall_after_marker in line:
            self.armed = True

    def verdict(self, now: float) -> str | None:
        """'timeout', 'stall' or None."""
        if now >= self.deadline:
            return "timeout"
        stall = self.spec.stall_timeout_s
        if stall is not None and self.armed and not self.quiet and now - self.last_line_at >= stall:
            return "stall"
        return None


class _SignalState:
    """Shared by nested `signals_interrupt` blocks: how deep, and whether a signal already fired."""

    depth = 0
    fired: str | None = None


def _raise_interrupted(signum, frame) -> None:
    """Signal handler: the first SIGINT/SIGTERM raises Interrupted; later ones wait while the cleanup runs."""
    if _SignalState.fired:
        return  # already stopping: a second Ctrl-C must not cut the process-tree kill short
    _SignalState.fired = signal.Signals(signum).name
    raise Interrupted(_SignalState.fired)


@contextmanager
def signals_interrupt():
    """While inside, SIGINT and SIGTERM raise `Interrupted` in the main thread (elsewhere: no change).

    SIGTERM's default would kill Python on the spot, leaving the children (each in its own session) running.
    A signal the process ignores (SIG_IGN, e.g. under nohup) stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, _raise_interrupted)
    _SignalState.depth += 1
    try:
        yield
    finally:
        _SignalState.depth -= 1
        if _SignalState.depth == 0:
            _SignalState.fired = None
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def run_stage(spec: StageSpec, run_dir: str | os.PathLike, on_line: Callable[[str], None] | None = None,
              on_start: Callable[[subprocess.Popen], None] | None = None, *,
              kill_grace_s: float = KILL_GRACE_S, reraise_interrupt: bool = True,
              cancel: threading.Event | None = None, spawner: Callable | None = None) -> StageResult:
    """Run `spec`, log its merged output to run_dir/<name>.log, and return how it ended.

    Timeouts and stalls come back as returncode -1. A KeyboardInterrupt (SIGINT or SIGTERM in the main thread)
    or an exception raised by a callback kills the process tree first and is then re-raised
    (``reraise_interrupt=False`` returns ``interrupted=True`` for a KeyboardInterrupt instead). Setting
    `cancel` from another thread stops the stage the same way and returns ``interrupted=True``.
    `spawner(argv, env, cwd)` may start the stage instead of subprocess.Popen (harness.run.forkserver: a fork of
    a pre-imported server, its own session all the same); when it returns None, Popen starts it.
    """
    with signals_interrupt():
        return _run_stage(spec, Path(run_dir), on_line, on_start, kill_grace_s, reraise_interrupt, cancel, spawner)


def _start(spec: StageSpec, spawner: Callable | None):
    """The stage's process: forked by the spawner when it takes it, else a fresh one in its own session."""
    env = _child_env(spec.env, spec.base_env)
    popen = spawner(spec.argv, env, spec.cwd) if spawner is not None else None
    if popen is not None:
        return popen
    return subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=spec.cwd, env=env, start_new_session=True)


def _run_stage(spec: StageSpec, run_dir: Path, on_line, on_start, kill_grace_s: float, reraise_interrupt: bool,
               cancel: threading.Event | None, spawner: Callable | None = None) -> StageResult:
    """run_stage's body, inside the signal handlers."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / f"{spec.name}.log"
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    printer = on_line if isinstance(on_line, ProgressPrinter) else None
    if printer:
        printer.stage_started(spec, log_path)
        on_line = printer.for_stage(spec.name)  # the stage's own name on its lines, whatever runs beside it
    start = time.monotonic()
    try:
        popen = _start(spec, spawner)
    except OSError as exc:
        return _not_started(spec, run_dir, log_path, start, exc, printer)
    tree = _Tree(popen)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_reader, args=(popen.stdout, lines), daemon=True, name=f"stage-{spec.name}")
    reader.start()
    outcome = None
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            if on_start is not None:
                on_start(popen)
            outcome = _pump(popen, tree, spec, start, lines, log, tail, on_line, cancel)
        except KeyboardInterrupt:
            if reraise_interrupt:
                raise
            outcome = "interrupt"
        finally:
            tree.kill(kill_grace_s)  # always, even after a clean exit: no orphan outlives its stage
            _close_output(reader, popen, lines, log, tail)
    result = StageResult(
        name=spec.name, argv=spec.argv, returncode=-1 if outcome else popen.returncode,
        timed_out=outcome == "timeout", stalled=outcome == "stall", interrupted=outcome == "interrupt",
        duration_s=time.monotonic() - start, log_path=log_path, run_dir=run_dir, tail=tuple(tail),
        pids_seen=tuple(sorted({*tree.seen, popen.pid})), timeout_s=spec.timeout_s, stall_timeout_s=spec.stall_timeout_s,
        stall_after_marker=spec.stall_after_marker, started_at=start)
    if printer:
        printer.stage_finished(result)
    return result


def _not_started(spec: StageSpec, run_dir: Path, log_path: Path, start: float, exc: OSError,
                 printer: "ProgressPrinter | None") -> StageResult:
    """A stage whose program could not be started (missing executable, bad cwd): exit code 127, like a shell."""
    line = f"cannot start {spec.argv[0]!r}: {exc.__class__.__name__}: {exc}"
    log_path.write_text(line + "\n", encoding="utf-8")
    result = StageResult(name=spec.name, argv=spec.argv, returncode=NOT_STARTED, timed_out=False, stalled=False,
                         interrupted=False, duration_s=time.monotonic() - start, log_path=log_path, run_dir=run_dir,
                         tail=(line,), pids_seen=(), timeout_s=spec.timeout_s, started_at=start)
    if printer:
        printer.stage_finished(result)
    return result


def _close_output(reader: threading.Thread, popen, lines: queue.Queue, log, tail: deque) -> None:
    """After the kill: let the reader hit end of output, log its last lines (no callback), close the pipe."""
    reader.join(READER_JOIN_S)
    _drain(lines, log, tail, None)
    if not reader.is_alive():
        popen.stdout.close()


def _pump(popen, tree: _Tree, spec: StageSpec, start: float, lines: queue.Queue, log, tail: deque,
          on_line, cancel: threading.Event | None = None) -> str | None:
    """Copy output lines to the log until the child is done; return 'timeout', 'stall', 'interrupt' or None."""
    watch = _Watch(spec, start)
    next_scan = start + PID_SCAN_INTERVAL_S
    exited_at = None
    while True:
        try:
            line = lines.get(timeout=POLL_S)
        except queue.Empty:
            line = _NO_LINE
        now = time.monotonic()
        if line is None:
            break
        if line is not _NO_LINE:
            _emit(line, log, tail, on_line)
            watch.saw_line(line, now)
        if now >= next_scan:
            tree.scan()
            next_scan = now + PID_SCAN_INTERVAL_S
        if cancel is not None and cancel.is_set():
            return "interrupt"
        verdict = watch.verdict(now)
        if verdict:
            return verdict
        if popen.poll() is not None:
            exited_at = exited_at or now
            if now - exited_at > READER_JOIN_S:
                break  # the root is gone but an orphan still holds the pipe: the finally kills it
    _drain(lines, log, tail, on_line)
    return None


def _emit(line: str, log, tail: deque, on_line) -> None:
    """Write one line to the log (flushed, so `tail -f` works), the tail, and the callback."""
    log.write(line + "\n")
    log.flush()
    tail.append(line)
    if on_line is not None:
        on_line(line)


def _drain(lines: queue.Queue, log, tail: deque, on_line) -> None:
    """Log whatever the reader queued after the end marker was seen or the root exited."""
    while True:
        try:
            line = lines.get_nowait()
        except queue.Empty:
            return
        if line is not None:
            _emit(line, log, tail, on_line)


# ---- live progress ---------------------------------------------------------------------------------------------

ITERATION_RE = re.compile(r"\biteration\s+(?P<it>\d+)\s*/\s*(?P<total>\d+)\s*\|")
ELAPSED_RE = re.compile(r"elapsed time per iteration \(ms\):\s*(?P<ms>[0-9.]+)")
LM_LOSS_RE = re.compile(r"\blm loss:\s*(?P<loss>[-+0-9.eE]+)")


def condense_iteration(stage: str, line: str) -> str | None:
    """`[train] iter 120/200 | lm loss 8.41 | 9.8 ms/iter` for a Megatron iteration line, else None."""
    it = ITERATION_RE.search(line)
    if not it:
        return None
    loss = LM_LOSS_RE.search(line)
    elapsed = ELAPSED_RE.search(line)
    parts = [f"[{stage}] iter {int(it['it'])}/{int(it['total'])}",
             f"lm loss {float(loss['loss']):.2f}" if loss else "lm loss -- (step skipped)"]
    if elapsed:
        parts.append(f"{float(elapsed['ms']):g} ms/iter")
    return " | ".join(parts)


class ProgressPrinter:
    """An `on_line` callback that shows stage start/end and condensed iteration lines on the real terminal.

    One printer may serve stages running at once: run_stage labels each stage's lines through `for_stage`.
    """

    def __init__(self, stream: TextIO | None = None, label: str = "stage"):
        self.stream = stream
        self.label = label
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        """Write past pytest's capture (sys.__stderr__) unless a stream was given; one whole line at a time."""
        stream = self.stream or sys.__stderr__ or sys.stderr
        with self._lock:
            stream.write(text + "\n")
            stream.flush()

    def stage_started(self, spec: StageSpec, log_path: Path) -> None:
        """Announce a stage with its limit and log file."""
        self._write(f"[{spec.name}] started (limit {spec.timeout_s:g} s), log: {log_path}")

    def stage_finished(self, result: StageResult) -> None:
        """Announce how the stage ended."""
        end = (f"finished: exit 0 in {result.duration_s:.1f} s" if result.ok else result.headline())
        self._write(f"[{result.name}] {end}")

    def note(self, text: str) -> None:
        """A line of the caller's own (e.g. where an interrupted session left its files)."""
        self._write(text)

    def line(self, stage: str, line: str) -> None:
        """Print `stage`'s iteration lines condensed, labelled with `stage`; ignore everything else."""
        short = condense_iteration(stage, line)
        if short:
            self._write(short)

    def for_stage(self, stage: str) -> Callable[[str], None]:
        """The on_line callback of one stage: its lines carry its own name."""
        return lambda line: self.line(stage, line)

    def __call__(self, line: str) -> None:
        """Print iteration lines condensed under this printer's label."""
        self.line(self.label, line)


def progress_printer(stream: TextIO | None = None) -> ProgressPrinter:
    """A live progress callback for run_stage (default stream: the real terminal's stderr)."""
    return ProgressPrinter(stream)
