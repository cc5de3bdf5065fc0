"""The reference trainer against Megatron-LM's own run: same seed, flags and data, every log interval compared.

Reuses the session's reference run (the course's flags, seed 1234 by default) and compares its log with the
recorded Megatron-LM core_v0.16.1 log named in fixtures/golden/megatron_parity.toml; the table (parity.md,
parity.json) is written into the run directory.
"""

import pytest

from harness.tools import parity

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def reference_parity(gpu_session):
    """The reference run's log compared with Megatron-LM's; parity.md / parity.json in the run directory."""
    spec = parity.load_spec()
    outcome = gpu_session.outcomes.get("reference")
    if outcome is None or outcome.stage is None:
        pytest.fail("the session has no reference run to compare", pytrace=False)
    seed = next((a for f, a in zip(outcome.stage.argv, outcome.stage.argv[1:]) if f == "--seed"), "1234")
    if int(seed) != spec.seed:
        pytest.skip(f"the reference run used --seed {seed}; Megatron-LM's recorded run used {spec.seed}")
    result = parity.compare_files(outcome.stage.log_path, spec)
    parity.write(result, gpu_session.run_dir / "parity")
    return result, str(gpu_session.run_dir / "parity")


def test_trainer_matches_megatron_every_interval(reference_parity):
    """lm loss, validation and test loss within the tolerance, skipped counts equal, at every log line."""
    result, where = reference_parity
    assert not result.failures, result.failure_message(where)
