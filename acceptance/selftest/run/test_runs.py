"""The run table (harness/run/runs.py) on CPU: every criterion of the reference profile is failed by a mutant."""

from __future__ import annotations

import pytest

from harness.evidence.diagnose import RULES
from harness.run.runs import DERIVED_MUTANTS, LIVE_MUTANTS, session_runs
from harness.judge.profiles import load_profile

MUTANTS = LIVE_MUTANTS + DERIVED_MUTANTS


@pytest.fixture(scope="module")
def reference_ids() -> set:
    """Criterion ids of the profile the mutants are written against."""
    return set(load_profile("reference").ids)


def test_every_criterion_is_failed_by_a_live_run(reference_ids):
    """The union of intended failures covers the whole reference profile: no criterion that cannot fail."""
    covered = set().union(*(m.expected_failures for m in MUTANTS))
    assert covered == reference_ids, f"never failed on purpose: {sorted(reference_ids - covered)}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_names_real_criteria_and_a_reason_to_tolerate(mutant, reference_ids):
    """Expected and tolerated failures are criteria of the profile; a tolerated one says why."""
    assert mutant.expected_failures <= reference_ids, sorted(mutant.expected_failures - reference_ids)
    assert mutant.tolerated_failures <= reference_ids and not mutant.tolerated_failures & mutant.expected_failures
    assert bool(mutant.tolerated_failures) == bool(mutant.why_tolerated), mutant.name


@pytest.mark.parametrize("mutant", [m for m in LIVE_MUTANTS if m.resume_from], ids=lambda m: m.name)
def test_broken_resumes_load_a_run_of_the_session_and_fail_only_resume_matches(mutant):
    """A broken resume resumes an earlier run of the session, from iter_0000100, and breaks only the resume."""
    earlier = [r.name for r in session_runs()][: [r.name for r in session_runs()].index(mutant.name)]
    assert mutant.is_broken_resume and mutant.resume_from in earlier
    assert mutant.expected_failures == {"resume-matches"} and "--ckpt-step" in mutant.extra_args
    assert mutant.extra_args[mutant.extra_args.index("--ckpt-step") + 1] == "100"


def test_diagnosed_mutants_name_real_rules():
    """A mutant's intended diagnosis is a rule of harness.evidence.diagnose."""
    ids = {r.id for r in RULES}
    assert all(m.diagnosis in ids for m in LIVE_MUTANTS if m.diagnosis)


def test_drop_flags_drops_a_value_only_where_the_flag_has_one():
    """A plan's `drop` removes a flag with its value (`--save DIR`), and a valueless flag alone (`--fp16` before
    another flag, or last): the bf16 and fp32 runs drop --fp16 without eating the flag after it."""
    from harness.run.population import drop_flags

    argv = ["--save", "/tmp/s", "--fp16", "--lr", "1e-4", "--seed", "-1", "--bf16-no"]
    assert drop_flags(argv, ("--save",)) == ["--fp16", "--lr", "1e-4", "--seed", "-1", "--bf16-no"]
    assert drop_flags(argv, ("--fp16",)) == ["--save", "/tmp/s", "--lr", "1e-4", "--seed", "-1", "--bf16-no"]
    assert drop_flags(argv, ("--seed",)) == ["--save", "/tmp/s", "--fp16", "--lr", "1e-4", "--bf16-no"]
    assert drop_flags(["--lr", "1", "--fp16"], ("--fp16",)) == ["--lr", "1"]
    assert drop_flags(argv, ("--fp16", "--save")) == ["--lr", "1e-4", "--seed", "-1", "--bf16-no"]
