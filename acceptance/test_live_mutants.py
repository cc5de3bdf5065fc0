"""Proof that every criterion can fail: deliberately broken runs, each caught by exactly its criteria.

The mutants train in the same session as the reference run (harness/run/runs.py lists them); a mutant that
fails too few criteria means a criterion cannot fail, too many means a criterion raises false alarms.
"""

import pytest

from harness.judge import criteria
from harness.run.runs import DERIVED_MUTANTS, LIVE_MUTANTS

pytestmark = pytest.mark.gpu

MUTANTS = LIVE_MUTANTS + DERIVED_MUTANTS


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_fails_exactly_its_criteria(mutant, verdicts_by_run, settings):
    if settings.skip_mutants:
        pytest.skip("--skip-mutants: live mutants were not trained")
    if settings.profile != "reference":
        pytest.skip("mutant expectations are written against the reference profile")
    verdicts = verdicts_by_run.get(mutant.name)
    if verdicts is None:
        pytest.skip(f"{mutant.name} was not run in this session")
    failed = {v.criterion_id for v in verdicts if v.status == criteria.FAIL}
    missed, extra = mutant.judge(failed)
    messages = "\n\n".join(v.message for v in verdicts if v.criterion_id in extra)
    assert not missed and not extra, (
        f"mutant {mutant.name} ({mutant.description}): criteria that should have failed but passed: {missed}; "
        f"criteria that failed unexpectedly: {extra}\n{messages}")
