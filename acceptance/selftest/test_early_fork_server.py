"""`pytest -m gpu` starts the session's fork server at start-up (root conftest); where no test trains (here: no
GPU, so every GPU test skips), the server is stopped at exit and the run directory it would have used is removed."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from harness import paths


def forkservers() -> set[int]:
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if "harness.run.forkserver" in " ".join(proc.info["cmdline"] or []):
            found.add(proc.info["pid"])
    return found


def test_unused_early_fork_server_stops_and_leaves_no_run_dir(tmp_path):
    before = forkservers()
    run_dir = tmp_path / "run"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "acceptance/test_course_checklist.py", "--run-dir", str(run_dir)],
                          cwd=paths.REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "skipped" in done.stdout and "passed" not in done.stdout.split("\n")[-2]
    assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())
    assert forkservers() <= before


def test_a_usage_error_stops_the_early_fork_server_and_leaves_no_run_dir(tmp_path):
    before = forkservers()
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "--run-dir", str(run_dir), "--stage-timeout", "soon"],
                          cwd=paths.REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 4 and "--stage-timeout 'soon': not a number" in done.stderr, done.stderr[-1500:]
    assert not run_dir.exists()
    assert forkservers() <= before
