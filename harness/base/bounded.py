"""Running a command in a child process under budgets: an address-space and CPU-time rlimit set in the child, a
wall-clock budget enforced from the parent by killing the child's process group, and Ctrl-C / SIGTERM reaching the
parent, which kills the child and stops. What came back, or which budget ended it, in `Bounded`.

The child is a fresh interpreter (`run_bounded`), or a fork of this process (`fork_bounded`): what this process
imported is there at once, so a fork of a pre-imported process (the session's fork server) skips seconds of imports;
the budgets are the same, set in the child before it runs anything of the caller's."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from harness.base.paths import REPO, STOP_SIGNALS, stop_signals_to

KILLED_GRACE_S = 5.0   # fork_bounded: how long a killed child's pipes may stay open before they are left unread


@dataclass(frozen=True)
class Bounded:
    returncode: int | None
    out: str = ""
    err: str = ""
    over: str = ""              # which budget ended it, in words ("" when it ended on its own)
    stopped_by: int | None = None  # the signal (SIGINT/SIGTERM) that stopped the parent's wait


def _set_limits(budget_s: float, address_space: int) -> None:
    """In the child: RLIMIT_AS `address_space` bytes (never above a hard limit already set) and RLIMIT_CPU."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:
        address_space = min(address_space, hard)
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    cpu = int(budget_s) + 5
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))


def _kill_group(pid: int) -> None:
    """SIGKILL the child's process group, and the child itself (a fork not yet in its own session has none)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _outcome(returncode: int, out: bytes, err: bytes, over: str, budget_mb: int, ok_codes) -> Bounded:
    """The child's result; an exit outside `ok_codes` is reported as the address-space budget or a crash."""
    text_err = err.decode("utf-8", "replace")
    if not over and returncode not in ok_codes:
        died = f"signal {-returncode}" if returncode < 0 else f"exit {returncode}"
        tail = text_err.strip().splitlines()[-1:]
        over = (f"it ended with {died} (over its {budget_mb} MB address-space budget, or a crash"
                f"{': ' + tail[0][:200] if tail else ''})")
    return Bounded(returncode, out.decode("utf-8", "replace"), text_err, over)


def run_bounded(argv: list[str], budget_s: float, budget_mb: int, ok_codes=(0, 1)) -> Bounded:
    """Run `argv` (this checkout's harness importable) under the budgets; an exit outside `ok_codes` is reported as
    the address-space budget or a crash, with the last line of its stderr."""
    limit = int(budget_mb) << 20
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    procs: list = []
    stopped: list[int] = []

    def kill() -> None:
        for proc in procs:
            _kill_group(proc.pid)

    def on_signal(signum, frame):
        stopped.append(signum)
        kill()
        raise KeyboardInterrupt

    over = ""
    try:
        main = threading.current_thread() is threading.main_thread()   # signal handlers: the main thread only
        with stop_signals_to(on_signal) if main else contextlib.nullcontext():   # before the child starts
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          start_new_session=True, preexec_fn=lambda: _set_limits(budget_s, limit),
                                          env=env))
            try:
                out, err = procs[0].communicate(timeout=budget_s)
            except subprocess.TimeoutExpired:
                kill()
                out, err = procs[0].communicate()
                over = f"it ran past its {budget_s:g} s budget"
    except KeyboardInterrupt:
        kill()
        for proc in procs:
            proc.wait()
        return Bounded(None, stopped_by=stopped[0] if stopped else signal.SIGINT)
    return _outcome(procs[0].returncode, out, err, over, budget_mb, ok_codes)


def python_module(module: str, argv: list[str]) -> list[str]:
    """`python -m module argv...` with this interpreter."""
    return [sys.executable, "-m", module, *argv]


def mapped_bytes() -> int:
    """This process's address space in bytes (VmSize, what RLIMIT_AS counts); 0 where /proc does not say."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def fork_bounded(func: Callable[[], int | None], budget_s: float, budget_mb: int, ok_codes=(0, 1)) -> Bounded:
    """run_bounded for `func()` in a fork of this process instead of a fresh interpreter.

    The child gets its own session (process group), /dev/null as stdin, pipes as stdout and stderr (what comes back
    as out and err), the default Ctrl-C and SIGTERM, then the rlimits: CPU time as run_bounded's, address space
    `budget_mb` on top of what this process maps already (a fresh interpreter spends part of its budget on its
    imports; a fork has them mapped). Then func runs; its return value (or SystemExit's) is the exit status, an
    exception prints its traceback and exits 1, as an interpreter would; the child never returns to the caller's
    code. Call it from a process with one thread: a fork copies only the calling thread."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    stopped: list[int] = []
    pids: list[int] = []

    def on_signal(signum, frame):
        stopped.append(signum)
        for pid in pids:
            _kill_group(pid)
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    try:
        with stop_signals_to(on_signal) if main else contextlib.nullcontext():   # before the child starts
            held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)   # until the child is known to on_signal
            try:
                pid = os.fork()
                if pid == 0:
                    _bounded_child(func, budget_s, (int(budget_mb) << 20) + mapped_bytes(), out_w, err_w,
                                   (out_r, err_r), held)
                pids.append(pid)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            os.close(out_w)
            os.close(err_w)
            out, err, over = _collect(pid, out_r, err_r, budget_s)
            returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            pids.clear()   # reaped: its pid may be another process's from now on
    except KeyboardInterrupt:
        for pid in pids:
            _kill_group(pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        return Bounded(None, stopped_by=stopped[0] if stopped else signal.SIGINT)
    finally:
        for fd in (out_r, err_r, out_w, err_w):
            with contextlib.suppress(OSError):
                os.close(fd)
    return _outcome(returncode, out, err, over, budget_mb, ok_codes)


def _collect(pid: int, out_fd: int, err_fd: int, budget_s: float) -> tuple[bytes, bytes, str]:
    """Read the child's stdout and stderr to their end; past the wall-clock budget, kill its group first."""
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    open_fds, over = [out_fd, err_fd], ""
    deadline = time.monotonic() + budget_s
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0 and not over:
            _kill_group(pid)
            over = f"it ran past its {budget_s:g} s budget"
        ready, _, _ = select.select(open_fds, [], [], max(left, 0) if not over else KILLED_GRACE_S)
        if over and not ready:   # killed, and a process that left its group still holds a pipe: stop reading
            break
        for fd in ready:
            data = os.read(fd, 1 << 16)
            if data:
                chunks[fd].append(data)
            else:
                open_fds.remove(fd)
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), over


def _bounded_child(func, budget_s: float, address_space: int, out_w: int, err_w: int, parent_fds, mask) -> None:
    """In fork_bounded's child: its own session, its streams, its limits, then func; never returns."""
    code = 1
    try:
        os.setsid()
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)   # blocked by the parent around the fork: unblocked
        for fd in parent_fds:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (out_w, 1), (err_w, 2)):
            os.dup2(fd, target)
            os.close(fd)
        # the caller's sys.stdout may be another object (a test's capture): the child's are its fds 1 and 2
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
        _set_limits(budget_s, address_space)
        code = _status(func())
    except SystemExit as exc:
        code = _status(exc.code)
    except BaseException:  # noqa: BLE001 - printed as an interpreter would, then exit 1
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _status(value) -> int:
    """sys.exit(value)'s exit status: None -> 0, an int as is, anything else printed to stderr -> 1."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    with contextlib.suppress(BaseException):
        print(value, file=sys.stderr)
    return 1
