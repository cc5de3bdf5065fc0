"""The loss-curve picture marks only what matters: on real passing logs (fp16 skips steps 1-17 or 18 while it
searches its loss scale) the warm-up skips the profile expects (warmup_of: its skips_only_before criterion's window)
draw no red mark, a skip after it (which the criterion counts: the FAQ's micro-batch 1 runs) still does, and the same
picture drawn with every skip marked has them (so the check can fail). A failing run's title also carries its root
cause's id (harness.cli.grade passes it: results/grading-example/grades/submissions/nan/loss-curve.png)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from harness.base.paths import FIXTURES
from harness.judge.profiles import load_profile
from harness.judge.submission import evidence, judge_recorded
from harness.report.plot import LossCurvePainter, warmup_of

PASSING = ["logs/runs-h200/core_v0.16.1-li5-s1234.log.gz", "logs/runs-h200/core_v0.16.1-b-li1-s1234.log.gz",
           "logs/population/a-mbs1-s3104.log.gz", "logs/population/b-s2004.log.gz",
           "logs/core_v0.16.1_h200_course_flags_binary_head.log"]
RED = (214, 39, 40)     # matplotlib's tab:red: skip and NaN marks, and a FAIL title


def red_pixels(png: bytes) -> int:
    import numpy as np

    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    return int((np.abs(pixels - np.array(RED)).max(axis=2) <= 30).sum())


@pytest.mark.parametrize("profile", ["reference", "course"])
def test_the_warm_up_is_the_profiles_own(profile):
    assert warmup_of(load_profile(profile)) == 40
    assert warmup_of(None) == 40      # the reference's window: fp16 warms up whatever a profile judges


@pytest.mark.parametrize("name", PASSING)
def test_a_passing_runs_warm_up_skips_are_not_red(name):
    profile = load_profile("reference")
    ev = evidence(FIXTURES / name)
    j = judge_recorded(profile, ev)
    assert j.verdict == "pass"
    assert any((r.skipped or 0) > 0 for r in ev.log.iterations), "a log without warm-up skips proves nothing here"
    painter = LossCurvePainter()
    golden = profile.for_recipe(j.recipe).golden
    warmup = warmup_of(profile)
    late = any((r.skipped or 0) > 0 and r.iteration > warmup for r in ev.log.iterations)
    drawn = red_pixels(painter.png(ev.log, golden, "x", j.verdict, None, warmup))
    assert (drawn > 0) == late, f"{drawn} red pixels; skips after the warm-up: {late}"   # late skips still count
    assert red_pixels(painter.png(ev.log, golden, "x", j.verdict, None, 0)) > 0
