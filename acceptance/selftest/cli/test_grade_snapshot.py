"""The grade of every real log and checkpoint folder in fixtures/ is what it was before the package was rebuilt
(fixtures/golden/grades-snapshot.json, taken at 13328bc with grade_snapshot.py before the first move): the
verdict, the failed and unmeasured criteria, the root cause and every criterion's measured value, under each
profile. A change of any grade is a change of behaviour and must come with a new snapshot and its reason."""

from __future__ import annotations

import json

import pytest

import grade_snapshot

pytestmark = pytest.mark.slow


def test_every_fixture_grade_is_unchanged():
    want = json.loads(grade_snapshot.SNAPSHOT.read_text())
    got = grade_snapshot.snapshot()
    assert set(got) == set(want)
    for profile in want:
        assert set(got[profile]) == set(want[profile]), profile
        changed = {name: {k: (want[profile][name].get(k), got[profile][name].get(k))
                          for k in set(want[profile][name]) | set(got[profile][name])
                          if want[profile][name].get(k) != got[profile][name].get(k)}
                   for name in want[profile] if want[profile][name] != got[profile][name]}
        assert not changed, f"{profile}: {len(changed)} grade(s) changed: {json.dumps(changed)[:4000]}"
