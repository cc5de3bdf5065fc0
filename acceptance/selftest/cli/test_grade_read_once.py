"""Each submission is read once, in its own bounded worker: the worker hands back the grade and the log's copy
fingerprint, and the grader's own process never opens a submission's file (copy detection runs on the returned
fingerprints). The copies it names from fingerprints are the ones, with the same words, that reading the logs again
named: on real logs, exact copies, copies with the clock shifted, copies jittered by a print unit, and none among
distinct runs with identical losses."""

from __future__ import annotations

import argparse
import builtins
import gzip
import io
import json
import os
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from harness.base.paths import REPO
from harness.cli import grade
from harness.evidence import logs
from harness.evidence.logformat import TIMESTAMP_FORMAT, format_iteration
from harness.judge import copies
from harness.judge.grade_record import Grade
from harness.judge.submission import evidence

RUNS = REPO / "fixtures/logs/runs-h200"
REAL_LOGS = sorted([*RUNS.glob("*.log.gz"), *(REPO / "fixtures/logs").glob("*.log"),
                    *(REPO / "fixtures/logs/population").glob("*.log.gz"),
                    *(REPO / "fixtures/failures/real-h200").glob("*.log.gz")])
PLAIN = RUNS / "core_v0.16.1-plain-s1234.log.gz"          # Megatron-LM, 21 iteration lines, timings scatter
OTHER = RUNS / "core_v0.18.2-plain-s1234.log.gz"          # another run, the same losses


def _lines(path: Path) -> list:
    return list(evidence(path).log.lines)


def _edit(lines: list, change) -> str:
    out = list(lines)
    for rec in logs.parse_log("\n".join(lines) + "\n").iterations:
        out[rec.line_no - 1] = format_iteration(change(rec))
    return "\n".join(out) + "\n"


def _shifted(lines: list, hours: int) -> str:
    return _edit(lines, lambda r: r.__class__(**{**r.__dict__, "timestamp": (
        datetime.strptime(r.timestamp, TIMESTAMP_FORMAT) + timedelta(hours=hours)).strftime(TIMESTAMP_FORMAT)}))


def _jittered(lines: list) -> str:
    """Elapsed times moved by one print unit, every timestamp by a few ms (test_copies.py: still one run)."""
    k = iter(range(10_000))

    def change(r):
        i = next(k)
        when = datetime.strptime(r.timestamp, TIMESTAMP_FORMAT) + timedelta(microseconds=(i * 1237) % 5000 + 1)
        return r.__class__(**{**r.__dict__, "elapsed_ms": round(max(0.1, r.elapsed_ms + (0.1, -0.1, 0.0)[i % 3]), 1),
                              "timestamp": when.strftime(TIMESTAMP_FORMAT)})
    return _edit(lines, change)


def _same(a: copies.Fingerprint, b: copies.Fingerprint) -> bool:
    """Equal fingerprints (NaN equal to NaN)."""
    def key(fp):
        return (repr(fp.noise), [(i, repr(p[0]), p[1], p[2]) for i, p in fp.points.items()])
    return key(a) == key(b)


def _through_the_pipe(fp: copies.Fingerprint) -> copies.Fingerprint:
    """What the coordinator gets: the worker's report is JSON (harness.base.sandbox)."""
    return copies.Fingerprint.from_json(json.loads(json.dumps(fp.to_json())))


def test_every_real_logs_fingerprint_comes_back_through_the_pipe_unchanged():
    assert len(REAL_LOGS) >= 30
    for path in REAL_LOGS:
        log = evidence(path).log
        if log.iterations:
            fp = copies.Fingerprint.of(log)
            assert len(fp.points) <= copies.MAX_POINTS and _same(_through_the_pipe(fp), fp), path.name


def test_a_fingerprint_is_bounded_and_a_bad_report_is_refused():
    """A log of many iteration lines: its first MAX_POINTS, its noise over all; an over-long timestamp becomes its
    digest (equal texts, equal digests); what is not a fingerprint raises ValueError (the grade is kept, no claim)."""
    lines = _lines(PLAIN)
    its = [r for r in logs.parse_log("\n".join(lines) + "\n").iterations]
    many = "\n".join(format_iteration(its[i % len(its)].__class__(**{**its[i % len(its)].__dict__, "iteration": i + 1}))
                     for i in range(copies.MAX_POINTS + 50)) + "\n"
    fp = copies.Fingerprint.of(logs.parse_log(many))
    assert list(fp.points) == list(range(1, copies.MAX_POINTS + 1))
    assert len(json.dumps(fp.to_json())) < 100 * copies.MAX_POINTS
    assert copies._stamp("2026-01-01 00:00:00." + "1" * 500) == copies._stamp("2026-01-01 00:00:00." + "1" * 500)
    assert len(copies._stamp("2026-01-01 00:00:00." + "1" * 500)) == 71
    assert copies._stamp("2026-01-01 00:00:00.123456") == "2026-01-01 00:00:00.123456"
    for bad in (None, [], {"points": "x", "noise": 1.0}, {"points": [[1, 2.0, "t"]], "noise": 1.0},
                {"points": [["1", 2.0, "t", 3]], "noise": 1.0}, {"points": [], "noise": "1"},
                {"points": [[1, 2.0, "x" * 500, 3]], "noise": 1.0},
                {"points": [[i, 2.0, None, None] for i in range(copies.MAX_POINTS + 1)], "noise": 1.0}):
        with pytest.raises(ValueError):
            copies.Fingerprint.from_json(bad)


def _batch_logs() -> dict:
    """name -> log text: alice and bob hand in one run, carol it with the clock shifted, dan his own run (the same
    losses), erin a print-unit jitter of alice's, frank a run of his own with another log interval."""
    plain = gzip.decompress(PLAIN.read_bytes()).decode()
    lines = _lines(PLAIN)
    return {"alice": plain, "bob": plain, "carol": _shifted(lines, 30), "dan": gzip.decompress(OTHER.read_bytes()).decode(),
            "erin": _jittered(lines),
            "frank": gzip.decompress((RUNS / "core_v0.16.1-li5-s1234.log.gz").read_bytes()).decode()}


def test_fingerprints_name_the_same_copies_as_the_logs_read_again():
    texts = _batch_logs()
    parsed = {n: logs.parse_log(t) for n, t in texts.items()}
    before = copies.find_copies(parsed)                    # what the grader computed when it read each log again
    after = copies.matches({n: _through_the_pipe(copies.Fingerprint.of(lg)) for n, lg in parsed.items()})
    assert after == before
    assert set(before) == {"alice", "bob", "carol", "erin"}
    assert dict(before["alice"])["bob"] == "identical timestamps at 21/21 iteration lines"
    assert "clock shifted" in dict(before["alice"])["carol"]
    assert "erin" in dict(before["alice"])


class _OpenSpy:
    """Every file the grader's own process opens (os.open, open, io.open); a forked worker records into its own
    copy of the list, which never comes back."""

    def __init__(self, monkeypatch):
        self.pid, self.opened, self.paused = os.getpid(), [], False
        for module, name in ((os, "open"), (builtins, "open"), (io, "open")):
            real = getattr(module, name)
            monkeypatch.setattr(module, name, self._wrap(real))

    def _wrap(self, real):
        def spy(file, *args, **kwargs):
            if os.getpid() == self.pid and not self.paused and isinstance(file, (str, bytes, os.PathLike)):
                self.opened.append(os.path.abspath(os.fsdecode(file)))
            return real(file, *args, **kwargs)
        return spy


def test_the_grader_never_opens_a_submission_and_still_names_the_copies(tmp_path, monkeypatch):
    """`grade` over real copies, each submission's folder deleted as soon as its worker has returned, every file the
    grader's own process opens recorded: it opened none under DIR, and the grades name exactly the copies (with the
    same verdict, word for word) that copy detection on the logs read again names."""
    texts = _batch_logs()
    root = tmp_path / "dir"
    for name, text in texts.items():
        (root / name).mkdir(parents=True)
        (root / name / "train.log").write_text(text)
    parsed = {n: evidence(root / n / "train.log").log for n in texts}
    expected = {n: copies.verdict(n, m, str(root / n / "train.log")) for n, m in copies.find_copies(parsed).items()}
    assert set(expected) == {"alice", "bob", "carol", "erin"}

    real_add = grade.Batch.add
    gone = []

    def add_then_delete(batch, task, judged):
        spy.paused = True                                  # the test's own deletion opens the folder
        shutil.rmtree(task.folder)                         # nothing of it is left to read again
        spy.paused = False
        gone.append(task.name)
        return real_add(batch, task, judged)

    monkeypatch.setattr(grade.Batch, "add", add_then_delete)
    spy = _OpenSpy(monkeypatch)
    out = tmp_path / "out"
    args = argparse.Namespace(submissions=str(root), criteria="reference", out=str(out), jobs=2, no_progress=True,
                              no_copy_detection=False, time_limit=60, memory_limit=2048)
    assert grade.main(args) == grade.EXIT_FAILED
    monkeypatch.undo()
    assert sorted(gone) == sorted(texts)
    inside_dir = [p for p in spy.opened if Path(p).is_relative_to(root)]
    assert not inside_dir, inside_dir
    assert spy.opened, "the spy saw nothing: it is not in the grader's path"
    grades = {g["submission"]: g for g in json.loads((out / "grades.json").read_text())}
    for name, g in grades.items():
        copy = [c for c in g["criteria"] if c["id"] == copies.CHECK_ID]
        if name not in expected:
            assert not copy and copies.CHECK_ID not in g["failed"], name
            continue
        v = expected[name]
        assert copy == [{"id": v.criterion_id, "status": v.status, "measured": v.measured, "expected": v.expected,
                         "where": v.where, "consequence_of": None, "message": v.message}], name
        assert g["verdict"] == "fail" and g["failed"][-1] == copies.CHECK_ID and g["diagnosis_id"] == copies.CHECK_ID
        own = json.loads((out / "submissions" / name / "grade.json").read_text())
        assert own == g


def test_a_worker_report_that_is_not_a_grade_is_that_submissions_error():
    """The coordinator checks what comes back: a report without a grade, or with a broken fingerprint, is an
    `error` grade naming it (never a crash of the batch, never a pass)."""
    task = grade.Task(0, "/dir/x", "x", "x", "/out", "reference")
    budget = grade.sandbox.Budget()
    for value in ({"never": 1}, {"grade": {"submission": "x"}}, [1, 2],
                  {"grade": Grade("x", verdict="pass").to_dict(), "fingerprint": {"points": "no"}}):
        g = grade.grade_from_outcome(task, grade.sandbox.WorkerOutcome(grade.sandbox.DONE, value), budget)
        assert g.verdict == "error" and g.diagnosis_id == "grader-error", value
        assert "the judging worker's report is not a grade" in g.diagnosis_cause
    fine = {"grade": Grade("x", verdict="pass").to_dict(), "fingerprint": None}
    assert grade.grade_from_outcome(task, grade.sandbox.WorkerOutcome(grade.sandbox.DONE, fine), budget).verdict == "pass"
