"""The pre-imported fork server (harness.run.forkserver) under the real launcher: output, exit codes, timeouts and
kills as with a fresh process, its own session, the environment and working directory it was given, and a fresh
process whenever the server cannot take a stage."""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

from harness.run.forkserver import ForkServer
from harness.run.launch import StageSpec, run_stage

CORPUS = (sys.executable, "-m", "harness.data.corpus")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    fs = ForkServer.start(modules=("numpy", "harness.data.corpus"),
                          log_path=tmp_path_factory.mktemp("fs") / "forkserver.log")
    assert fs.ready(60), fs.why_not_ready()
    yield fs
    fs.close()


def spawner(fs):
    return lambda argv, env, cwd: fs.spawn(argv, env, cwd)


def test_a_forked_stage_logs_and_exits_like_a_fresh_one(server, tmp_path):
    (tmp_path / "out").mkdir()
    spec = StageSpec("corpus", CORPUS + ("out/corpus.json", "--lines", "20"), 60, cwd=tmp_path)
    result = run_stage(spec, tmp_path, spawner=spawner(server))
    assert result.ok, result.failure_message()
    assert (tmp_path / "out" / "corpus.json").is_file()  # relative to the stage's cwd
    assert result.tail[-1].endswith("out/corpus.json")
    assert server.info["ready"] and server.info["import_s"] >= 0


def test_exit_code_and_stderr_of_a_failing_stage(server, tmp_path):
    spec = StageSpec("corpus-bad", CORPUS + ("x.json", "--layout", "nonsense"), 60, cwd=tmp_path)
    result = run_stage(spec, tmp_path, spawner=spawner(server))
    assert result.returncode == 2 and not result.timed_out
    assert "invalid choice" in (tmp_path / "corpus-bad.log").read_text()


def test_a_timeout_kills_the_forked_stage_in_its_own_session(server, tmp_path):
    """The child blocks opening a FIFO: the stage times out and nothing of it is left."""
    fifo = tmp_path / "never-read.json"
    os.mkfifo(fifo)
    seen = {}
    spec = StageSpec("corpus-hang", CORPUS + (str(fifo),), 1.5, cwd=tmp_path)

    def started(popen):
        time.sleep(0.3)
        seen.update(pid=popen.pid, sid=os.getsid(popen.pid), nice=psutil.Process(popen.pid).nice())

    t0 = time.monotonic()
    result = run_stage(spec, tmp_path, on_start=started, spawner=spawner(server))
    assert result.timed_out and result.returncode == -1
    assert time.monotonic() - t0 < 10
    assert seen["sid"] == seen["pid"] and seen["pid"] in result.pids_seen
    assert not psutil.pid_exists(seen["pid"]) or psutil.Process(seen["pid"]).status() == psutil.STATUS_ZOMBIE


def test_nice_prefix_is_applied_in_the_child(server, tmp_path):
    fifo = tmp_path / "blocked.json"
    os.mkfifo(fifo)
    seen = {}
    spec = StageSpec("corpus-nice", ("nice", "-n", "5") + CORPUS + (str(fifo),), 1.0, cwd=tmp_path)

    def started(popen):
        time.sleep(0.3)
        seen.update(nice=psutil.Process(popen.pid).nice(), forked=not hasattr(popen, "communicate"))

    run_stage(spec, tmp_path, on_start=started, spawner=spawner(server))
    assert seen == {"nice": os.nice(0) + 5, "forked": True}


def test_other_commands_start_as_fresh_processes(server, tmp_path):
    assert ForkServer.forkable([sys.executable, "-c", "print(1)"]) is None
    assert ForkServer.forkable([sys.executable, "-m", "torch.distributed.run", "x"]) is None
    assert ForkServer.forkable(["nice", "-n", "5", sys.executable, "-m", "harness.train", "--x"]) == (
        "harness.train", ["--x"], 5)
    spec = StageSpec("plain", (sys.executable, "-c", "print('fresh')"), 30, cwd=tmp_path)
    result = run_stage(spec, tmp_path, spawner=spawner(server))
    assert result.ok and result.tail == ("fresh",)


def test_a_dead_server_falls_back_to_fresh_processes(tmp_path):
    fs = ForkServer.start(modules=("numpy",))
    assert fs.ready(60)
    fs.proc.kill()
    fs.proc.wait()
    assert fs.spawn(CORPUS + ("x.json",), dict(os.environ), tmp_path) is None
    result = run_stage(StageSpec("corpus", CORPUS + ("c.json", "--lines", "5"), 60, cwd=tmp_path), tmp_path,
                       spawner=spawner(fs))
    assert result.ok and (tmp_path / "c.json").is_file()
    assert "exited" in fs.why_not_ready() or "not ready" in fs.why_not_ready()
    fs.close()


def test_closing_the_server_kills_children_it_still_has(tmp_path):
    fs = ForkServer.start(modules=("harness.data.corpus",))
    assert fs.ready(60)
    fifo = tmp_path / "blocked.json"
    os.mkfifo(fifo)
    proc = fs.spawn(CORPUS + (str(fifo),), dict(os.environ), tmp_path)
    assert proc is not None and proc.poll() is None
    fs.close()
    deadline = time.monotonic() + 5
    while psutil.pid_exists(proc.pid) and psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the forked child outlived its server"
        time.sleep(0.05)


LAZY_COMPILE_CHILD = '''
import sys, torch
from harness.base.imports import lazy_compile
compile = lazy_compile(torch.compile)
plain = compile(lambda x: x * 2 + 1, backend="eager")

@compile(backend="eager")
def decorated(x):
    return x - 3

assert "torch._dynamo" not in sys.modules, "decorating imported torch._dynamo"
x = torch.arange(4.0)
assert torch.equal(plain(x), x * 2 + 1) and torch.equal(decorated(x), x - 3)
assert "torch._dynamo" in sys.modules, "the first call did not compile"
print("ok")
'''


def test_lazy_compile_compiles_at_the_first_call_not_at_decoration():
    """What the fork server's imports get for torch.compile: no torch._dynamo until a compiled function runs."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", LAZY_COMPILE_CHILD], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


PRELOAD_CHILD = '''
import sys, torch
real = torch.compile
from harness.run.forkserver import _preload
info = _preload(["torch", "megatron.core", "megatron.core.models.bert.bert_model"])
assert not info["missing"], info
assert torch.compile is real, "torch.compile was not restored"
import gc
assert gc.isenabled(), "the collector was left off"
# frozen (harness.base.imports.collector_paused): the forks' collections never walk what the server loaded
assert info["frozen_objects"] > 0 and not any(o is torch.nn.Module for o in gc.get_objects()), info
print(info["dynamo_imported"])
'''


def test_the_servers_imports_of_megatron_core_do_not_import_torch_dynamo():
    """megatron-core decorates its fusions with torch.compile on import; the server's preload must not pay for it."""
    import subprocess

    out = subprocess.run([sys.executable, "-W", "ignore", "-c", PRELOAD_CHILD], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_children_get_one_cpu_thread_on_a_small_machine():
    """Trainers share the host: 1 thread each up to 4 cores (2 each there spin-wait against each other in libgomp),
    2 on a bigger machine; every child's environment carries it (a forked child applies it to torch)."""
    from harness.run.session import child_threads, python_env

    assert [child_threads(c) for c in (1, 2, 4, 5, 16, 128)] == [1, 1, 1, 2, 2, 2]
    assert python_env()["OMP_NUM_THREADS"] == str(child_threads(len(os.sched_getaffinity(0))))
    assert python_env({"OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"] == "4"   # a run's own setting wins


def test_a_stage_gone_before_the_first_look_still_names_its_pid(server, tmp_path, monkeypatch):
    """A forked stage can exit before the launcher first looks at its tree (not our child: the server reaps it at
    once); its pid is still among pids_seen, so the checks for leftovers look at it."""
    import psutil as real_psutil

    from harness.run import launch

    class Gone:
        def __init__(self, pid):
            raise real_psutil.NoSuchProcess(pid)

    monkeypatch.setattr(launch.psutil, "Process", Gone)
    started = {}
    spec = StageSpec("corpus-gone", CORPUS + ("--no-such-option",), 20.0, cwd=tmp_path)
    result = run_stage(spec, tmp_path, on_start=lambda popen: started.update(pid=popen.pid), spawner=spawner(server))
    monkeypatch.undo()
    assert result.returncode != 0 and started["pid"] in result.pids_seen, (started, result.pids_seen)


def test_collector_paused_freezes_what_was_loaded_and_restores_the_collector():
    """The heavy imports' helper: collector off inside, what exists frozen after, the caller's setting restored."""
    import gc

    from harness.base.imports import collector_paused

    assert gc.isenabled()
    before, inside = gc.get_freeze_count(), []
    with collector_paused():
        inside.append(gc.isenabled())
        made = [[] for _ in range(1000)]   # containers created while paused
    assert inside == [False] and gc.isenabled()
    assert gc.get_freeze_count() >= before + len(made)
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()   # a caller that had it off keeps it off
    finally:
        gc.enable()
