"""The trainer under torchrun with 2 gloo processes on CPU: a clean exit, and a timeout that leaves nothing behind.

Every process of a run carries one tag in its environment (torchrun's agent, both workers, the checkpoint
writer's manager and any process they fork), so the check for leftovers finds a process even after it was
re-parented away from the tree the launcher followed.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from harness import paths
from harness.run import failures
from harness.run.launch import DATASET_MARKER, StageResult, run_stage

pytestmark = pytest.mark.slow

TAG = "BERT_ACCEPTANCE_TREE_TAG"
ENV = {"OMP_NUM_THREADS": "1"}
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
CLEAN_TIMEOUT_S = 240.0
# The stalled run waits for data that never comes, after setup (process group, model, checkpoint writer's
# manager): the stall watchdog fires while both workers and their grandchildren run. Setup takes ~10-15 s here;
# the timeout only bounds the test when the watchdog fails.
HANG_TIMEOUT_S = 120.0
STALL_S = 4.0
# From the test-set validation line to torchrun's exit: measured 4.2 s on a 2-core machine (teardown, interpreter
# exit of both workers, the agent noticing). Five times that; a worker that never exits runs into the stage timeout.
EXIT_AFTER_LAST_LINE_S = 20.0
LAST_LINE = "on test set"


def tagged(tag: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment carries `tag`."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def describe(procs: list[psutil.Process]) -> list[str]:
    """pid and command line of each process, for a failure message."""
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid}: {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            out.append(f"{proc.pid}: ?")
    return out


def torchrun_stage(name: str, run_dir: Path, data: Path, timeout_s: float, tag: str, *extra: str, **limits):
    """The CPU smoke recipe under torchrun, saving torch_dist checkpoints, every process tagged."""
    argv = failures.train_argv(data, paths.VOCAB_FILE, run_dir / "index-cache", "--save", str(run_dir / "ckpt"),
                               *extra)
    return failures.stage(name, [*TORCHRUN, *argv[1:]], timeout_s=timeout_s, env={**ENV, TAG: tag}, **limits)


def run_timed(spec, run_dir: Path) -> tuple[StageResult, list[tuple[float, str]]]:
    """Run a stage; each output line with seconds since start."""
    start = time.monotonic()
    lines: list[tuple[float, str]] = []
    result = run_stage(spec, run_dir, on_line=lambda line: lines.append((time.monotonic() - start, line)))
    return result, lines


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The healthy CPU dataset, shared with the other CPU self-tests of the session."""
    return failures.healthy_dataset(tmp_path_factory.getbasetemp() / "healthy-dataset")


def test_a_stall_kills_agent_workers_and_grandchildren(tmp_path, data):
    """The sample-index hang as a real run meets it: silence after the dataset marker. The stall watchdog stops the
    stage mid-run and no process of the torchrun tree is left (a timeout ends through the same tree kill,
    test_launch.py); the stage timeout behind it only bounds the test."""
    tag = uuid.uuid4().hex
    never = tmp_path / "not-yet" / "corpus_text_sentence"   # the workers wait for it past the stall
    spec = torchrun_stage("train-torchrun-stall", tmp_path, data, HANG_TIMEOUT_S, tag,
                          "--data-path", str(never), "--wait-for-data", "600",
                          stall_timeout_s=STALL_S, stall_after_marker=DATASET_MARKER)
    result, lines = run_timed(spec, tmp_path)
    left = tagged(tag)
    for proc in left:   # never leak from the test itself
        proc.kill()
    assert result.stalled and not result.timed_out and result.returncode == -1, result.failure_message()
    assert not left, f"still running after the stall watchdog killed the stage: {describe(left)}"
    waiting = [t for t, line in lines if DATASET_MARKER in line]
    assert waiting and result.duration_s - waiting[0] >= STALL_S, (
        f"the stage ended before the workers reached the data wait; log tail: {result.tail[-5:]}")
    assert len(result.pids_seen) >= 5, (
        f"expected torchrun, 2 workers and their checkpoint-writer managers, saw pids {result.pids_seen}")


def test_clean_run_exits_0_soon_after_its_last_line(tmp_path, data):
    """Training, saves and the final validation done, torchrun exits 0 within the bound and leaves no process."""
    tag = uuid.uuid4().hex
    spec = torchrun_stage("train-torchrun-exit", tmp_path, data, CLEAN_TIMEOUT_S, tag)
    result, lines = run_timed(spec, tmp_path)
    left = tagged(tag)
    for proc in left:
        proc.kill()
    assert result.ok, result.failure_message()
    assert not left, f"still running after a clean exit: {describe(left)}"
    last = [t for t, line in lines if LAST_LINE in line]
    assert last, f"no test-set validation line; log tail: {result.tail[-5:]}"
    after = result.duration_s - last[-1]
    assert after <= EXIT_AFTER_LAST_LINE_S, (
        f"torchrun exited {after:.1f} s after the test-set validation line (bound {EXIT_AFTER_LAST_LINE_S:g} s)")
