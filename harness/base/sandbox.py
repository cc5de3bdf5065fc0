"""Judging untrusted input in bounded, isolated workers: one forked process per item, in its own process group,
with an address-space rlimit (RLIMIT_AS) and a CPU-time rlimit (RLIMIT_CPU) set in the child before it reads
anything, a wall-clock budget enforced from OUTSIDE (the coordinator SIGKILLs the worker's process group), and
the worker's current phase ("reading ckpt/common.pt") reported to the coordinator through a pipe, so that an
outcome names what it was doing when a budget ended it.

Whatever the worker raises (any BaseException: SystemExit, KeyboardInterrupt or GeneratorExit raised by what it
read included) is that item's outcome, never the coordinator's. Ctrl-C and SIGTERM reach only the coordinator (the
workers are in their own process groups): whatever exception it raises while waiting stops the loop, and every
live worker is SIGKILLed and reaped before the exception goes on.

    outcomes = run_all(items, fn, jobs=2, budget=Budget(60, 3072), on_done=lambda item, outcome: ...)

`fn(item)` runs in the worker and returns something JSON-able; sandbox.phase(text) inside it names the phase.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import time
from dataclasses import dataclass, field

DEFAULT_TIME_S = 120.0        # wall clock per submission (a normal grade takes 1-5 s on one core)
DEFAULT_MEMORY_MB = 3072      # address space per worker (a normal grade: ~0.7 GB virtual with torch, ~0.3 GB RSS)
MAX_MESSAGE_BYTES = 32 << 20  # a worker's report larger than this is its own outcome (the coordinator stays small)
PR_SET_PDEATHSIG = 1
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}

DONE, RAISED, OVER_TIME, OVER_MEMORY, DIED = "done", "raised", "over-time", "over-memory", "died"


@dataclass(frozen=True)
class Budget:
    time_s: float = DEFAULT_TIME_S
    memory_mb: int = DEFAULT_MEMORY_MB

    def words(self) -> str:
        return f"{self.time_s:g} s / {self.memory_mb} MB"


@dataclass
class WorkerOutcome:
    status: str                        # DONE, RAISED, OVER_TIME, OVER_MEMORY, DIED
    value: object = None               # fn's return value (DONE)
    error: str = ""                    # "SystemExit: 2" (RAISED), the signal (DIED)
    phase: str = ""                    # the last phase the worker reported
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == DONE

    def text(self, budget: Budget) -> str:
        """One line for a grade: which budget ended the worker, while doing what."""
        where = f" while {self.phase}" if self.phase else ""
        if self.status == OVER_TIME:
            return f"exceeded {budget.time_s:g} s (wall clock) or its CPU time{where}"
        if self.status == OVER_MEMORY:
            return f"exceeded {budget.memory_mb} MB{where}"
        if self.status == RAISED:
            return f"raised {self.error}{where}"
        if self.status == DIED:
            return f"the worker died ({self.error}){where}"
        return "judged"


_PHASE_FD: list[int] = []   # in a worker: the pipe to the coordinator
_LIBC: list = []            # the C library's handle, opened once by the coordinator (each worker inherits it)


def _libc():
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def phase(text: str) -> None:
    """In a worker: report what it is doing now (one line to the coordinator). Elsewhere: nothing."""
    if _PHASE_FD:
        line = "P " + json.dumps(str(text)[:300]) + "\n"
        try:
            os.write(_PHASE_FD[0], line.encode("utf-8", "surrogateescape"))
        except OSError:
            pass


def _child(fn, item, budget: Budget, wfd: int, mask=()) -> None:
    """In the forked worker: limits first, then fn; never returns."""
    code = 0
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        try:
            _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError, TypeError):
            pass
        limit = int(budget.memory_mb) << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cpu = max(1, int(budget.time_s + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        _PHASE_FD[:] = [wfd]
        try:
            value = fn(item)
            message = "R " + json.dumps(value) + "\n"
        except MemoryError:
            message = "M\n"
        except BaseException as exc:   # noqa: BLE001 - whatever the input raised is this item's outcome
            text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            message = "E " + json.dumps(f"{type(exc).__name__}: {text}" if text else type(exc).__name__) + "\n"
        data = message.encode("utf-8", "surrogateescape")
        view = memoryview(data)
        while view:
            view = view[os.write(wfd, view):]
    except BaseException:   # noqa: BLE001 - a worker never runs the coordinator's code after this point
        code = 70
    finally:
        os._exit(code)


@dataclass
class _Worker:
    item: object
    pid: int
    rfd: int
    started: float
    buffer: bytearray = field(default_factory=bytearray)
    phase: str = ""
    result: WorkerOutcome | None = None


def _kill(worker: _Worker) -> None:
    for target in (lambda: os.killpg(worker.pid, signal.SIGKILL), lambda: os.kill(worker.pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


def _parse(worker: _Worker) -> None:
    """Phase lines and the final message from what the worker wrote so far."""
    while b"\n" in worker.buffer:
        line, _, rest = bytes(worker.buffer).partition(b"\n")
        worker.buffer = bytearray(rest)
        kind, _, payload = line.decode("utf-8", "surrogateescape").partition(" ")
        try:
            if kind == "P":
                worker.phase = str(json.loads(payload))
            elif kind == "R":
                worker.result = WorkerOutcome(DONE, json.loads(payload))
            elif kind == "E":
                worker.result = WorkerOutcome(RAISED, error=str(json.loads(payload)))
            elif kind == "M":
                worker.result = WorkerOutcome(OVER_MEMORY)
        except ValueError:
            worker.result = WorkerOutcome(DIED, error="its report was not readable")


def _finish(worker: _Worker, timed_out: bool, unreaped: list | None = None) -> WorkerOutcome:
    """The worker's outcome; it is killed with its process group first. A worker whose report came needs no exit
    status: with `unreaped` given, its pid goes there to be reaped later (_reap) instead of waiting for its exit."""
    _kill(worker)
    status = 0
    if unreaped is not None and worker.result is not None and not timed_out:
        unreaped.append(worker.pid)
    else:
        try:
            _, status = os.waitpid(worker.pid, 0)
        except ChildProcessError:
            pass
    os.close(worker.rfd)
    outcome = worker.result
    if timed_out:
        outcome = WorkerOutcome(OVER_TIME)
    elif outcome is None:
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        if sig == signal.SIGXCPU:
            outcome = WorkerOutcome(OVER_TIME)
        elif sig in (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS):
            # an allocation refused by RLIMIT_AS inside C code ends as abort/segfault
            outcome = WorkerOutcome(OVER_MEMORY, error=f"signal {sig}")
        else:
            outcome = WorkerOutcome(DIED, error=f"signal {sig}" if sig else f"exit {os.WEXITSTATUS(status)}")
    outcome.phase = worker.phase
    outcome.seconds = time.monotonic() - worker.started
    return outcome


def _reap(pids: list, block: bool = False) -> None:
    """Reap the killed workers in `pids` that have exited (all of them when `block`); the rest stay listed."""
    for pid in list(pids):
        try:
            done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            pids.remove(pid)


def _start(fn, item, budget: Budget) -> _Worker:
    """Fork one bounded worker for `item`."""
    rfd, wfd = os.pipe()
    # Ctrl-C / SIGTERM held while forking: one arriving inside fork's own hooks would be swallowed there
    # ("Exception ignored in _releaseLock"), or the worker would be lost before the caller records it.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            _child(fn, item, budget, wfd, held)
        os.close(wfd)
        try:
            os.setpgid(pid, pid)   # also from here: no window where a kill of its group misses it
        except OSError:
            pass
        return _Worker(item, pid, rfd, time.monotonic())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)   # a held signal acts now (the caller records the worker)


def run_all(items: list, fn, jobs: int, budget: Budget, on_done) -> None:
    """fn(item) for every item, each in its own bounded worker, at most `jobs` at once; on_done(item, WorkerOutcome) in
    this process as each ends. A worker ends when its report has come (it is then killed with its process group,
    and reaped once it has exited, never waited for), when its pipe closes, or when its time is up; the next workers
    are forked before on_done is called, so the cores stay busy while this process records an outcome. Any exception in this process (Ctrl-C, SIGTERM's,
    on_done's) kills every live worker, reaps it, and propagates."""
    pending = list(items)
    live: dict[int, _Worker] = {}
    unreaped: list[int] = []
    jobs = max(1, int(jobs))
    try:
        _libc()
    except OSError:
        pass

    def fill():
        while pending and len(live) < jobs:
            worker = _start(fn, pending.pop(0), budget)
            live[worker.rfd] = worker

    try:
        fill()
        while live:
            now = time.monotonic()
            wait = max(0.0, min(w.started + budget.time_s for w in live.values()) - now)
            ready, _, _ = select.select(list(live), [], [], min(wait, 1.0))
            ended = []
            for rfd in ready:
                worker = live[rfd]
                chunk = os.read(rfd, 1 << 16)
                if chunk:
                    worker.buffer += chunk
                    if len(worker.buffer) > MAX_MESSAGE_BYTES:
                        worker.result = WorkerOutcome(DIED, error=f"its report exceeded {MAX_MESSAGE_BYTES >> 20} MB")
                    else:
                        _parse(worker)
                if not chunk or worker.result is not None:
                    del live[rfd]
                    ended.append((worker, False))
            now = time.monotonic()
            for rfd, worker in list(live.items()):
                if now - worker.started > budget.time_s:
                    del live[rfd]
                    ended.append((worker, True))
            outcomes = [(worker.item, _finish(worker, timed_out, unreaped)) for worker, timed_out in ended]
            fill()
            _reap(unreaped)
            for item, outcome in outcomes:
                on_done(item, outcome)
    finally:
        for worker in live.values():
            _kill(worker)
        for worker in live.values():
            try:
                os.waitpid(worker.pid, 0)
            except ChildProcessError:
                pass
            try:
                os.close(worker.rfd)
            except OSError:
                pass
        _reap(unreaped, block=True)


def run_one(item, fn, budget: Budget) -> WorkerOutcome:
    """run_all for one item: its WorkerOutcome."""
    got: list = []
    run_all([item], fn, 1, budget, lambda _item, outcome: got.append(outcome))
    return got[0]
