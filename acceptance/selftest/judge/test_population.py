"""The population of real Megatron-LM runs: healthy runs of every kind pass, broken ones fail with the cause first,
the bands are what the stated rule gives, and the profile carries the derived numbers."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from harness.judge import criteria, memory_golden
from harness.evidence import fp16, logs
from harness.judge import derive_bands as population
from harness.judge.profiles import FAIL, load_profile, PASS
from harness.judge.submission import judge_submission
from harness.base.paths import FIXTURES, GOLDEN_DIR, REPO
from harness.evidence.logformat import IterationRecord, format_iteration

POPULATION_LOGS = FIXTURES / "logs" / "population"
BANDS = FIXTURES / "population" / "bands-h200.json"


def real_log(tmp_path: Path, name: str) -> Path:
    """A gzipped real Megatron-LM log of the population, written out as a plain .log."""
    out = tmp_path / name.replace(".gz", "")
    out.write_bytes(gzip.decompress((POPULATION_LOGS / name).read_bytes()))
    return out


@pytest.fixture(scope="module")
def reference():
    return load_profile("reference")


@pytest.fixture(scope="module")
def derived():
    doc, runs = population.load()
    bands = population.derive(doc, runs)
    return doc, runs, bands, population.evaluate(bands, runs)


# ---------------------------------------------------------------- healthy fp16 is not divergence


@pytest.mark.parametrize("name, what", [
    ("a-mbs1-s3104.log.gz", "loss scale down to 1, one skip per interval, loss still falling"),
    ("b-mbs1-s3101.log.gz", "11 overflow skips after the search, 'nan iterations' counted, NAN validation losses"),
    ("b-s2004.log.gz", "one overflow skip in iterations 41-50 (loss scale 65536 -> 32768)"),
])
def test_healthy_fp16_runs_pass_every_log_criterion(tmp_path, reference, name, what):
    """Real healthy runs with fp16 overflow skips (and the FAQ's micro-batch remedy) pass: nothing fails."""
    j = judge_submission(reference, real_log(tmp_path, name))
    failed = [v for v in j.verdicts if v.status == FAIL]
    assert not failed, f"{what}: " + "; ".join(f"{v.criterion_id}: {v.measured}" for v in failed)
    assert j.verdict == "pass" and j.diagnosis is None


def test_micro_batch_remedy_is_reported_not_failed(tmp_path, reference):
    """--micro-batch-size 1 with the global batch kept: the recipe passes and says the FAQ allows it."""
    j = judge_submission(reference, real_log(tmp_path, "b-mbs1-s3101.log.gz"))
    recipe = next(v for v in j.verdicts if v.criterion_id == "recipe")
    assert recipe.status == PASS and "micro_batch_size: 4 -> 1 (allowed: the course's FAQ remedy)" in recipe.measured


def test_hidden_64_is_graded_by_its_own_bands(tmp_path, reference):
    """--hidden-size 64 is recognised as its own recipe, judged by its calibrated golden and final-loss band."""
    j = judge_submission(reference, real_log(tmp_path, "a-h64-s3205.log.gz"))
    assert j.recipe == "a-h64" and j.verdict == "pass", [(v.criterion_id, v.measured) for v in j.verdicts
                                                          if v.status == FAIL]
    final = next(v for v in j.verdicts if v.criterion_id == "final-loss")
    lo, hi = json.loads(BANDS.read_text())["bands"]["families"]["a-h64"]["final_loss_band"]
    assert f"[{lo}, {hi}]" in final.expected, final.expected
    assert "population_a-h64_h200.json" in reference.for_recipe("a-h64").golden.path


def test_far_too_large_learning_rate_fails_with_the_flag_first(tmp_path, reference):
    """--lr 1e-2 (real run): the loss falls to 2.27 on the repetitive corpus, and the run fails; recipe names lr."""
    j = judge_submission(reference, real_log(tmp_path, "lr-x100-s5001.log.gz"))
    failed = {v.criterion_id: v for v in j.verdicts if v.status == FAIL}
    assert {"recipe", "final-loss", "golden-final-loss", "golden-curve"} <= set(failed), sorted(failed)
    assert failed["recipe"].measured.startswith("1 deviation(s): lr: 0.0001 -> 0.01"), failed["recipe"].measured


def test_micro_batch_8_is_a_deviation_naming_the_flag(tmp_path, reference):
    """A micro-batch the FAQ does not name fails the recipe criterion with the flag and both values."""
    text = real_log(tmp_path, "b-s2004.log.gz").read_text()
    line = next(l for l in text.splitlines() if l.strip().startswith("micro_batch_size "))
    bad = tmp_path / "mbs8.log"
    bad.write_text(text.replace(line, line.rsplit(" ", 1)[0] + " 8"))
    j = judge_submission(reference, bad)
    recipe = next(v for v in j.verdicts if v.criterion_id == "recipe")
    assert recipe.status == FAIL and "micro_batch_size: 4 -> 8" in recipe.measured and "allowed" not in recipe.measured


def test_every_step_skipped_after_the_search_is_divergence_cause_first(tmp_path, reference):
    """A run whose every step overflows from iteration 121 (no loss logged) fails no-nan and skips, diagnosed."""
    text = real_log(tmp_path, "b-s2004.log.gz").read_text()
    broken = logs.parse_log(text)
    records = {r.iteration: r for r in broken.iterations}
    lines = text.splitlines()
    for it, r in records.items():
        if it > 120:
            from dataclasses import replace

            lines[r.line_no - 1] = format_iteration(replace(r, lm_loss=None, skipped=10, nan=10, loss_scale=1.0))
    path = tmp_path / "diverged.log"
    path.write_text("\n".join(lines) + "\n")
    j = judge_submission(reference, path)
    failed = {v.criterion_id: v for v in j.verdicts if v.status == FAIL}
    assert {"no-nan", "skips-early-only"} <= set(failed)
    assert "every step of the interval ending at iteration 130 was skipped" in failed["no-nan"].measured
    assert j.diagnosis is not None and j.diagnosis.cause_id == "nan" and "diverged" in j.diagnosis.cause


def test_divergence_rules_on_counters():
    """fp16.divergence: a non-finite loss and a whole skipped interval diverge; a low scale with progress does not."""
    def rec(it, lm=8.0, skipped=0, scale=65536.0):
        return IterationRecord(iteration=it, train_iters=200, consumed_samples=0, elapsed_ms=1.0,
                                    learning_rate=1e-4, global_batch_size=16, loss_scale=scale, lm_loss=lm,
                                    skipped=skipped, nan=skipped)
    healthy = [rec(20, skipped=7), *[rec(i, skipped=1, scale=1.0) for i in range(30, 201, 10)]]
    assert fp16.divergence(healthy) is None
    assert "non-finite" in fp16.divergence([*healthy[:3], rec(50, lm=math.nan)])[0]
    assert "every step" in fp16.divergence([*healthy[:3], rec(50, lm=None, skipped=10)])[0]
    assert fp16.divergence([rec(20, lm=None, skipped=10)]) is None   # the loss-scale search, before iteration 40
    count = fp16.skips_after(healthy, 40)
    assert (count.skipped, count.steps) == (16, 160)


# ---------------------------------------------------------------- the derivation


def test_committed_bands_are_what_the_rule_gives(derived):
    """bands-h200.json and every population golden file equal a fresh derivation from the committed population."""
    doc, runs, bands, evaluation = derived
    committed = json.loads(BANDS.read_text())
    assert committed["bands"] == json.loads(json.dumps(bands))
    assert committed["evaluation"]["false_alarm_rate"] == evaluation["false_alarm_rate"]
    for family in bands["families"]:
        on_disk = json.loads((GOLDEN_DIR / f"population_{family}_h200.json").read_text())
        assert on_disk == json.loads(json.dumps(population.golden_document(bands, family))), family


def test_profile_carries_the_derived_numbers(derived, reference):
    """The reference profile's skip fraction and hidden-64 final-loss bands are the derivation's, not typed."""
    _, _, bands, _ = derived
    assert reference.by_id("skips-early-only").params["max_fraction"] == bands["skips"]["max_fraction"]
    for family in ("a-h64", "b-h64"):
        c = reference.for_recipe(family).by_id("final-loss")
        assert [c.params["lo"], c.params["hi"]] == bands["families"][family]["final_loss_band"], family


def test_held_out_runs_and_mutants(derived):
    """Held-out healthy runs (FAQ variants, resumed, rank-prefixed and EAGER runs among them): no false alarm;
    every mutant of the population is caught."""
    doc, runs, bands, evaluation = derived
    assert evaluation["held_out"] >= 30
    assert evaluation["false_alarms"] == [] and evaluation["false_alarm_rate"] == 0
    assert len(evaluation["mutants"]) == 3 and all(m["failed"] for m in evaluation["mutants"]), evaluation["mutants"]


def test_split_keeps_other_shapes_out_of_the_derivation(derived):
    """Resumed, rank-prefixed and EAGER runs are never derived from; every other group contributes half."""
    _, runs, _, _ = derived
    derivation, held = population.split(runs)
    assert not {r.group for r in derivation} & set(population.HELD_OUT_GROUPS)
    assert {r.group for r in derivation} == {g for g in population.DERIVATION_GROUPS}
    assert not set(map(id, derivation)) & set(map(id, held))


@pytest.fixture(scope="module")
def fresh():
    """The committed bands and the runs made after them, both batches (fixtures/population/plan-fresh*.toml)."""
    runs = population.load_batches(population.FRESH_POPULATIONS)   # raises when a run is in two batches
    bands = json.loads(BANDS.read_text())["bands"]
    return runs, bands, population.validate(bands, runs)


def test_bands_hold_on_runs_made_after_them(fresh):
    """Runs none of the bands came from (new seeds, the FAQ's micro-batch 1, both recipes resumed, rank-prefixed and
    EAGER): no false alarm; the two mutants (--lr ten and three times the course's) fail, the flag named first."""
    runs, bands, result = fresh
    assert not {r.name for r in runs} & {r.name for r in population.load()[1]}, "a fresh run is in the derivation"
    assert result["healthy"] == sum(r.ok and not r.raw["mutant"] for r in runs) >= 38
    assert result["false_alarms"] == [] and result["false_alarm_rate"] == 0 and result["failed_runs"] == []
    assert {r.group for r in runs} >= {"a", "b", "a-mbs1", "b-mbs1", "a-resume", "b-resume", "a-tee", "b-tee",
                                       "b-eager"}
    assert all(m >= 0 for m in result["smallest_margin"].values()), result["smallest_margin"]
    first = sorted(m["failed"][0] for m in result["mutants"])
    assert first == ["recipe: lr: 0.0001 -> 0.0003", "recipe: lr: 0.0001 -> 0.001"], result["mutants"]


def test_validate_fails_a_band_too_narrow_for_the_fresh_runs(fresh):
    """The validation can fail: a final-loss band a hundredth as wide turns healthy fresh runs into false alarms."""
    runs, bands, _ = fresh
    narrow = json.loads(json.dumps(bands))
    for fam in narrow["families"].values():
        golden = fam["golden"]["lm loss"]
        golden["tol"] = [t / 100 for t in golden["tol"]]
    result = population.validate(narrow, runs)
    assert result["false_alarms"] and result["false_alarm_rate"] > 0.5


@pytest.mark.parametrize("names, population_file", [
    (("a-resume-s4001.1.log.gz", "a-resume-s4001.2.log.gz"), population.DEFAULT_POPULATION),
    (("b-resume-s7101.1.log.gz", "b-resume-s7101.2.log.gz"), population.FRESH_POPULATION),
    (("a-tee-s4101.log.gz",), population.DEFAULT_POPULATION),
    (("b-tee-s7201.log.gz",), population.FRESH_POPULATION),
], ids=["a-resumed", "b-resumed", "a-rank-prefixed", "b-rank-prefixed"])
def test_resumed_and_rank_prefixed_real_runs_pass_as_one_submission(tmp_path, reference, names, population_file):
    """A real resumed run handed in as its two logs, and a real log with a launcher's rank prefixes, are graded as
    one run of the right recipe: every log criterion passes and the final loss read is the run's own."""
    folder = tmp_path / "submission"
    folder.mkdir()
    for name in names:
        real_log(folder, name)
    run_name = names[0].split(".")[0]
    j = judge_submission(reference, folder)
    failed = [f"{v.criterion_id}: {v.measured}" for v in j.verdicts if v.status == FAIL]
    assert not failed and j.verdict == "pass" and j.diagnosis is None, failed
    assert j.recipe == run_name[0]
    _, runs = population.load(population_file)
    final = next(r for r in runs if r.name == run_name).series("lm loss")[200]
    assert f"{final:.4f} at iteration 200" in next(v.measured for v in j.verdicts if v.criterion_id == "final-loss")
    said = " ".join(j.provenance)
    assert ("stitched by iteration" in said) if len(names) == 2 else ("rank prefixes" in said), said


# ---------------------------------------------------------------- memory on other machines


def test_unknown_gpu_falls_back_to_the_portable_band_and_says_so():
    """A GPU kind with no calibration is judged by the H200's own-memory band, and the reason names both."""
    doc, why = memory_golden.select("NVIDIA GeForce RTX 4090")
    assert doc["gpu"] == "NVIDIA H200" and "no calibration for NVIDIA GeForce RTX 4090" in why and "portable" in why
    own, why_own = memory_golden.select("NVIDIA H200")
    assert own == doc and why_own.startswith("calibrated on this GPU kind")
    assert memory_golden.select("X", folder=Path("/nonexistent"))[0] is None


@pytest.mark.parametrize("context, own, status", [
    (1696, 702, PASS),          # default module loading on the H200 (GPU run c22a4c6)
    (2772, 702, PASS),          # CUDA_MODULE_LOADING=EAGER: the context grows, the training's own memory does not
    (1696, 702 + 512, FAIL),    # the memory-leak mutant: its own memory leaves the band
])
def test_memory_is_judged_on_the_trainings_own_part(reference, context, own, status):
    """The same own memory passes whatever the context; more own memory fails with the OOM remedy."""
    from harness.evidence.records import MemoryReport, RunEvidence

    mem = MemoryReport(method="nvml-process", peak_mib=context + own, samples=10, interval_ms=50,
                       gpu_name="NVIDIA A100-SXM4-80GB")
    ev = RunEvidence(run_dir="/runs/t", memory=mem,
                     extra={"summary": {"torch_max_reserved_mib": own, "world_size": 1,
                                        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                                        "data_parallel_size": 1}})
    v = next(v for v in criteria.judge(reference, ev, live=True).verdicts if v.criterion_id == "gpu-memory")
    assert v.status == status, v.message
    assert f"context {context} MiB" in v.measured and "no calibration for NVIDIA A100-SXM4-80GB" in v.expected
    if status == FAIL:
        assert "--micro-batch-size 2 or 1" in v.message
    golden = next(v for v in criteria.judge(reference, ev, live=True).verdicts if v.criterion_id == "golden-curve")
    assert ("population_a_h200.json, calibrated on NVIDIA H200; this run's GPU (NVIDIA A100-SXM4-80GB) has no "
            "golden values of its own: judged by these, calibrated elsewhere") in golden.expected, golden.expected


@pytest.mark.parametrize("versions, own, status", [
    ({"torch": "2.11.0+cu130", "cuda": "13.0"}, 702, PASS),      # the calibration's own versions: no note
    ({"torch": "2.6.0+cu124", "cuda": "12.4"}, 702, PASS),       # an older torch and CUDA: passes, with the note
    ({"torch": "2.6.0+cu124", "cuda": "12.4"}, 702 + 512, FAIL),  # a leak on them still fails, the OOM remedy first
    (None, 702, PASS),                                           # a summary without versions: nothing to compare
])
def test_other_torch_and_cuda_versions_are_judged_by_the_band_and_named(reference, versions, own, status):
    """A run on other torch/CUDA versions than the H200 calibration's: the same verdict, and the expected text names
    both versions and the fix (calibrate here) only when they differ."""
    from harness.evidence.records import MemoryReport, RunEvidence

    mem = MemoryReport(method="nvml-process", peak_mib=1696 + own, samples=10, interval_ms=50, gpu_name="NVIDIA H200")
    summary = {"torch_max_reserved_mib": own, "world_size": 1, "tensor_model_parallel_size": 1,
               "pipeline_model_parallel_size": 1, "data_parallel_size": 1, **({"versions": versions} if versions else {})}
    ev = RunEvidence(run_dir="/runs/t", memory=mem, extra={"summary": summary})
    v = next(v for v in criteria.judge(reference, ev, live=True).verdicts if v.criterion_id == "gpu-memory")
    assert v.status == status, v.message
    differs = versions is not None and versions["torch"] != "2.11.0+cu130"
    assert ("torch 2.11.0+cu130 there, 2.6.0+cu124 here; cuda 13.0 there, 12.4 here" in v.expected) == differs
    assert ("python -m harness calibrate" in v.expected) == differs, v.expected
    if status == FAIL:
        assert "--micro-batch-size 2 or 1" in v.message and v.measured.startswith(f"own {own} MiB"), v.message


def test_calibrate_help_names_every_step():
    """`python -m harness calibrate` runs, collects, derives and validates; each step's --help works."""
    for step in ("runs", "collect", "derive", "validate"):
        out = subprocess.run([sys.executable, "-m", "harness", "calibrate", step, "--help"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and f"harness calibrate {step}" in out.stdout, out.stderr


def test_pytest_header_names_the_memory_band_and_why():
    """The header says which band this GPU is judged by: its own file, or the portable one and why."""
    assert memory_golden.header_line("NVIDIA H200").endswith("calibrated on this GPU kind (nvidia-h200.json)")
    line = memory_golden.header_line("Tesla T4")
    assert "memory band for Tesla T4" in line and "no calibration for Tesla T4 (tesla-t4.json absent)" in line
    assert "python -m harness calibrate" in line
