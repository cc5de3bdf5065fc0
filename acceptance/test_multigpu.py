"""The same recipe on 2 GPUs with Megatron's own parallelism (torchrun + NCCL), judged against the 1-GPU golden curve.

DP=2: two ranks, each 2 micro-batches of the global batch of 16. TP=2: one model split over two GPUs
(--make-vocab-size-divisible-by 64 keeps the padded vocab at 30592, as on one GPU). Both must follow the 1-GPU
golden curve within its tolerance (3 std of the seed spread, at least 2%: fixtures/golden/reference_trainer_h200.json),
write checkpoints in the parallel layout that load back, and be seen by NVML. Auto-skipped with fewer than 2 GPUs.
Not yet run on GPUs; the multi-GPU evidence so far is the CPU run of acceptance/selftest/test_parallel_cpu.py
(see README, "Beyond one GPU").
"""

from __future__ import annotations

import sys

import pytest

from harness.judge import criteria
from harness.run.runs import RunSpec
from harness.run.session import Session

pytestmark = pytest.mark.multigpu

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
PARALLEL_RUNS = (
    RunSpec("dp2", "data parallel over 2 GPUs", extra_args=("--tensor-model-parallel-size", "1")),
    RunSpec("tp2", "tensor parallel over 2 GPUs",
            extra_args=("--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64")),
)
PARITY = ("first-loss", "loss-decreases", "final-loss", "golden-final-loss", "golden-curve", "no-nan",
          "checkpoints-saved", "checkpoint-tracker", "checkpoint-loads", "exit-code", "gpu-memory")


class TorchrunSession(Session):
    """A Session whose trainer starts under torchrun with 2 processes."""

    def train_argv(self, spec: RunSpec) -> list[str]:
        argv = super().train_argv(spec)
        return [*TORCHRUN, *argv[1:]]  # argv[0] is the interpreter; torchrun takes `-m harness.train ...`


@pytest.fixture(scope="module")
def parallel_verdicts(settings, tmp_path_factory) -> dict:
    session = TorchrunSession(settings.run_dir / "multigpu" if settings.run_dir else tmp_path_factory.mktemp("mg"),
                              settings.vocab_file, settings.stage_timeout_s)
    prepared = session.run_all(PARALLEL_RUNS, prepare=True)
    assert prepared.ok, prepared.failure_message()
    profile = criteria.load_profile("reference")
    return {name: {v.criterion_id: v for v in criteria.evaluate(profile, session.evidence(name), live=True)}
            for name in session.outcomes}


@pytest.mark.parametrize("run", [r.name for r in PARALLEL_RUNS])
@pytest.mark.parametrize("criterion_id", PARITY)
def test_parallel_run_matches_one_gpu(parallel_verdicts, run, criterion_id):
    verdict = parallel_verdicts[run][criterion_id]  # a live run: not measurable is already a failure
    assert verdict.status == criteria.PASS, verdict.message
