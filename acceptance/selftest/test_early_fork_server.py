"""`pytest -m gpu` starts the session's fork server at start-up (root conftest); where no test trains (here: no
GPU, so every GPU test skips), the server is stopped at exit and the run directory it would have used is removed."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psutil

from harness import paths

TAG = "BERT_ACCEPTANCE_TEST_TAG"  # inherited by the pytest subprocess and every process it starts


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
    env, tag = tagged_env(CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "acceptance/test_course_checklist.py", "--run-dir", str(run_dir)],
                          cwd=paths.REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "skipped" in done.stdout and "passed" not in done.stdout.split("\n")[-2]
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())
    assert not forkservers(tag)


def test_a_usage_error_stops_the_early_fork_server_and_leaves_no_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    env, tag = tagged_env()
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "--run-dir", str(run_dir), "--stage-timeout", "soon"],
                          cwd=paths.REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 4 and "--stage-timeout 'soon': not a number" in done.stderr, done.stderr[-1500:]
    assert not run_dir.exists()
    assert not forkservers(tag)
