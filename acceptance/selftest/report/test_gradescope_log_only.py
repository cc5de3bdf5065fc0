"""A passing log-only submission on Gradescope: the score is what the weights give the criteria a log proves (90 of
100 with fixtures/gradescope/weights.toml, whose 10 points for checkpoint-tracker and checkpoint-loads need the
--save folder), and results.json's summary says so, naming those criteria and the two ways to a full score; with
the --save folder's criteria at 0 points (a log-only assignment) the same grade scores 100."""

from __future__ import annotations

import pytest

from harness.base.paths import FIXTURES
from harness.cli import gradescope
from harness.judge.grade_record import Grade
from harness.judge.profiles import load_profile
from harness.judge.submission import evidence, judge_recorded

LOGS = ["logs/runs-h200/core_v0.16.1-li5-s1234.log.gz", "logs/runs-h200/core_v0.16.1-b-li1-s1234.log.gz",
        "logs/population/b-resume-s7101.2.log.gz"]


@pytest.mark.parametrize("name", LOGS[:2])
def test_a_passing_log_scores_what_a_log_proves_and_says_why_not_more(name, tmp_path):
    profile = load_profile("reference")
    log = FIXTURES / name
    grade = Grade.judged(log.name, log, None, judge_recorded(profile, evidence(log)), None)
    assert grade.verdict == "pass"
    data = gradescope.results(grade, profile, gradescope.load_weights(), 1.0)
    lost = [t for t in data["tests"] if "not-measured" in t["tags"] and t["max_score"] > 0]
    assert data["score"] == pytest.approx(100 - sum(t["max_score"] for t in lost)) and lost
    assert f"{sum(t['max_score'] for t in lost):g} of the points are for criteria the submitted files cannot show" in data["output"]
    assert all(t["tags"][0] in data["output"] for t in lost)
    weights = (gradescope.DEFAULT_WEIGHTS.read_text()
               .replace("checkpoint-tracker = 5", "checkpoint-tracker = 0")
               .replace("checkpoint-loads = 5", "checkpoint-loads = 0"))
    (tmp_path / "log-only.toml").write_text(weights)
    log_only = gradescope.results(grade, profile, gradescope.load_weights(tmp_path / "log-only.toml"), 1.0)
    assert log_only["score"] == pytest.approx(100) and "cannot show (" not in log_only["output"]
