"""SIGINT and SIGTERM during a session: every run stops within 10 s, no process is left, the run directory is
kept and named; each progress line carries its own run's name."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from harness.base import paths

STOP_WITHIN_S = 10.0  # every run of the session stopped within 10 s of the signal
EXIT_WITHIN_S = 20.0  # ... and the session process gone too (its interpreter teardown: seconds on a busy host)

# A stand-in trainer: a grandchild, a pid file, then Megatron-style iteration lines with this run's own loss
# forever. With "stubborn" it and its grandchild ignore SIGTERM, so only the SIGKILL after the grace stops them.
FAKE_TRAINER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    pidfile, loss, stubborn = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
    if stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(pidfile, "w").write(f"{os.getpid()} {kid.pid}")
    for it in range(1, 10**6):
        print(f" iteration {it:8d}/ 1000000 | elapsed time per iteration (ms): 100.0 | lm loss: {loss:E} |",
              flush=True)
        time.sleep(0.1)
""")

# The session under test, in its own process (a terminal's Ctrl-C handler even if the test runner ignores SIGINT).
SESSION = textwrap.dedent("""
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from harness.run import session
    from harness.run.launch import progress_printer
    from harness.run.runs import RunSpec
    from harness.run.session import Session

    session.expected_sharded_shapes = lambda *shape: None  # builds a BertModel: 10-20 s of CPU the fake runs do not need

    FAKE_TRAINER, run_dir = sys.argv[1], sys.argv[2]
    LOSS = {"a": "1", "b": "2", "c": "3"}

    class FakeTrainers(Session):
        def train_argv(self, spec):
            return [sys.executable, "-c", FAKE_TRAINER, f"{self.run_dir}/{spec.name}.pids", LOSS[spec.name],
                    "1" if spec.name == "b" else "0"]

    runs = (RunSpec("a", "runs until stopped"), RunSpec("b", "ignores SIGTERM"),
            RunSpec("c", "resumes from a's checkpoint, which never comes", resume_from="a"))
    FakeTrainers(run_dir, on_line=progress_printer()).run_all(runs)
    print("run_all returned", flush=True)
""")


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    """Poll until predicate() holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout_s} s")


def _pids(path: Path) -> list[int]:
    """The trainer's and its grandchild's pids from a fake trainer's pid file."""
    return [int(p) for p in path.read_text().split()] if path.is_file() and path.read_text() else []


def _alive(pids) -> list[int]:
    """Pids still running (zombies count as gone: init reaps them)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@dataclass(frozen=True)
class Stopped:
    """A fake session stopped by a signal: how long it took, what it left, what it said."""

    sig: signal.Signals
    runs_gone_s: float            # signal -> the last process of every run gone
    exited_s: float               # signal -> the session process exited
    tree: tuple[int, ...]         # the session process and every descendant, taken just before the signal
    stdout: str
    stderr: str
    run_dir: Path


def _kill_leftovers(proc: subprocess.Popen, tree) -> None:
    """After a failure: kill the session and whatever it left, so one failing test leaves no orphans."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
    for pid in _alive(tree):
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def _iterations(log: Path) -> int:
    """Iteration lines a trainer has logged so far."""
    return log.read_text().count(" iteration ") if log.is_file() else 0


@pytest.fixture(scope="module", params=[signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def stopped(request, tmp_path_factory) -> Stopped:
    """Three running fake trainers (b ignores SIGTERM, c resumes from a), then the signal."""
    sig = request.param
    run_dir = tmp_path_factory.mktemp(sig.name) / "run"
    proc = subprocess.Popen([sys.executable, "-c", SESSION, FAKE_TRAINER, str(run_dir)], cwd=paths.REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree: list[int] = []
    try:
        pidfiles = [run_dir / "a.pids", run_dir / "b.pids", run_dir / "c.pids"]
        _wait_for(lambda: all(len(_pids(p)) == 2 for p in pidfiles), 120, "the three fake trainers did not start")
        _wait_for(lambda: all(_iterations(run_dir / f"train-{n}.log") >= 5 for n in "ab"), 30,
                  "both fake trainers did not log 5 iterations")
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert set(sum((_pids(p) for p in pidfiles), [])) <= set(tree), "the fake trainers are not in the tree"
        sent = time.monotonic()
        proc.send_signal(sig)
        runs = tree[1:]
        _wait_for(lambda: not _alive(runs), STOP_WITHIN_S + 10, f"runs still alive after {sig.name}: {_alive(runs)}")
        runs_gone = time.monotonic() - sent
        out, err = proc.communicate(timeout=EXIT_WITHIN_S + 10)
        exited = time.monotonic() - sent
    finally:
        _kill_leftovers(proc, tree)
    return Stopped(sig, runs_gone, exited, tuple(tree), out, err, run_dir)


def test_every_run_stops_within_10_s(stopped):
    """Every process of every run is gone within 10 s of the signal (b needs the SIGKILL after the grace)."""
    assert stopped.runs_gone_s <= STOP_WITHIN_S, (f"the runs took {stopped.runs_gone_s:.1f} s to stop after "
                                                  f"{stopped.sig.name}\n{stopped.stderr[-3000:]}")


def test_the_session_exits_without_finishing(stopped):
    """The session process ends on the signal instead of returning from run_all."""
    assert stopped.exited_s <= EXIT_WITHIN_S, f"the session process took {stopped.exited_s:.1f} s to exit"
    assert "run_all returned" not in stopped.stdout


def test_no_process_is_left_behind(stopped):
    """The session, both trainers and their grandchildren are all gone (b ignored SIGTERM)."""
    assert not _alive(stopped.tree), f"left behind after {stopped.sig.name}: {_alive(stopped.tree)}"


def test_the_run_dir_is_kept_and_named(stopped):
    """The message names the signal, the stopped runs and the kept run directory; the logs are there."""
    err = stopped.stderr
    assert f"session interrupted by {stopped.sig.name}" in err, err[-3000:]
    assert re.search(r"stages stopped: .*train-a", err) and re.search(r"stages stopped: .*train-b", err), err[-3000:]
    assert f"run directory kept: {stopped.run_dir}" in err, err[-3000:]
    assert _iterations(stopped.run_dir / "train-a.log") >= 5 and _iterations(stopped.run_dir / "train-b.log") >= 5


def test_a_resuming_run_is_stopped_and_told_why(stopped):
    """The run resuming from a (started at once, before a saved anything) is stopped and named with the others;
    a's save directory gets the marker a waiting trainer reads."""
    assert re.search(r"stages stopped: .*train-c", stopped.stderr), stopped.stderr[-3000:]
    marker = stopped.run_dir / "a" / "checkpoints.failed"
    assert marker.is_file() and "the session was stopped" in marker.read_text(), marker


def test_each_progress_line_carries_its_own_runs_name(stopped):
    """Both runs share one printer: every `[train-a]` line shows a's loss, every `[train-b]` line b's."""
    shown = re.findall(r"^\[(train-[ab])\] iter \d+/1000000 \| lm loss ([0-9.]+)", stopped.stderr, re.M)
    assert {label for label, _ in shown} == {"train-a", "train-b"}, stopped.stderr[-3000:]
    wrong = [(label, loss) for label, loss in shown if float(loss) != {"train-a": 1.0, "train-b": 2.0}[label]]
    assert not wrong, f"lines labelled with another run's name: {wrong[:5]}"
