"""The course checklist (acceptance/test_course_checklist.py) is tied to the criteria profiles, as checkout mode's
list is (test_megatron_lm.py): every id it asks for is a criterion of a profile, every criterion of every profile is
asked for once, and an id no profile has fails the checklist test instead of skipping it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.plugin import judging
from harness.judge.consistency import CHECK_ID
from harness.judge.submission import PROVENANCE_ID
from harness.base.paths import CRITERIA_DIR
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, Verdict, load_profile

CHECKLIST = Path(__file__).resolve().parents[2] / "test_course_checklist.py"
PROFILES = sorted(p.stem for p in CRITERIA_DIR.glob("*.toml") if p.stem != "course-recipe")


def checklist_ids() -> list:
    """The criterion ids the checklist's tests pass to judge(...), in file order."""
    tree = ast.parse(CHECKLIST.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "judge"]
    assert all(len(c.args) == 1 and isinstance(c.args[0], ast.Constant) for c in calls), "judge() takes one literal id"
    return [c.args[0].value for c in sorted(calls, key=lambda c: c.lineno)]


def test_the_profiles_found_are_the_shipped_ones():
    assert {"course", "reference", "megatron-lm"} <= set(PROFILES)


def test_checklist_asks_for_each_id_once():
    ids = checklist_ids()
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("name", PROFILES)
def test_every_criterion_of_each_profile_has_a_checklist_test(name):
    profile = load_profile(name)
    missing = sorted(set(profile.ids) - set(checklist_ids()))
    assert not missing, f"profile {name!r} ({profile.path}) has criteria no checklist test judges: {missing}"


def test_every_checklist_id_is_a_criterion_of_some_profile():
    known = set().union(*(load_profile(n).ids for n in PROFILES)) | {PROVENANCE_ID, CHECK_ID}
    unknown = sorted(set(checklist_ids()) - known)
    assert not unknown, f"{CHECKLIST.name} asks for ids no profile in {CRITERIA_DIR} has: {unknown}"


def test_default_profile_equals_the_checklist():
    """The default (reference) profile judges exactly what the checklist asks for, the grader's log-provenance
    verdict aside."""
    assert set(checklist_ids()) - {PROVENANCE_ID, CHECK_ID} == set(load_profile("reference").ids)


def test_known_ids_are_every_profiles_ids():
    known = judging.known_criterion_ids()
    for name in PROFILES:
        for cid in load_profile(name).ids:
            assert name in known[cid]
    assert PROVENANCE_ID in known


def _verdict(cid: str, status: str) -> Verdict:
    return Verdict(cid, "label", status, "measured", "expected", "where", f"{status.upper()}: message")


def test_an_unknown_id_fails_naming_the_id_and_the_profile():
    """judge("final_loss") for the profile's "final-loss" (the rename the issue planted): a failure, not a skip."""
    profile = load_profile("reference")
    verdicts = {cid: _verdict(cid, PASS) for cid in profile.ids}
    renamed = "final_loss"
    assert renamed not in judging.known_criterion_ids()
    with pytest.raises(pytest.fail.Exception) as failed:
        judging.judge_verdict(verdicts, profile.name, renamed)
    assert repr(renamed) in str(failed.value) and repr(profile.name) in str(failed.value)


def test_an_id_another_profile_judges_is_a_skip_naming_that_profile():
    course = load_profile("course")
    other = sorted(set(load_profile("reference").ids) - set(course.ids))[0]
    verdicts = {cid: _verdict(cid, PASS) for cid in course.ids}
    with pytest.raises(pytest.skip.Exception) as skipped:
        judging.judge_verdict(verdicts, course.name, other)
    assert repr(other) in str(skipped.value) and "reference" in str(skipped.value)


@pytest.mark.parametrize("status, outcome", [(PASS, None), (FAIL, pytest.fail.Exception),
                                             (NOT_MEASURABLE, pytest.skip.Exception)])
def test_a_known_id_takes_its_verdicts_outcome(status, outcome):
    cid = load_profile("reference").ids[0]
    verdicts = {cid: _verdict(cid, status)}
    if outcome is None:
        assert judging.judge_verdict(verdicts, "reference", cid) is verdicts[cid]
    else:
        with pytest.raises(outcome):
            judging.judge_verdict(verdicts, "reference", cid)
