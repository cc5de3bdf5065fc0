"""`pytest -m gpu` starts the session's fork server at start-up (root conftest) when the machine shows a GPU device;
where no test trains (here: torch sees no GPU, so every GPU test skips), the server is stopped at exit and the run
directory it would have used is removed. Without a GPU device file the server is not started at all."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psutil

from harness.plugin import options
from harness.base import paths

TAG = "BERT_ACCEPTANCE_TEST_TAG"  # inherited by the pytest subprocess and every process it starts
# A device file every machine has stands for a GPU's: the server starts as on a GPU machine (torch still sees none)
AS_IF_A_GPU = {options.GPU_NODES_ENV: os.devnull}


def tagged_env(**extra) -> tuple[dict, str]:
    """The environment for one pytest subprocess, tagged so that its fork servers can be told from others'."""
    tag = uuid.uuid4().hex
    return {**os.environ, TAG: tag, **extra}, tag


def forkservers(tag: str) -> set[int]:
    """Live fork servers started under this tag (never another test's or another session's: tests run in parallel)."""
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if "harness.run.forkserver" not in " ".join(proc.info["cmdline"] or []):
            continue
        try:
            if proc.environ().get(TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.add(proc.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def test_forkservers_finds_a_tagged_server_and_only_it():
    """The count cannot pass by seeing nothing: a server started with the tag is found, one without it is not."""
    env, tag = tagged_env()
    servers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "harness.run.forkserver"],
                                env=e) for e in (env, os.environ)]
    try:
        assert forkservers(tag) == {servers[0].pid}
    finally:
        for server in servers:
            server.kill()
            server.wait()
    assert forkservers(tag) == set()


def test_unused_early_fork_server_stops_and_leaves_no_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    env, tag = tagged_env(CUDA_VISIBLE_DEVICES="", **AS_IF_A_GPU)
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "acceptance/test_course_checklist.py", "--run-dir", str(run_dir)],
                          cwd=paths.REPO, env=env, capture_output=True, text=True, timeout=300)
    # no usable GPU (every device hidden): the session stops red before any test (conftest's NO_GPU_EXIT, one line)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert "no usable CUDA GPU on this machine" in done.stdout + done.stderr and " passed" not in done.stdout
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())
    assert not forkservers(tag)


def test_a_usage_error_stops_the_early_fork_server_and_leaves_no_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    env, tag = tagged_env(**AS_IF_A_GPU)
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "--run-dir", str(run_dir), "--stage-timeout", "soon"],
                          cwd=paths.REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 4 and "--stage-timeout 'soon': not a number" in done.stderr, done.stderr[-1500:]
    assert not run_dir.exists()
    assert not forkservers(tag)


def test_no_gpu_device_no_early_fork_server(monkeypatch, tmp_path):
    """The look for a GPU: a device file decides, CUDA_VISIBLE_DEVICES="" or -1 hides every GPU, and where none is
    seen `-m gpu` does not want the fork server (nothing would train: its imports would be wasted)."""
    get = {"no_fork_server": False}.get
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(options.GPU_NODES_ENV, f"{tmp_path}/nvidia[0-9]*")
    assert not options.gpu_device_visible() and not options.wants_fork_server("gpu", get)
    (tmp_path / "nvidia0").touch()
    assert options.gpu_device_visible() and options.wants_fork_server("gpu", get)
    assert not options.wants_fork_server("not gpu", get) and not options.wants_fork_server("gpu", {"from_log": "x"}.get)
    monkeypatch.setenv(options.GPU_NODES_ENV, f"/nowhere:{tmp_path}/nvidia0")
    assert options.gpu_device_visible()
    monkeypatch.delenv(options.GPU_NODES_ENV)
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not options.gpu_device_visible()
