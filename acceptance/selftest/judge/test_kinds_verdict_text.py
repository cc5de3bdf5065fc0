"""The whole Finding (status, measured, expected, where, missing) of the checkers besides the loss bands: markers,
exit code, device, checkpoints, tracker, loading, NVML memory per layout, the training's own memory, the CUDA
graph and no-NaN, plus the helpers behind them (windows of the trend, the loss-scale text, a missing counter,
a profile without golden values). (Written against the mutation run's survivors in harness.judge.kinds;
test_band_verdict_text.py, test_skips_verdict_text.py and test_resume_verdict_text.py cover the band checkers.)"""

from __future__ import annotations

from dataclasses import replace

from harness.judge import kinds, layouts, log_evidence, memory_golden
from harness.evidence import logs
from harness.judge.profiles import FAIL, Golden, load_profile, NOT_MEASURABLE, PASS
from harness.evidence.records import CheckpointReport, MemoryReport, RankMemory, RunEvidence
from harness.judge.kinds import Finding
from harness.base.paths import CRITERIA_DIR, RECORDED_LOGS
from harness.evidence.logformat import (IterationRecord, MARKER_DONE_SETUP, MARKER_TRAINING, ParsedLog, format_arguments, format_iteration, format_memory)
from harness.evidence.recipe import load_recipe

REFERENCE = load_profile("reference")
MEGATRON = load_profile("megatron-lm")
SAVE = "/runs/t/ckpt"
ONE_GPU = "no parallel sizes recorded; NVML saw one GPU"
H200_OWN = memory_golden.select("NVIDIA H200")[0]["own_band_mib"]


def _check(profile, cid: str, ev: RunEvidence, golden=None, needs=..., **params) -> Finding:
    c = profile.by_id(cid)
    c = replace(c, params={**c.params, **params}, needs=c.needs if needs is ... else needs)
    return kinds.CHECKERS[c.kind](c, ev, golden)


def _ev(**fields) -> RunEvidence:
    return RunEvidence(run_dir="/runs/t", **fields)


def _unmeasured(reason: str, expected: str, where: str = "-") -> Finding:
    return Finding(NOT_MEASURABLE, f"not measured: {reason}", expected, where)


def _iteration(it: int, loss_scale=65536.0, skipped=0, nan=0) -> str:
    return format_iteration(IterationRecord(
        iteration=it, train_iters=200, consumed_samples=16 * it, elapsed_ms=90.0, learning_rate=1e-4,
        global_batch_size=16, loss_scale=loss_scale, lm_loss=9.0, sop_loss=0.69, skipped=skipped, nan=nan))


def _log(*lines: str) -> ParsedLog:
    return logs.parse_log("\n".join(lines) + "\n")


# ---------------------------------------------------------------- exit code, device, markers


def test_exit_code_texts():
    # "the run completed": exit code and no timeout (a live run) and the log's normal end (logs.run_end)
    end = ("the run completed: the log's normal end (last iteration = --train-iters, the final save's `successfully "
           "saved` line, `validation loss ... on validation set` and `... on test set`, no traceback or launcher "
           "failure after them)")
    expected = end + "; exit code 0, no timeout"
    assert _check(REFERENCE, "exit-code", _ev(exit_code=137, timed_out=True)) == Finding(
        FAIL, "timed out (exit code 137)", expected, "process end")
    assert _check(REFERENCE, "exit-code", _ev()) == _unmeasured("no training log to show the run's end", end)
    assert _check(REFERENCE, "exit-code", _ev(exit_code=0)) == _unmeasured(
        "exit code 0; no training log to show the run's end", expected)
    assert _check(REFERENCE, "exit-code", _ev(exit_code=1)) == Finding(FAIL, "exit code 1", expected, "process end")
    full = logs.parse_log_file(RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log")
    ok = _check(REFERENCE, "exit-code", _ev(exit_code=0, log=full))
    assert ok.status == PASS and ok.measured.startswith("exit code 0; completed: iteration 200 of 200"), ok
    cut = _log(_iteration(10), _iteration(20))
    out = _check(REFERENCE, "exit-code", _ev(log=cut))
    assert out == Finding(FAIL, "stopped at iteration 20 of 200; missing: iterations 21-200", end,
                          "iteration 20, log line 2"), out


def test_device_texts():
    expected = "device cuda (the log's CUDA memory report lines, NCCL process-group lines or device arguments)"
    assert _check(REFERENCE, "ran-on-gpu", _ev()) == _unmeasured(
        "the trainer's device was not recorded and there is no training log", expected)
    assert _check(REFERENCE, "ran-on-gpu", _ev(device="cuda")) == Finding(PASS, "device cuda", expected,
                                                                         "trainer start")
    assert _check(REFERENCE, "ran-on-gpu", _ev(device="cpu")) == Finding(FAIL, "device cpu", expected,
                                                                        "trainer start")
    bare = _log(_iteration(10))
    assert _check(REFERENCE, "ran-on-gpu", _ev(log=bare)) == _unmeasured(
        "the log has no CUDA memory report line (`[Rank N] ... memory (MB) | allocated`), no NCCL process-group line "
        "and no device argument", expected, "whole log (1 lines)")
    mem = _log(_iteration(10), format_memory(0, 10, 121.39, 212.27, 296.0, 296.0))
    assert _check(REFERENCE, "ran-on-gpu", _ev(log=mem)).status == PASS
    gloo = _log(*format_arguments({"distributed_backend": "gloo"}), _iteration(10))
    out = _check(REFERENCE, "ran-on-gpu", _ev(log=gloo))
    assert out.status == FAIL and "distributed_backend gloo" in out.measured, out


def test_marker_texts_name_the_missing_and_the_found_lines():
    wanted = ["training", "done_setup", "after_training"]
    expected = "log lines: 'training ...'; 'done with setup ...'; '[after training is done] datetime:'"
    assert _check(REFERENCE, "training-started", _ev(), markers=wanted) == _unmeasured("no training log", expected)
    log = _log("hello", MARKER_TRAINING, _iteration(10))
    assert _check(REFERENCE, "training-started", _ev(log=log), markers=wanted) == Finding(
        FAIL, "missing 'done with setup ...'; '[after training is done] datetime:'; found training (line 2)",
        expected, "whole log (3 lines)", missing=True)
    two = _log(MARKER_DONE_SETUP, MARKER_TRAINING)
    assert _check(REFERENCE, "training-started", _ev(log=two), markers=wanted).measured == (
        "missing '[after training is done] datetime:'; found training (line 2), done_setup (line 1)")
    none = _check(REFERENCE, "training-started", _ev(log=_log("hello")), markers=["training", "done_setup"])
    assert none.measured == "missing 'training ...'; 'done with setup ...'" and none.missing
    both = _log(MARKER_DONE_SETUP, "x", MARKER_TRAINING)
    assert _check(REFERENCE, "training-started", _ev(log=both), markers=["training", "done_setup"]) == Finding(
        PASS, "found at log line(s) 3, 1", "log lines: 'training ...'; 'done with setup ...'", "log line 3")


# ---------------------------------------------------------------- checkpoints


def test_checkpoint_iteration_texts():
    expected = ("iter_0000100/ and iter_0000200/ with weights; in the log a `saving checkpoint at iteration N` line "
                "followed by `successfully saved checkpoint from iteration N` for each")
    assert _check(REFERENCE, "checkpoints-saved", _ev()) == _unmeasured(
        "no checkpoint directory inspected and no training log", expected)
    one = CheckpointReport(save_dir=SAVE, iterations=(100,), format="torch_dist")
    assert _check(REFERENCE, "checkpoints-saved", _ev(checkpoints=one)) == Finding(
        FAIL, "missing iter_0000200/ (found: iter_0000100)", expected, SAVE, missing=True)
    empty = CheckpointReport(save_dir=SAVE)
    assert _check(REFERENCE, "checkpoints-saved", _ev(checkpoints=empty)).measured == (
        "missing iter_0000100/, iter_0000200/ (found: none)")
    no_weights = CheckpointReport(save_dir=SAVE, iterations=(100, 200))
    assert _check(REFERENCE, "checkpoints-saved", _ev(checkpoints=no_weights)) == Finding(
        FAIL, "found iter_0000100, iter_0000200 but no weights files recognised", expected, SAVE)
    good = replace(no_weights, format="torch")
    assert _check(REFERENCE, "checkpoints-saved", _ev(checkpoints=good)) == Finding(
        PASS, "found iter_0000100, iter_0000200 (torch)", expected, SAVE)


def test_tracker_texts():
    expected = "latest_checkpointed_iteration.txt = 200"
    assert _check(REFERENCE, "checkpoint-tracker", _ev()) == _unmeasured("no checkpoint directory inspected",
                                                                        expected)
    for tracker, status in ((200, PASS), (100, FAIL), (None, FAIL)):
        report = CheckpointReport(save_dir=SAVE, tracker=tracker)
        assert _check(REFERENCE, "checkpoint-tracker", _ev(checkpoints=report)) == Finding(
            status, f"tracker = {tracker}", expected, SAVE)


def test_checkpoint_load_texts():
    expected = "newest checkpoint loads on CPU, parameter names and shapes match the model"
    assert _check(REFERENCE, "checkpoint-loads", _ev()) == _unmeasured("no checkpoint directory inspected",
                                                                      expected)
    ok = CheckpointReport(save_dir=SAVE, loaded=True, shapes_ok=True, num_parameters=5)
    assert _check(REFERENCE, "checkpoint-loads", _ev(checkpoints=ok)) == Finding(
        PASS, "loaded=True, shapes_ok=True, 5 parameters", expected, SAVE)
    shapes = replace(ok, shapes_ok=False, problems=("a.pt: shape (2, 3), model (3, 2)", "fix the config"))
    assert _check(REFERENCE, "checkpoint-loads", _ev(checkpoints=shapes)) == Finding(
        FAIL, "loaded=True, shapes_ok=False, 5 parameters; a.pt: shape (2, 3), model (3, 2); fix the config",
        expected, SAVE)
    unloaded = replace(ok, loaded=False)
    assert _check(REFERENCE, "checkpoint-loads", _ev(checkpoints=unloaded)).status == FAIL


# ---------------------------------------------------------------- NVML memory per layout


def _band_expected(lo, hi, layout: str, source: str) -> str:
    return f"peak GPU memory per GPU in [{lo}, {hi}] MiB for {layout} ({source}; NVML, includes CUDA context)"


def test_one_gpu_nvml_band_texts():
    expected = _band_expected(2908, 3554, "1 GPU", "the 1-GPU band")
    assert _check(MEGATRON, "gpu-memory", _ev()) == _unmeasured("no NVML memory trace (needs a live GPU run)",
                                                               expected)
    assert _check(MEGATRON, "gpu-memory", _ev(), needs=None) == _unmeasured("no NVML memory trace", expected)
    gone = MemoryReport(method="unavailable", reason="no NVIDIA driver")
    assert _check(MEGATRON, "gpu-memory", _ev(memory=gone)).measured == (
        "not measured: unavailable: no NVIDIA driver (needs a live GPU run)")
    assert _check(MEGATRON, "gpu-memory", _ev(memory=replace(gone, reason=""))).measured == (
        "not measured: unavailable: no peak (needs a live GPU run)")
    mem = MemoryReport(method="nvml-process", peak_mib=3000.4, samples=12, gpu_name="NVIDIA H200",
                       ranks=(RankMemory(0, 3000.4),))
    assert _check(MEGATRON, "gpu-memory", _ev(memory=mem)) == Finding(
        PASS, "3000 MiB (nvml-process, 12 samples)", expected, f"GPU NVIDIA H200, 1 GPU (layout from {ONE_GPU})")
    high = replace(mem, peak_mib=4000.0, gpu_name=None, ranks=())
    assert _check(MEGATRON, "gpu-memory", _ev(memory=high)) == Finding(
        FAIL, "4000 MiB (nvml-process, 12 samples)", expected, f"GPU ?, 1 GPU (layout from {ONE_GPU})")


def _summary(layout: layouts.Layout) -> dict:
    return {"tensor_model_parallel_size": layout.tp, "pipeline_model_parallel_size": layout.pp,
            "data_parallel_size": layout.dp, "world_size": layout.world_size}


def test_several_gpus_texts_unknown_uncalibrated_and_per_rank():
    ranks = (RankMemory(0, 3000.0, rank=0), RankMemory(1, 3100.0, rank=1))
    mem = MemoryReport(method="nvml-process", peak_mib=3100.0, samples=7, gpu_name="NVIDIA H200", ranks=ranks)
    assert _check(REFERENCE, "gpu-memory", _ev(memory=mem)) == _unmeasured(
        "the run's parallel layout is unknown (no parallel sizes in the log or summary.json, and NVML saw 2 GPUs), "
        "so no band applies", "peak GPU memory in the band of the run's layout")
    tp4 = _ev(memory=mem, extra={"summary": _summary(layouts.Layout(tp=4))})
    known = layouts.load_layout_bands("multigpu_h200.json")
    assert _check(REFERENCE, "gpu-memory", tp4) == _unmeasured(
        f"no memory band is calibrated for TP=4 in layouts file multigpu_h200.json (calibrated: "
        f"{', '.join(b.layout.name() for b in known.values())}); measure that layout's per-rank peaks on the GPU "
        "and add them", "peak GPU memory per GPU in the band of TP=4", "layout from summary.json")
    assert len(known) >= 2
    assert _check(MEGATRON, "gpu-memory", tp4) == _unmeasured(
        "no memory band is calibrated for TP=4 in this profile (calibrated: none); measure that layout's per-rank "
        "peaks on the GPU and add them", "peak GPU memory per GPU in the band of TP=4", "layout from summary.json")
    dp2 = known[layouts.Layout(dp=2)]
    out = _check(REFERENCE, "gpu-memory", _ev(memory=mem, extra={"summary": _summary(layouts.Layout(dp=2))}))
    assert out == Finding(
        PASS if dp2.lo <= 3000 and 3100 <= dp2.hi else FAIL,
        "highest 3100 MiB (nvml-process, 7 samples); per rank: rank 0 (GPU 0) 3000 MiB; rank 1 (GPU 1) 3100 MiB",
        _band_expected(dp2.lo, dp2.hi, "DP=2", f"multigpu_h200.json {dp2.key}"),
        "GPU NVIDIA H200, DP=2 (layout from summary.json)")
    gone = _check(REFERENCE, "gpu-memory", _ev(memory=replace(mem, peak_mib=None),
                                               extra={"summary": _summary(layouts.Layout(dp=2))}))
    assert gone == _unmeasured("nvml-process: no peak (needs a live GPU run)",
                               _band_expected(dp2.lo, dp2.hi, "DP=2", f"multigpu_h200.json {dp2.key}"))


# ---------------------------------------------------------------- the training's own memory


def _own_expected(why: str) -> str:
    return (f"the training's own peak memory (torch allocator, max reserved) in [{H200_OWN['lo']}, "
            f"{H200_OWN['hi']}] MiB ({why}); the CUDA context of this machine is reported, not judged")


def test_own_memory_texts():
    mem = MemoryReport(method="nvml-process", peak_mib=2500.0, samples=9, gpu_name="NVIDIA H200")
    here = memory_golden.select("NVIDIA H200")[1]
    assert here.startswith("calibrated on this GPU kind")
    own = H200_OWN["lo"] + 1
    out = _check(REFERENCE, "gpu-memory", _ev(memory=mem, extra={"summary": {"torch_max_reserved_mib": own}}))
    assert out == Finding(PASS, f"own {own:.0f} MiB + context {2500 - own:.0f} MiB = 2500 MiB total on NVIDIA H200 "
                                "(nvml-process; the course says about 2-4 GB in total)", _own_expected(here),
                          "GPU NVIDIA H200, 1 GPU")
    anon = replace(mem, gpu_name=None)
    portable = memory_golden.select(None)[1]
    assert portable != here
    out = _check(REFERENCE, "gpu-memory", _ev(memory=anon, extra={"summary": {"torch_max_reserved_mib": 5000}}))
    assert out == Finding(FAIL, "own 5000 MiB + context -2500 MiB = 2500 MiB total on this GPU (nvml-process; the "
                                "course says about 2-4 GB in total)", _own_expected(portable), "GPU ?, 1 GPU")
    assert _check(REFERENCE, "gpu-memory", _ev(memory=mem)) == _unmeasured(
        "the trainer recorded no allocator peak (summary.json: torch_max_reserved_mib)", _own_expected(here))
    assert _check(REFERENCE, "gpu-memory", _ev(memory=replace(mem, peak_mib=None, reason="lost"))) == _unmeasured(
        "nvml-process: lost (needs a live GPU run)", _own_expected(here))
    assert _check(REFERENCE, "gpu-memory", _ev()) == _unmeasured("no NVML memory trace (needs a live GPU run)",
                                                                _own_expected(portable))


def test_own_memory_without_a_calibration_is_not_measured(monkeypatch):
    asked = []
    monkeypatch.setattr(memory_golden, "select", lambda name: asked.append(name) or (None, f"nothing for {name}"))
    mem = MemoryReport(method="nvml-process", peak_mib=2500.0, samples=9, gpu_name="NVIDIA H200")
    assert _check(REFERENCE, "gpu-memory", _ev(memory=mem)) == _unmeasured(
        "nothing for NVIDIA H200", "the training's own peak GPU memory in a calibrated band")
    assert asked == ["NVIDIA H200"]


# ---------------------------------------------------------------- CUDA graph


def test_cuda_graph_texts():
    expected = "whole step captured in one CUDA graph and replayed (summary.json: cuda_graphs true)"

    def out(summary):
        return _check(REFERENCE, "cuda-graph", _ev(extra={"summary": summary} if summary is not None else {}))

    assert out(None) == _unmeasured("the trainer wrote no summary.json (or not the reference trainer)", expected)
    assert out({"device": "cuda"}) == out(None)
    assert out({"cuda_graphs": True}) == Finding(PASS, "CUDA graph captured and replayed", expected, "trainer setup")
    assert out({"cuda_graphs": False, "cuda_graph_error": "capture of op x failed"}) == Finding(
        FAIL, "capture failed, the run fell back to the eager step: capture of op x failed", expected,
        "trainer setup (log line 'WARNING: CUDA graph capture failed')")
    assert out({"cuda_graphs": False, "failed_in": "setup", "error": "CUDA out of memory"}) == Finding(
        FAIL, "no CUDA graph: the run failed during setup before capture: CUDA out of memory", expected,
        "trainer setup")
    assert out({"cuda_graphs": False, "failed_in": "train", "device": "cpu"}) == Finding(
        FAIL, "no CUDA graph: eager step on device cpu", expected, "trainer setup")


# ---------------------------------------------------------------- no NaN, counters, helpers


NO_NAN_EXPECTED = ("every logged loss finite and no log interval after iteration 40 skipped whole (an occasional "
                   "overflow skip is normal fp16 loss scaling)")


def test_no_nan_texts():
    assert _check(REFERENCE, "no-nan", _ev()) == _unmeasured("no training log", NO_NAN_EXPECTED)
    assert _check(REFERENCE, "no-nan", _ev(log=_log("a", "b"))) == Finding(
        FAIL, "no iteration line in the log", NO_NAN_EXPECTED, "whole log (2 lines)", missing=True)
    log = _log(_iteration(1, nan=1), _iteration(10, 32768.0, nan=2), _iteration(20, 65536.0))
    assert _check(REFERENCE, "no-nan", _ev(log=log)) == Finding(
        PASS, "finite losses in 3 iteration lines; lowest loss scale 32768; 2 overflowed step(s) counted as 'nan "
              "iterations' (skipped, as fp16 loss scaling does)", NO_NAN_EXPECTED, "whole log (3 lines)")
    # the parser requires a loss scale on every iteration line; records built otherwise may lack one
    unscaled = replace(log, iterations=tuple(replace(r, loss_scale=None) for r in log.iterations))
    assert "; lowest loss scale not logged; " in _check(REFERENCE, "no-nan", _ev(log=unscaled)).measured
    assert kinds._scale(None) == "not logged" and kinds._scale(65536.0) == "65536" and kinds._scale(0.5) == "0.5"


def test_an_absent_skip_counter_names_its_first_line():
    lines = [_iteration(10), _iteration(20, skipped=None), _iteration(30, skipped=None)]
    out = _check(REFERENCE, "skips-early-only", _ev(log=_log(*lines)))
    assert out.status == NOT_MEASURABLE
    assert out.measured == ("not measured: 2 of 3 iteration lines have no 'number of skipped iterations' counter "
                            "(first at log line 2); an absent counter is not 0")


def test_windows_spread_the_remainder_over_the_first_chunks():
    assert log_evidence.value_windows(list(range(7)), 3) == [[0, 1, 2, 3], [4, 5, 6]]
    assert log_evidence.value_windows(list(range(11)), 3) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    assert log_evidence.value_windows(list(range(6)), 3) == [[0, 1, 2], [3, 4, 5]]


def test_golden_kinds_without_golden_values_are_not_measured():
    for cid in ("golden-final-loss", "golden-curve"):
        assert _check(REFERENCE, cid, _ev(log=_log(_iteration(10)))) == _unmeasured(
            "this profile has no golden values for the run's recipe", "lm loss golden values")


def test_a_cut_last_line_is_named_in_the_whole_log_where():
    out = _check(REFERENCE, "no-nan", _ev(log=logs.parse_log("a\nb")))
    assert out.where == "whole log (2 lines, last line cut off)"
    assert kinds._fmt(None) == "none" and kinds._fmt(8.123456) == "8.1235"


def test_no_nan_judges_whole_skipped_intervals_only_after_its_iteration():
    skipped = format_iteration(IterationRecord(
        iteration=30, train_iters=200, consumed_samples=480, elapsed_ms=90.0, learning_rate=1e-4,
        global_batch_size=16, loss_scale=1.0, lm_loss=None, sop_loss=None, skipped=10, nan=0))
    log = _log(_iteration(10), _iteration(20), skipped, _iteration(50), _iteration(60))
    assert _check(REFERENCE, "no-nan", _ev(log=log), after=40).status == PASS
    what, r = kinds.fp16.divergence(log.iterations, 20)
    assert _check(REFERENCE, "no-nan", _ev(log=log), after=20) == Finding(
        FAIL, what, NO_NAN_EXPECTED.replace("iteration 40", "iteration 20"), "iteration 30, log line 3")


def test_golden_source_names_the_file_its_gpu_and_a_run_elsewhere():
    golden = Golden(path="/fixtures/golden/g.json", provenance={"gpu": "NVIDIA H200"}, metrics={})
    h200, a100 = (MemoryReport(method="nvml-process", peak_mib=1.0, gpu_name=n) for n in ("NVIDIA H200", "NVIDIA A100"))
    assert kinds._golden_source(golden, _ev()) == "g.json, calibrated on NVIDIA H200"
    assert kinds._golden_source(golden, _ev(memory=h200)) == "g.json, calibrated on NVIDIA H200"
    assert kinds._golden_source(golden, _ev(memory=a100)) == (
        "g.json, calibrated on NVIDIA H200; this run's GPU (NVIDIA A100) has no golden values of its own: judged by "
        "these, calibrated elsewhere")
    unknown = replace(golden, provenance={})
    assert kinds._golden_source(unknown, _ev(memory=a100)) == "g.json"


RECORDED = logs.parse_log_file(RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log")


def test_recipe_texts_list_deviations_reported_and_unprinted_flags():
    recipe = load_recipe("course-recipe.toml")
    title = recipe.variants["a"].title
    expected = f"the course's training flags ({len(recipe.expected('a'))} judged, recipe a: {title})"
    where = f"arguments block at log line {RECORDED.arguments_line}"
    out = _check(REFERENCE, "recipe", _ev(log=RECORDED))
    assert out == Finding(PASS, "no deviation (arguments block: bert_binary_head True)", expected, where)
    args = dict(RECORDED.arguments)
    course_lr, course_layers = recipe.expected("a")["lr"], recipe.expected("a")["num_layers"]
    args.update(lr="0.01", num_layers="2", seed="7")
    del args["hidden_size"], args["seq_length"]
    out = _check(REFERENCE, "recipe", _ev(log=replace(RECORDED, arguments=args)))
    assert out == Finding(FAIL, f"2 deviation(s): num_layers: {course_layers} -> 2; lr: {course_lr} -> 0.01; "
                                "reported, not judged: seed: 1234 -> 7; not printed: hidden_size, seq_length",
                          expected, where)
    args = {**RECORDED.arguments, "seed": "7", "micro_batch_size": "2"}
    del args["hidden_size"]
    out = _check(REFERENCE, "recipe", _ev(log=replace(RECORDED, arguments=args)))
    assert out == Finding(PASS, "no deviation (arguments block: bert_binary_head True); reported, not judged: "
                                "micro_batch_size: 4 -> 2 (allowed: the course's FAQ remedy); seed: 1234 -> 7; "
                                "not printed: hidden_size", expected, where)
    none = _check(REFERENCE, "recipe", _ev(log=logs.parse_log("a\nb")))
    assert none == _unmeasured("the log has no `arguments` block (Megatron-LM prints it at start-up), so the flags "
                               "cannot be compared", expected, "whole log (2 lines, last line cut off)")
    assert _check(REFERENCE, "recipe", _ev()) == _unmeasured("no training log", expected)


def test_recipe_b_is_detected_with_the_recipe_file():
    recipe = load_recipe("course-recipe.toml")
    b = logs.parse_log_file(RECORDED_LOGS / "reference_trainer_h200_recipe_b_seed1234.log")
    out = _check(REFERENCE, "recipe", _ev(log=b))
    assert out.expected == (f"the course's training flags ({len(recipe.expected('b'))} judged, recipe b: "
                            f"{recipe.variants['b'].title})")
    assert out.measured == "no deviation (arguments block: bert_binary_head False)"


def test_the_recipe_is_detected_with_the_criterions_own_recipe_file(tmp_path):
    """A recipe file whose recipes a and b trade binary-head values: the recorded log (binary head on) is b there."""
    text = (CRITERIA_DIR / "course-recipe.toml").read_text()
    on, off = "flags = { bert_binary_head = true }", "flags = { bert_binary_head = false }"
    assert text.count(on) == 1 and text.count(off) == 1
    own = tmp_path / "own-recipe.toml"
    own.write_text(text.replace(on, "@").replace(off, on).replace("@", off))
    recipe = load_recipe(str(own))
    out = _check(REFERENCE, "recipe", _ev(log=RECORDED), recipe=str(own))
    assert out.expected == (f"the course's training flags ({len(recipe.expected('b'))} judged, recipe b: "
                            f"{recipe.variants['b'].title})")
