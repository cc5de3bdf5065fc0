"""How a pytest test turns one criterion's verdict into its outcome (shared by every checklist-style test)."""

from __future__ import annotations

from harness.judge import criteria


def judge_verdict(verdicts: dict, profile_name: str, criterion_id: str):
    """Pass and return the verdict; fail with its message; skip when absent from the profile or not measurable."""
    import pytest

    verdict = verdicts.get(criterion_id)
    if verdict is None:
        pytest.skip(f"profile {profile_name!r} has no criterion {criterion_id!r}")
    if verdict.status == criteria.NOT_MEASURABLE:
        pytest.skip(f"not measurable here: {verdict.message.splitlines()[0]}")
    if verdict.status != criteria.PASS:
        pytest.fail(verdict.message, pytrace=False)
    return verdict
