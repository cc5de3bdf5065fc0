"""harness.judge.copies, field by field: logs without timestamps are never copies of each other for lacking them,
distinct real runs of one seed are never copies (with or without their timestamps), a copy with Windows line endings
is a copy; each names the other and says why, in the words the grade shows. Issue 43: a planted bug that made two
logs without timestamps copies of each other got through the suite."""

from __future__ import annotations

import gzip
import itertools
import re

import pytest

from harness.judge import copies
from harness.judge.profiles import FAIL
from harness.judge.submission import evidence
from harness.evidence import logs
from harness.base.paths import REPO

RUNS = REPO / "fixtures/logs/runs-h200"
ROUND11 = REPO / "fixtures/logs/runs-h200-round11"
FILES = sorted([*RUNS.glob("*.log.gz"), *ROUND11.glob("*.log.gz"), *(REPO / "fixtures/logs/population").glob("*.log.gz"),
                *(REPO / "fixtures/failures/real-h200").glob("*.log.gz"), *(REPO / "results/checkout").glob("*.log.gz"),
                *(REPO / "results/multigpu").rglob("*.log"), *(REPO / "fixtures/logs").glob("*.log")])
STAMP = re.compile(r"^(\s*)\[[^\]\n]{1,64}\]\s*(?=iteration\s)")


def _lines(path) -> list:
    return list(evidence(path).log.lines)


def _without_stamps(lines: list) -> list:
    return [STAMP.sub(r"\1", line) for line in lines]


LOGS = {p.name: _lines(p) for p in FILES}
LOGS = {n: lines for n, lines in LOGS.items() if len(logs.parse_log("\n".join(lines) + "\n").iterations) >= 5}
STAMPED = {n: logs.parse_log("\n".join(lines) + "\n") for n, lines in LOGS.items()}
BARE = {n: logs.parse_log("\n".join(_without_stamps(lines)) + "\n") for n, lines in LOGS.items()}


def _seed(lines) -> str | None:
    for line in lines:
        if m := re.match(r"\s*seed \.+ (\d+)", line):
            return m[1]
    return None


def test_the_logs_without_timestamps_really_have_none():
    assert len(BARE) >= 40
    for name, log in BARE.items():
        assert log.iterations and all(r.timestamp is None for r in log.iterations), name
        assert all(p[1] is None and p[2] is None for p in copies.Fingerprint.of(log).points.values()), name


def test_logs_without_timestamps_are_not_copies_for_lacking_them():
    """Every pair of distinct real runs, each with its timestamps taken off: no copy (lacking a timestamp is no
    evidence that two lines are one)."""
    assert copies.find_copies(BARE) == {}
    for a, b in itertools.combinations(sorted(BARE)[:12], 2):
        assert copies.compare(copies.Fingerprint.of(BARE[a]), copies.Fingerprint.of(BARE[b])) is None, (a, b)


def test_a_log_without_timestamps_is_not_a_copy_of_one_with_them():
    name = "core_v0.16.1-plain-s1234.log.gz"
    other = logs.parse_log("\n".join(LOGS["core_v0.18.2-plain-s1234.log.gz"]) + "\n")
    assert copies.find_copies({"alice": BARE[name], "bob": other}) == {}


def test_distinct_real_runs_of_one_seed_are_not_copies_with_or_without_timestamps():
    by_seed: dict = {}
    for name, lines in LOGS.items():
        by_seed.setdefault(_seed(lines), []).append(name)
    pairs = [(a, b) for names in by_seed.values() for a, b in itertools.combinations(names, 2)]
    assert len(by_seed.get("1234", [])) >= 20 and len(pairs) >= 200
    for table in (STAMPED, BARE):
        prints = {n: copies.Fingerprint.of(log) for n, log in table.items()}
        for a, b in pairs:
            why = copies.compare(prints[a], prints[b])
            assert why is None, (a, b, why)


def test_one_run_without_timestamps_handed_in_twice_is_named_by_its_timings():
    """The one thing that still proves a copy without timestamps: the same scattering elapsed times."""
    name = "core_v0.16.1-plain-s1234.log.gz"
    found = copies.find_copies({"alice": BARE[name], "bob": BARE[name], "carol": BARE["core_v0.18.2-plain-s1234.log.gz"]})
    assert found == {"alice": [("bob", "identical timings at 21/21 iterations")],
                     "bob": [("alice", "identical timings at 21/21 iterations")]}


def _write(path, lines, newline):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(newline.join(lines).encode() + newline.encode())


@pytest.mark.parametrize("newline", ["\r\n", "\r\r\n"])
def test_a_crlf_copy_is_a_copy_and_says_so_field_by_field(tmp_path, newline):
    """alice's log as written, bob's the same run with Windows line endings: both named, both directions, the
    verdict's every field as a grade shows it."""
    name = "core_v0.16.1-plain-s1234.log.gz"
    raw = gzip.decompress((RUNS / name).read_bytes()).decode().splitlines()
    _write(tmp_path / "alice" / "train.log", raw, "\n")
    _write(tmp_path / "bob" / "train.log", raw, newline)
    _write(tmp_path / "carol" / "train.log", gzip.decompress((RUNS / "core_v0.18.2-plain-s1234.log.gz").read_bytes())
           .decode().splitlines(), "\r\n")
    parsed = {who: evidence(tmp_path / who / "train.log").log for who in ("alice", "bob", "carol")}
    assert all(len(p.iterations) == 21 for p in parsed.values())
    found = copies.find_copies(parsed)
    why = "identical timestamps at 21/21 iteration lines"
    assert found == {"alice": [("bob", why)], "bob": [("alice", why)]}
    v = copies.verdict("bob", found["bob"], "bob/train.log")
    assert (v.criterion_id, v.status) == (copies.CHECK_ID, FAIL) == ("log-copy", "fail")
    assert v.label == copies.LABEL
    assert v.measured == f"copy of alice's log ({why})"
    assert v.expected == copies.EXPECTED
    assert v.where == "bob/train.log"
    assert v.consequence_of is None and v.grader is False
    assert "FAIL" in v.message and "log-copy" in v.message and f"copy of alice's log ({why})" in v.message
    assert "hand in the log of your own run" in v.message
    # and through the fingerprints a judging worker hands back
    prints = {who: copies.Fingerprint.from_json(copies.Fingerprint.of(p).to_json()) for who, p in parsed.items()}
    assert copies.matches(prints) == found


def test_a_crlf_copy_without_timestamps_is_named_by_its_timings(tmp_path):
    name = "core_v0.16.1-plain-s1234.log.gz"
    _write(tmp_path / "alice" / "train.log", _without_stamps(LOGS[name]), "\n")
    _write(tmp_path / "bob" / "train.log", _without_stamps(LOGS[name]), "\r\n")
    parsed = {who: evidence(tmp_path / who / "train.log").log for who in ("alice", "bob")}
    assert all(r.timestamp is None for p in parsed.values() for r in p.iterations)
    assert copies.find_copies(parsed) == {"alice": [("bob", "identical timings at 21/21 iterations")],
                                          "bob": [("alice", "identical timings at 21/21 iterations")]}


def test_a_verdict_names_every_submission_it_shares_its_run_with():
    name = "core_v0.16.1-plain-s1234.log.gz"
    log = logs.parse_log("\n".join(LOGS[name]) + "\n")
    found = copies.find_copies({"a": log, "b": log, "c": log})
    why = "identical timestamps at 21/21 iteration lines"
    assert found == {"a": [("b", why), ("c", why)], "b": [("a", why), ("c", why)], "c": [("a", why), ("b", why)]}
    v = copies.verdict("a", found["a"])
    assert v.measured == f"copy of b's log ({why}); copy of c's log ({why})" and v.where == "a"


def test_the_verdicts_whole_message_as_a_grade_prints_it():
    v = copies.verdict("bob", [("alice", "identical timestamps at 21/21 iteration lines")], "bob/train.log")
    assert v.message == (
        "FAIL: the log is this submission's own run (no other submission's timings) [log-copy]\n"
        "  measured:  copy of alice's log (identical timestamps at 21/21 iteration lines)\n"
        "  expected:  no other submission of the batch with the same timestamps, the same times between lines, or "
        "the same elapsed times (identical losses are normal: same flags, same seed)\n"
        "  where:     bob/train.log\n  artifacts: bob/train.log\n  last log lines:\n    (see measured)\n"
        "  remedy:    hand in the log of your own run: two submissions with one run's timings are graded as copies")
    bare = copies.verdict("bob", [("alice", "x")])
    assert (bare.where, bare.expected, bare.label) == ("bob", copies.EXPECTED, copies.LABEL)
    assert "  where:     bob\n  artifacts: bob\n" in bare.message


def _fp(stamps=(), deltas=(), ms=(), noise=0.0, n=21):
    """A fingerprint of n lines: the given timestamps / deltas / elapsed ms first, the rest distinct per call."""
    import random

    rnd = random.Random(len(stamps) * 1000 + len(deltas) * 10 + len(ms) + n + int(noise * 7))
    pts = {}
    for k in range(n):
        it = 10 * (k + 1)
        pts[it] = (ms[k] if k < len(ms) else 100.0 + rnd.random() * 50,
                   stamps[k] if k < len(stamps) else f"2026-01-01 00:00:{rnd.random():.6f}",
                   deltas[k] if k < len(deltas) else rnd.randrange(10 ** 9))
    return copies.Fingerprint(pts, noise)


def test_the_thresholds_at_their_edges_and_the_words_they_print():
    same = [f"2026-12-01 10:00:{k:02d}.000001" for k in range(copies.SAME_STAMPS)]
    why = copies.compare(_fp(stamps=same), _fp(stamps=same, n=20))
    assert why == "identical timestamps at 2/20 iteration lines"
    assert copies.compare(_fp(stamps=same[:1]), _fp(stamps=same[:1], n=20)) is None
    # times between lines: 3 of 6 the same is a copy (SAME_DELTA_MIN, half); 3 of 7 is not; 2 of 4 is not
    d = [111, 222, 333]
    assert copies.compare(_fp(deltas=d, n=6), _fp(deltas=d, n=6, noise=0.5)) == (
        "identical times between lines (to the microsecond) at 3/6 iteration lines: the same run with its clock shifted")
    assert copies.compare(_fp(deltas=d, n=7), _fp(deltas=d, n=7, noise=0.5)) is None
    assert copies.compare(_fp(deltas=d[:2], n=4), _fp(deltas=d[:2], n=4, noise=0.5)) is None
    # a line whose delta one log lacks counts in neither the matches nor the lines compared
    a = _fp(deltas=d, n=6)
    b = copies.Fingerprint({i: (p[0] + 1, "x", p[2] if k < 3 else None) for k, (i, p) in enumerate(a.points.items())},
                           0.0)
    assert copies.compare(a, b) == ("identical times between lines (to the microsecond) at 3/3 iteration lines: the "
                                    "same run with its clock shifted")


def test_nothing_and_empty_logs_are_compared_with_nothing():
    empty = logs.parse_log("no iteration line here\n")
    log = logs.parse_log("\n".join(LOGS["core_v0.16.1-plain-s1234.log.gz"]) + "\n")
    assert copies.find_copies({"a": None, "b": empty, "c": log}) == {}
    assert copies.matches({"a": None, "b": copies.Fingerprint({}, 0.0), "c": copies.Fingerprint.of(log)}) == {}
