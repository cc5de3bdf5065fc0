"""What a Megatron-LM log proves, checked over every real log kept in fixtures (fixtures/logs/**/*.log*: a real log
added later is picked up) and the real runs that fail or stop (fixtures/failures/real-h200/).

- A truncated or altered log never passes: cut after any line before its normal end, the run did not complete and
  the grade says where it stopped; a save line removed fails checkpoints-saved; the final evaluation removed fails
  exit-code ("the run completed"). Hypothesis picks the log and the cut.
- The real runs that stop are graded as what they are: the course's literal command (no --save) fails
  checkpoints-saved naming --save; each SIGKILL names where it stopped and what was in flight.
- Every real log's memory lies in its variant's band, and the bands file is the derivation over the logs it names.

Each log is read once (module cache); a cut is parsed from its text (about 20 ms).
"""

from __future__ import annotations

import functools
from dataclasses import replace
import glob
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.judge import criteria, log_evidence, submission
from harness.evidence import logs, logread
from harness.judge.profiles import FAIL, load_profile, PASS, Profile, Verdict
from harness.evidence.records import CheckpointReport
from harness.base.paths import FIXTURES, GOLDEN_DIR
from harness.evidence.logformat import ParsedLog

REAL_LOGS = sorted(Path(p) for p in glob.glob(str(FIXTURES / "logs" / "**" / "*.log*"), recursive=True))
STOPPED = FIXTURES / "failures" / "real-h200"
CHECKPOINTS = FIXTURES / "checkpoints"
PROFILES = {"megatron-lm": load_profile("megatron-lm"), "reference": load_profile("reference")}
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _profile(path: Path) -> Profile:
    """The reference trainer's own log is judged by its profile, every other real log as Megatron-LM's."""
    return PROFILES["reference" if path.name.startswith("reference_trainer") else "megatron-lm"]


@functools.lru_cache(maxsize=None)
def _text(path: Path) -> tuple:
    """The log's lines, as the judge reads them (gzip, encodings)."""
    info = logread.ReadInfo(str(path))
    return tuple(line for _, line in logread.unwrap(logread.read_lines(path, info), info))


@functools.lru_cache(maxsize=None)
def _parsed(path: Path) -> ParsedLog:
    return logs.parse_log("\n".join(_text(path)) + "\n")


def _judge(path: Path, lines) -> criteria.Judgement:
    """The grade of these lines as a recorded log (criteria.evidence_from_log_text + criteria.judge)."""
    return criteria.judge(_profile(path), criteria.evidence_from_log_text("\n".join(lines) + "\n", str(path.parent),
                                                                          str(path)))


def _verdict(j: criteria.Judgement, cid: str) -> Verdict:
    return next(v for v in j.verdicts if v.criterion_id == cid)


COMPLETE = [p for p in REAL_LOGS if logs.run_end(_parsed(p)).complete]


def test_the_real_logs_are_there_and_most_end_normally():
    """The glob finds the kept real logs, and every one of them that is not a first leg of a resumed run ends the
    way Megatron-LM ends a run (a first leg ends with its save: it is resumed)."""
    assert len(REAL_LOGS) >= 20, REAL_LOGS
    legs = {p for p in REAL_LOGS if re.search(r"\.1\.log", p.name)}
    assert set(REAL_LOGS) - set(COMPLETE) == legs, [(p.name, logs.run_end(_parsed(p)).stopped)
                                                    for p in set(REAL_LOGS) - set(COMPLETE) - legs]
    for p in legs:
        assert "exited after its checkpoint save" in logs.run_end(_parsed(p)).stopped


def _end_line(log: ParsedLog) -> int:
    """The line of the normal end: the later of the final validation-set and test-set lines."""
    n = log.iterations[-1].train_iters
    return max(v.line_no for v in log.validations if v.iteration == n and v.split in ("validation", "test"))


@FAST
@given(st.data())
def test_a_log_cut_before_its_normal_end_never_passes(data):
    path = data.draw(st.sampled_from(COMPLETE), label="log")
    lines = _text(path)
    cut = data.draw(st.integers(min_value=0, max_value=_end_line(_parsed(path)) - 1), label="lines kept")
    j = _judge(path, lines[:cut])
    assert j.verdict == "fail", (path.name, cut)
    done = _verdict(j, "exit-code")
    assert done.status == FAIL, (path.name, cut, done.message)
    end = logs.run_end(logs.parse_log("\n".join(lines[:cut]) + "\n"))
    assert not end.complete and end.stopped in done.measured, (path.name, cut, done.measured)
    assert j.diagnosis is not None, (path.name, cut)
    if j.diagnosis.cause_id == "log-ends-early":       # no error in the log: the cause is where it stopped
        assert j.diagnosis.cause.startswith(end.stopped), (path.name, cut, j.diagnosis.cause)


@pytest.mark.parametrize("path", COMPLETE, ids=lambda p: p.name)
def test_every_real_log_cut_in_its_last_steps_fails(path):
    """Every complete real log (not a sample of them), cut where a kill hurts most: right after its last iteration
    line, right after its final `saving checkpoint` line (the save in flight), and just before its last final
    evaluation line."""
    log, lines = _parsed(path), _text(path)
    n = log.iterations[-1].train_iters
    cuts = {log.iterations[-1].line_no: "stopped", _end_line(log) - 1: "stopped during the final evaluation"}
    final_save = [c.line_no for c in log.checkpoints if c.event == "saving" and c.iteration == n]
    if final_save:
        cuts[final_save[0]] = f"killed during the checkpoint save at iteration {n}"
    for cut, stopped in cuts.items():
        j = _judge(path, lines[:cut])
        done = _verdict(j, "exit-code")
        assert j.verdict == "fail" and done.status == FAIL and done.measured.startswith(stopped), (cut, done.measured)


def _save_lines(path: Path) -> list:
    return [c.line_no for c in _parsed(path).checkpoints if c.event in ("saving", "saved")]


@FAST
@given(st.data())
def test_a_log_without_one_of_its_save_lines_fails_checkpoints_saved(data):
    path = data.draw(st.sampled_from([p for p in COMPLETE if _save_lines(p)]), label="log")
    drop = data.draw(st.sampled_from(_save_lines(path)), label="save line removed")
    lines = list(_text(path))
    del lines[drop - 1]
    v = _verdict(_judge(path, lines), "checkpoints-saved")
    assert v.status == FAIL, (path.name, drop, v.message)


@FAST
@given(st.data())
def test_a_log_without_its_final_evaluation_fails_the_run_completed(data):
    path = data.draw(st.sampled_from(COMPLETE), label="log")
    log = _parsed(path)
    n = log.iterations[-1].train_iters
    final = [v.line_no for v in log.validations if v.iteration == n and v.split in ("validation", "test")]
    drop = set(data.draw(st.sets(st.sampled_from(final), min_size=1), label="final evaluation lines removed"))
    lines = [t for i, t in enumerate(_text(path), start=1) if i not in drop]
    j = _judge(path, lines)
    v = _verdict(j, "exit-code")
    assert v.status == FAIL and "on test set" in v.measured + v.expected, (path.name, drop, v.message)
    assert j.verdict == "fail"


def test_the_healthy_real_logs_pass_what_their_log_proves():
    """The log's own evidence passes on every complete real run that saved: it completed, ran on the GPU, saved at
    100 and 200, and its memory lies in its variant's band."""
    for path in COMPLETE:
        if path.name.startswith("reference_trainer") or re.search(r"\.2\.log", path.name):
            continue                          # the reference trainer: its own profile; a last leg: see stitching
        j = _judge(path, _text(path))
        for cid in ("exit-code", "ran-on-gpu", "checkpoints-saved", "gpu-memory", "loss-decreases"):
            v = _verdict(j, cid)
            assert v.status == PASS, (path.name, v.message)


# ---------------------------------------------------------------- the real runs that fail or stop


def _stopped(name: str) -> criteria.Judgement:
    path = STOPPED / f"core_v0.16.1-{name}-s1234.log.gz"
    return submission.judge_submission(PROFILES["megatron-lm"], path)


def test_the_courses_literal_command_fails_checkpoints_saved_naming_save():
    j = _stopped("literal")
    v = _verdict(j, "checkpoints-saved")
    assert v.status == FAIL and "save ... None" in v.measured and "add `--save DIR`" in v.measured, v.message
    assert "course's command lacks --save" in v.message
    assert _verdict(j, "exit-code").status == PASS         # it ran to its normal end: the save is what is missing
    assert j.verdict == "fail"
    assert j.diagnosis.cause_id == "no-save" and "lacks --save" in j.diagnosis.cause, j.diagnosis
    assert "--save DIR" in j.diagnosis.remedy


@pytest.mark.parametrize("name,stopped", [
    ("kill-save200", "killed during the checkpoint save at iteration 200"),
    ("kill-save100", "killed during the checkpoint save at iteration 100"),
    ("kill-final-eval", "stopped during the final evaluation, after iteration 200 of 200"),
    ("kill-it130", "stopped at iteration 130 of 200"),
    ("kill-eval150", "stopped at iteration 150 of 200, after its evaluation at iteration 150"),
    ("kill-datasets", "stopped before training started"),
])
def test_a_killed_run_fails_and_says_where_it_stopped(name, stopped):
    j = _stopped(name)
    assert j.verdict == "fail" and j.diagnosis is not None
    v = _verdict(j, "exit-code")
    assert v.status == FAIL and v.measured.startswith(stopped), v.measured
    if j.diagnosis.cause_id == "log-ends-early":
        assert j.diagnosis.cause.startswith(stopped), j.diagnosis.cause


def test_a_run_killed_during_its_last_save_fails_checkpoints_saved_with_its_folder_too():
    """With its --save folder (tracker still 100), the log's unfinished save at 200 fails checkpoints-saved."""
    ev = submission.evidence(STOPPED / "core_v0.16.1-kill-save200-s1234.log.gz")
    # what the inspector reports of fixtures/checkpoints/core_v0.16.1-killed-during-save-200/ (both folders, tracker
    # 100), stated here: the folder alone would pass checkpoints-saved
    folder = CheckpointReport(save_dir=str(CHECKPOINTS / "core_v0.16.1-killed-during-save-200"), iterations=(100, 200),
                              tracker=100, format="torch_dist", loaded=True, shapes_ok=True)
    j = criteria.judge(PROFILES["megatron-lm"], replace(ev, checkpoints=folder))
    v = _verdict(j, "checkpoints-saved")
    assert v.status == FAIL and "begun but never finished at iteration(s) 200" in v.measured, v.message


# ---------------------------------------------------------------- memory bands from the real logs


def test_every_real_megatron_log_lies_in_its_memory_band():
    doc = log_evidence.memory_bands()
    for path in log_evidence.real_logs():
        log = logs.parse_log_file(path)
        key, _ = log_evidence.memory_variant(log)
        top = log_evidence.peak(log)
        assert key in doc["bands"] and top is not None, path
        band = doc["bands"][key]
        assert band["lo"] <= top.max_reserved <= band["hi"], (path, top.max_reserved, band)


def test_the_memory_bands_are_the_derivation_over_the_logs_they_name():
    doc = json.loads((GOLDEN_DIR / log_evidence.MEMORY_BANDS).read_text())
    named = [p for p in log_evidence.real_logs() if Path(p).name in set(doc["provenance"]["logs"])]
    assert len(named) == len(doc["provenance"]["logs"])
    assert log_evidence.derive_memory_bands(named)["bands"] == doc["bands"]
