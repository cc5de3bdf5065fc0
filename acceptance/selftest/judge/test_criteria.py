"""Self-tests of harness.judge.criteria: profiles load, loader errors name file and id, every kind can fail."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from harness.judge import memory_golden
from harness.judge import criteria
from harness.evidence import logs
from harness.judge.profiles import (build_golden, Criterion, FAIL, KINDS, load_golden, load_profile, NOT_MEASURABLE, PASS, Profile)
from harness.evidence.records import CheckpointReport, MemoryReport, RunEvidence
from harness.base.paths import GOLDEN_DIR, RECORDED_LOGS
from harness.base.errors import CriteriaError
from harness.evidence.logformat import (IterationRecord, MARKER_BUILDING_BERT_DATASETS, MARKER_BUILDING_DATASETS, MARKER_DONE_SETUP, MARKER_FINISHED_DATASETS, MARKER_TRAINING, format_datetime_marker, format_iteration, format_validation)
from harness.judge.bands import compute_band

RECORDED = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
SETUP = [MARKER_BUILDING_DATASETS, MARKER_BUILDING_BERT_DATASETS, MARKER_FINISHED_DATASETS,
         format_datetime_marker("after dataloaders are built", "2026-01-01 00:00:00.000000"),
         MARKER_DONE_SETUP, MARKER_TRAINING]
MEGATRON_GOLDEN = GOLDEN_DIR / "megatron_lm_core_v0.16.1_h200.json"


def make_log(losses: dict, train_iters: int = 200, skipped: dict | None = None, nan: dict | None = None) -> str:
    """A synthetic Megatron log: setup markers, then one iteration line per {iteration: lm loss}."""
    lines = list(SETUP)
    for it, loss in losses.items():
        rec = IterationRecord(iteration=it, train_iters=train_iters, consumed_samples=16 * it, elapsed_ms=90.0,
                                   learning_rate=1e-4, global_batch_size=16, loss_scale=65536.0, lm_loss=loss,
                                   sop_loss=0.69, skipped=(skipped or {}).get(it, 0), nan=(nan or {}).get(it, 0),
                                   timestamp="2026-01-01 00:00:00.000000")
        lines.append(format_iteration(rec))
    return "\n".join(lines) + "\n"


def evidence(text: str | None = None, **fields) -> RunEvidence:
    """RunEvidence with a parsed synthetic log and any other fields."""
    log = logs.parse_log(text) if text is not None else None
    return RunEvidence(run_dir="/runs/test", log=log, **fields)


def one(kind: str, **params) -> Profile:
    """A profile of one criterion of this kind, golden from the Megatron file."""
    spec = KINDS[kind]
    c = Criterion(id=f"c-{kind}", label=f"label {kind}", kind=kind, rationale="r", remedy="do this",
                           params={**spec.optional, **params})
    golden = load_golden(MEGATRON_GOLDEN) if spec.uses_golden else None
    return Profile(name="t", path="t.toml", description="", criteria=(c,), golden=golden)


def status(kind: str, ev: RunEvidence, **params) -> str:
    """The status of one criterion on one evidence."""
    return criteria.evaluate(one(kind, **params), ev)[0].status


GOOD = {it: 10.35 - 0.011 * (it - 20) for it in range(20, 201, 10)}          # 10.35 -> 8.37, decreasing


# ---------------------------------------------------------------- profiles on disk


@pytest.mark.parametrize("name", ["course", "reference", "megatron-lm"])
def test_profiles_load(name):
    """Every committed profile loads; ids are unique."""
    profile = load_profile(name)
    assert profile.name == name and len(set(profile.ids)) == len(profile.ids)


def test_reference_has_the_course_criteria_and_more():
    """Reference = the course's criteria (same ids) plus exit code, device, nan/skips, checkpoints, resume, golden."""
    course, reference = load_profile("course"), load_profile("reference")
    assert set(course.ids) < set(reference.ids)
    kinds = {c.kind for c in reference.criteria}
    # every kind is used: memory_band_mib (NVML's total) by the megatron-lm profile, whose script records no
    # allocator peak; the reference profile judges the training's own memory (memory_own_band)
    assert kinds | {c.kind for c in load_profile("megatron-lm").criteria} == set(KINDS)


def test_course_labels_keep_the_course_wording():
    """The course's "starting training" stays the label; the rationale says Megatron never prints it."""
    c = load_profile("course").by_id("training-started")
    assert '"starting training"' in c.label and c.params["markers"] == ["training"]
    assert "never prints" in c.rationale
    assert load_profile("course").by_id("final-loss").params == {"lo": 6.0, "hi": 7.0, "metric": "lm loss",
                                                                           "require_complete": True}


def test_profile_golden_files():
    """reference and megatron-lm -> golden values derived from the population of real Megatron-LM runs."""
    reference, megatron = load_profile("reference"), load_profile("megatron-lm")
    for profile in (reference, megatron):
        for recipe, name in (("a", "population_a_h200.json"), ("b", "population_b_h200.json"),
                             ("a-h64", "population_a-h64_h200.json"), ("b-h64", "population_b-h64_h200.json")):
            golden = profile.for_recipe(recipe).golden
            assert Path(golden.path).name == name, (profile.name, recipe)
            assert golden.provenance["runs"] >= 2 and golden.provenance["held_out_runs"] > 0
    assert reference.golden.provenance["runs"] >= 8   # recipe (a): half of 16 seeds and of the FAQ's variants
    assert megatron.extends == "reference"
    assert megatron.ids == [i for i in reference.ids if i != "cuda-graph"]  # dropped: no whole-step graph there


CURVE_FILES = sorted(p for p in GOLDEN_DIR.glob("*.json") if "metrics" in json.loads(p.read_text()))  # not memory


@pytest.mark.parametrize("path", CURVE_FILES, ids=lambda p: p.name)
def test_golden_bands_are_computed_from_samples(path):
    """Stored mean/tol equal compute_band over the stored raw samples (nothing typed by hand)."""
    doc = json.loads(path.read_text())
    rule = doc["band_rule"]
    for name, metric in doc["metrics"].items():
        runs = list(metric["samples"].values())
        assert len(runs) == metric.get("runs", doc["provenance"]["runs"]), name
        for i, it in enumerate(metric["iterations"]):
            band = compute_band([r[i] for r in runs], rule["rel_tol_floor"], rule["k_std"])
            assert metric["mean"][i] == pytest.approx(band.mean, abs=1e-6), (name, it)
            assert metric["tol"][i] == pytest.approx(band.tol, abs=1e-6), (name, it)


def test_megatron_golden_holds_the_recorded_curve():
    """The Megatron golden file is the recorded log's curve: 10.35 at 20, 8.159132 at 200, validation 8.110321."""
    golden = load_golden(MEGATRON_GOLDEN)
    assert golden.metrics["lm loss"].at(20)[0] == 10.35269
    assert golden.metrics["lm loss"].at(200)[0] == 8.159132
    assert golden.metrics["validation lm loss"].at(200)[0] == 8.110321


# ---------------------------------------------------------------- bands


def test_compute_band_single_run_uses_the_floor():
    """One run has no spread: the tolerance is the relative floor."""
    band = compute_band([8.0], rel_tol_floor=0.02)
    assert (band.mean, band.std, band.tol, band.n) == (8.0, 0.0, pytest.approx(0.16), 1)


def test_compute_band_spread_wins_over_floor():
    """With a real spread the tolerance is k * sample std."""
    band = compute_band([8.0, 8.2, 8.4], rel_tol_floor=0.001, k=3.0)
    assert band.std == pytest.approx(0.2) and band.tol == pytest.approx(0.6)


def test_compute_band_needs_samples():
    """No samples is a programming error."""
    with pytest.raises(ValueError):
        compute_band([], 0.02)


def test_build_golden_from_several_runs():
    """Runs become raw samples; iterations common to all runs only."""
    a = logs.parse_log(make_log({10: 9.0, 20: 8.0}))
    b = logs.parse_log(make_log({10: 9.2, 20: 8.2, 30: 7.0}))
    doc = build_golden({"s1": a, "s2": b}, {"gpu": "x"}, rel_tol_floor=0.0, k=1.0, metrics=("lm loss",))
    metric = doc["metrics"]["lm loss"]
    assert metric["iterations"] == [10, 20] and metric["samples"] == {"s1": [9.0, 8.0], "s2": [9.2, 8.2]}
    assert metric["tol"][0] == pytest.approx(0.1414214, abs=1e-6) and doc["provenance"]["runs"] == 2


# ---------------------------------------------------------------- loader errors


def _write(tmp_path: Path, body: str, name: str = "p.toml") -> Path:
    """A profile file in tmp_path."""
    path = tmp_path / name
    path.write_text(body)
    return path


BASE = '''
[criteria.first]
label = "L"
kind = "first_loss_band"
rationale = "R"
remedy = "M"
'''


@pytest.mark.parametrize("body, problem", [
    (BASE.replace("first_loss_band", "loss_vibes") + "lo = 1\nhi = 2\n", "unknown kind 'loss_vibes'"),
    (BASE.replace('label = "L"\n', "") + "lo = 1\nhi = 2\n", "missing field(s): label"),
    (BASE + "lo = 1\n", "needs field(s): hi"),
    (BASE + "lo = 11\nhi = 10\n", "lo (11) > hi (10)"),
    (BASE + "lo = 1\nhi = 2\nhigh = 3\n", "unknown field(s) for kind 'first_loss_band': high"),
    (BASE + 'lo = "ten"\nhi = 2\n', "lo must be a number"),
    (BASE + 'lo = 1\nhi = 2\nmetric = "accuracy"\n', "unknown metric 'accuracy'"),
    (BASE + 'lo = 1\nhi = 2\nneeds = "tpu"\n', "unknown needs 'tpu'"),
    (BASE + 'lo = 1\nhi = 2\nid = "other"\n', "differs from the table name"),
    (BASE.replace("first_loss_band", "marker_present") + 'markers = ["starting_training"]\n',
     "unknown marker id(s) ['starting_training']"),
    (BASE.replace("first_loss_band", "decreasing_trend") + "window = -1\n", "window must be a non-negative"),
    (BASE.replace("first_loss_band", "golden_curve"), "names no `golden` file"),
])
def test_loader_error_names_file_and_criterion(tmp_path, body, problem):
    """Each mistake in a profile is reported with the file, the criterion id and the problem."""
    path = _write(tmp_path, body)
    with pytest.raises(CriteriaError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path.name) in message and "criterion 'first'" in message and problem in message


@pytest.mark.parametrize("body, problem", [
    ("[criteria\n", "cannot read criteria"),
    ("colour = 1\n" + BASE + "lo = 1\nhi = 2\n", "unknown top-level key(s) colour"),
    ('description = "empty"\n', "has no [criteria.<id>] tables"),
    ('extends = "p"\n', "`extends` cycle"),
])
def test_profile_level_errors_name_the_file(tmp_path, body, problem):
    """Errors outside any criterion still name the file."""
    path = _write(tmp_path, body)
    with pytest.raises(CriteriaError, match="p.toml") as info:
        load_profile(path)
    assert problem in str(info.value)


def test_unknown_profile_lists_the_known_ones():
    """A wrong profile name says which profiles exist."""
    with pytest.raises(CriteriaError, match="known: .*reference"):
        load_profile("referense")


def test_golden_metric_missing_is_an_error(tmp_path):
    """A golden criterion whose metric the golden file lacks fails at load time."""
    golden = _write(tmp_path, json.dumps({"metrics": {}}), "g.json")
    path = _write(tmp_path, f'golden = "{golden}"\n' + BASE.replace("first_loss_band", "golden_curve"))
    with pytest.raises(CriteriaError, match="criterion 'first': metric 'lm loss' not in"):
        load_profile(path)


def test_extends_overrides_fields_and_drops(tmp_path):
    """A profile that extends another overrides single fields, drops criteria and inherits the golden file."""
    _write(tmp_path, f'golden = "{MEGATRON_GOLDEN}"\n' + BASE + "lo = 10\nhi = 11\n"
           + BASE.replace("first", "second"), "base.toml")
    path = _write(tmp_path, 'extends = "base"\ndrop = ["second"]\n[criteria.first]\nhi = 12\n')
    profile = load_profile(path)
    assert profile.ids == ["first"] and profile.by_id("first").params["hi"] == 12
    assert profile.by_id("first").params["lo"] == 10 and profile.golden.path == str(MEGATRON_GOLDEN)
    assert profile.name == "p"


# ---------------------------------------------------------------- decreasing trend


def _noisy(start: float, end: float, n: int, noise: float, seed: int) -> dict:
    """A linear curve from start to end with uniform noise, logged every 10 iterations."""
    rng = random.Random(seed)
    return {10 * (i + 1): start + (end - start) * i / (n - 1) + rng.uniform(-noise, noise) for i in range(n)}


@pytest.mark.parametrize("seed", range(5))
def test_trend_noisy_but_decreasing_passes(seed):
    """Per-line noise larger than the per-line decrease does not fail a falling curve."""
    curve = _noisy(10.3, 8.2, 19, noise=0.25, seed=seed)
    assert sum(b > a for a, b in zip(list(curve.values()), list(curve.values())[1:])) >= 3   # really noisy
    assert status("decreasing_trend", evidence(make_log(curve))) == PASS


@pytest.mark.parametrize("curve", [
    _noisy(10.3, 10.3, 19, noise=0.05, seed=1),      # flat
    _noisy(8.2, 10.3, 19, noise=0.05, seed=2),       # increasing
    {10: 10.3, 20: 8.0, 30: 10.2, 40: 8.1, 50: 10.1, 60: 8.2, 70: 10.0, 80: 8.3, 90: 9.9, 100: 8.4},  # oscillating
    {10: 10.0, 20: 9.0, 30: 8.0},                    # too short to judge
], ids=["flat", "increasing", "oscillating", "too-short"])
def test_trend_flat_or_increasing_fails(curve):
    """No real downward trend, or too few points, fails."""
    assert status("decreasing_trend", evidence(make_log(curve))) == FAIL


def test_trend_bounded_rises():
    """A step up between window means is allowed up to max_increases."""
    curve = {10 * (i + 1): v for i, v in enumerate([10, 10, 10, 9, 9, 9, 9.5, 9.5, 9.5, 8, 8, 8])}
    assert status("decreasing_trend", evidence(make_log(curve)), max_increases=1) == PASS
    assert status("decreasing_trend", evidence(make_log(curve)), max_increases=0) == FAIL


# ---------------------------------------------------------------- every kind can fail


def _report(**fields) -> CheckpointReport:
    """A checkpoint report of a good run, with overrides."""
    base = dict(save_dir="/runs/test/ckpt", iterations=(100, 200), tracker=200, format="torch_dist", loaded=True,
                shapes_ok=True, num_parameters=4839042)
    return CheckpointReport(**{**base, **fields})


def _memory(peak: float, gpu: str = "H200") -> MemoryReport:
    """An NVML memory report with this peak."""
    return MemoryReport(method="nvml-process", peak_mib=peak, samples=100, interval_ms=100, gpu_name=gpu)


# the middle of the H200's calibrated own-memory band (fixtures/golden/memory/nvidia-h200.json)
_OWN_BAND = (memory_golden.select("NVIDIA H200")[0] or {}).get("own_band_mib", {"lo": 0, "hi": 0})
_OWN_MID = (_OWN_BAND["lo"] + _OWN_BAND["hi"]) / 2


RECORDED_CURVE = dict(logs.parse_log_file(RECORDED).lm_losses)

# kind -> (params, passing evidence, failing evidence)
KIND_CASES = {
    "marker_present": ({"markers": ["training"]}, evidence(make_log(GOOD)),
                       evidence(make_log(GOOD).replace("training ...\n", ""))),
    "exit_code": ({}, evidence(RECORDED.read_text(), exit_code=0), evidence(RECORDED.read_text(), exit_code=1)),
    "ran_on_gpu": ({}, evidence(device="cuda"), evidence(device="cpu")),
    "first_loss_band": ({"lo": 10, "hi": 11}, evidence(make_log(GOOD)), evidence(make_log({20: 12.5, 30: 11.0}))),
    "decreasing_trend": ({}, evidence(make_log(GOOD)), evidence(make_log({it: 10.3 for it in GOOD}))),
    "final_loss_band": ({"lo": 7.5, "hi": 8.8}, evidence(make_log(GOOD)), evidence(make_log({**GOOD, 200: 9.9}))),
    "golden_final_loss": ({}, evidence(make_log(RECORDED_CURVE)),
                          evidence(make_log({**RECORDED_CURVE, 200: 8.6}))),
    "golden_curve": ({"max_misses": 2}, evidence(make_log(RECORDED_CURVE)),
                     evidence(make_log({it: v + 0.5 if it >= 170 else v for it, v in RECORDED_CURVE.items()}))),
    "no_nan": ({}, evidence(make_log(GOOD, nan={100: 1}, skipped={100: 1})),
               evidence(make_log({**GOOD, 150: math.inf}))),
    "skips_only_before": ({"iteration": 40, "max_fraction": 0.05}, evidence(make_log(GOOD, skipped={20: 7, 120: 2})),
                          evidence(make_log(GOOD, skipped={20: 7, 120: 5, 130: 5}))),
    "memory_own_band": ({}, evidence(memory=_memory(2400, "NVIDIA H200"), extra={"summary": {"torch_max_reserved_mib": _OWN_MID}}),
                        evidence(memory=_memory(2400 + 512, "NVIDIA H200"),
                                 extra={"summary": {"torch_max_reserved_mib": _OWN_MID + 512}})),
    "checkpoint_iterations": ({"iterations": [100, 200]}, evidence(checkpoints=_report()),
                              evidence(checkpoints=_report(iterations=(100,)))),
    "tracker_equals": ({"value": 200}, evidence(checkpoints=_report()), evidence(checkpoints=_report(tracker=100))),
    "checkpoint_loads": ({}, evidence(checkpoints=_report()),
                         evidence(checkpoints=_report(shapes_ok=False, problems=("word_embeddings: (30592, 64)",)))),
    "resume_matches": ({"tol": 0.05}, evidence(make_log(GOOD), resume_log=logs.parse_log(make_log({110: GOOD[110]}))),
                       evidence(make_log(GOOD), resume_log=logs.parse_log(make_log({110: GOOD[110] + 0.3})))),
    "memory_band_mib": ({"lo": 1907, "hi": 3815}, evidence(memory=_memory(3231)), evidence(memory=_memory(5000))),
    "recipe_matches": ({}, evidence(RECORDED.read_text()),
                       evidence(RECORDED.read_text().replace("  hidden_dropout .................................. 0.1",
                                                             "  hidden_dropout .................................. 0.0"))),
    "cuda_graph_used": ({}, evidence(extra={"summary": {"cuda_graphs": True, "cuda_graph_error": None}}),
                        evidence(extra={"summary": {"cuda_graphs": False, "cuda_graph_error": "RuntimeError: boom"}})),
}


def test_every_kind_has_a_failing_case():
    """The table below covers the whole vocabulary."""
    assert set(KIND_CASES) == set(KINDS)


@pytest.mark.parametrize("kind", sorted(KIND_CASES))
def test_kind_passes_and_fails(kind):
    """Each kind passes on good evidence and fails on its breakage."""
    params, good, bad = KIND_CASES[kind]
    assert status(kind, good, **params) == PASS
    assert status(kind, bad, **params) == FAIL


@pytest.mark.parametrize("kind", sorted(KIND_CASES))
def test_missing_evidence_is_never_a_pass(kind):
    """Evidence with nothing measured gives not-measurable for every kind."""
    params = KIND_CASES[kind][0]
    assert status(kind, RunEvidence(run_dir="/runs/empty"), **params) == NOT_MEASURABLE


def test_memory_unavailable_is_not_measurable():
    """An NVML sampler that could not measure leaves the band unjudged, with its reason."""
    ev = evidence(memory=MemoryReport(method="unavailable", reason="no NVML"))
    verdict = criteria.evaluate(one("memory_band_mib", lo=1, hi=2), ev)[0]
    assert verdict.status == NOT_MEASURABLE and "no NVML" in verdict.measured


def test_cuda_graph_failure_shows_the_capture_error():
    """A failed capture fails with the trainer's capture error as the measured value; eager on purpose fails too."""
    error = "RuntimeError: operation not permitted when stream is capturing"
    failed = evidence(extra={"summary": {"cuda_graphs": False, "cuda_graph_error": error, "device": "cuda"}})
    verdict = criteria.evaluate(one("cuda_graph_used"), failed)[0]
    assert verdict.status == FAIL and error in verdict.measured and error in verdict.message
    eager = evidence(extra={"summary": {"cuda_graphs": False, "cuda_graph_error": None, "device": "cpu"}})
    assert criteria.evaluate(one("cuda_graph_used"), eager)[0].measured == "no CUDA graph: eager step on device cpu"


def test_cuda_graph_is_checked_only_for_the_reference_trainer():
    """Megatron-LM's script has no whole-step graph: its profile drops the criterion, the reference keeps it."""
    assert "cuda-graph" in load_profile("reference").ids
    assert "cuda-graph" not in load_profile("megatron-lm").ids


def test_timeout_fails_exit_code():
    """A timed-out run fails the exit-code criterion even without an exit code."""
    assert status("exit_code", evidence(timed_out=True)) == FAIL


def test_nan_loss_fails_bands_and_trend():
    """A nan loss is outside any band and breaks the trend."""
    ev = evidence(make_log({**GOOD, 200: math.nan}))
    assert status("final_loss_band", ev, lo=7.5, hi=8.8) == FAIL
    assert status("decreasing_trend", ev) == FAIL
    assert status("no_nan", ev) == FAIL


def test_final_band_on_validation_metric():
    """final_loss_band also judges the periodic validation loss at the last iteration."""
    ev = evidence(make_log(GOOD) + format_validation(200, 8.11, 0.69) + "\n")
    assert status("final_loss_band", ev, lo=7.5, hi=8.8, metric="validation lm loss") == PASS
    assert status("final_loss_band", evidence(make_log(GOOD)), lo=7.5, hi=8.8, metric="validation lm loss") == FAIL


def test_stopped_run_fails_final_band():
    """A run that stops before --train-iters has no final loss."""
    ev = evidence(make_log({it: v for it, v in GOOD.items() if it <= 150}))
    verdict = criteria.evaluate(one("final_loss_band", lo=7.5, hi=8.8), ev)[0]
    assert verdict.status == FAIL and "stops at iteration 150 of 200" in verdict.measured


# ---------------------------------------------------------------- verdicts and messages


def _failing_evidence() -> RunEvidence:
    """A run that fails several reference criteria at once."""
    text = make_log({**{it: 12.0 for it in GOOD}, 100: math.nan}) + "\n".join(f"tail line {i}" for i in range(15)) + "\n"
    return evidence(text, exit_code=1, device="cpu", checkpoints=_report(iterations=(), tracker=None, loaded=False),
                    memory=_memory(100, "NVIDIA H200"), extra={"summary": {"torch_max_reserved_mib": 10.0}})


def test_all_failures_collected():
    """Every criterion is judged; evaluation never stops at the first failure."""
    profile = load_profile("reference")
    verdicts = criteria.evaluate(profile, _failing_evidence())
    assert [v.criterion_id for v in verdicts] == profile.ids
    failed = {v.criterion_id for v in verdicts if v.status == FAIL}
    assert failed >= {"first-loss", "loss-decreases", "final-loss", "exit-code", "ran-on-gpu", "no-nan",
                      "checkpoints-saved", "checkpoint-tracker", "checkpoint-loads", "gpu-memory", "golden-curve"}


def test_failure_message_follows_the_template():
    """criterion, measured, expected, where, artifacts, last 10 log lines, remedy: in that order, from the constant."""
    ev = _failing_evidence()
    verdict = criteria.evaluate(one("first_loss_band", lo=10, hi=11), ev)[0]
    tail = "\n".join(f"    | {line}" for line in ev.log.lines[-10:])
    cause = criteria.root_cause(ev)
    head, _, rest = criteria.FAILURE_TEMPLATE.format(
        status="FAIL", label="label first_loss_band", criterion_id="c-first_loss_band", measured=verdict.measured,
        expected=verdict.expected, where=verdict.where, artifacts="/runs/test", tail=tail, remedy="do this"
    ).partition("\n")
    root = criteria.ROOT_CAUSE_TEMPLATE.format(cause_id=cause.cause_id, cause=cause.cause, remedy=cause.remedy)
    assert verdict.message == head + "\n" + root + rest, "the root cause comes right after the criterion line"
    assert verdict.measured == "12.0000 at iteration 20" and verdict.where == "iteration 20, log line 7"
    assert "tail line 14" in verdict.message and "tail line 4" not in verdict.message


def test_not_measurable_message_uses_the_template_too():
    """Missing evidence is explained with the same fields, never silently passed."""
    verdict = criteria.evaluate(one("tracker_equals", value=200), RunEvidence(run_dir="/runs/x"))[0]
    assert verdict.message.startswith("NOT-MEASURABLE: label tracker_equals [c-tracker_equals]")
    assert "(no log lines)" in verdict.message and "remedy:    do this" in verdict.message


def test_log_read_from_log_path(tmp_path):
    """Evidence with only a log path is parsed on the fly."""
    path = tmp_path / "train.log"
    path.write_text(make_log(GOOD))
    ev = RunEvidence(run_dir=str(tmp_path), log_path=str(path))
    assert status("first_loss_band", ev, lo=10, hi=11) == PASS


def test_cli_check_recorded_log(capsys):
    """`python -m harness criteria check` exits 0 on the recorded log with the megatron-lm profile."""
    assert criteria.main(["check", "--profile", "megatron-lm", "--log", str(RECORDED)]) == 0
    assert "PASS: The lm loss curve follows the golden curve" in capsys.readouterr().out


def test_cli_golden_writes_a_band(tmp_path):
    """`python -m harness criteria golden` computes a golden file from logs."""
    out = tmp_path / "g.json"
    assert criteria.main(["golden", "--out", str(out), "--provenance", '{"gpu": "H200"}', str(RECORDED)]) == 0
    doc = json.loads(out.read_text())
    assert doc["provenance"] == {"gpu": "H200", "runs": 1, "run_names": [RECORDED.stem]}
    assert doc["metrics"]["lm loss"]["mean"][-1] == 8.159132


# ---------------------------------------------------------------- counters, live runs


@pytest.mark.parametrize("kind", ["skips_only_before"])   # no_nan reads losses and the loss scale, no counter
def test_absent_counters_are_not_measured_never_zero(kind):
    """Iteration lines without the nan/skipped counters cannot pass the counter criteria."""
    text = "\n".join(line.split(" | number of skipped")[0] + " |" if " iteration " in line else line
                     for line in make_log(GOOD).splitlines()) + "\n"
    assert "number of nan" not in text and "number of skipped" not in text
    params = KIND_CASES[kind][0]
    assert status(kind, evidence(text), **params) == NOT_MEASURABLE


def test_live_run_turns_not_measured_into_a_failure():
    """In a live run every criterion must be measured: missing evidence fails, with the reason."""
    profile = load_profile("reference")
    ev = evidence(RECORDED.read_text())
    recorded = {v.criterion_id: v.status for v in criteria.evaluate(profile, ev)}
    live = {v.criterion_id: v for v in criteria.evaluate(profile, ev, live=True)}
    unmeasured = [cid for cid, s in recorded.items() if s == NOT_MEASURABLE]
    assert unmeasured, "the recorded log alone leaves memory, exit code, checkpoints unmeasured"
    for cid in unmeasured:
        assert live[cid].status == FAIL and "not measured" in live[cid].measured, live[cid].message
    assert NOT_MEASURABLE not in {v.status for v in live.values()}


def test_a_resumed_run_that_logged_no_loss_names_how_its_own_log_ends():
    """The resumed run's own last lines (its error), not only the source run's log, explain a failed resume."""
    from harness.evidence.records import RunEvidence
    from harness.evidence.logs import parse_log

    source = parse_log(" [2026-12-01 01:00:00.000000] iteration      110/     200 | consumed samples:         1760 | "
                       "elapsed time per iteration (ms): 6.8 | learning rate: 1.700000E-05 | global batch size:    16 | "
                       "lm loss: 8.425311E+00 | loss scale: 65536.0 | grad norm: 3.788 | number of skipped iterations:"
                       "   0 | number of nan iterations:   0 |\n")
    crashed = parse_log("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                        "RuntimeError: address already in use\n")
    profile = load_profile("reference")
    verdict = {v.criterion_id: v for v in criteria.evaluate(profile, RunEvidence(run_dir="/tmp/run", log=source, resume_log=crashed))}
    resume = verdict["resume-matches"]
    assert resume.status == criteria.FAIL and "RuntimeError: address already in use" in resume.measured
    assert resume.where.startswith("resumed run's whole log (3 lines")
