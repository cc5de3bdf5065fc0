"""CUDA out of memory provoked for real on the GPU, capped to an 8 GB card, then the course's remedy on the same cap.

The cap is the trainer's --memory-cap-gb (torch.cuda.set_per_process_memory_fraction), so an H200 behaves like the
course's minimum card. The OOM configuration cannot fit: with --seq-length 512 and --micro-batch-size 512 the lm
head's logits alone are 512 x 512 x 30592 (padded vocab) x 2 bytes (fp16) = 16.0 GB, twice the cap, before the
fp32 copy the loss makes. The remedy (--micro-batch-size 2, same sequences, same cap) needs 2/512 of that: 63 MB.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness import failures, paths
from harness.diagnose import COURSE_OOM_REMEDY, diagnose
from harness.launch import StageResult, StageSpec, current_pids, run_stage
from harness.logs import parse_log_file
from harness.session import python_env
from harness.train_args import COURSE_FLAGS

pytestmark = pytest.mark.gpu

CAP_GB = "8"
STAGE_TIMEOUT_S = 300.0
SHORT = ("--train-iters", "4", "--log-interval", "2", "--eval-interval", "4", "--eval-iters", "1",
         "--seq-length", "512", "--max-position-embeddings", "512", "--memory-cap-gb", CAP_GB)
OOM = ("--micro-batch-size", "512", "--global-batch-size", "512")
REMEDY = ("--micro-batch-size", "2", "--global-batch-size", "16")


def _train(root: Path, data: Path, name: str, batch: tuple[str, ...]) -> StageResult:
    """The course's command on the GPU with this batch, capped to 8 GB, as a stage."""
    argv = [sys.executable, "-m", "harness.train", *COURSE_FLAGS, *SHORT, *batch, "--data-path", str(data),
            "--vocab-file", str(paths.VOCAB_FILE), "--data-cache-path", str(root / name / "index-cache")]
    spec = StageSpec(f"train-{name}", tuple(argv), STAGE_TIMEOUT_S, env=python_env(), cwd=str(paths.REPO))
    return run_stage(spec, root / name)


@pytest.fixture(scope="module")
def capped_runs(tmp_path_factory) -> dict[str, StageResult]:
    """The OOM run, then the remedy run, one after the other on the one GPU."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("trains on a CUDA GPU; torch sees none (--reuse-run/--from-log do not replay these runs)")
    root = tmp_path_factory.mktemp("failures-gpu")
    data = failures.write_dataset(root / "data")
    with failures.launch_env_without_leaks():
        return {"oom": _train(root, data, "oom", OOM), "remedy": _train(root, data, "oom-remedy", REMEDY)}


def test_oom_is_diagnosed_with_the_course_remedy(capped_runs):
    """micro-batch 512 x 512 tokens under an 8 GB cap dies of CUDA OOM, diagnosed with the course's remedy."""
    r = capped_runs["oom"]
    assert not r.ok and not r.timed_out, f"expected an OOM failure, got: {r.headline()}\n{r.failure_message()}"
    found = diagnose(r.name, r.returncode, r.log_path.read_text(errors="replace"), duration_s=r.duration_s,
                     argv=r.argv)
    assert found is not None and found.cause_id == "cuda-oom", r.failure_message()
    assert COURSE_OOM_REMEDY in r.failure_message(), r.failure_message()


def test_course_remedy_fits_the_same_cap(capped_runs):
    """--micro-batch-size 2 with the same sequences and cap trains to the end (fp16: no loss logged yet)."""
    r = capped_runs["remedy"]
    assert r.ok, r.failure_message()
    logged = [record.iteration for record in parse_log_file(r.log_path).iterations]
    assert logged and logged[-1] == 4, f"iteration lines: {logged}; log {r.log_path}"


def test_no_process_outlives_its_run(capped_runs):
    """Neither run leaves a process behind (the OOM'd trainer's checkpoint helpers included)."""
    alive = {name: sorted(current_pids(r)) for name, r in capped_runs.items() if current_pids(r)}
    assert not alive, f"still running after their stage ended: {alive}"
