"""How a pytest test turns one criterion's verdict into its outcome (shared by every checklist-style test)."""

from __future__ import annotations

import functools
import tomllib

from harness.base.paths import CRITERIA_DIR
from harness.judge.profiles import NOT_MEASURABLE, PASS, load_profile


@functools.lru_cache(maxsize=1)
def known_criterion_ids() -> dict:
    """criterion id -> names of the profiles in fixtures/criteria/ that judge it (log-provenance: none, the grader's
    own verdict on submitted logs)."""
    from harness.judge.consistency import CHECK_ID
    from harness.judge.submission import PROVENANCE_ID

    known: dict = {PROVENANCE_ID: [], CHECK_ID: []}
    for path in sorted(CRITERIA_DIR.glob("*.toml")):
        raw = tomllib.loads(path.read_text())
        if "criteria" not in raw and "extends" not in raw:   # the recipe file, not a profile
            continue
        profile = load_profile(path)
        for cid in profile.ids:
            known.setdefault(cid, []).append(profile.name)
    return known


def judge_verdict(verdicts: dict, profile_name: str, criterion_id: str):
    """Pass and return the verdict; fail with its message; skip when not measured, or when the profile lacks a
    criterion another profile has (the course profile judges only the chapter's own criteria); fail for an id that
    no profile has (a typo or a renamed criterion must never pass as a skip).

    Text from the run (quoted log lines) reaches the terminal with its control characters made visible.
    Not measured only exists for recorded runs (a live run turns it into a failure, see criteria.judge).
    The caller records the verdict into the JUnit file first (harness.cli.drift.record_verdict: the drift job sits
    above the judge and reads what it records).
    """
    import pytest

    from harness.report.gradebook import visible

    verdict = verdicts.get(criterion_id)
    if verdict is None:
        known = known_criterion_ids()
        if criterion_id not in known:   # a typo or a renamed criterion: an error, never a skip
            pytest.fail(f"unknown criterion id {criterion_id!r}: profile {profile_name!r} has no such criterion, and "
                        f"neither has any profile in {CRITERIA_DIR} (known: {', '.join(sorted(known))})",
                        pytrace=False)
        pytest.skip(f"profile {profile_name!r} has no criterion {criterion_id!r} (judged by: "
                    f"{', '.join(known[criterion_id]) or 'the grader of submitted logs'})")
    if verdict.grader:   # the suite's own limitation: said as such, never the student's failure, never a pass
        pytest.skip(visible(f"NOT JUDGED, this suite's limitation and not the run's: "
                            f"{verdict.measured.removeprefix('not judged: ')}"))
    if verdict.status == NOT_MEASURABLE:
        pytest.skip(visible(f"not measured from a recorded run (never counted as a pass): "
                            f"{verdict.measured.removeprefix('not measured: ')}"))
    if verdict.status != PASS:
        # the message quotes the log: its control characters and escape sequences are shown, never obeyed
        pytest.fail("\n".join(visible(line) for line in verdict.message.split("\n")), pytrace=False)
    return verdict
