"""`gpu-memory` judges every rank of a multi-GPU run against its layout's band; the report shows every rank."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from harness.judge import criteria, layouts
from harness.evidence import logs
from harness.report import session_report as report
from harness.evidence.records import MemoryReport, RankMemory, RunEvidence
from harness.judge.layouts import Layout
from harness.base.paths import GOLDEN_DIR
from harness.base.errors import CriteriaError
from harness.evidence.logformat import format_arguments
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, Profile, Verdict, load_profile

DP2, TP2, TP4 = Layout(dp=2), Layout(tp=2), Layout(tp=4)


@pytest.fixture(scope="module")
def band() -> Profile:
    """The reference profile's gpu-memory criterion alone."""
    profile = load_profile("reference")
    c = next(c for c in profile.criteria if c.id == "gpu-memory")
    return replace(profile, criteria=(c,))


@pytest.fixture(scope="module")
def layout_bands(band) -> dict:
    """{Layout: LayoutBand} of the layout file the reference profile names."""
    return layouts.load_layout_bands(band.criteria[0].params["layouts"])


def memory(*peaks: float) -> MemoryReport:
    """An NVML process report with one rank per peak (rank i on GPU i), peak_mib the highest."""
    ranks = tuple(RankMemory(i, peak, (1000 + i,), i) for i, peak in enumerate(peaks))
    return MemoryReport(method="nvml-process", peak_mib=max(peaks), samples=50, interval_ms=50, gpu_name="H200",
                        saw_process=True, ranks=ranks)


def sizes(layout: Layout) -> dict:
    """The parallel sizes the trainer records (summary.json, and its arguments block)."""
    return {"tensor_model_parallel_size": layout.tp, "pipeline_model_parallel_size": layout.pp,
            "data_parallel_size": layout.dp, "world_size": layout.world_size}


def verdict(profile: Profile, mem: MemoryReport, layout: Layout | None = None,
            live: bool = True) -> Verdict:
    """The one verdict of `profile` on evidence holding `mem`, the layout recorded in summary.json."""
    extra = {"summary": sizes(layout)} if layout is not None else {}
    return criteria.evaluate(profile, RunEvidence(run_dir="/runs/t", memory=mem, extra=extra), live=live)[0]


def middle(lo: float, hi: float) -> float:
    """The middle of a band."""
    return (lo + hi) / 2


def one_gpu_calibration() -> list[float]:
    """The 1-GPU NVML peaks of the reference trainer's calibration runs."""
    golden = json.loads((GOLDEN_DIR / "reference_trainer_h200.json").read_text())
    return golden["provenance"]["calibration"]["memory_band_mib"]["samples"]


H200_MEMORY = json.loads((GOLDEN_DIR / "memory" / "nvidia-h200.json").read_text())
OWN_MID = middle(H200_MEMORY["own_band_mib"]["lo"], H200_MEMORY["own_band_mib"]["hi"])


def one_gpu_summary(own: float = OWN_MID) -> dict:
    """summary.json of a 1-GPU trainer run whose allocator peaked at `own` MiB."""
    return {**sizes(Layout()), "torch_max_reserved_mib": own}


def test_one_gpu_band_follows_the_layout_rule():
    """The rule that computes the layout bands gives the H200's own-memory band from its calibration samples."""
    own = [s["own_mib"] for s in H200_MEMORY["samples"].values()]
    computed = layouts.memory_band(own)
    assert (computed["lo"], computed["hi"]) == (H200_MEMORY["own_band_mib"]["lo"], H200_MEMORY["own_band_mib"]["hi"])


def test_dp2_inside_its_band_passes_and_names_layout_band_and_ranks(band, layout_bands):
    """Both ranks of a DP=2 run inside the DP=2 band pass; the verdict names the layout, the band and each rank."""
    dp2 = layout_bands[DP2]
    mid = middle(dp2.lo, dp2.hi)
    v = verdict(band, memory(mid, mid + 10), DP2)
    assert v.status == PASS, v.message
    assert f"[{dp2.lo}, {dp2.hi}] MiB for DP=2" in v.message, v.message
    assert f"rank 0 (GPU 0) {mid:.0f} MiB" in v.measured and f"rank 1 (GPU 1) {mid + 10:.0f} MiB" in v.measured


def test_one_gpu_value_fails_a_dp2_run(band, layout_bands):
    """The 1-GPU calibration peak on each rank passes a 1-GPU run and fails a DP=2 run: the layout picks the band."""
    peak = max(one_gpu_calibration())
    one = criteria.evaluate(band, RunEvidence(run_dir="/runs/t", memory=replace(memory(peak), gpu_name="NVIDIA H200"),
                                              extra={"summary": one_gpu_summary()}), live=True)[0]
    assert one.status == PASS, one.message
    v = verdict(band, memory(peak, peak), DP2)
    assert v.status == FAIL and "DP=2" in v.expected, v.message


@pytest.mark.parametrize("bad", ["high", "low"])
def test_one_rank_outside_fails_the_run(band, layout_bands, bad):
    """The worst rank decides: one rank above its layout's band, or one below while the other is inside, fails."""
    tp2 = layout_bands[TP2]
    off = tp2.hi + 100 if bad == "high" else tp2.lo - 100
    v = verdict(band, memory(middle(tp2.lo, tp2.hi), off), TP2)
    assert v.status == FAIL and f"rank 1 (GPU 1) {off:.0f} MiB" in v.measured, v.measured


def test_uncalibrated_layout_is_not_measured(band, layout_bands):
    """TP=4 has no calibrated band: not measured (a failure in a live run), never the 1-GPU or another band."""
    assert TP4 not in layout_bands
    peak = max(one_gpu_calibration())
    recorded = verdict(band, memory(*[peak] * 4), TP4, live=False)
    assert recorded.status == NOT_MEASURABLE, recorded.message
    assert "no memory band is calibrated for TP=4" in recorded.measured, recorded.measured
    assert verdict(band, memory(*[peak] * 4), TP4).status == FAIL


def test_layout_read_from_the_arguments_block(band, layout_bands):
    """Without summary.json the log's arguments block gives the layout (as Megatron-LM prints it)."""
    tp2 = layout_bands[TP2]
    text = "\n".join(format_arguments({"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
                                            "world_size": 2}))
    ev = RunEvidence(run_dir="/runs/t", log=logs.parse_log(text), memory=memory(tp2.hi + 50, tp2.hi - 50))
    v = criteria.evaluate(band, ev, live=True)[0]
    assert v.status == FAIL and f"[{tp2.lo}, {tp2.hi}] MiB for TP=2" in v.expected, v.message
    assert "arguments block" in v.where, v.where


def test_tp_from_the_block_and_world_size_from_the_summary_make_tp2(band, layout_bands):
    """A log that prints only the TP and PP sizes (older trainers) plus summary.json's world size: TP=2, not DP=2."""
    text = "\n".join(format_arguments({"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1}))
    tp2 = layout_bands[TP2]
    ev = RunEvidence(run_dir="/runs/t", log=logs.parse_log(text), memory=memory(tp2.lo + 1, tp2.lo + 1),
                     extra={"summary": {"world_size": 2}})
    v = criteria.evaluate(band, ev, live=True)[0]
    assert v.status == PASS and "for TP=2" in v.expected, v.message
    assert "arguments block and summary.json" in v.where, v.where


def test_several_gpus_without_a_recorded_layout_is_not_measured(band):
    """NVML saw two GPUs but neither the log nor summary.json says how the run was split: no band applies."""
    peak = max(one_gpu_calibration())
    v = verdict(band, memory(peak, peak), None, live=False)
    assert v.status == NOT_MEASURABLE and "layout is unknown" in v.measured, v.message


def test_profile_without_layouts_does_not_judge_multi_gpu_runs(layout_bands):
    """megatron-lm.toml calibrates no multi-GPU run: a DP=2 run inside the reference trainer's band is not measured."""
    profile = load_profile("megatron-lm")
    c = next(c for c in profile.criteria if c.id == "gpu-memory")
    dp2 = layout_bands[DP2]
    v = verdict(replace(profile, criteria=(c,)), memory(dp2.lo + 1, dp2.lo + 1), DP2, live=False)
    assert v.status == NOT_MEASURABLE and "this profile" in v.measured, v.message


def test_single_gpu_report_is_judged_by_its_own_memory(band):
    """One GPU (ranks empty, as in reports of older versions): the allocator's peak decides, NVML's total and the
    context are reported beside it, no per-rank list."""
    mem = MemoryReport(method="nvml-process", peak_mib=2398, samples=5, interval_ms=50, gpu_name="NVIDIA H200")
    v = criteria.evaluate(band, RunEvidence(run_dir="/runs/t", memory=mem, extra={"summary": one_gpu_summary()}),
                          live=True)[0]
    assert v.status == PASS and "per rank" not in v.measured, v.message
    assert f"own {OWN_MID:.0f} MiB + context {2398 - OWN_MID:.0f} MiB = 2398 MiB" in v.measured, v.measured


@pytest.mark.parametrize("broken, says", [
    ({"layouts": {"dp2": {"tp": 1, "pp": 1, "dp": 2}}}, "layout 'dp2' needs tp, pp, dp and peak_mib_per_rank"),
    ({"layouts": {"dp2": {"tp": 1, "pp": 1, "dp": 2, "peak_mib_per_rank": {}}}}, "layout 'dp2' has no measured peak"),
    ({"bands": {}}, "needs a `layouts` object"),
])
def test_broken_layout_file_names_file_and_layout(tmp_path, broken, says):
    """A layout file without peaks, or without layouts, is refused with its path and what is missing."""
    path = tmp_path / "layouts.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(layouts.LayoutError) as err:
        layouts.load_layout_bands(path)
    assert str(path) in str(err.value) and says in str(err.value), err.value


def test_profile_naming_a_missing_layout_file_is_refused(tmp_path):
    """A profile whose gpu-memory names a layout file that is not there fails to load, naming the criterion."""
    reference = load_profile("reference").path
    profile = tmp_path / "p.toml"
    profile.write_text(f'extends = "{reference}"\n[criteria.gpu-memory]\nlayouts = "no-such-layouts.json"\n')
    with pytest.raises(CriteriaError, match="gpu-memory.*no-such-layouts.json"):
        load_profile(profile)


def test_ranks_survive_json_and_show_in_the_markdown():
    """report.json keeps every rank; reading it back gives RankMemory again; report.md lists each rank."""
    mem = memory(2400, 2600)
    raw = json.loads(json.dumps(asdict(mem)))
    assert MemoryReport(**raw) == mem
    run = {"name": "dp2", "description": "d", "exit_code": 0, "seconds": 1.0, "ms_per_iter_median": 5.0,
           "cuda_graphs": True, "memory": raw, "verdicts": []}
    text = report.markdown({"profile": "reference", "runs": [run]})
    assert "GPU memory per rank (NVML peak): rank 0 (GPU 0) 2400 MiB; rank 1 (GPU 1) 2600 MiB" in text


def test_report_rounds_times_to_what_they_mean():
    """report.md shows seconds and ms/iter to a tenth (the JSON keeps every digit); a missing median says so."""
    run = {"name": "reference", "description": "d", "exit_code": 0, "seconds": 17.3649, "verdicts": [],
           "ms_per_iter_median": 37.64834403991699, "cuda_graphs": True, "memory": None}
    text = report.markdown({"profile": "reference", "runs": [run]})
    assert "exit code 0, 17.4 s, median 37.6 ms/iter, CUDA graphs: True" in text, text
    assert "median n/a ms/iter" in report.markdown({"profile": "reference",
                                                     "runs": [{**run, "ms_per_iter_median": None}]})
