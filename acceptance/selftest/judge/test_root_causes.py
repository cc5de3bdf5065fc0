"""No FAIL without a root cause, and the most specific finding is the root cause: over every real log in fixtures
(alone, with its --save folder, and the two legs of each real resumed run together) under every profile, a failed
grade always names one; the submitted logs not being one run (log-provenance) comes before where the judged log
stopped; a killed run is named from what its surviving processes print.

Constructed cases (each from real logs kept in fixtures; nothing here was run):

- the rerun into its own --save: fixtures/logs/population/a-resume-s4001.2 (real core_v0.16.1, --load = --save =
  its checkpoint folder) with its load at iteration 200 (`loading distributed checkpoint from ... at iteration 200`,
  `successfully loaded checkpoint ... at iteration 200`, `Overwriting rerun_state_machine.current_iteration from -1
  to 200`) and every line between `[before the start of training step]` and `[after training is done]` taken out:
  what core_v0.16.1 prints when it loads --train-iters (training.py: `while iteration < args.train_iters` runs
  nothing, no save since 200 % --save-interval == 0, then the final evaluations);
- a run resumed from another run's checkpoint: the real first leg of run b-resume-s7101 (stopped at 130, saved in
  its own folder) and the real second leg of run a-resume-s4001 (loads a-resume-s4001's checkpoint) in one folder;
- killed while building the data loaders, its DataLoader worker surviving: the real SIGKILLed run
  fixtures/failures/real-h200/core_v0.16.1-kill-datasets-s1234 followed by a multiprocessing queue feeder's
  BrokenPipeError traceback (CPython 3.12's multiprocessing/queues.py `_feed` and connection.py frames, line numbers
  from CPython 3.12.1's sources), the way a child process's feeder thread reports the pipe to a dead process; with
  torchrun's report of the signal (the real kill-it130 log's `Signal 9 (SIGKILL) received` block) after it;
- a DataLoader worker killed by SIGKILL: fixtures/failures/logs/megatron-lm-878.log (a real thread's log where torch
  reports `DataLoader worker (pid N) is killed by signal: Bus error`) with the signal's text as torch prints it for
  SIGKILL (`Killed.`).
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import pytest

from harness.base.paths import FIXTURES, REPO
from harness.judge.profiles import FAIL, PASS, load_profile
from harness.judge.submission import evidence, judge_recorded, judge_submission

sys.path.insert(0, str(REPO / "acceptance" / "selftest"))
from grade_snapshot import CHECKPOINT_LOGS, real_logs  # noqa: E402  (what the grade snapshot grades)

PROFILES = tuple(load_profile(name) for name in ("reference", "course", "megatron-lm"))
POPULATION = FIXTURES / "logs" / "population"
REAL_H200 = FIXTURES / "failures" / "real-h200"
RESUMED = (("a-resume-s4001.1.log.gz", "a-resume-s4001.2.log.gz"), ("b-resume-s7101.1.log.gz",
                                                                    "b-resume-s7101.2.log.gz"))
FEEDER_BROKEN_PIPE = """Traceback (most recent call last):
  File "/usr/lib/python3.12/multiprocessing/queues.py", line 261, in _feed
    send_bytes(obj)
  File "/usr/lib/python3.12/multiprocessing/connection.py", line 200, in send_bytes
    self._send_bytes(m[offset:offset + size])
  File "/usr/lib/python3.12/multiprocessing/connection.py", line 427, in _send_bytes
    self._send(header + buf)
  File "/usr/lib/python3.12/multiprocessing/connection.py", line 384, in _send
    n = write(self._handle, buf)
        ^^^^^^^^^^^^^^^^^^^^^^^^
BrokenPipeError: [Errno 32] Broken pipe
"""


def _lines(path: Path) -> list:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        return fh.read().split("\n")


def _submissions(tmp: Path) -> list:
    """(name, folder) of every real log alone, each checkpoint folder with its run's log, each resumed run's legs."""
    out = []
    for i, log in enumerate(real_logs()):
        sub = tmp / f"log{i:03d}"
        sub.mkdir()
        shutil.copy(log, sub / log.name)
        out.append((log.relative_to(FIXTURES).as_posix(), sub))
    for name, log in CHECKPOINT_LOGS.items():
        sub = tmp / f"ckpt-{name}"
        shutil.copytree(FIXTURES / "checkpoints" / name, sub / "ckpt")
        shutil.copy(FIXTURES / log, sub / Path(log).name)
        out.append((f"{log} with checkpoints/{name}", sub))
    for legs in RESUMED:
        sub = tmp / legs[0].split(".")[0]
        sub.mkdir()
        for leg in legs:
            shutil.copy(POPULATION / leg, sub / leg)
        out.append((" + ".join(legs), sub))
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    out = {}
    for name, folder in _submissions(tmp):
        ev = evidence(folder)                       # read once, judged under every profile
        out.update({(name, p.name): judge_recorded(p, ev) for p in PROFILES})
    return out


def test_no_real_log_fails_without_a_root_cause(graded):
    failed = {key: j for key, j in graded.items() if j.verdict == "fail"}
    assert len(failed) >= 300, len(failed)                     # ~100 failing real logs under each profile
    empty = [(key, j.ids(FAIL)) for key, j in failed.items() if j.diagnosis is None or not j.diagnosis.cause_id
             or not j.diagnosis.cause or not j.diagnosis.remedy]
    assert not empty, empty
    assert all(j.diagnosis is None for j in graded.values() if j.verdict == "pass")
    for legs in RESUMED:                                       # the two legs together are one healthy run
        assert graded[(" + ".join(legs), "reference")].verdict == "pass"


def test_a_resumed_leg_alone_is_named_by_its_provenance(graded):
    """The real second leg of a resumed run, submitted without the first: the row's root cause is the missing log,
    not a criterion (it names the checkpoint it loaded)."""
    for _, second in RESUMED:
        for profile in ("reference", "course", "megatron-lm"):
            j = graded[(f"logs/population/{second}", profile)]
            assert j.diagnosis.cause_id == "resume-unknown-checkpoint", (second, profile, j.diagnosis)
            assert "no log of the run before the resume was submitted" in j.diagnosis.cause
            missing = [v for v in j.verdicts if v.status == FAIL and v.consequence_of]
            assert missing and all(v.consequence_of == "resume-unknown-checkpoint" for v in missing)


def test_the_course_profile_names_its_own_unreachable_claim(graded):
    """A healthy real run under `course` fails only the chapter's 6-7 final loss: that finding is the root cause, with
    its own remedy (judge with the reference profile)."""
    j = graded[("logs/runs-h200/core_v0.16.1-plain-s1234.log.gz", "course")]
    assert j.ids(FAIL) == ["final-loss"] and j.diagnosis.cause_id == "final-loss"
    assert "between 6 and 7: 8.1591 at iteration 200" in j.diagnosis.cause and "reference profile" in j.diagnosis.remedy


@pytest.fixture()
def rerun(tmp_path):
    src = _lines(POPULATION / "a-resume-s4001.2.log.gz")
    start = next(i for i, line in enumerate(src) if "[before the start of training step]" in line)
    end = next(i for i, line in enumerate(src) if "[after training is done]" in line)
    head = [line.replace("at iteration 130", "at iteration 200").replace("from -1 to 130", "from -1 to 200")
            for line in src[:start + 1]]
    (tmp_path / "train.log").write_text("\n".join(head + src[end:]))
    return tmp_path


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_a_rerun_into_its_own_save_is_named_before_stopped_early(rerun, profile):
    j = judge_submission(profile, rerun)
    assert j.diagnosis.cause_id == "rerun-of-finished-run", j.diagnosis
    assert "loaded the checkpoint of iteration 200" in j.diagnosis.cause and "its own --save folder" in \
        j.diagnosis.cause and "trained no iteration" in j.diagnosis.cause
    assert "stopped before training started" not in j.diagnosis.cause
    v = {v.criterion_id: v for v in j.verdicts}
    assert v["log-provenance"].status == FAIL and "[rerun-of-finished-run]" in v["log-provenance"].measured
    if "exit-code" in v:                      # it ended normally: it loaded 200 and evaluated
        assert v["exit-code"].status == PASS and "trained none" in v["exit-code"].measured
    assert v["final-loss"].status == FAIL and v["final-loss"].consequence_of == "rerun-of-finished-run"
    assert "loaded the checkpoint of iteration 200" in v["final-loss"].measured


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_a_resume_from_another_runs_checkpoint_is_the_root_cause(tmp_path, profile):
    shutil.copy(POPULATION / "b-resume-s7101.1.log.gz", tmp_path / "first.log.gz")
    shutil.copy(POPULATION / "a-resume-s4001.2.log.gz", tmp_path / "second.log.gz")
    j = judge_submission(profile, tmp_path)
    assert j.diagnosis.cause_id == "resume-unknown-checkpoint", j.diagnosis
    assert "second.log.gz resumes from /home/student/runs/pop/ckpt/a-resume-s4001 at iteration 130, a checkpoint " \
           "that no earlier log saved" in j.diagnosis.cause


def _killed(tmp_path: Path, *tails: str) -> Path:
    lines = [line for line in _lines(REAL_H200 / "core_v0.16.1-kill-datasets-s1234.log.gz") if line.strip()]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n" + "".join(tails))
    return tmp_path


def _signal_report() -> str:
    lines = _lines(REAL_H200 / "core_v0.16.1-kill-it130-s1234.log.gz")
    start = next(i for i, line in enumerate(lines) if "failed (exitcode: -9)" in line)
    return "\n".join(lines[start:]) + "\n"


@pytest.mark.parametrize("tails, signal", [((FEEDER_BROKEN_PIPE,), None),
                                           ((FEEDER_BROKEN_PIPE, "<torchrun>"), "SIGKILL")],
                         ids=["the worker alone", "with torchrun's report"])
def test_a_run_killed_while_building_its_data_is_named_by_its_survivors(tmp_path, tails, signal):
    tails = tuple(_signal_report() if t == "<torchrun>" else t for t in tails)
    for profile in PROFILES:
        j = judge_submission(profile, _killed(tmp_path, *tails))
        assert j.diagnosis.cause_id == "killed-by-signal", (profile.name, j.diagnosis)
        cause = j.diagnosis.cause
        assert "killed" in cause and "building the data loaders" in cause and "BrokenPipeError" in cause
        assert "read the traceback" not in j.diagnosis.remedy and "out-of-memory killer" in j.diagnosis.remedy
        assert (f"by {signal}" in cause) == bool(signal), cause


def test_a_broken_pipe_in_the_programs_own_code_is_no_kill(tmp_path):
    """A BrokenPipeError raised in the program's own frames (writing to a closed pipe) is its own error."""
    own = FEEDER_BROKEN_PIPE.replace('/usr/lib/python3.12/multiprocessing/queues.py", line 261, in _feed',
                                     '/home/student/Megatron-LM/pretrain_bert.py", line 90, in forward_step')
    j = judge_submission(PROFILES[0], _killed(tmp_path, own))
    assert j.diagnosis.cause_id != "killed-by-signal", j.diagnosis


def test_a_dataloader_worker_killed_by_sigkill(tmp_path):
    text = (FIXTURES / "failures" / "logs" / "megatron-lm-878.log").read_text(encoding="utf-8", errors="replace")
    assert "is killed by signal: Bus error." in text
    bus = ("is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. "
           "Please try to raise your shared memory limit.")
    killed = text.replace(bus, "is killed by signal: Killed.")
    (tmp_path / "train.log").write_text(killed, encoding="utf-8")
    j = judge_submission(PROFILES[0], tmp_path)
    assert j.diagnosis.cause_id == "killed-by-signal", j.diagnosis
    assert "DataLoader worker was killed by SIGKILL" in j.diagnosis.cause


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_a_log_cut_short_of_what_its_save_folder_holds_is_named_cut(tmp_path, profile):
    """The real plain run's log cut after its iteration-150 line (constructed), beside that run's real --save folder
    (fixtures/checkpoints/core_v0.16.1, tracker 200): the tracker proves the run went on, so the log was cut: not
    'stopped, killed, or cut'; final-loss names the lines the log lacks."""
    lines = _lines(FIXTURES / "logs" / "runs-h200" / "core_v0.16.1-plain-s1234.log.gz")
    cut = next(i for i, line in enumerate(lines) if "iteration      150/" in line)
    (tmp_path / "train.log").write_text("\n".join(lines[:cut + 1]) + "\n")
    j = judge_submission(profile, tmp_path / "train.log", FIXTURES / "checkpoints" / "core_v0.16.1")
    assert j.diagnosis.cause_id == "log-cut", j.diagnosis
    assert "stopped at iteration 150 of 200" in j.diagnosis.cause and "saved iteration 200" in j.diagnosis.cause
    final = next(v for v in j.verdicts if v.criterion_id == "final-loss")
    assert final.status == FAIL and "the --save folder's tracker" in final.measured and "160-200" in final.measured
