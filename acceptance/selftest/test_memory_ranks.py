"""`gpu-memory` judges every rank of a multi-GPU run: the worst rank decides, each rank is named, the report shows all."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest

from harness.judge import criteria, report
from harness.judge.evidence import MemoryReport, RankMemory, RunEvidence


@pytest.fixture(scope="module")
def band() -> criteria.Profile:
    """The reference profile's gpu-memory criterion alone."""
    profile = criteria.load_profile("reference")
    c = next(c for c in profile.criteria if c.id == "gpu-memory")
    return replace(profile, criteria=(c,))


def memory(*peaks: float) -> MemoryReport:
    """An NVML process report with one rank per peak (rank i on GPU i), peak_mib the highest."""
    ranks = tuple(RankMemory(i, peak, (1000 + i,), i) for i, peak in enumerate(peaks))
    return MemoryReport(method="nvml-process", peak_mib=max(peaks), samples=50, interval_ms=50, gpu_name="H200",
                        saw_process=True, ranks=ranks)


def verdict(profile: criteria.Profile, mem: MemoryReport) -> criteria.Verdict:
    """The one verdict of `profile` on evidence holding `mem`."""
    return criteria.evaluate(profile, RunEvidence(run_dir="/runs/t", memory=mem), live=True)[0]


def inside(profile) -> float:
    """The middle of the band."""
    c = profile.criteria[0]
    return (c.params["lo"] + c.params["hi"]) / 2


def test_every_rank_inside_passes_and_each_is_named(band):
    """Two ranks inside the band pass; the message names both ranks' peaks."""
    mid = inside(band)
    v = verdict(band, memory(mid, mid + 10))
    assert v.status == criteria.PASS, v.message
    assert f"rank 0 (GPU 0) {mid:.0f} MiB" in v.measured and f"rank 1 (GPU 1) {mid + 10:.0f} MiB" in v.measured


@pytest.mark.parametrize("bad", ["high", "low"])
def test_one_rank_outside_fails_the_run(band, bad):
    """The worst rank decides: one rank above the band, or one far below while the other is inside, fails."""
    c = band.criteria[0]
    off = c.params["hi"] + 100 if bad == "high" else c.params["lo"] - 100
    v = verdict(band, memory(inside(band), off))
    assert v.status == criteria.FAIL and f"rank 1 (GPU 1) {off:.0f} MiB" in v.measured, v.measured


def test_single_gpu_report_is_judged_as_before(band):
    """One GPU (ranks empty, as in reports of older versions): peak_mib alone decides, no per-rank list."""
    mid = inside(band)
    v = verdict(band, MemoryReport(method="nvml-process", peak_mib=mid, samples=5, interval_ms=50))
    assert v.status == criteria.PASS and "per rank" not in v.measured


def test_ranks_survive_json_and_show_in_the_markdown():
    """report.json keeps every rank; reading it back gives RankMemory again; report.md lists each rank."""
    mem = memory(2400, 2600)
    raw = json.loads(json.dumps(asdict(mem)))
    assert MemoryReport(**raw) == mem
    run = {"name": "dp2", "description": "d", "exit_code": 0, "seconds": 1.0, "ms_per_iter_median": 5.0,
           "cuda_graphs": True, "memory": raw, "verdicts": []}
    text = report.markdown({"profile": "reference", "runs": [run]})
    assert "GPU memory per rank (NVML peak): rank 0 (GPU 0) 2400 MiB; rank 1 (GPU 1) 2600 MiB" in text
