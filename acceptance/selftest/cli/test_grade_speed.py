"""What keeps `python -m harness grade` fast without giving up a worker per submission: the coordinator warms
every cache judging needs before it forks (a worker imports, loads and compiles nothing on a course log, passing
or failing), the next worker is forked before an outcome is recorded, and the frozen heap is unfrozen afterwards.
(The speed itself: results/speed/, `python -m harness bench grade --batch DIR --against TREE`.)"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import pytest

from harness.base import sandbox
from harness.base.paths import FIXTURES, RECORDED_LOGS
from harness.cli import grade
from harness.evidence import mutants

GOOD_A = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
GOOD_B = RECORDED_LOGS / "reference_trainer_h200_recipe_b_seed1234.log"
REAL_FAILURES = [FIXTURES / "failures/real-h200/core_v0.16.1-kill-save100-s1234.log.gz",
                 FIXTURES / "failures/real-h200/core_v0.16.1-vocab-missing-s1234.log.gz"]


def _cold(task) -> dict:
    """In a worker: judge_one, and what it had to import, load or draw that the coordinator had not."""
    from harness.evidence import diagnose

    before = set(sys.modules)
    causes, profiles = diagnose.load_table.cache_info().misses, grade._profile.cache_info().misses
    painter = grade._painter()
    backgrounds = len(painter._backgrounds)
    judged = grade.judge_one(task)
    return {"verdict": judged.grade.verdict, "imported": sorted(set(sys.modules) - before),
            "causes_loaded": diagnose.load_table.cache_info().misses - causes,
            "profiles_loaded": grade._profile.cache_info().misses - profiles,
            "backgrounds_drawn": len(painter._backgrounds) - backgrounds}


def test_a_warm_coordinators_workers_load_nothing_again(tmp_path):
    """After warm(), a forked worker judging a course log (recipe a or b, passing, NaN, stopped, a real crash)
    imports no module, loads no profile or causes table, and draws no new background for a passing run."""
    grade.warm("reference")
    cases = {"a": GOOD_A.read_text(), "b": GOOD_B.read_text(), "nan": mutants.nan_at(120)(GOOD_A.read_text()),
             "stopped": mutants.stopped_at(150)(GOOD_A.read_text())}
    folders = []
    for name, text in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.log").write_text(text)
        folders.append(tmp_path / name)
    for path in REAL_FAILURES:
        (tmp_path / path.name).mkdir()
        (tmp_path / path.name / path.name).write_bytes(path.read_bytes())
        folders.append(tmp_path / path.name)
    (tmp_path / "out").mkdir()
    for i, folder in enumerate(folders):
        task = grade.Task(i, str(folder), folder.name, folder.name, str(tmp_path / "out"), "reference")
        outcome = sandbox.run_one(task, _cold, sandbox.Budget(60, 2048))
        assert outcome.ok, (folder.name, outcome.error)
        got = outcome.value
        assert got["imported"] == [] and got["causes_loaded"] == 0 and got["profiles_loaded"] == 0, (folder.name, got)
        if folder.name in ("a", "b"):
            assert got["verdict"] == "pass" and got["backgrounds_drawn"] == 0, (folder.name, got)


def test_the_next_worker_is_forked_before_an_outcome_is_recorded(tmp_path):
    """One job at a time: while the first item's outcome is being recorded, the second item's worker already runs
    (the cores never wait for the coordinator's bookkeeping)."""
    def work(item):
        (tmp_path / f"started-{item}").write_text("x")
        return item

    seen = []

    def on_done(item, outcome):
        if item == 0:
            deadline = time.monotonic() + 20
            while not (tmp_path / "started-1").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append((tmp_path / "started-1").exists())
        assert outcome.ok and outcome.value == item

    sandbox.run_all([0, 1], work, 1, sandbox.Budget(30, 1024), on_done)
    assert seen == [True]


def test_a_worker_that_reported_is_not_waited_for():
    """A worker's report ends it: it is killed with its process group at once (reaped once it has exited), its
    outcome the report.
    Here the worker leaves a child holding its pipe open for 30 s: the outcome still comes at once, and the child
    is gone with its group."""
    def report_and_leave_a_child(item):
        pid = os.fork()
        if pid == 0:                           # holds the worker's end of the pipe
            time.sleep(30)
            os._exit(0)
        return {"item": item, "child": pid, "worker": os.getpid()}

    started = time.monotonic()
    outcome = sandbox.run_one(1, report_and_leave_a_child, sandbox.Budget(60, 1024))
    assert outcome.ok and outcome.value["item"] == 1 and time.monotonic() - started < 15
    child = outcome.value["child"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)
    with pytest.raises(ChildProcessError):            # the worker itself is reaped: no zombie left behind
        os.waitpid(outcome.value["worker"], os.WNOHANG)


def test_every_worker_is_reaped_when_the_batch_ends():
    pids = []
    sandbox.run_all(list(range(6)), lambda item: os.getpid(), 2, sandbox.Budget(30, 1024),
                    lambda item, outcome: pids.append(outcome.value))
    assert len(set(pids)) == 6
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_grading_leaves_the_heap_as_it_found_it(tmp_path):
    """The coordinator freezes its heap while its workers run (their collectors never walk it, so its pages stay
    shared) and unfreezes it afterwards, unless its caller had frozen it first (harness.base.imports does)."""
    (tmp_path / "dir" / "alice").mkdir(parents=True)
    (tmp_path / "dir" / "alice" / "train.log").write_text(GOOD_A.read_text())
    args = argparse.Namespace(submissions=str(tmp_path / "dir"), criteria="reference", out=str(tmp_path / "out"),
                              jobs=1, no_progress=True, no_copy_detection=False, time_limit=60, memory_limit=2048)
    was_frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    try:
        assert grade.main(args) == grade.EXIT_PASSED and gc.get_freeze_count() == 0
        assert (tmp_path / "out" / "submissions" / "alice" / "loss-curve.png").is_file()
        gc.freeze()
        frozen = gc.get_freeze_count()
        args.out = str(tmp_path / "out2")
        assert grade.main(args) == grade.EXIT_PASSED and gc.get_freeze_count() >= frozen > 0
    finally:
        gc.freeze() if was_frozen else gc.unfreeze()
