"""The trainer's data- and tensor-parallel paths on CPU: 2 gloo processes under torchrun, judged against 1 process.

Four runs start together on the same data, seed and flags, dropout off: one process, TP=2, DP=2, and DP=2 launched
as two "nodes" (harness.run.nodes: two torchrun agents of one process each, c10d rendezvous on 127.0.0.1, the
multi-node command shape). All see the same global batches in the same order (DP splits each global batch by
micro-batch; TP splits the weights, not the data), and with `use_cpu_initialization` megatron-core draws the full
weights from one seed and then slices them, so TP=2 starts from the same model as one process. TP=2 gets
--make-vocab-size-divisible-by 64: the vocab is padded to a multiple of 64 x TP = 128, the same 30592 rows as one
process (and as the checkpoint inspector expects).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.run import failures, nodes

from harness.base import paths
from harness.evidence.checkpoints.inspector import inspect_save_dir
from harness.run.launch import StageResult, current_pids
from harness.evidence.records import RunEvidence
from harness.judge.layouts import Layout, layout_of
from harness.evidence.logformat import ParsedLog
from harness.evidence.logs import parse_log_file
from harness.base.proc import free_port
from process_tags import TAG, leftovers, new_tag, run_timed

pytestmark = pytest.mark.slow

ITERS = 4
# Global batch 2 of micro-batches of 1: the smallest that still gives each DP rank its own sample and one process two
# micro-batches to accumulate; half the compute of the smoke runs' 4 and 2 (this file: 41-42 s of CPU against 48-52,
# two interleaved pairs), with the same checks failing on the same bugs.
FLAGS = ("--train-iters", str(ITERS), "--log-interval", "2", "--eval-interval", str(ITERS), "--save-interval",
         str(ITERS), "--attention-dropout", "0", "--hidden-dropout", "0", "--global-batch-size", "2",
         "--micro-batch-size", "1")
PARALLEL = {"tp2": ("--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64"), "dp2": (),
            "dp2-c10d": ()}
RUNS = ("single", *PARALLEL)
LAYOUTS = {"single": Layout(), "tp2": Layout(tp=2), "dp2": Layout(dp=2), "dp2-c10d": Layout(dp=2)}
ENV = {"OMP_NUM_THREADS": "1"}   # ten processes on two cores
STAGE_TIMEOUT_S = 240.0
# From the test-set validation line to torchrun's exit: measured 4.2 s on a 2-core machine for one run alone
# (teardown, interpreter exit of both workers, the agent noticing). Five times that; a worker that never exits runs
# into the stage timeout.
EXIT_AFTER_LAST_LINE_S = 20.0
LAST_LINE = "on test set"
QKV = "encoder.layers.self_attention.linear_qkv.weight"   # (layers, 3 x hidden, hidden), split on dim 1 under TP

# Iteration 1 is a forward and backward pass on identical weights and samples: the runs differ only in how fp32
# sums are split across ranks (relative ~1e-6, i.e. ~1e-5 at a loss of 10). Lines print 7 significant digits;
# 1e-4 is ten times that noise. Another batch (a data-order bug) moves the loss by 0.03-0.07 here (the lr-0 run
# of test_trainer_cpu). Measured: lm loss and grad norm equal to every printed digit at iterations 1, 2 and 4, the
# sop loss to 1e-7.
LOSS_TOLERANCE = 1e-4
# The grad norm prints 3 decimals (~16 at iteration 1); an unreduced DP gradient or a TP norm that counts
# replicated weights twice changes it in the first decimal.
GRAD_NORM_TOLERANCE = 2e-3


def _argv(data: Path, run_dir: Path, name: str) -> list[str]:
    """One process, torchrun with two, or two one-process agents (c10d), training the same recipe."""
    argv = failures.train_argv(data, paths.VOCAB_FILE, run_dir / "index-cache", *FLAGS)
    if name == "single":
        return argv
    argv += [*PARALLEL[name], "--save", str(run_dir / "checkpoints")]
    if name == "dp2-c10d":
        return nodes.command(2, free_port(), argv[1:])
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *argv[1:]]


@dataclass
class Trained:
    """One run: its stage, each output line with seconds since the start, and the tag its processes carry."""
    result: StageResult
    lines: list[tuple[float, str]]
    tag: str


def _train(root: Path, data: Path, name: str) -> Trained:
    """One run as a stage in its own directory, every process tagged."""
    tag = new_tag()
    spec = failures.stage(f"train-{name}", _argv(data, root / name, name), timeout_s=STAGE_TIMEOUT_S,
                          env={**ENV, **tag})
    result, lines = run_timed(spec, root / name)
    return Trained(result, lines, tag[TAG])


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Trained]:
    """single, tp2, dp2 and dp2-c10d, trained concurrently."""
    data = failures.healthy_dataset(tmp_path_factory.getbasetemp() / "healthy-dataset")
    root = tmp_path_factory.mktemp("parallel-cpu")
    with ThreadPoolExecutor(max_workers=len(RUNS)) as pool:
        jobs = {name: pool.submit(_train, root, data, name) for name in RUNS}
        return {name: job.result() for name, job in jobs.items()}


@pytest.fixture(scope="module")
def runs(trained) -> dict[str, StageResult]:
    """Each run's stage result."""
    return {name: t.result for name, t in trained.items()}


def _parsed(result: StageResult) -> ParsedLog:
    """The run's parsed log; fails with the stage's failure message if the run failed."""
    if not result.ok:
        pytest.fail(result.failure_message(), pytrace=False)
    return parse_log_file(result.log_path)


def _by_iteration(parsed: ParsedLog) -> dict:
    """Iteration records keyed by iteration."""
    return {r.iteration: r for r in parsed.iterations}


@pytest.mark.parametrize("name", RUNS)
def test_run_exits_0(runs, name):
    """The run finishes cleanly and logs iterations 1, 2 and 4 with an lm loss."""
    parsed = _parsed(runs[name])
    assert [(r.iteration, r.lm_loss is not None) for r in parsed.iterations] == [(1, True), (2, True), (4, True)], (
        f"{name}: {parsed.iterations}")


@pytest.mark.parametrize("name", list(PARALLEL))
def test_loss_matches_one_process(runs, name):
    """lm and sop loss at the first log line equal the one-process run's (and stay equal at 2 and 4)."""
    single, parallel = _by_iteration(_parsed(runs["single"])), _by_iteration(_parsed(runs[name]))
    pairs = [(it, key, getattr(single[it], key), getattr(parallel[it], key)) for it in sorted(single)
             for key in ("lm_loss", "sop_loss")]
    off = [pair for pair in pairs if abs(pair[2] - pair[3]) > LOSS_TOLERANCE]
    assert not off, f"{name} vs one process, beyond {LOSS_TOLERANCE} (iteration, metric, single, {name}): {off}"


@pytest.mark.parametrize("name", list(PARALLEL))
def test_grad_norm_matches_one_process(runs, name):
    """Gradients are reduced across ranks: the grad norm at every log line equals the one-process run's."""
    single, parallel = _by_iteration(_parsed(runs["single"])), _by_iteration(_parsed(runs[name]))
    off = [(it, single[it].grad_norm, parallel[it].grad_norm) for it in sorted(single)
           if abs(single[it].grad_norm - parallel[it].grad_norm) > GRAD_NORM_TOLERANCE]
    assert not off, f"{name} vs one process, grad norm beyond {GRAD_NORM_TOLERANCE} (iteration, single, {name}): {off}"


@pytest.mark.parametrize("name", list(PARALLEL))
def test_checkpoint_written_and_loads(runs, name):
    """A torch_dist checkpoint at the last iteration that loads with the course model's full shapes."""
    _parsed(runs[name])
    report = inspect_save_dir(runs[name].run_dir / "checkpoints")
    assert (report.iterations, report.tracker, report.format) == ((ITERS,), ITERS, "torch_dist"), report
    assert report.loaded and report.shapes_ok and not report.problems, report


@pytest.mark.parametrize("name", RUNS)
def test_log_records_the_layout(runs, name):
    """The arguments block gives each run's layout (what gpu-memory picks its band by); the two c10d agents formed
    one world of 2, a data-parallel pair like torchrun --standalone's."""
    ev = RunEvidence(run_dir=str(runs[name].run_dir), log=_parsed(runs[name]))
    assert layout_of(ev) == (LAYOUTS[name], "the log's arguments block"), ev.log.arguments


def test_tp2_checkpoint_holds_each_ranks_shard(runs):
    """Under TP=2 each rank wrote its own half of a split weight into its own files."""
    from torch.distributed.checkpoint import FileSystemReader

    _parsed(runs["tp2"])
    iter_dir = runs["tp2"].run_dir / "checkpoints" / f"iter_{ITERS:07d}"
    metadata = FileSystemReader(str(iter_dir)).read_metadata()
    writer = {}   # start row on dim 1 -> writing ranks (the file's first number)
    for index, info in metadata.storage_data.items():
        if index.fqn == QKV:
            writer.setdefault(index.offset[1], set()).add(info.relative_path.split("_")[2])
    assert writer == {0: {"0"}, 192: {"1"}}, f"{QKV} in {iter_dir}: dim-1 offset -> writing ranks {writer}"


def test_no_process_outlives_its_run(trained):
    """Neither torchrun nor its workers nor the checkpoint writers survive their stage: none of the pids the
    launcher saw, and no process carrying the run's tag (found even when re-parented away from the tree)."""
    alive = {name: sorted(current_pids(t.result)) for name, t in trained.items() if current_pids(t.result)}
    tagged = {name: left for name, t in trained.items() if (left := leftovers(t.tag))}
    assert not alive and not tagged, f"still running after their stage ended: {alive}; by tag: {tagged}"


@pytest.mark.parametrize("name", list(PARALLEL))
def test_torchrun_exits_soon_after_the_last_line(trained, name):
    """Training, saves and the final validation done, torchrun (one agent, or the two c10d agents) exits 0 within
    the bound of the test-set validation line."""
    result, lines = trained[name].result, trained[name].lines
    assert result.ok, result.failure_message()
    last = [t for t, line in lines if LAST_LINE in line]
    assert last, f"{name}: no test-set validation line; log tail: {result.tail[-5:]}"
    after = result.duration_s - last[-1]
    assert after <= EXIT_AFTER_LAST_LINE_S, (
        f"{name}: torchrun exited {after:.1f} s after the test-set validation line (bound {EXIT_AFTER_LAST_LINE_S:g} s)")
