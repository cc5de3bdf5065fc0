"""The trainer under torchrun with 2 gloo processes on CPU: a stalled run is stopped and leaves nothing behind.

Every process of the run carries one tag in its environment (process_tags.py), so the check for leftovers finds a
process even after it was re-parented away from the tree the launcher followed. The clean exit of the same tree
is checked on test_parallel_cpu.py's data-parallel run (one torchrun tree fewer to start on 2 cores).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.base import paths
from harness.run import failures
from harness.run.launch import DATASET_MARKER
from process_tags import TAG, leftovers, new_tag, run_timed

pytestmark = pytest.mark.slow

ENV = {"OMP_NUM_THREADS": "1"}
TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
# The stalled run waits for data that never comes, after setup (process group, model, checkpoint writer's
# manager): the stall watchdog fires while both workers and their grandchildren run. Setup takes ~10-15 s here;
# the timeout only bounds the test when the watchdog fails.
HANG_TIMEOUT_S = 120.0
STALL_S = 4.0


def torchrun_stage(name: str, run_dir: Path, data: Path, timeout_s: float, tag: dict, *extra: str, **limits):
    """The CPU smoke recipe under torchrun, saving torch_dist checkpoints, every process tagged."""
    argv = failures.train_argv(data, paths.VOCAB_FILE, run_dir / "index-cache", "--save", str(run_dir / "ckpt"),
                               *extra)
    return failures.stage(name, [*TORCHRUN, *argv[1:]], timeout_s=timeout_s, env={**ENV, **tag}, **limits)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The healthy CPU dataset, shared with the other CPU self-tests of the session."""
    return failures.healthy_dataset(tmp_path_factory.getbasetemp() / "healthy-dataset")


def test_a_stall_kills_agent_workers_and_grandchildren(tmp_path, data):
    """The sample-index hang as a real run meets it: silence after the dataset marker. The stall watchdog stops the
    stage mid-run and no process of the torchrun tree is left (a timeout ends through the same tree kill,
    test_launch.py); the stage timeout behind it only bounds the test."""
    tag = new_tag()
    never = tmp_path / "not-yet" / "corpus_text_sentence"   # the workers wait for it past the stall
    spec = torchrun_stage("train-torchrun-stall", tmp_path, data, HANG_TIMEOUT_S, tag,
                          "--data-path", str(never), "--wait-for-data", "600",
                          stall_timeout_s=STALL_S, stall_after_marker=DATASET_MARKER)
    result, lines = run_timed(spec, tmp_path)
    left = leftovers(tag[TAG])
    assert result.stalled and not result.timed_out and result.returncode == -1, result.failure_message()
    assert not left, f"still running after the stall watchdog killed the stage: {left}"
    waiting = [t for t, line in lines if DATASET_MARKER in line]
    assert waiting and result.duration_s - waiting[0] >= STALL_S, (
        f"the stage ended before the workers reached the data wait; log tail: {result.tail[-5:]}")
    assert len(result.pids_seen) >= 5, (
        f"expected torchrun, 2 workers and their checkpoint-writer managers, saw pids {result.pids_seen}")
