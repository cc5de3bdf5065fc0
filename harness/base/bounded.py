"""Running a command in a child process under budgets: an address-space and CPU-time rlimit set in the child, a
wall-clock budget enforced from the parent by killing the child's process group, and Ctrl-C / SIGTERM reaching the
parent, which kills the child and stops. What came back, or which budget ended it, in `Bounded`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

from harness.base.paths import REPO, stop_signals_to


@dataclass(frozen=True)
class Bounded:
    returncode: int | None
    out: str = ""
    err: str = ""
    over: str = ""              # which budget ended it, in words ("" when it ended on its own)
    stopped_by: int | None = None  # the signal (SIGINT/SIGTERM) that stopped the parent's wait


def run_bounded(argv: list[str], budget_s: float, budget_mb: int, ok_codes=(0, 1)) -> Bounded:
    """Run `argv` (this checkout's harness importable) under the budgets; an exit outside `ok_codes` is reported as
    the address-space budget or a crash, with the last line of its stderr."""
    limit = int(budget_mb) << 20

    def limits() -> None:   # in the child, before it runs anything
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cpu = int(budget_s) + 5
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    procs: list = []
    stopped: list[int] = []

    def kill() -> None:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def on_signal(signum, frame):
        stopped.append(signum)
        kill()
        raise KeyboardInterrupt

    over = ""
    try:
        main = threading.current_thread() is threading.main_thread()   # signal handlers: the main thread only
        with stop_signals_to(on_signal) if main else contextlib.nullcontext():   # before the child starts
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          start_new_session=True, preexec_fn=limits, env=env))
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
    proc = procs[0]
    text_err = err.decode("utf-8", "replace")
    if not over and proc.returncode not in ok_codes:
        died = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
        tail = text_err.strip().splitlines()[-1:]
        over = (f"it ended with {died} (over its {budget_mb} MB address-space budget, or a crash"
                f"{': ' + tail[0][:200] if tail else ''})")
    return Bounded(proc.returncode, out.decode("utf-8", "replace"), text_err, over)


def python_module(module: str, argv: list[str]) -> list[str]:
    """`python -m module argv...` with this interpreter."""
    return [sys.executable, "-m", module, *argv]
