"""The same recipe on 2 GPUs with Megatron's own parallelism (NCCL), judged against the 1-GPU golden curve.

Three runs, one after the other, so that each run's ms/iter is its own (two runs sharing the two GPUs slow each
other down):
- dp2: `torchrun --standalone --nproc-per-node 2`, each rank 2 micro-batches of the global batch of 16;
- tp2: the same launch, one model split over two GPUs (--make-vocab-size-divisible-by 64 keeps the padded vocab
  at 30592, as on one GPU);
- dp2-c10d: DP=2 launched as two "nodes": two torchrun agents of one process each on this host, each seeing one
  GPU, meeting through a c10d rendezvous on 127.0.0.1 (harness.run.nodes, the multi-node command shape).
Each must follow the 1-GPU golden curve within its tolerance (fixtures/golden/reference_trainer_h200.json), write
checkpoints in its parallel layout that load back, exit 0, and keep every GPU inside its layout's memory band
(fixtures/golden/multigpu_h200.json). RUN_DIR/multigpu/speed.json records each run's ms/iter against the 1-GPU
reference. Auto-skipped with fewer than 2 GPUs.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from harness.judge import criteria
from harness.base.paths import GOLDEN_DIR
from harness.run import nodes
from harness.run.runs import RunSpec
from harness.run.session import Session
from harness.base.proc import free_port
from harness.judge.profiles import PASS, load_profile

pytestmark = pytest.mark.multigpu

TORCHRUN = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
C10D = "dp2-c10d"
PARALLEL_RUNS = (
    RunSpec("dp2", "data parallel over 2 GPUs", extra_args=("--tensor-model-parallel-size", "1")),
    RunSpec("tp2", "tensor parallel over 2 GPUs",
            extra_args=("--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64")),
    RunSpec(C10D, "data parallel over 2 one-GPU 'nodes' (two torchrun agents, c10d rendezvous)",
            extra_args=("--tensor-model-parallel-size", "1")),
)
PARITY = ("first-loss", "loss-decreases", "final-loss", "golden-final-loss", "golden-curve", "no-nan",
          "checkpoints-saved", "checkpoint-tracker", "checkpoint-loads", "exit-code", "gpu-memory")
SPEED_FILE = "speed.json"


def node_devices() -> list[str]:
    """The two GPUs the stand-in nodes get, one each: the first two of CUDA_VISIBLE_DEVICES, else 0 and 1."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[:2] if len(visible) >= 2 else ["0", "1"]


class TorchrunSession(Session):
    """A Session whose trainer starts under torchrun: 2 processes on this host, or 2 one-process agents (c10d)."""

    def train_argv(self, spec: RunSpec) -> list[str]:
        program = super().train_argv(spec)[1:]   # argv[0] is the interpreter; torchrun takes `-m harness.train ...`
        if spec.name == C10D:
            return nodes.command(2, free_port(), program, node_devices())
        return [*TORCHRUN, *program]


def one_gpu_speed() -> dict:
    """The 1-GPU reference ms/iter and where it was measured (fixtures/golden/multigpu_h200.json)."""
    return json.loads((GOLDEN_DIR / "multigpu_h200.json").read_text())["one_gpu_speed"]


@pytest.fixture(scope="module")
def parallel_session(settings, tmp_path_factory) -> TorchrunSession:
    """The three runs, trained one after the other (the first one while the corpus is preprocessed)."""
    session = TorchrunSession(settings.run_dir / "multigpu" if settings.run_dir else tmp_path_factory.mktemp("mg"),
                              settings.vocab_file, settings.stage_timeout_s)
    for i, spec in enumerate(PARALLEL_RUNS):
        prepared = session.run_all((spec,), prepare=i == 0)
        assert prepared is None or prepared.ok, prepared.failure_message()
    return session


@pytest.fixture(scope="module")
def parallel_verdicts(parallel_session) -> dict:
    """{run: {criterion id: Verdict}} under the reference profile, as live runs."""
    profile = load_profile("reference")
    return {name: {v.criterion_id: v for v in criteria.evaluate(profile, parallel_session.evidence(name), live=True)}
            for name in parallel_session.outcomes}


@pytest.fixture(scope="module")
def speed(parallel_session) -> dict:
    """RUN_DIR/multigpu/speed.json: each run's median ms/iter (its summary.json) and its ratio to one GPU."""
    reference = one_gpu_speed()
    runs = {}
    for name, outcome in parallel_session.outcomes.items():
        ms = outcome.summary.get("ms_per_iter_median")
        runs[name] = {"ms_per_iter_median": ms, "ms_per_iter_intervals": outcome.summary.get("ms_per_iter_intervals"),
                      "ratio_to_one_gpu": None if ms is None else round(ms / reference["ms_per_iter_median"], 3)}
    doc = {"one_gpu_reference": reference, "runs": runs,
           "note": "runs trained one after the other, each alone on the GPUs; ratio = run ms/iter / 1-GPU ms/iter "
                   "(the 1-GPU number is the fixture's, not measured in this session)"}
    (parallel_session.run_dir / SPEED_FILE).write_text(json.dumps(doc, indent=1))
    return doc


@pytest.mark.parametrize("run", [r.name for r in PARALLEL_RUNS])
@pytest.mark.parametrize("criterion_id", PARITY)
def test_parallel_run_matches_one_gpu(parallel_verdicts, run, criterion_id):
    verdict = parallel_verdicts[run][criterion_id]  # a live run: not measurable is already a failure
    assert verdict.status == PASS, verdict.message


@pytest.mark.parametrize("run", [r.name for r in PARALLEL_RUNS])
def test_speed_is_recorded(speed, run, record_property):
    """The run's median ms/iter and its ratio to one GPU go into speed.json and the JUnit properties."""
    entry, reference = speed["runs"][run], speed["one_gpu_reference"]
    record_property("ms_per_iter_median", entry["ms_per_iter_median"])
    record_property("ratio_to_one_gpu", entry["ratio_to_one_gpu"])
    record_property("one_gpu_ms_per_iter_median", reference["ms_per_iter_median"])
    assert entry["ms_per_iter_median"], f"{run}: summary.json has no ms_per_iter_median (the run logged no interval)"
