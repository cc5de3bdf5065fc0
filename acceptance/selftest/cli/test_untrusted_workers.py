"""Each submission judged in its own bounded worker (harness.base.sandbox): a submission that hangs, eats memory or
raises any BaseException (SystemExit, KeyboardInterrupt, GeneratorExit from its content) costs only its own grade,
named by what it was reading; SIGTERM reaches the coordinator with --jobs 1 too; Gradescope always writes a
results.json; every entry of DIR gets a row; OUT is never a submission folder. Budgets are small so this is fast."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from harness.cli import gradescope, grade
from harness.base import sandbox

BUDGET = sandbox.Budget(time_s=4, memory_mb=1024)   # 4 s: a junk log is judged in well under 1 s, even loaded
NORMAL_LOG = "junk\n"   # judged quickly (a `fail`: not a Megatron-LM log)


def args(dir_: Path, out: Path | None, jobs: int = 1, **kw) -> argparse.Namespace:
    return argparse.Namespace(submissions=str(dir_), criteria="reference", out=str(out) if out else None, jobs=jobs,
                              no_progress=True, no_copy_detection=True, time_limit=kw.get("time_limit", 4),
                              memory_limit=kw.get("memory_limit", 1024))


def _hostile_grade_one(real):
    """judge_one where the folder's name says what its content does while it is read (inherited by the fork)."""
    def hostile(task):
        name = Path(task.folder).name
        sandbox.phase("reading ckpt/common.pt")
        if name.startswith("exit"):
            raise SystemExit(0)
        if name.startswith("ctrlc"):
            raise KeyboardInterrupt
        if name.startswith("genexit"):
            raise GeneratorExit
        if name.startswith("hang"):
            while True:
                pass
        if name.startswith("sleep"):
            time.sleep(60)
        if name.startswith("fat"):
            return {"never": len(bytearray(8 << 30))}       # 8 GB, over 1 GB
        return real(task)
    return hostile


@pytest.fixture
def hostile(monkeypatch):
    monkeypatch.setattr(grade, "judge_one", _hostile_grade_one(grade.judge_one))


@pytest.mark.parametrize("status,fn", [
    (sandbox.RAISED, lambda _: (_ for _ in ()).throw(SystemExit(3))),
    (sandbox.RAISED, lambda _: (_ for _ in ()).throw(KeyboardInterrupt())),
    (sandbox.OVER_TIME, lambda _: time.sleep(30)),
    (sandbox.OVER_MEMORY, lambda _: bytearray(8 << 30)),
    (sandbox.DONE, lambda x: {"x": x}),
])
def test_the_worker_outcome_names_the_budget_and_the_phase(status, fn):
    def run(item):
        sandbox.phase("reading train.log")
        return fn(item)

    started = time.monotonic()
    budget = sandbox.Budget(time_s=1.5, memory_mb=1024)
    outcome = sandbox.run_one(7, run, budget)
    assert outcome.status == status, outcome
    assert time.monotonic() - started < budget.time_s + 3
    if status == sandbox.DONE:
        assert outcome.value == {"x": 7}
    else:
        assert outcome.phase == "reading train.log" and "while reading train.log" in outcome.text(budget)
    if status == sandbox.OVER_MEMORY:
        assert "exceeded 1024 MB" in outcome.text(budget)


@pytest.mark.parametrize("jobs", [2])   # --jobs 1 runs the same workers one at a time (the SIGTERM test below)
def test_each_hostile_submission_is_its_own_outcome_and_the_rest_are_graded(tmp_path, hostile, jobs):
    names = ["alice", "exit-f2py", "ctrlc", "genexit", "hang", "fat", "zoe"]
    dir_ = tmp_path / "dir"
    for n in names:
        (dir_ / n).mkdir(parents=True)
        (dir_ / n / "train.log").write_text(NORMAL_LOG)
    started = time.monotonic()
    code = grade.main(args(dir_, tmp_path / "out", jobs))
    assert time.monotonic() - started < 30
    assert code == grade.EXIT_GRADER_ERROR, "a submission not judged is exit 3, never 0"
    got = {g["submission"]: g for g in json.loads((tmp_path / "out" / "grades.json").read_text())}
    assert set(got) == set(names)
    for n in ("alice", "zoe"):                                                 # judged: a junk log fails
        assert got[n]["verdict"] == "fail", got[n]["diagnosis"]
    for n in ("exit-f2py", "ctrlc", "genexit"):
        assert got[n]["verdict"] == "error" and got[n]["diagnosis_id"] == "grader-error", got[n]
        assert "while reading ckpt/common.pt" in got[n]["diagnosis"]
    for n in ("hang", "fat"):
        assert got[n]["verdict"] == "error" and got[n]["diagnosis_id"] == "grader-limit", got[n]
        assert "exceeded" in got[n]["diagnosis"] and "while reading ckpt/common.pt" in got[n]["diagnosis"]
    for n in names:   # grade.json by the coordinator, one per submission
        assert json.loads((tmp_path / "out" / "submissions" / n / "grade.json").read_text()) == got[n]


def test_sigterm_reaches_the_coordinator_with_jobs_1(tmp_path, hostile):
    """A worker hashing forever ignores nothing: the coordinator gets SIGTERM, kills it, writes what finished."""
    dir_ = tmp_path / "dir"
    for n in ("alice", "sleep-forever", "zoe"):
        (dir_ / n).mkdir(parents=True)
        (dir_ / n / "train.log").write_text(NORMAL_LOG)
    first = tmp_path / "out" / "submissions" / "alice" / "grade.json"

    def term_once_alice_is_graded():
        deadline = time.monotonic() + 60
        while not first.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)   # the worker of sleep-forever is running by now
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Thread(target=term_once_alice_is_graded, daemon=True)
    timer.start()
    started = time.monotonic()
    try:
        code = grade.main(args(dir_, tmp_path / "out", 1, time_limit=60))
    finally:
        timer.join()
    assert code == grade.EXIT_INTERRUPTED and time.monotonic() - started < 30
    got = {g["submission"]: g["verdict"] for g in json.loads((tmp_path / "out" / "grades.json").read_text())}
    assert got == {"alice": "fail", "sleep-forever": "incomplete", "zoe": "incomplete"}


@pytest.mark.parametrize("name,expect", [("exit-f2py", "raised SystemExit"), ("fat", "exceeded 1024 MB")])
def test_gradescope_always_writes_results_json(tmp_path, hostile, capsys, name, expect):
    sub = tmp_path / name
    sub.mkdir()
    (sub / "train.log").write_text(NORMAL_LOG)
    out = tmp_path / "results" / "results.json"
    ns = argparse.Namespace(submission=str(sub), results=str(out), criteria="reference",
                            weights=str(gradescope.DEFAULT_WEIGHTS), time_limit=4, memory_limit=1024)
    assert gradescope.main(ns) == 0
    data = json.loads(out.read_text())
    assert data["score"] == 0 and expect in data["output"], data["output"]
    assert "\x1b" not in capsys.readouterr().out


_NAME_BYTES = st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\0" not in b
                                                        and b not in (b".", b".."))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(st.tuples(_NAME_BYTES, st.sampled_from(["folder", "file", "archive", "link-out",
                                                                  "link-in"])),
                        min_size=1, max_size=5, unique_by=lambda e: e[0].lower()))
def test_every_entry_of_dir_gets_a_row_and_nothing_is_written_outside_out(tmp_path_factory, entries):
    base = tmp_path_factory.mktemp("tree")
    dir_, out, secret = base / "dir", base / "out", base / "secret.txt"
    dir_.mkdir()
    secret.write_text("SECRET")
    made = []
    for raw, kind in entries:
        name = raw + (b".zip" if kind == "archive" else b"")
        path = os.path.join(os.fsencode(dir_), name)
        if os.path.lexists(path):
            continue
        if kind == "file" or kind == "archive":
            with open(path, "wb") as fh:
                fh.write(b"PK\x03\x04" if kind == "archive" else b"x")
        else:
            os.mkdir(path)
            target = os.fsencode(secret) if kind == "link-out" else b"train.log"
            with open(os.path.join(path, b"real.log" if kind == "link-in" else b"train.log"), "w") as fh:
                fh.write(NORMAL_LOG)
            if kind != "folder":
                os.symlink(target if kind == "link-out" else b"real.log", os.path.join(path, b"x.log"))
        made.append(os.fsdecode(name))
    before = sorted(p for p in base.rglob("*") if not p.is_relative_to(out))
    try:
        code = grade.main(args(dir_, out))
    except SystemExit as exc:   # never: usage errors are return codes
        pytest.fail(f"grade raised SystemExit({exc.code})")
    assert code in (grade.EXIT_FAILED, grade.EXIT_USAGE, grade.EXIT_GRADER_ERROR)
    assert sorted(p for p in base.rglob("*") if not p.is_relative_to(out)) == before, "written outside OUT"
    assert secret.read_text() == "SECRET"
    if code == grade.EXIT_USAGE:   # no sub-folder at all
        assert not any(os.path.isdir(os.path.join(dir_, n)) and not n.startswith(".") for n in made)
        return
    rows = json.loads((out / "grades.json").read_text())
    assert len(rows) == len(made), (rows, made)
    assert {r["submission"] for r in rows} == {grade.display_name(n) for n in made}
    text = (out / "grades.md").read_text(encoding="utf-8") + (out / "grades.csv").read_text(encoding="utf-8")
    assert "SECRET" not in text and "\x1b" not in text
    assert all(r["verdict"] != "pass" for r in rows)
