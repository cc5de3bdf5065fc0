"""The inspector's bounded child as a fork (harness.base.bounded.fork_bounded, `--bounded-fork`): no new interpreter
(the child runs with what the parent imported, its command line the parent's), yet its own process in its own
session, with the address-space and CPU-time rlimits set in it and the wall clock enforced from outside, exactly as
the fresh interpreter's; what eats memory or hangs there is stopped by the budget and named as the budget."""

from __future__ import annotations

import json
import mmap
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.base.bounded import fork_bounded, mapped_bytes
from harness.base.paths import REPO

SAVE = REPO / "fixtures" / "checkpoints" / "core_v0.16.1"


def _cmdline(pid: int | str = "self") -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_the_child_is_a_fork_in_its_own_session_with_the_limits_set():
    """Same command line as the parent (no exec), the parent's modules already there, its own session, and the
    rlimits: CPU time budget + 5 s, address space the budget on top of what the parent mapped."""
    parent, parent_cmdline = os.getpid(), _cmdline()

    def probe():
        print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
                          "same_cmdline": _cmdline() == parent_cmdline, "pytest_here": "pytest" in sys.modules,
                          "as": resource.getrlimit(resource.RLIMIT_AS), "cpu": resource.getrlimit(resource.RLIMIT_CPU),
                          "mapped": mapped_bytes()}))
        return 0

    before = mapped_bytes()
    done = fork_bounded(probe, 20, 256)
    assert done.returncode == 0 and not done.over, done
    seen = json.loads(done.out)
    assert seen["ppid"] == parent and seen["pid"] != parent and seen["sid"] == seen["pid"]
    assert seen["same_cmdline"] and seen["pytest_here"]
    assert seen["cpu"] == [25, 30]
    soft, hard = seen["as"]
    assert soft == hard and 0 <= soft - (256 << 20) - before < (256 << 20), (soft, before)   # + what it mapped


def test_memory_beyond_the_budget_is_refused_in_the_child_only():
    """Mapping 512 MB on top of a 256 MB budget fails in the child (ENOMEM), and works with a 2048 MB one; the
    parent's own limit is untouched."""
    def map_512():
        try:
            mmap.mmap(-1, 512 << 20)   # address space only: nothing is touched
        except OSError:
            return 7
        return 0

    limit = resource.getrlimit(resource.RLIMIT_AS)
    assert fork_bounded(map_512, 20, 256, ok_codes=(0,)).returncode == 7
    refused = fork_bounded(map_512, 20, 256, ok_codes=(0,))
    assert "over its 256 MB address-space budget" in refused.over
    assert fork_bounded(map_512, 20, 2048, ok_codes=(0,)).returncode == 0
    assert resource.getrlimit(resource.RLIMIT_AS) == limit


def test_a_hanging_child_is_killed_at_the_wall_clock_budget_with_its_group():
    """A child that sleeps, and a grandchild in its group, are killed at the budget; the result names it."""
    def hang():
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        print("started", flush=True)
        time.sleep(600)

    start = time.monotonic()
    done = fork_bounded(hang, 0.5, 256)
    assert done.over == "it ran past its 0.5 s budget" and done.returncode == -signal.SIGKILL, done
    assert time.monotonic() - start < 10 and done.out == "started\n"


def test_output_exit_status_and_a_traceback_come_back():
    def fails():
        print("to stdout")
        print("to stderr", file=sys.stderr)
        raise ValueError("boom")

    done = fork_bounded(fails, 20, 256)
    assert done.returncode == 1 and not done.over   # 1: an interpreter's exit on an exception, in ok_codes
    assert done.out == "to stdout\n" and "to stderr" in done.err and "ValueError: boom" in done.err
    assert fork_bounded(lambda: sys.exit(4), 20, 256, ok_codes=(4,)).returncode == 4
    assert fork_bounded(lambda: None, 20, 256).returncode == 0


def _cli(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen([sys.executable, "-m", "harness.evidence.checkpoints.inspector", *map(str, args)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    except OSError:
        return []


def test_cli_with_bounded_fork_reports_what_the_fresh_child_reports(tmp_path):
    """`--bounded-fork`: the same report, and the same budget verdicts (memory: 1 MB on top cannot build the
    model; wall clock: 0.01 s), as the fresh interpreter gives."""
    fresh, fork = tmp_path / "fresh.json", tmp_path / "fork.json"
    for out, extra in ((fresh, []), (fork, ["--bounded-fork"])):
        proc = _cli(SAVE, "--json-out", out, *extra)
        proc.communicate(timeout=120)
        assert proc.returncode == 1   # the fixture holds the small files only: its shards are missing
    assert json.loads(fresh.read_text()) == json.loads(fork.read_text())
    for budget, said in ((["--budget-mb", "1"], "over its 1 MB address-space budget"),
                         (["--budget-s", "0.01"], "ran past its 0.01 s budget")):
        proc = _cli(SAVE, "--bounded-fork", *budget)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1 and said in json.loads(out)["problems"][0], (out, err[-2000:])


def test_sigterm_reaches_the_parent_which_kills_the_forked_child():
    """SIGTERM to the process waiting in fork_bounded: the child is killed, the wait ends with stopped_by."""
    code = ("import time, sys; from harness.base.bounded import fork_bounded\n"
            "done = fork_bounded(lambda: time.sleep(600), 600, 256)\n"
            "print('stopped_by', done.stopped_by, flush=True); sys.exit(5)")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while not _children(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    children = _children(proc.pid)
    assert children, "no forked child"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 5 and out.strip() == f"stopped_by {int(signal.SIGTERM)}", out
    time.sleep(0.2)
    assert not [c for c in children if Path(f"/proc/{c}").exists()
                and "Z" not in (Path(f"/proc/{c}/stat").read_text().split()[2:3] or ["Z"])], "the child outlived it"
