"""Self-tests of harness.judge.copies: copies of one run are named (both names), distinct real runs never are,
however equal their losses."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.judge import copies
from harness.evidence import logs
from harness.judge.submission import evidence
from harness.base.paths import REPO
from harness.evidence.logformat import ParsedLog, TIMESTAMP_FORMAT, format_iteration

RUNS = REPO / "fixtures/logs/runs-h200"
REAL = {p.name: evidence(p).log for p in sorted([*RUNS.glob("*.log.gz"), *(REPO / "fixtures/logs").glob("*.log"),
                                                *(REPO / "fixtures/logs/population").glob("*.log.gz"),
                                                *(REPO / "results/checkout").glob("*.log.gz"),
                                                *(REPO / "results/multigpu").rglob("*.log"),
                                                *(REPO / "fixtures/failures/real-h200").glob("*.log.gz")])}
REAL = {n: lg for n, lg in REAL.items() if len(lg.iterations) >= 5}
MEGATRON = [n for n, lg in REAL.items() if "inject_nan_at" not in (lg.arguments or {})]
# logs whose timings tell runs apart: enough lines, elapsed times scattering by a millisecond or more
JITTERABLE = [n for n in MEGATRON if len(REAL[n].iterations) >= copies.NEAR_MIN
              and copies.Fingerprint.of(REAL[n]).noise >= copies.NOISE_MIN_MS]
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _text(name: str) -> list:
    return list(REAL[name].lines)


def _edit_iterations(lines: list, change) -> list:
    """Each iteration line rewritten by change(record) -> record."""
    out = list(lines)
    for rec in logs.parse_log("\n".join(lines) + "\n").iterations:
        out[rec.line_no - 1] = format_iteration(change(rec))
    return out


def _log(lines: list) -> ParsedLog:
    return logs.parse_log("\n".join(lines) + "\n")


def test_distinct_real_runs_are_never_copies_even_with_identical_losses():
    """Every pair of the real logs (Megatron-LM's and the trainer's steady CUDA-graph timings): none flagged; among
    them pairs with the same flags and seed print identical losses."""
    assert len(REAL) >= 30
    assert copies.find_copies(REAL) == {}
    same_losses = [(a, b) for a, b in itertools.combinations(MEGATRON, 2)
                   if REAL[a].lm_losses and REAL[a].lm_losses == REAL[b].lm_losses]
    assert len(same_losses) >= 3, same_losses          # e.g. core_v0.16.1-plain and core_v0.18.2-plain: 8.159132
    # every Megatron-LM log with 10 lines or more scatters enough to be told apart; the trainer's do not
    assert len(JITTERABLE) >= 20 and set(JITTERABLE) == {n for n in MEGATRON if len(REAL[n].iterations) >= 10}


def test_a_copy_with_the_name_changed_is_named_both_ways():
    logs_in = {"alice": REAL["core_v0.16.1-plain-s1234.log.gz"], "bob": REAL["core_v0.16.1-plain-s1234.log.gz"],
               "carol": REAL["core_v0.18.2-plain-s1234.log.gz"]}
    found = copies.find_copies(logs_in)
    assert set(found) == {"alice", "bob"}
    assert found["alice"][0][0] == "bob" and found["bob"][0][0] == "alice"
    assert found["alice"][0][1] == "identical timestamps at 21/21 iteration lines"
    v = copies.verdict("alice", found["alice"], "alice/train.log")
    assert v.status == "fail" and "copy of bob's log (identical timestamps at 21/21 iteration lines)" in v.message


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(REAL)), hours=st.integers(1, 24 * 30))
def test_a_copy_with_its_clock_shifted_is_named(name, hours):
    shifted = _edit_iterations(_text(name), lambda r: r.__class__(**{
        **r.__dict__, "timestamp": (datetime.strptime(r.timestamp, TIMESTAMP_FORMAT) + timedelta(hours=hours))
        .strftime(TIMESTAMP_FORMAT)}))
    found = copies.find_copies({"alice": REAL[name], "bob": _log(shifted)})
    assert set(found) == {"alice", "bob"} and "clock shifted" in found["bob"][0][1], found


@SETTINGS
@given(name=st.sampled_from(JITTERABLE), data=st.data())
def test_a_copy_jittered_by_a_print_unit_is_named(name, data):
    """Decision: elapsed times moved by up to one print unit (0.1 ms) and every timestamp moved by up to 5 ms
    (independently per line) are still one run's timings: Megatron-LM's scatter from line to line is milliseconds."""
    steps = data.draw(st.lists(st.sampled_from([-0.1, 0.0, 0.1]), min_size=400, max_size=400))
    wobble = data.draw(st.lists(st.integers(-5000, 5000), min_size=400, max_size=400))
    it = iter(range(400))

    def jitter(r):
        k = next(it)
        when = datetime.strptime(r.timestamp, TIMESTAMP_FORMAT) + timedelta(microseconds=wobble[k] or 1)
        return r.__class__(**{**r.__dict__, "elapsed_ms": round(max(0.1, r.elapsed_ms + steps[k]), 1),
                              "timestamp": when.strftime(TIMESTAMP_FORMAT)})

    found = copies.find_copies({"alice": REAL[name], "bob": _log(_edit_iterations(_text(name), jitter))})
    assert set(found) == {"alice", "bob"}, name


def test_a_copy_jittered_beyond_the_scatter_is_not_claimed():
    """Decision: with every elapsed time moved by several ms and the timestamps rewritten, the timings are no
    longer the other run's; copy detection makes no claim (the consistency checks and a replay still apply)."""
    name = "core_v0.16.1-plain-s1234.log.gz"
    k = iter(range(1000))
    far = _edit_iterations(_text(name), lambda r: r.__class__(**{
        **r.__dict__, "elapsed_ms": r.elapsed_ms + (5.0 if next(k) % 2 else -5.0),
        "timestamp": (datetime.strptime(r.timestamp, TIMESTAMP_FORMAT) + timedelta(milliseconds=37 * r.iteration
                                                                                          + 3)).strftime(
            TIMESTAMP_FORMAT)}))
    assert copies.find_copies({"alice": REAL[name], "bob": _log(far)}) == {}


def test_grade_names_both_copies_in_the_grades(tmp_path):
    """`python -m harness grade`: alice and bob hand in one run's log, carol her own (same losses): alice and bob
    fail log-copy naming each other, in grades.json and in each grade.json; carol has no such verdict."""
    import gzip

    batch = tmp_path / "batch"
    plain = gzip.decompress((RUNS / "core_v0.16.1-plain-s1234.log.gz").read_bytes())
    for who, data in (("alice", plain), ("bob", plain),
                      ("carol", gzip.decompress((RUNS / "core_v0.18.2-plain-s1234.log.gz").read_bytes()))):
        (batch / who).mkdir(parents=True)
        (batch / who / "train.log").write_bytes(data)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run([sys.executable, "-m", "harness", "grade", str(batch), "--out", str(tmp_path / "out"),
                           "--no-progress", "--jobs", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode in (0, 1), done.stderr
    grades = {g["submission"]: g for g in json.loads((tmp_path / "out" / "grades.json").read_text())}
    for me, other in (("alice", "bob"), ("bob", "alice")):
        assert grades[me]["verdict"] == "fail" and "log-copy" in grades[me]["failed"]
        copy = [c for c in grades[me]["criteria"] if c["id"] == "log-copy"]
        assert copy and re.search(rf"copy of {other}'s log \(identical timestamps at 21/21 iteration lines\)",
                                  copy[0]["measured"])
        own = json.loads(next((tmp_path / "out").rglob(f"*{me}*/grade.json")).read_text())
        assert "log-copy" in own["failed"]
        assert f"copy of {other}" in (tmp_path / "out" / "grades.md").read_text()
    assert "log-copy" not in grades["carol"]["failed"]
    assert not [c for c in grades["carol"]["criteria"] if c["id"] == "log-copy"]
