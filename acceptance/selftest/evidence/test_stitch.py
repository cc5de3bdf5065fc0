"""Self-tests of resumed runs (harness.evidence.stitch) and of how a submission's logs are found (find_submission).

The resumed logs are made from the recorded Megatron log, split at its save of iteration 100: the first part
stops there as --exit-interval 100 stops it (or crashes later), the second is the restart with --load, its
header carrying the load lines exactly as core_v0.16.1's checkpointing.py prints them.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from harness.plugin import options
from harness.judge import consistency
from harness.evidence import logs, stitch
from harness.judge.submission import PROVENANCE_ID, evidence, find_submission, judge_submission
from harness.base.paths import RECORDED_LOGS
from harness.evidence.logformat import (TIMESTAMP_FORMAT, format_checkpoint_loaded, format_checkpoint_loading, format_iteration)
from harness.judge.profiles import FAIL, PASS, Verdict, load_profile

RECORDED = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
TEXT = RECORDED.read_text()
LINES = TEXT.split("\n")[:-1]
CKPT = "/tmp/ckpt_docs"
CLEAN = logs.parse_log(TEXT)
PROFILE = load_profile("reference")


def _index(start: str) -> int:
    return next(i for i, line in enumerate(LINES) if line.lstrip().startswith(start))


SAVED_100 = _index("[2026-11-29 14:17:49.383522] successfully saved checkpoint from iteration     100")
AFTER_SAVE = SAVED_100 + 4                       # the memory line and the save timer after it
TRAINING = _index("training ...")
BUILT = _index("[after model, optimizer, and learning rate scheduler are built]")
ITER = {r.iteration: r.line_no - 1 for r in CLEAN.iterations}


def _first_part(until: int = AFTER_SAVE, tail: tuple = ()) -> str:
    """The run up to the save at 100 (or further), then what ended it."""
    return "\n".join([*LINES[:until], *tail]) + "\n"


EXIT_100 = ("[exiting program at iteration 100] datetime: 2026-11-29 14:17:49.500000 ",)
CRASH = ("Traceback (most recent call last):", '  File "pretrain_bert.py", line 1, in <module>',
         "RuntimeError: CUDA error: an illegal memory access was encountered")


def _resumed(at: int = 100, path: str = CKPT, load_lines: bool = True, rest_from: int = 110,
             change=None) -> str:
    """The restart: the same setup, the load lines before the optimizer-built marker, Megatron's first-iteration
    line (101), then the recorded run's lines from iteration `rest_from` on (each changed by `change`)."""
    header = [line.replace("  load ............................................ None",
                           f"  load ............................................ {path}") for line in LINES[:BUILT]]
    loads = [format_checkpoint_loading(at, path), format_checkpoint_loaded(at, path)] if load_lines else []
    # Megatron's first-iteration line of the restart, consistent with the lines after it (harness.judge.consistency):
    # the schedule's learning rate after its steps (17 skipped), stamped the timer's time before the next line
    nxt = CLEAN.iterations[ITER_INDEX[rest_from]]
    lr = consistency.Schedule.from_log(CLEAN).lr((at + 1 - 17) * 16)
    stamp = datetime.strptime(nxt.timestamp, TIMESTAMP_FORMAT) - timedelta(
        milliseconds=nxt.elapsed_ms * (rest_from - at - 1))
    first = replace(nxt, iteration=at + 1, consumed_samples=(at + 1) * 16, learning_rate=float(f"{lr:.6E}"),
                    timestamp=stamp.strftime(TIMESTAMP_FORMAT))
    rest = LINES[ITER[rest_from]:]
    if change:
        rest = [change(line) for line in rest]
    return "\n".join([*header, *loads, *LINES[BUILT:TRAINING + 1], format_iteration(first), *rest]) + "\n"


ITER_INDEX = {r.iteration: i for i, r in enumerate(CLEAN.iterations)}


def _folder(tmp_path, files: dict):
    folder = tmp_path / "alice"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def _judge(folder):
    sub = find_submission(folder)
    return judge_submission(PROFILE, folder), evidence(sub.logs, sub.save_dir)


def _provenance(j) -> Verdict:
    return {v.criterion_id: v for v in j.verdicts}[PROVENANCE_ID]


def test_load_lines_are_megatrons():
    """The load lines the tests write are core_v0.16.1's (checkpointing.py), and parse as load records."""
    assert format_checkpoint_loading(100, CKPT) == f" loading distributed checkpoint from {CKPT} at iteration 100"
    assert format_checkpoint_loaded(100, CKPT) == (f"  successfully loaded checkpoint from {CKPT} [ t 1/1, p 1/1 ]"
                                                        " at iteration 100")
    parsed = logs.parse_log(_resumed())
    assert [(c.event, c.iteration, c.path) for c in parsed.checkpoints[:2]] == [("loading", 100, CKPT),
                                                                                ("loaded", 100, CKPT)]


@pytest.mark.parametrize("first_name,second_name", [("train-1.log", "train-2.log"), ("z-first.log", "a-resumed.log")])
def test_run_stopped_by_exit_interval_and_resumed_is_judged_as_one(first_name, second_name, tmp_path):
    """Ordered by first iteration, not by name; stitched at the resume; passes as the uninterrupted run does; the
    grade says where it was resumed."""
    folder = _folder(tmp_path, {first_name: _first_part(tail=EXIT_100), second_name: _resumed()})
    j, ev = _judge(folder)
    assert j.verdict == "pass", [v.message for v in j.verdicts if v.status == FAIL]
    assert [r.iteration for r in ev.log.iterations] == [1, *range(10, 101, 10), 101, *range(110, 201, 10)]
    assert [r.lm_loss for r in ev.log.iterations if r.iteration != 101] == [r.lm_loss for r in CLEAN.iterations]
    assert [(v.iteration, v.split) for v in ev.log.validations] == [(v.iteration, v.split) for v in CLEAN.validations]
    note = f"resumed at iteration 100 from iter_0000100 saved by {first_name} ({CKPT}), in {second_name}"
    assert note in j.provenance and _provenance(j).status == PASS and note in _provenance(j).measured
    assert j.provenance[0].startswith(f"2 logs of one run, stitched by iteration: {first_name}, {second_name}")


def test_crash_after_the_save_overlap_agrees(tmp_path):
    """Crashed at 130 after saving 100, resumed from 100: iterations 110-130 are in both logs and agree; the resumed
    run's lines are kept, and the crash in the first log is no root cause."""
    folder = _folder(tmp_path, {"run1.log": _first_part(ITER[130] + 1, CRASH), "run2.log": _resumed()})
    j, ev = _judge(folder)
    assert j.verdict == "pass" and j.diagnosis is None, [v.message for v in j.verdicts if v.status == FAIL]
    kept = [r.line_no for r in ev.log.iterations if r.iteration in (110, 120, 130)]
    first_lines = logs.parse_log(_first_part(ITER[130] + 1, CRASH)).lines_total
    assert all(n > first_lines for n in kept)


def _fails(j, failure_id: str) -> str:
    v = _provenance(j)
    assert j.verdict == "fail" and v.status == FAIL and f"[{failure_id}]" in v.measured, v.measured
    return v.message


def test_overlap_whose_losses_disagree_is_named(tmp_path):
    changed = lambda line: line.replace("lm loss: 8.424390E+00", "lm loss: 8.424400E+00")  # noqa: E731
    folder = _folder(tmp_path, {"run1.log": _first_part(ITER[130] + 1, CRASH), "run2.log": _resumed(change=changed)})
    message = _fails(_judge(folder)[0], "resume-overlap-disagrees")
    assert "iteration 110 is in run1.log and run2.log with different lm losses (8.42439 and 8.4244)" in message
    assert "remedy:    submit the logs of one run only" in message


def test_overlap_within_print_resolution_agrees():
    assert stitch._agree(8.424390, 8.424391) and not stitch._agree(8.424390, 8.424393)
    assert stitch._agree(None, None) and not stitch._agree(None, 1.0)


def test_gap_between_the_logs_is_named(tmp_path):
    """The resumed log's lines 101-149 lost: iterations missing between the logs."""
    text = _resumed()
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if "iteration      101/" in line)
    end = next(i for i, line in enumerate(lines) if "iteration      150/" in line)
    folder = _folder(tmp_path, {"run1.log": _first_part(tail=EXIT_100), "run2.log": "\n".join(lines[:start] +
                                                                                              lines[end:])})
    message = _fails(_judge(folder)[0], "resume-gap")
    assert "iterations 101-149 are in none of the logs" in message


@pytest.mark.parametrize("kwargs,says", [
    ({"path": "/home/bob/ckpt"}, "resumes from /home/bob/ckpt at iteration 100, a checkpoint that no earlier log saved"),
    ({"at": 150, "rest_from": 160}, "resumes from /tmp/ckpt_docs at iteration 150, a checkpoint that no earlier log"),
    ({"load_lines": False}, "has no 'loading checkpoint ... at iteration N' line"),
])
def test_resume_from_a_checkpoint_no_earlier_log_saved_is_named(kwargs, says, tmp_path):
    folder = _folder(tmp_path, {"run1.log": _first_part(tail=EXIT_100), "run2.log": _resumed(**kwargs)})
    message = _fails(_judge(folder)[0], "resume-unknown-checkpoint")
    assert says in message and message.index(says) < message.index("remedy:"), message


def test_resumed_log_alone_is_named(tmp_path):
    """Only the second log of a resumed run: judged, and its missing start named rather than read as the run."""
    message = _fails(_judge(_folder(tmp_path, {"train-2.log": _resumed()}))[0], "resume-unknown-checkpoint")
    assert "train-2.log resumes from /tmp/ckpt_docs at iteration 100, but no log of the run before" in message


def test_unrelated_logs_say_which_was_judged_and_why(tmp_path):
    folder = _folder(tmp_path, {"a.log": "hello\n", "b.log": _first_part(ITER[50] + 1), "train.log": TEXT})
    j, ev = _judge(folder)
    assert j.verdict == "pass" and ev.log_path.endswith("train.log")
    assert ("3 logs, not one resumed run: judged train.log, whose iteration lines reach furthest (200); ignored "
            "a.log (no iteration line), b.log (iterations 1-50)") in j.provenance


def test_one_log_provenance_passes_and_says_how_it_was_read(tmp_path):
    folder = _folder(tmp_path, {})
    (folder / "train.log.gz").write_bytes(gzip.compress(TEXT.encode()))
    j, _ = _judge(folder)
    v = _provenance(j)
    assert j.verdict == "pass" and v.measured == "train.log.gz: gzip-compressed, read decompressed"


# ---------------------------------------------------------------- finding the logs


def test_scheduler_output_file_is_a_log(tmp_path):
    """slurm-12345.out has no .log suffix, and a crashed one has no iteration line: it is still the log."""
    folder = _folder(tmp_path, {"slurm-12345.out": "Traceback (most recent call last):\nImportError: x\n",
                                "notes.txt": "my notes\n"})
    assert find_submission(folder).log == folder / "slurm-12345.out"


def test_stdout_and_stderr_files_are_one_log(tmp_path):
    err = [line for line in LINES if "Warning" in line or line.startswith("  warnings.warn")]
    out = [line for line in LINES if line not in err]
    folder = _folder(tmp_path, {"slurm-7.out": "\n".join(out) + "\n", "slurm-7.err": "\n".join(err) + "\n"})
    sub = find_submission(folder)
    assert sub.logs == (((folder / "slurm-7.out", None), (folder / "slurm-7.err", None)),)
    j, ev = _judge(folder)
    assert j.verdict == "pass" and "2 files read as one log, in this order: slurm-7.out, slurm-7.err" in j.provenance


def test_torchrun_log_dir_rank_files_are_one_log(tmp_path):
    """torchrun --log-dir writes <run>/attempt_0/<local rank>/stdout.log and stderr.log: rank 0 prints the setup,
    rank 1 (the last) the iteration lines; read as one log, rank 0 judged with rank 1's iteration lines."""
    last = {r.line_no for r in (*CLEAN.iterations, *CLEAN.validations)}
    attempt = tmp_path / "alice" / "logs" / "none_abc" / "attempt_0"
    for rank in (0, 1):
        (attempt / str(rank)).mkdir(parents=True)
        mine = [line for i, line in enumerate(LINES, start=1) if (i in last) == (rank == 1)]
        (attempt / str(rank) / "stdout.log").write_text("\n".join(mine) + "\n")
        (attempt / str(rank) / "stderr.log").write_text("")
    sub = find_submission(tmp_path / "alice")
    assert len(sub.logs) == 1 and [r for _, r in sub.logs[0]] == [(0,), (0,), (1,), (1,)]
    j, ev = _judge(tmp_path / "alice")
    assert j.verdict == "pass", [v.message for v in j.verdicts if v.status == FAIL]
    assert [r.lm_loss for r in ev.log.iterations] == [r.lm_loss for r in CLEAN.iterations]
    assert any("iteration and validation lines from rank 1" in n for n in j.provenance)


def test_grade_entry_carries_the_provenance(tmp_path):
    from harness.cli import grade

    folder = _folder(tmp_path, {"train-1.log": _first_part(tail=EXIT_100), "train-2.log": _resumed()})
    (tmp_path / "out").mkdir()
    entry = grade.grade_one(grade.Task(0, str(folder), folder.name, folder.name, str(tmp_path / "out"), PROFILE.path))
    json.dumps(entry)
    assert entry["verdict"] == "pass" and any("resumed at iteration 100" in n for n in entry["provenance"])
    assert [c["status"] for c in entry["criteria"] if c["id"] == PROVENANCE_ID] == [PASS]
    from harness.report.gradebook import markdown

    assert "- alice: 2 logs of one run, stitched by iteration: train-1.log, train-2.log" in markdown([entry], "x")


def test_from_log_accepts_a_folder_of_one_runs_logs(tmp_path):
    folder = _folder(tmp_path, {"train-1.log": _first_part(tail=EXIT_100), "train-2.log": _resumed()})
    get = {"from_log": str(folder)}.get
    assert options.resolve(get, tmp_path).from_log == folder
    with pytest.raises(options.OptionError, match="no such file"):
        options.resolve({"from_log": str(tmp_path / "nowhere")}.get, tmp_path)
