"""Self-tests of harness.run.launch: results instead of exceptions, logs, stall watchdog, and no orphans."""

from __future__ import annotations

import io
import signal
import sys
import textwrap
import threading
import time

import psutil
import pytest

from harness.base.errors import Interrupted
from harness.run import launch
from harness.run.launch import (FAILED_EXIT, FAILED_TIMEOUT, StageResult, StageSpec, condense_iteration,
                            current_pids, progress_printer, run_stage)
from harness.base.proc import LOAD_WAIT_MARKER

ITERATION_LINE = (" [2026-11-29 14:17:59.537060] iteration      120/     200 | consumed samples:         1920 | "
                  "elapsed time per iteration (ms): 9.8 | throughput per GPU (TFLOP/s/GPU): 0.7 | "
                  "learning rate: 5.000000E-05 | global batch size:    16 | lm loss: 8.412345E+00 | "
                  "sop loss: 6.956014E-01 | loss scale: 65536.0 | grad norm: 3.751 | "
                  "number of skipped iterations:   0 | number of nan iterations:   0 |")
SKIPPED_LINE = (" [2026-11-29 14:17:40.000000] iteration       10/     200 | consumed samples:          160 | "
                "elapsed time per iteration (ms): 120.5 | learning rate: 0.000000E+00 | global batch size:    16 | "
                "loss scale: 268435456.0 | number of skipped iterations:  10 | number of nan iterations:   0 |")

# A child that starts a grandchild (which writes its pid, then sleeps), then sleeps itself.
SPAWNER = textwrap.dedent("""
    import subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c",
        "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)", sys.argv[1]])
    print("spawned", grandchild.pid, flush=True)
    time.sleep(600)
""")


def py(code: str, *args: str) -> tuple[str, ...]:
    """argv running a tiny Python child program."""
    return (sys.executable, "-c", code, *args)


def wait_for_file(path, timeout=10.0) -> str:
    """Contents of a file another process is about to write."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} was not written within {timeout} s")


def assert_gone(*pids: int) -> None:
    """Every pid is gone or a zombie (reaped by init later)."""
    for pid in pids:
        alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert not alive, f"pid {pid} survived its stage"


def test_success_logs_merged_output_and_tail(tmp_path):
    """stdout and stderr land in run_dir/<name>.log in order, and the tail keeps the last 50 lines."""
    code = "import sys\nfor i in range(60): print('line', i)\nprint('to stderr', file=sys.stderr)"
    result = run_stage(StageSpec("hello", py(code), timeout_s=20), tmp_path / "run")
    assert result.ok and result.returncode == 0
    assert result.log_path == tmp_path / "run" / "hello.log"
    logged = result.log_path.read_text().splitlines()
    assert logged[0] == "line 0" and logged[-1] == "to stderr" and len(logged) == 61
    assert len(result.tail) == launch.TAIL_LINES and result.tail[-1] == "to stderr"
    assert result.argv[0] == sys.executable and result.pids_seen


def test_nonzero_exit_is_reported_with_artifacts_and_tail(tmp_path):
    """A failing stage says which stage, its exit code, where the artifacts are and its last lines."""
    code = "import sys\nfor i in range(30): print('step', i)\nsys.exit(3)"
    result = run_stage(StageSpec("preprocess", py(code), timeout_s=20), tmp_path)
    assert result.returncode == 3 and not result.ok and not result.timed_out
    message = result.failure_message()
    assert FAILED_EXIT.format(name="preprocess", returncode=3, duration=result.duration_s) in message
    assert f"artifacts kept in {tmp_path}" in message and str(result.log_path) in message
    assert "step 29" in message and "step 10" in message and "step 9\n" not in message  # last 20 lines only


def test_blank_lines_are_kept(tmp_path):
    """Empty output lines are logged, not dropped."""
    result = run_stage(StageSpec("blank", py("print('a'); print(); print('b')"), timeout_s=20), tmp_path)
    assert result.log_path.read_text() == "a\n\nb\n"


def test_missing_program_is_a_result_not_an_exception(tmp_path):
    """A program that does not exist comes back as exit code 127 with the reason in the log."""
    result = run_stage(StageSpec("train", ("/nonexistent/torchrun", "x"), timeout_s=5), tmp_path)
    assert result.returncode == launch.NOT_STARTED and "cannot start" in result.log_path.read_text()


def test_timeout_returns_minus_one_and_kills_child_and_grandchild(tmp_path):
    """On timeout: returncode -1, no TimeoutExpired, and neither the child nor its grandchild survives."""
    pidfile = tmp_path / "grandchild.pid"
    result = run_stage(StageSpec("train", py(SPAWNER, str(pidfile)), timeout_s=1.5), tmp_path)
    grandchild = int(wait_for_file(pidfile))
    assert result.timed_out and result.returncode == -1 and not result.stalled
    assert grandchild in result.pids_seen
    assert_gone(*result.pids_seen)
    assert FAILED_TIMEOUT.split(":")[0].format(name="train") in result.failure_message()


def test_escaped_grandchild_in_its_own_session_is_killed(tmp_path):
    """A grandchild that left the process group (setsid) is still found through psutil and killed."""
    code = SPAWNER.replace("subprocess.Popen([", "subprocess.Popen(start_new_session=True, args=[")
    pidfile = tmp_path / "escaped.pid"
    result = run_stage(StageSpec("train", py(code, str(pidfile)), timeout_s=1.5), tmp_path)
    escaped = int(wait_for_file(pidfile))
    assert_gone(escaped, *result.pids_seen)


def test_background_grandchild_is_killed_after_clean_exit(tmp_path):
    """A child that exits 0 but leaves a sleeping grandchild behind still leaves no orphan."""
    code = textwrap.dedent("""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print("leaving", flush=True)
    """)
    result = run_stage(StageSpec("train", py(code), timeout_s=20), tmp_path)
    assert result.returncode == 0 and not result.timed_out
    assert_gone(*result.pids_seen)


def test_stall_watchdog_only_after_marker(tmp_path):
    """Silence before the marker is tolerated; silence after it is a stall, killed and flagged."""
    marker = launch.DATASET_MARKER
    code = f"import time\nprint('setup', flush=True)\ntime.sleep(1.2)\nprint({marker!r}, flush=True)\ntime.sleep(600)"
    spec = StageSpec("train", py(code), timeout_s=30, stall_timeout_s=0.8, stall_after_marker=marker)
    result = run_stage(spec, tmp_path)
    assert result.stalled and result.returncode == -1 and not result.timed_out
    assert result.tail[-1] == marker  # the 1.2 s of silence before the marker did not count
    assert "stalled, no output for 0.8 s once" in result.failure_message()
    assert_gone(*result.pids_seen)


def test_stall_clock_stops_while_the_last_line_is_the_quiet_marker(tmp_path):
    """A resuming trainer's wait line stops the stall clock (the wait has its own limit); the next line restarts it."""
    quiet, marker = LOAD_WAIT_MARKER, launch.DATASET_MARKER
    # armed by the dataset marker, as the session arms a trainer's watchdog: the interpreter's start-up on a loaded
    # machine is not part of what this test times
    code = (f"import time\nprint({marker!r}, flush=True)\nprint({quiet + ': iteration 100'!r}, flush=True)\n"
            "time.sleep(1.5)\nprint('loaded', flush=True)\ntime.sleep(600)")
    spec = StageSpec("train", py(code), timeout_s=30, stall_timeout_s=0.8, stall_quiet_marker=quiet,
                     stall_after_marker=marker)
    result = run_stage(spec, tmp_path)
    assert result.stalled and not result.timed_out, result.tail
    assert result.tail[-1] == "loaded"  # the 1.5 s after the wait line did not count
    assert_gone(*result.pids_seen)


def test_stall_watchdog_without_marker_and_steady_output(tmp_path):
    """Without a marker the watchdog is armed from the start; steady output never trips it."""
    steady = "import time\nfor i in range(8):\n    print(i, flush=True); time.sleep(0.1)"
    # 2 s: the clock runs from the start, and a loaded machine may take that long to start the interpreter
    assert run_stage(StageSpec("ok", py(steady), timeout_s=20, stall_timeout_s=2.0), tmp_path).ok
    silent = run_stage(StageSpec("silent", py("import time; time.sleep(600)"), timeout_s=20, stall_timeout_s=0.5),
                       tmp_path)
    assert silent.stalled and silent.duration_s < 10


def test_callback_exception_kills_tree_and_propagates(tmp_path):
    """An exception in the caller's callback kills the whole tree and reaches the caller."""
    pidfile = tmp_path / "gc.pid"
    seen = []

    def boom(line):
        wait_for_file(pidfile)
        seen.extend(current_pids(started[0]))
        raise RuntimeError("observer broke")

    started = []
    with pytest.raises(RuntimeError, match="observer broke"):
        run_stage(StageSpec("train", py(SPAWNER, str(pidfile)), timeout_s=30), tmp_path, on_line=boom,
                  on_start=started.append)
    assert int(pidfile.read_text()) in seen
    assert_gone(*seen)


def test_keyboard_interrupt_kills_tree(tmp_path):
    """Ctrl-C in the caller kills the tree; it is re-raised, or returned as interrupted when asked."""
    pidfile = tmp_path / "gc.pid"
    spec = StageSpec("train", py(SPAWNER, str(pidfile)), timeout_s=30)

    def interrupt_soon(popen):
        timer = threading.Timer(0.8, signal.raise_signal, args=(signal.SIGINT,))
        timer.start()

    result = run_stage(spec, tmp_path, on_start=interrupt_soon, reraise_interrupt=False)
    assert result.interrupted and result.returncode == -1
    assert_gone(*result.pids_seen)
    with pytest.raises(KeyboardInterrupt):
        run_stage(spec, tmp_path / "again", on_start=interrupt_soon)


def test_ctrl_c_tests_pass_when_the_suite_starts_with_sigint_ignored(tmp_path):
    """A background job (`pytest &` in a script, nohup) starts with SIGINT ignored; the self-tests' conftest gives
    the process Python's Ctrl-C handler back, so the test above still sees its interrupt (it failed so before)."""
    import subprocess

    from harness.base.paths import REPO

    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                           f"{__file__}::test_keyboard_interrupt_kills_tree", "--basetemp", str(tmp_path / "t")],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == 0 and "1 passed" in done.stdout, (done.stdout[-3000:], done.stderr[-2000:])


def test_on_start_exposes_the_process_tree(tmp_path):
    """current_pids follows the running trainer's tree from the Popen handed to on_start."""
    pidfile = tmp_path / "gc.pid"
    trees = []

    def look(line):
        if line.startswith("spawned"):
            wait_for_file(pidfile)
            trees.append(current_pids(started[0]))

    started = []
    result = run_stage(StageSpec("train", py(SPAWNER, str(pidfile)), timeout_s=2), tmp_path, on_line=look,
                       on_start=started.append)
    assert trees and {started[0].pid, int(pidfile.read_text())} <= trees[0]
    assert current_pids(result) == frozenset() and current_pids(None) == frozenset()


def test_condense_iteration_lines():
    """Megatron's iteration line shrinks to one short progress line; skipped steps say so."""
    assert condense_iteration("train", ITERATION_LINE) == "[train] iter 120/200 | lm loss 8.41 | 9.8 ms/iter"
    assert condense_iteration("train", SKIPPED_LINE) == "[train] iter 10/200 | lm loss -- (step skipped) | 120.5 ms/iter"
    assert condense_iteration("train", " validation loss at iteration 200 | lm loss value: 8.1 |") is None
    assert condense_iteration("train", "> building train, validation, and test datasets ...") is None


def test_progress_printer_prints_start_iterations_and_end(tmp_path):
    """The printer shows the stage start, condensed iteration lines only, and the end."""
    stream = io.StringIO()
    code = f"print('noise'); print({ITERATION_LINE!r}); print('more noise')"
    run_stage(StageSpec("train", py(code), timeout_s=20), tmp_path, on_line=progress_printer(stream))
    shown = stream.getvalue().splitlines()
    assert shown[0].startswith("[train] started (limit 20 s), log: ")
    assert shown[1] == "[train] iter 120/200 | lm loss 8.41 | 9.8 ms/iter"
    assert shown[2].startswith("[train] finished: exit 0 in ") and len(shown) == 3


def test_one_printer_labels_concurrent_stages_by_their_own_name(tmp_path):
    """Two stages sharing one printer at once: each iteration line carries the name of the stage that printed it."""
    stream = io.StringIO()
    printer = progress_printer(stream)
    code = ("import sys, time\nfor i in range(1, 21):\n"
            "    print(f' iteration {i:8d}/      20 | lm loss: {sys.argv[1]}E+00 |', flush=True); time.sleep(0.02)")
    threads = [threading.Thread(target=run_stage, args=(StageSpec(name, py(code, loss), timeout_s=30),
                                                       tmp_path / name), kwargs={"on_line": printer})
               for name, loss in (("train-a", "1.0"), ("train-b", "2.0"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shown = [line for line in stream.getvalue().splitlines() if " iter " in line]
    assert len(shown) == 40, shown
    wrong = [line for line in shown if not (line.startswith("[train-a]") and "lm loss 1.00" in line
                                            or line.startswith("[train-b]") and "lm loss 2.00" in line)]
    assert not wrong, wrong[:5]


def test_signals_interrupt_turns_sigterm_into_an_interrupt():
    """Inside signals_interrupt SIGTERM raises Interrupted (not the default: death without cleanup); then restored."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted, match="SIGTERM"):
        with launch.signals_interrupt():
            signal.raise_signal(signal.SIGTERM)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is before


def test_progress_printer_defaults_to_real_stderr(monkeypatch):
    """Under pytest capture the printer still reaches the terminal through sys.__stderr__."""
    fake = io.StringIO()
    monkeypatch.setattr(sys, "__stderr__", fake)
    printer = progress_printer()
    printer(ITERATION_LINE)
    assert "iter 120/200" in fake.getvalue()


def test_spec_rejects_shell_strings_and_bad_values():
    """argv must be a list; names become file names; timeouts are positive."""
    with pytest.raises(TypeError, match="not a shell string"):
        StageSpec("train", "python train.py", timeout_s=1)
    with pytest.raises(ValueError, match="file name"):
        StageSpec("a/b", ("true",), timeout_s=1)
    with pytest.raises(ValueError, match="timeout_s"):
        StageSpec("train", ("true",), timeout_s=0)
    assert StageSpec("t", ["a", 1], timeout_s=1).argv == ("a", "1")


def test_failure_message_names_a_diagnosed_cause(tmp_path):
    """When the log shows a known failure the message ends with its cause and remedy."""
    code = "import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'); sys.exit(1)"
    result = run_stage(StageSpec("train", py(code), timeout_s=20), tmp_path)
    assert isinstance(result, StageResult)
    assert "remedy: lower --micro-batch-size to 2 or 1, or --hidden-size to 64" in result.failure_message()
