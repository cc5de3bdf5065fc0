"""A resuming run in a session, with stand-in trainers (no torch): it starts with its source, before any
checkpoint exists, and waits; when the source ends without the checkpoint, the session marks the source's save
directory as failed, stops the waiting run and leaves its outcome without a stage, as if it had never started."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from harness.run import session as session_module
from harness.run.runs import RunSpec
from harness.run.outcomes import RunOutcome
from harness.run.session import Session

# The source: after a second, saves iteration 2 (an iteration folder, then the tracker) or exits 1 without it.
SOURCE = textwrap.dedent("""
    import os, sys, time
    save, mode = sys.argv[1], sys.argv[2]
    time.sleep(1.0)
    if mode == "crash":
        print("RuntimeError: the source crashes before its first save", flush=True)
        sys.exit(1)
    os.makedirs(os.path.join(save, "iter_0000002"))
    open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w").write("2")
""")
# The resuming run: notes whether the tracker existed when it started, then polls it (ignoring any marker: only
# the session can stop it early) for up to WAIT_S.
WAIT_S = 120
RESUMER = textwrap.dedent("""
    import os, sys, time
    load, step, note, wait_s = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    tracker = os.path.join(load, "latest_checkpointed_iteration.txt")
    open(note, "w").write(str(os.path.exists(tracker)))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if os.path.exists(tracker) and int(open(tracker).read() or 0) >= step:
            print("resumed", flush=True)
            sys.exit(0)
        time.sleep(0.02)
    sys.exit(1)
""")


class StandIns(Session):
    """The session's scheduling with stand-in trainers; `mode` says whether the source saves or crashes."""

    mode = "save"

    def train_argv(self, spec):
        if spec.resume_from:
            load = self.save_dir(self._spec(spec.resume_from))
            return [sys.executable, "-c", RESUMER, str(load), "2", str(self.run_dir / "tracker-at-start"), str(WAIT_S)]
        return [sys.executable, "-c", SOURCE, str(self.save_dir(spec)), self.mode]

    def checkpoints(self, outcome):
        return None  # nothing to inspect in a stand-in's save directory


RUNS = (RunSpec("reference", "saves iteration 2 after a second, or crashes"),
        RunSpec("resume", "resumes from iteration 2", extra_args=("--ckpt-step", "2"), resume_from="reference",
                save=False))


@pytest.fixture
def run(tmp_path, monkeypatch):
    """Run the stand-in session in `mode`; returns it with run_all's wall time."""
    monkeypatch.setattr(session_module, "expected_sharded_shapes", lambda *shape: None)  # builds a BertModel

    def go(mode: str):
        s = StandIns(tmp_path / mode, stage_timeout_s=300)
        s.mode = mode
        started = time.monotonic()
        s.run_all(RUNS)
        return s, time.monotonic() - started
    return go


def test_the_resume_starts_before_its_source_saved(run):
    s, _ = run("save")
    source, resume = s.outcomes["reference"].stage, s.outcomes["resume"].stage
    assert source.ok and resume is not None and resume.ok, (source.tail, resume and resume.tail)
    assert (s.run_dir / "tracker-at-start").read_text() == "False", "the resume started after the save"
    assert resume.started_at < source.started_at + source.duration_s
    assert not (s.run_dir / "reference" / "checkpoints.failed").exists()


def test_a_failed_source_leaves_the_resume_unstarted(run):
    """The outcome is the one of a resume that never started (judged through its source: no resumed log)."""
    s, wall_s = run("crash")
    assert s.outcomes["reference"].stage.returncode == 1
    assert s.outcomes["resume"] == RunOutcome(RUNS[1]), s.outcomes["resume"]
    assert wall_s < WAIT_S / 2, f"the waiting run was not stopped: the session took {wall_s:.1f} s"
    marker = s.run_dir / "reference" / "checkpoints.failed"
    assert "run 'reference' ended before" in marker.read_text() and "iteration 2" in marker.read_text()
    assert s.evidence("reference").resume_log is None and not s.interrupted


def test_the_resume_waits_in_its_own_trainer(tmp_path):
    """The session gives a resuming run --load and --wait-for-load (the stage timeout, which covers the wait)."""
    s = Session(tmp_path, stage_timeout_s=123)
    for spec in RUNS:
        s.outcomes[spec.name] = RunOutcome(spec)
    argv = s.train_argv(RUNS[1])
    at = argv.index("--load")
    assert argv[at:at + 4] == ["--load", str(s.save_dir(RUNS[0])), "--wait-for-load", "123"], argv
    assert "--wait-for-load" not in s.train_argv(RUNS[0])
