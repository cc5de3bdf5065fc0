"""Proof that every criterion can fail: deliberately broken runs, each caught by exactly its criteria.

The mutants train in the same session as the reference run (harness/run/runs.py lists them); a mutant that
fails too few criteria means a criterion cannot fail, too many means a criterion raises false alarms.
A mutant whose run fails (a crash, missing data) must also get the right diagnosis, and fail fast.
"""

import pytest

from harness.evidence.diagnose import diagnose
from harness.run.failures import FAST_FAIL_TIMEOUT_S
from harness.run.runs import DERIVED_MUTANTS, LIVE_MUTANTS
from harness.judge.profiles import FAIL

pytestmark = pytest.mark.gpu

MUTANTS = LIVE_MUTANTS + DERIVED_MUTANTS
DIAGNOSED = tuple(m for m in LIVE_MUTANTS if m.diagnosis)


def _applies(settings) -> None:
    """Skip, with the reason, when this session did not train the mutants against the reference profile."""
    if settings.skip_mutants:
        pytest.skip("--skip-mutants: live mutants were not trained")
    if settings.profile != "reference":
        pytest.skip("mutant expectations are written against the reference profile")


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_fails_exactly_its_criteria(mutant, verdicts_by_run, settings):
    _applies(settings)
    verdicts = verdicts_by_run.get(mutant.name)
    if verdicts is None:
        pytest.skip(f"{mutant.name} was not run in this session")
    failed = {v.criterion_id for v in verdicts if v.status == FAIL}
    missed, extra = mutant.judge(failed)
    messages = "\n\n".join(v.message for v in verdicts if v.criterion_id in extra)
    assert not missed and not extra, (
        f"mutant {mutant.name} ({mutant.description}): criteria that should have failed but passed: {missed}; "
        f"criteria that failed unexpectedly: {extra}\n{messages}")


@pytest.mark.parametrize("mutant", DIAGNOSED, ids=[m.name for m in DIAGNOSED])
def test_failed_mutant_is_diagnosed_and_fails_fast(mutant, gpu_session, settings):
    """The failed stage names the intended cause, and ended on its own within seconds (no hang, no watchdog)."""
    _applies(settings)
    outcome = gpu_session.outcomes.get(mutant.name)
    if outcome is None or outcome.stage is None:
        pytest.skip(f"{mutant.name} was not run in this session")
    r = outcome.stage
    found = diagnose(r.name, r.returncode, r.log_path.read_text(errors="replace"), timed_out=r.timed_out,
                     stalled=r.stalled, duration_s=r.duration_s, argv=r.argv)
    assert found is not None and found.cause_id == mutant.diagnosis, (
        f"{mutant.name}: expected diagnosis {mutant.diagnosis!r}, got {found and found.cause_id!r}\n"
        f"{r.failure_message()}")
    assert not (r.timed_out or r.stalled) and r.returncode != 0 and r.duration_s < FAST_FAIL_TIMEOUT_S, r.headline()
