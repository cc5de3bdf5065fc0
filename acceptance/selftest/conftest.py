"""Self-test isolation: a test leaves the process's signal handling as it found it.

The self-tests share worker processes (pytest-xdist, `-n auto`), so a test that left Ctrl-C ignored would make a
later test in the same worker fail far from the cause (a launched stage never interrupted; a `grade` subprocess,
which inherits an ignored SIGINT, never stopping). Each test's signal state (handlers, ignored and blocked
masks) is put back after it, with a warning that names the test that changed it.
"""

from __future__ import annotations

import signal
import warnings
from pathlib import Path

import pytest

from harness.run import launch

SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
