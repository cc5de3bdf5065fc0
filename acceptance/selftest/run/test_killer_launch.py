"""The stage killer (harness.run.launch.run_stage) against processes that try to outlive their stage.

Real subprocesses, fast (a short grace period): a grandchild that calls setsid (leaves the stage's process group
and session, so killpg cannot reach it) AND ignores SIGTERM must still be dead when run_stage returns, whether the
stage timed out, stalled, was cancelled or exited cleanly. Also a child that ignores SIGTERM inside the group, and
the grace period's edge (SIGKILL only after the grace period).
"""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time

import psutil
import pytest

from harness.run.launch import StageSpec, run_stage

GRACE_S = 0.4

# the stage's child: starts a grandchild that leaves the group (setsid), ignores SIGTERM, writes its pid, sleeps;
# then prints, and either sleeps (timeout/stall/cancel) or exits at once (clean exit) once the scan has seen it
STUBBORN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    code = ("import os, signal, sys, time\\n"
            "os.setsid()\\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
            "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\\n"
            "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\\n"
            "time.sleep(600)\\n")
    child = subprocess.Popen([sys.executable, "-c", code, sys.argv[1]],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    print("escaped", child.pid, flush=True)
    if sys.argv[2] == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.argv[2] == "exit":
        time.sleep(1.0)            # long enough for the stage's process scan (every 0.25 s) to see the grandchild
        sys.exit(0)
    if sys.argv[2] == "quiet":
        time.sleep(600)
    while True:
        print("working", flush=True)
        time.sleep(0.05)
""")


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def alive(pid: int, settle_s: float = 2.0) -> bool:
    """Still running `settle_s` after the stage ended (SIGKILL is delivered asynchronously: run_stage sends it and
    returns without waiting for a process outside its group, so a few milliseconds of 'running' are allowed)."""
    deadline = time.monotonic() + settle_s
    while running(pid):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def reap():
    """pids to SIGKILL after the test whatever it found (a failing test leaves no process behind)."""
    pids = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass


def stubborn_stage(tmp_path, mode: str, **limits):
    pidfile = tmp_path / f"{mode}.pid"
    spec = StageSpec(f"stage-{mode}", (sys.executable, "-c", STUBBORN, str(pidfile), mode), **limits)
    return spec, pidfile


def grandchild(pidfile) -> int:
    return int(pidfile.read_text())


@pytest.mark.parametrize("mode", ["busy", "ignore-term"])
def test_escaped_sigterm_ignoring_grandchild_dies_with_a_timed_out_stage(tmp_path, reap, mode):
    spec, pidfile = stubborn_stage(tmp_path, mode, timeout_s=2.0)
    result = run_stage(spec, tmp_path, kill_grace_s=GRACE_S)
    pid = grandchild(pidfile)
    reap.append(pid)
    assert result.timed_out and result.returncode == -1
    assert pid in result.pids_seen
    assert not alive(pid), f"grandchild {pid} (setsid, SIGTERM ignored) outlived its timed-out stage"
    assert not any(alive(p) for p in result.pids_seen)


def test_escaped_sigterm_ignoring_grandchild_dies_after_a_clean_exit(tmp_path, reap):
    spec, pidfile = stubborn_stage(tmp_path, "exit", timeout_s=30.0)
    result = run_stage(spec, tmp_path, kill_grace_s=GRACE_S)
    pid = grandchild(pidfile)
    reap.append(pid)
    assert result.returncode == 0 and not result.timed_out
    assert not alive(pid), f"grandchild {pid} (setsid, SIGTERM ignored) outlived its finished stage"


def test_escaped_sigterm_ignoring_grandchild_dies_with_a_stalled_stage(tmp_path, reap):
    spec, pidfile = stubborn_stage(tmp_path, "quiet", timeout_s=30.0, stall_timeout_s=1.0)
    result = run_stage(spec, tmp_path, kill_grace_s=GRACE_S)
    pid = grandchild(pidfile)
    reap.append(pid)
    assert result.stalled and result.returncode == -1
    assert not alive(pid)


def test_escaped_sigterm_ignoring_grandchild_dies_with_a_cancelled_stage(tmp_path, reap):
    spec, pidfile = stubborn_stage(tmp_path, "busy", timeout_s=30.0)
    cancel = threading.Event()
    timer = threading.Timer(1.5, cancel.set)
    timer.start()
    try:
        result = run_stage(spec, tmp_path, kill_grace_s=GRACE_S, cancel=cancel)
    finally:
        timer.cancel()
    pid = grandchild(pidfile)
    reap.append(pid)
    assert result.interrupted and not alive(pid)


def test_sigkill_comes_only_after_the_grace_period(tmp_path, reap):
    """A child ignoring SIGTERM is killed no sooner than the grace period after the stage's end, and not much later."""
    grace = 1.2
    spec, pidfile = stubborn_stage(tmp_path, "ignore-term", timeout_s=1.5)
    started = time.monotonic()
    result = run_stage(spec, tmp_path, kill_grace_s=grace)
    took = time.monotonic() - started
    reap.append(grandchild(pidfile))
    assert result.timed_out and not alive(grandchild(pidfile))
    assert result.duration_s >= 1.5 + grace - 0.1, result.duration_s      # waited the grace period out
    assert took < 1.5 + grace + 4.0, took                                     # then killed, no long hang
