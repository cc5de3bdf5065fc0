"""Self-test isolation: a test leaves the process's signal handling as it found it. And the self-tests keep the
bytecode they compile (see pytest_configure).

The self-tests share worker processes (pytest-xdist, `-n auto`), so a test that left Ctrl-C ignored would make a
later test in the same worker fail far from the cause (a launched stage never interrupted; a `grade` subprocess,
which inherits an ignored SIGINT, never stopping). Each test's signal state (handlers, ignored and blocked
masks) is put back after it, with a warning that names the test that changed it.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from pathlib import Path

import pytest

# the helpers beside this file (hostile_checkpoints, process_tags, checkout_stub, grade_snapshot) are imported by the
# tests in every room's folder below it
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.run import launch

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def pytest_configure(config):
    """The self-tests start about 150 Python processes (the CLI, pytest on a recorded log, the trainer on CPU).
    Where PYTHONDONTWRITEBYTECODE is set (many CI images and containers set it), each of them compiled the suite's
    modules again and pytest rewrote every test module again: 6.7 s for one `pytest --from-log` against 2.8 s
    with the bytecode kept. A self-test session keeps it, in the usual (git-ignored) __pycache__ folders; a GPU
    session, which starts few processes, leaves the setting as it is."""
    from harness.plugin.options import selects_gpu

    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not selects_gpu(config.option.markexpr):
        del os.environ["PYTHONDONTWRITEBYTECODE"]      # the processes the tests start
        sys.dont_write_bytecode = False                # and the test modules this process still has to import
    _handle_ctrl_c()


def _handle_ctrl_c() -> None:
    """Give this process Python's Ctrl-C handler when it started with SIGINT ignored.

    A script's background job (`pytest &`, `(bash .ci/run) &`, nohup) starts with SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler: the self-tests that press Ctrl-C (a stage interrupted, an atomic write
    holding it, a `grade` subprocess stopped) saw nothing happen and failed far from the cause, and every process
    they start inherited the ignored signal. With a handler installed here, the children start with SIGINT at its
    default again (exec resets a handled signal, never an ignored one). Measured: the same two Ctrl-C tests failed
    in a background job and passed in the foreground, before this."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _ignored_by_the_kernel() -> int:
    """The process's ignored-signal mask (what a child inherits, whatever Python's own table says)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    return 0


@pytest.fixture(autouse=True)
def _signal_state_restored(request):
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    ignored = _ignored_by_the_kernel()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # this (the main) thread's mask: children inherit it
    state = (launch._SignalState.depth, launch._SignalState.fired)
    yield
    changed = [signal.Signals(sig).name for sig in SIGNALS if signal.getsignal(sig) is not handlers[sig]]
    if _ignored_by_the_kernel() != ignored:
        changed.append("ignored-signal mask")
    if signal.pthread_sigmask(signal.SIG_BLOCK, []) != blocked:
        changed.append("blocked-signal mask")
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if (launch._SignalState.depth, launch._SignalState.fired) != state:
        changed.append("harness.run.launch signal state")
    if changed:
        for sig, handler in handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        launch._SignalState.depth, launch._SignalState.fired = state
        warnings.warn(f"{request.node.nodeid} left {', '.join(changed)} changed; restored for the next test: "
                      f"restore signal handlers in the test (or the code under test) before it returns", stacklevel=1)


@pytest.fixture(scope="session")
def cpu_fork_server():
    """One pre-imported fork server (harness.run.forkserver, as `pytest -m gpu` trains) for the CPU trainings of the
    self-tests that are not about how a process starts: torch and megatron-core are imported once per session (once
    per xdist worker) instead of once per tiny training (5 s each here). Stages it cannot fork start fresh."""
    from harness.run.forkserver import ForkServer

    server = ForkServer.start()
    yield server
    server.close()
