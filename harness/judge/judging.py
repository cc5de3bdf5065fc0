"""How a pytest test turns one criterion's verdict into its outcome (shared by every checklist-style test)."""

from __future__ import annotations

from harness.judge import criteria


def judge_verdict(verdicts: dict, profile_name: str, criterion_id: str):
    """Pass and return the verdict; fail with its message; skip when absent from the profile or not measured.

    Text from the run (quoted log lines) reaches the terminal with its control characters made visible.
    Not measured only exists for recorded runs (a live run turns it into a failure, see criteria.judge).
    The caller records the verdict into the JUnit file first (harness.drift.record_verdict: the drift job sits
    above the judge and reads what it records).
    """
    import pytest

    from harness.judge.gradebook import visible

    verdict = verdicts.get(criterion_id)
    if verdict is None:
        pytest.skip(f"profile {profile_name!r} has no criterion {criterion_id!r}")
    if verdict.status == criteria.NOT_MEASURABLE:
        pytest.skip(visible(f"not measured from a recorded run (never counted as a pass): "
                            f"{verdict.measured.removeprefix('not measured: ')}"))
    if verdict.status != criteria.PASS:
        # the message quotes the log: its control characters and escape sequences are shown, never obeyed
        pytest.fail("\n".join(visible(line) for line in verdict.message.split("\n")), pytrace=False)
    return verdict
