"""The reference trainer on CPU: CI runs the real megatron-core path (datasets, BertModel, dist-ckpt) without a GPU.

One module fixture preprocesses a 100-document course corpus and runs six tiny trainings through
harness.run.launch.run_stage: the reference (6 iterations, a save every 2), an lr-0 and a NaN mutant alongside it,
a crash mutant, a run whose --data-path names nothing, a resume from the reference's iteration 4 started as soon
as that checkpoint is saved, and one started at once with --wait-for-load, whose checkpoint is copied in only once it
has set up and logged its wait. The course's model dimensions are kept (the checkpoint inspector checks them); only
iterations and batches shrink. Dropout is off in every run, so the lr-0 band below measures batch noise alone
(the exact resume with dropout on, which needs the checkpointed RNG state, is in test_session_cpu.py).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.run import failures

from harness.base import paths
from harness.evidence.checkpoints.inspector import inspect_save_dir
from harness.base.proc import LOAD_WAIT_MARKER
from harness.run.launch import StageResult, current_pids, run_stage
from harness.evidence.logformat import ParsedLog, printed_value
from harness.evidence.logs import parse_checkpoint_line, parse_log_file
from harness.evidence.recipe import _same, load_recipe, recipe_deviations

pytestmark = pytest.mark.slow

ITERS = 6
RESUME_FROM = 4
# 6 iterations, checkpoints at 2/4/6, a log line at 1/2/4/6; one thread per process: four runs share 2 cores.
RUN_FLAGS = ("--train-iters", str(ITERS), "--save-interval", "2", "--attention-dropout", "0", "--hidden-dropout", "0")
ENV = {"OMP_NUM_THREADS": "1"}
STAGE_TIMEOUT_S = 240.0

# Resume: weights, Adam moments, step counts and loss scale are restored from fp32 tensors and the data order is
# the same, so the resumed iteration-6 line is the same computation as the uninterrupted one (measured: equal in
# all 7 printed digits). The line prints 7 significant digits (resolution 1e-5 at a loss of ~10); 1e-4 allows
# for summation-order noise only. A resume that lost the optimizer state or the data position is off by > 1e-2.
RESUME_TOLERANCE = 1e-4
# lr 0: weights never change, so the logged loss moves only with the batch. Measured spread over the four log
# lines of this data: 0.066. By iteration 6 the reference (same batches) is 0.245 below the lr-0 run, so a
# band of 0.15 separates "flat" from "learning".
FLAT_BAND = 0.15


@dataclass(frozen=True)
class CpuRuns:
    """The four CPU runs of this module and where their artifacts are."""

    reference: StageResult
    resumed: StageResult | None
    resumed_early: StageResult
    lr_zero: StageResult
    nan: StageResult
    crash: StageResult
    no_data: StageResult
    save_dir: Path
    summary_json: Path

    def all(self) -> list[StageResult]:
        """Every run that was started."""
        runs = (self.reference, self.resumed, self.resumed_early, self.lr_zero, self.nan, self.crash, self.no_data)
        return [r for r in runs if r is not None]


def _train(root: Path, data: Path, name: str, *extra: str, on_line=None, spawner=None) -> StageResult:
    """One CPU training run as a stage, in its own directory (a fork of the session's server, as a GPU session
    starts its runs)."""
    run_dir = root / name
    argv = failures.train_argv(data, paths.VOCAB_FILE, run_dir / "index-cache", *RUN_FLAGS, *extra)
    spec = failures.stage(f"train-{name}", argv, timeout_s=STAGE_TIMEOUT_S, env=ENV)
    return run_stage(spec, run_dir, on_line=on_line, spawner=spawner)


def _saved(iteration: int, event: threading.Event):
    """An on_line callback that sets `event` once the checkpoint of `iteration` is saved."""
    def on_line(line: str) -> None:
        record = parse_checkpoint_line(line.strip())
        if record is not None and record.event == "saved" and record.iteration == iteration:
            event.set()
    return on_line


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory, cpu_fork_server) -> CpuRuns:
    """Preprocess once, train reference + lr-0 + NaN concurrently, resume the reference from iteration 4."""
    data = failures.healthy_dataset(tmp_path_factory.getbasetemp() / "healthy-dataset")
    root = tmp_path_factory.mktemp("trainer-cpu")
    save_dir, summary = root / "reference" / "checkpoints", root / "reference" / "summary.json"
    checkpoint_ready = threading.Event()
    train = functools.partial(_train, spawner=cpu_fork_server.spawn)

    def reference() -> StageResult:
        try:
            return train(root, data, "reference", "--save", str(save_dir), "--summary-json", str(summary),
                          on_line=_saved(RESUME_FROM, checkpoint_ready))
        finally:
            checkpoint_ready.set()  # never leave the resume waiting

    def resumed() -> StageResult | None:
        checkpoint_ready.wait()
        if not (save_dir / f"iter_{RESUME_FROM:07d}").is_dir():
            return None
        return train(root, data, "resumed", "--load", str(save_dir), "--ckpt-step", str(RESUME_FROM),
                      "--exit-interval", "2")

    early_load, early_waiting, early_done = root / "early-load", threading.Event(), threading.Event()

    def resumed_early() -> StageResult:
        def on_line(line: str) -> None:
            if line.startswith(LOAD_WAIT_MARKER):
                early_waiting.set()
        try:
            return train(root, data, "resumed-early", "--load", str(early_load), "--ckpt-step", str(RESUME_FROM),
                          "--exit-interval", "2", "--wait-for-load", str(STAGE_TIMEOUT_S), on_line=on_line)
        finally:
            early_done.set()

    def copy_in() -> None:
        """The reference's checkpoint into early_load once the early resume waits for it, tracker last."""
        checkpoint_ready.wait()
        while not (early_waiting.wait(0.1) or early_done.is_set()):
            pass
        if early_waiting.is_set() and (save_dir / f"iter_{RESUME_FROM:07d}").is_dir():
            shutil.copytree(save_dir / f"iter_{RESUME_FROM:07d}", early_load / f"iter_{RESUME_FROM:07d}")
            (early_load / "tracker.tmp").write_text(str(RESUME_FROM))
            os.replace(early_load / "tracker.tmp", early_load / "latest_checkpointed_iteration.txt")

    with ThreadPoolExecutor(max_workers=6) as pool:
        pool.submit(copy_in)
        jobs = {"reference": pool.submit(reference), "resumed": pool.submit(resumed),
                "resumed_early": pool.submit(resumed_early),
                "lr_zero": pool.submit(train, root, data, "lr-zero", "--lr", "0", "--min-lr", "0"),
                "nan": pool.submit(train, root, data, "nan", "--train-iters", "1", "--inject-nan-at", "1"),
                "crash": pool.submit(train, root, data, "crash", "--train-iters", "2", "--inject-crash-at", "1",
                                     "--summary-json", str(root / "crash" / "summary.json")),
                "no_data": pool.submit(train, root, data, "no-data", "--data-path", str(root / "nowhere" / "corpus"),
                                       "--summary-json", str(root / "no-data" / "summary.json"))}
        results = {name: job.result() for name, job in jobs.items()}
    return CpuRuns(**results, save_dir=save_dir, summary_json=summary)


def _parsed(result: StageResult) -> ParsedLog:
    """The run's log, parsed; fails the test with the stage's failure message if the run failed."""
    if result is None:
        pytest.fail(f"not started: no iter_{RESUME_FROM:07d} checkpoint to resume from", pytrace=False)
    if not result.ok:
        pytest.fail(result.failure_message(), pytrace=False)
    return parse_log_file(result.log_path)


def _line_at(parsed: ParsedLog, iteration: int):
    """The iteration line of `iteration`."""
    for record in parsed.iterations:
        if record.iteration == iteration:
            return record
    pytest.fail(f"no iteration line for iteration {iteration}; logged: {[r.iteration for r in parsed.iterations]}",
                pytrace=False)


def test_reference_run_exits_0(cpu_runs):
    """The CPU smoke run of the course's recipe finishes cleanly."""
    assert cpu_runs.reference.ok, cpu_runs.reference.failure_message()


def test_log_has_dataset_markers_and_training(cpu_runs):
    """Megatron's setup markers appear, in order, before `training ...`."""
    markers = _parsed(cpu_runs.reference).markers
    wanted = ["building_datasets", "building_bert_datasets", "finished_datasets", "done_setup", "training"]
    missing = [m for m in wanted if m not in markers]
    assert not missing, f"markers missing from {cpu_runs.reference.log_path}: {missing}; found {markers}"
    lines = [markers[m] for m in wanted]
    assert lines == sorted(lines), f"markers out of order (line numbers {dict(zip(wanted, lines))})"


def test_iteration_lines_have_lm_and_sop_loss(cpu_runs):
    """Every logged iteration (1, 2, 4, 6) carries a finite lm loss and sop loss."""
    parsed = _parsed(cpu_runs.reference)
    assert [r.iteration for r in parsed.iterations] == [1, 2, 4, 6], f"iteration lines: {parsed.iterations}"
    bad = [(r.iteration, r.lm_loss, r.sop_loss) for r in parsed.iterations
           if r.lm_loss is None or r.sop_loss is None or not math.isfinite(r.lm_loss + r.sop_loss)]
    assert not bad, f"iteration lines without finite lm/sop loss (iteration, lm, sop): {bad}"


def test_checkpoints_are_complete_and_load(cpu_runs):
    """iter_0000002/4/6, a tracker at 6, and the newest checkpoint loads with the course model's shapes."""
    _parsed(cpu_runs.reference)
    report = inspect_save_dir(cpu_runs.save_dir)
    assert (report.iterations, report.tracker, report.format) == ((2, 4, 6), 6, "torch_dist"), report
    assert report.loaded and report.shapes_ok and not report.problems, report


def test_resume_continues_the_run(cpu_runs):
    """Resumed from iteration 4, the next log line (6) matches the uninterrupted run's."""
    resumed = _parsed(cpu_runs.resumed)
    loaded = [c.iteration for c in resumed.checkpoints if c.event == "loaded"]
    assert loaded == [RESUME_FROM], f"checkpoint loads logged: {loaded}"
    assert [r.iteration for r in resumed.iterations] == [ITERS], f"resumed iteration lines: {resumed.iterations}"
    expected, got = _line_at(_parsed(cpu_runs.reference), ITERS), resumed.iterations[0]
    diffs = {k: (getattr(expected, k), getattr(got, k)) for k in ("lm_loss", "sop_loss")
             if abs(getattr(expected, k) - getattr(got, k)) > RESUME_TOLERANCE}
    assert not diffs, (f"iteration {ITERS}: (uninterrupted, resumed) differ by more than {RESUME_TOLERANCE}: {diffs}; "
                       f"logs {cpu_runs.reference.log_path} {cpu_runs.resumed.log_path}")


def test_a_resume_set_up_before_its_checkpoint_existed_matches_the_resume_after(cpu_runs):
    """--wait-for-load: set up, logged its wait with an empty --load folder, then loaded the checkpoint copied in;
    its iteration-6 line is the one of the resume started after the save, to the last printed digit."""
    early, late = _parsed(cpu_runs.resumed_early), _parsed(cpu_runs.resumed)
    waited = [n for n, line in enumerate(early.lines, 1) if line.startswith(LOAD_WAIT_MARKER)]
    loaded = [c.line_no for c in early.checkpoints if c.event == "loaded"]
    assert len(waited) == 1 and len(loaded) == 1, (waited, loaded)
    assert early.markers["after_dataloaders"] < waited[0] < loaded[0] < early.markers["done_setup"], early.markers
    fields = lambda log: [(r.iteration, r.lm_loss, r.sop_loss, r.grad_norm, r.loss_scale)  # noqa: E731
                          for r in log.iterations]
    assert fields(early) == fields(late) and fields(late), (fields(early), fields(late))


def test_injected_nan_is_counted(cpu_runs):
    """--inject-nan-at 1 makes iteration 1 a skipped NaN iteration with no loss logged."""
    record = _line_at(_parsed(cpu_runs.nan), 1)
    assert (record.nan, record.skipped, record.lm_loss) == (1, 1, None), record


def test_lr_zero_keeps_the_loss_flat(cpu_runs):
    """With --lr 0 the learning rate logs 0 and the loss stays within the batch-noise band."""
    records = _parsed(cpu_runs.lr_zero).iterations
    assert records and all(r.learning_rate == 0 for r in records), [(r.iteration, r.learning_rate) for r in records]
    losses = [r.lm_loss for r in records]
    assert max(losses) - min(losses) < FLAT_BAND, f"lm loss with lr 0 moved {max(losses) - min(losses):.4f}: {losses}"


def test_reference_learns_more_than_the_flat_band(cpu_runs):
    """On the same batches the reference ends more than the band below the lr-0 run (the band can fail)."""
    learned = _line_at(_parsed(cpu_runs.reference), ITERS).lm_loss
    frozen = _line_at(_parsed(cpu_runs.lr_zero), ITERS).lm_loss
    assert frozen - learned > FLAT_BAND, f"iteration {ITERS}: reference {learned:.4f}, lr 0 {frozen:.4f}"


def test_summary_says_cpu(cpu_runs):
    """The trainer's summary JSON records where it ran."""
    _parsed(cpu_runs.reference)
    summary = json.loads(cpu_runs.summary_json.read_text())
    assert (summary["device"], summary["iterations"], summary["world_size"]) == ("cpu", ITERS, 1), summary


def test_layout_is_recorded_where_gpu_memory_reads_it(cpu_runs):
    """One process: the arguments block and summary.json both give the 1-GPU layout (TP, PP, DP sizes 1)."""
    from harness.evidence.records import RunEvidence
    from harness.judge.layouts import Layout, layout_of

    parsed = _parsed(cpu_runs.reference)
    summary = json.loads(cpu_runs.summary_json.read_text())
    assert layout_of(RunEvidence(run_dir="-", log=parsed)) == (Layout(), "the log's arguments block"), parsed.arguments
    assert layout_of(RunEvidence(run_dir="-", extra={"summary": summary})) == (Layout(), "summary.json"), summary


def test_no_process_outlives_its_run(cpu_runs):
    """No process of any run (trainer, checkpoint writer, resource tracker) is alive after it ended."""
    alive = {r.name: sorted(current_pids(r)) for r in cpu_runs.all() if current_pids(r)}
    assert not alive, f"still running after their stage ended: {alive}"


def test_log_prints_megatron_arguments_block_that_the_recipe_check_reads(cpu_runs):
    """The trainer prints Megatron's `arguments` block; the recipe check reads it and names the smoke run's changes."""

    parsed = _parsed(cpu_runs.reference)
    recipe = load_recipe()
    absent = sorted(set(recipe.expected("a")) - set(parsed.arguments or {}))
    assert parsed.arguments is not None and not absent, f"arguments block missing or lacks {absent}"
    failing, _, _ = recipe_deviations(recipe, parsed.arguments, "a")
    argv = list(cpu_runs.reference.argv)
    given = {argv[i][2:].replace("-", "_"): argv[i + 1] for i in range(len(argv) - 1)
             if argv[i].startswith("--") and not argv[i + 1].startswith("--")}
    overridden = {name for name, course in recipe.expected("a").items()
                  if name in given and not any(_same(v, printed_value(given[name]))
                                               for v in (course, *recipe.allowed.get(name, ())))}
    assert {d.split(":")[0] for d in failing} == overridden, failing
    assert overridden, "the CPU smoke run changes some of the course's flags, so the check must name them"


def test_crash_mutant_exits_nonzero_with_a_summary(cpu_runs):
    """--inject-crash-at 1: iteration 1 is logged, then a traceback and a non-zero exit; the summary says why."""
    r = cpu_runs.crash
    assert not r.ok and r.returncode != 0 and not r.timed_out, r.headline()
    log = r.log_path.read_text(errors="replace")
    assert "Traceback" in log and "RuntimeError: --inject-crash-at 1" in log, r.failure_message()
    assert [rec.iteration for rec in parse_log_file(r.log_path).iterations] == [1]
    summary = json.loads((r.run_dir / "summary.json").read_text())
    assert (summary["failed_in"], summary["iterations"], summary["device"]) == ("training", 1, "cpu"), summary
    assert summary["error"].startswith("RuntimeError: --inject-crash-at 1"), summary


def test_setup_failure_still_writes_the_summary(cpu_runs):
    """A --data-path that names nothing fails in setup at once; the summary records the device and the error."""
    r = cpu_runs.no_data
    assert not r.ok and not r.timed_out, r.headline()
    summary = json.loads((r.run_dir / "summary.json").read_text())
    assert (summary["failed_in"], summary["device"], summary["cuda_graphs"]) == ("setup", "cpu", False), summary
    assert ".bin/.idx not found" in summary["error"], summary
