"""The grader's own limitation is never the student's failure: a checkpoint this suite cannot read yet (a release's
new class) is 'not judged' in a recorded grade and in a live run, with the grader's remedy, never FAIL."""

from __future__ import annotations

import dataclasses

import pytest

from harness.evidence.checkpoints import inspector as ck
from harness.judge import criteria
from harness.evidence.checkpoints import safe_pickle
from harness.judge.profiles import FAIL, load_profile, NOT_MEASURABLE, PASS
from harness.base.paths import FIXTURES

RELEASE = FIXTURES / "checkpoints" / "core_v0.18.2"
LOG = FIXTURES / "logs" / "runs-h200" / "core_v0.18.2-plain-s1234.log.gz"


@pytest.fixture(scope="module")
def unreadable_report(tmp_path_factory):
    """The real core_v0.18.2 save's small files read by a suite that predates InferenceCudaGraphScope."""
    table = dict(safe_pickle._table())
    table.pop(("megatron.core.transformer.enums", "InferenceCudaGraphScope"))
    mp = pytest.MonkeyPatch()
    mp.setattr(safe_pickle, "_table", lambda: table)
    try:
        report = ck.inspect_save_dir(RELEASE, load=False)
    finally:
        mp.undo()
    assert "InferenceCudaGraphScope" in report.unreadable
    return report


@pytest.mark.parametrize("live", [False, True], ids=["recorded", "live"])
def test_an_unreadable_checkpoint_is_not_judged_never_failed(unreadable_report, live):
    """Recorded or live, checkpoint-loads stays not measured with the grader flag; the judgement lists it as not
    judged; its message carries the grader's remedy, not the student's ('Add --save', 'Re-save')."""
    profile = load_profile("megatron-lm")
    ev = dataclasses.replace(criteria.evidence_from_log_file(LOG), checkpoints=unreadable_report, exit_code=0)
    judgement = criteria.judge(profile, ev, live=live)
    by_id = {v.criterion_id: v for v in judgement.verdicts}
    loads = by_id["checkpoint-loads"]
    assert loads.status == NOT_MEASURABLE and loads.grader, loads
    assert "InferenceCudaGraphScope" in loads.measured
    assert criteria.GRADER_LIMIT_REMEDY in loads.message
    assert profile.by_id("checkpoint-loads").remedy not in loads.message
    assert [v.criterion_id for v in judgement.not_judged] == [v.criterion_id for v in judgement.verdicts
                                                             if v.grader]
    assert "checkpoint-loads" in [v.criterion_id for v in judgement.not_judged]
    assert FAIL not in {by_id[c].status for c in ("checkpoint-loads",)}


def test_a_readable_checkpoint_is_judged(unreadable_report):
    """The same save read with the full table is judged (no grader flag anywhere): the flag is not a blanket pass."""
    report = ck.inspect_save_dir(RELEASE, load=False)
    assert not report.unreadable
    profile = load_profile("megatron-lm")
    ev = dataclasses.replace(criteria.evidence_from_log_file(LOG), checkpoints=report)
    judgement = criteria.judge(profile, ev)
    assert judgement.not_judged == ()
    assert {v.criterion_id: v.status for v in judgement.verdicts}["checkpoint-tracker"] == PASS
