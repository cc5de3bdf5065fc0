"""The stitched log of three resumed logs field by field (iterations kept up to each resume, line numbers run on,
markers, memory, checkpoint records, problems, the first log's arguments, the last log's cut line, the notes and
a gap between two of the logs), and the helpers' edges: losses that agree at print resolution, --log-interval
from the arguments block or the iteration lines, and checkpoint folders compared as paths. (Written against the
mutation run's survivors in harness.evidence.stitch; test_stitch.py judges resumed runs made from a real log.)"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from harness.evidence import logs, stitch
from harness.evidence.logformat import (IterationRecord, MARKER_TRAINING, ParsedLog, format_arguments, format_checkpoint_loaded, format_checkpoint_loading, format_checkpoint_saved, format_checkpoint_saving, format_datetime_marker, format_iteration, format_memory)

CK = "/runs/ckpt"
TRAIN_ITERS = 60


def _iteration(it: int) -> str:
    return format_iteration(IterationRecord(
        iteration=it, train_iters=TRAIN_ITERS, consumed_samples=16 * it, elapsed_ms=90.0, learning_rate=1e-4,
        global_batch_size=16, loss_scale=65536.0, lm_loss=10.0 - it / 100, sop_loss=0.69, skipped=0, nan=0,
        timestamp="2026-11-29 14:00:00.000000"))


def _parts() -> list:
    """a.log saves at 20 and logs on to 30; b.log loads 20 but logs from 40 (a gap), saves at 50; c.log loads 50,
    logs 60, ends training and is cut in its last line."""
    a = [*format_arguments({"log_interval": "10", "save": CK}), MARKER_TRAINING, _iteration(10),
         format_memory(0, 10, 1.0, 2.0, 3.0, 4.0), _iteration(20), format_checkpoint_saved(20, CK),
         _iteration(30)]
    b = [*format_arguments({"load": CK + "/", "log_interval": "10"}), format_checkpoint_loading(20, CK),
         format_checkpoint_loaded(20, CK), MARKER_TRAINING, _iteration(40), _iteration(50),
         format_checkpoint_saved(50, CK)]
    c = [format_checkpoint_loading(50, CK + "/"), format_checkpoint_loaded(50, CK + "/"),
         MARKER_TRAINING, _iteration(60), format_memory(0, 60, 5.0, 6.0, 7.0, 8.0),
         format_datetime_marker("after training is done", "2026-11-29 15:00:00.000000"), "[after tra"]
    parsed = {"a.log": replace(logs.parse_log("\n".join(a) + "\n"), problems=("line 3: bad a",)),
              "b.log": replace(logs.parse_log("\n".join(b) + "\n"), problems=("line 9: bad b",)),
              "c.log": logs.parse_log("\n".join(c))}          # no newline at the end: its last line is cut
    return list(parsed.items())


def test_three_logs_are_stitched_field_by_field():
    parts = _parts()
    a, b, c = (log for _, log in parts)
    assert (a.lines_total, b.lines_total, c.lines_total) == (10, 10, 7) and c.truncated_last_line
    choice = stitch.choose(parts + [("empty.log", logs.parse_log("nothing here\n"))])
    s = choice.log
    assert choice.names == ("a.log", "b.log", "c.log")
    # a.log's iteration 30 is dropped (b.log resumed at 20); line numbers run on through the logs in order
    assert [(r.iteration, r.line_no) for r in s.iterations] == [(10, 6), (20, 8), (40, 18), (50, 19), (60, 24)]
    assert [(m.after_iterations, m.line_no) for m in s.memory] == [(10, 7), (60, 25)]
    assert [(k.event, k.iteration, k.line_no) for k in s.checkpoints] == [
        ("saved", 20, 9), ("loading", 20, 15), ("loaded", 20, 16), ("saved", 50, 20), ("loading", 50, 21),
        ("loaded", 50, 22)]
    assert s.markers == {"training": 5, "after_training": 26}
    assert s.problems == ("a.log: line 3: bad a", "b.log: line 9: bad b")
    assert s.lines == a.lines + b.lines + c.lines and s.lines_total == 27
    assert s.truncated_last_line is True
    assert s.arguments == {"log_interval": "10", "save": CK} and s.arguments_line == 1
    notes = ("3 logs of one run, stitched by iteration: a.log, b.log, c.log (line numbers run on: a.log lines 1-10; "
             "b.log lines 11-20; c.log lines 21-27)",
             f"resumed at iteration 20 from iter_0000020 saved by a.log ({CK}), in b.log",
             f"resumed at iteration 50 from iter_0000050 saved by b.log ({CK}/), in c.log",
             "ignored empty.log (no iteration line; not part of this run)")
    assert choice.notes == notes and s.source == notes[:3]     # the ignored log is a note of the choice only
    assert choice.failures == (("resume-gap", "iterations 21-39 are in none of the logs (a.log ends at 30, b.log "
                                "resumes at 20 but its first iteration line is 40)",
                                "submit every log of the run, each complete"),)


def test_the_last_log_decides_the_cut_line_and_the_first_the_arguments():
    """Only the middle log is cut: the stitched log is not; the middle one's arguments are not the run's."""
    (na, a), (nb, b), (nc, c) = _parts()
    b = replace(b, truncated_last_line=True)
    c = replace(c, truncated_last_line=False, arguments={"log_interval": "5"}, arguments_line=1)
    s = stitch.choose([(na, a), (nb, b), (nc, c)]).log
    assert s.truncated_last_line is False
    assert s.arguments == {"log_interval": "10", "save": CK} and s.arguments_line == 1


@pytest.mark.parametrize("a, b, agree", [
    (None, None, True), (None, 1.0, False), (1.0, None, False),
    (math.nan, math.nan, True), (math.inf, math.inf, True), (math.inf, -math.inf, False),
    (math.nan, 1.0, False), (1.0, math.nan, False), (math.inf, 1.0, False), (math.nan, math.inf, False),
    (0.0, 0.0, True),
    (10.0, 9.99999, True), (9.99999, 10.0, True),           # one unit of the larger value's last printed digit
    (1.0, 1.000001, True), (1.0, 1.0000015, False),         # 1.5 units: not print rounding
    (0.5, 0.50000005, True), (0.5, 0.5000004, False),       # below 1 the unit is 1e-7, not 1e-6
    (0.0, 10 ** -306 * 1.0001, True),                       # exactly the tolerance (of a value below 1e-300)
])
def test_losses_agree_up_to_one_unit_of_the_last_printed_digit(a, b, agree):
    assert stitch._agree(a, b) is agree


def _with(iterations: tuple, arguments) -> ParsedLog:
    text = "\n".join(_iteration(it) for it in iterations) + "\n"
    return replace(logs.parse_log(text), arguments=arguments)


@pytest.mark.parametrize("iterations, arguments, interval", [
    ((1, 10, 20), {"log_interval": "5"}, 5),
    ((1, 4, 10, 16, 30), None, 6),          # the iteration-1 line is left out: 4 -> 10 -> 16 -> 30
    ((1, 4, 10, 16, 30), {"save": CK}, 6),   # a block without --log-interval
    ((1, 7), None, 10),                      # one step line after the first: the usual 10
    ((), {}, 10),
])
def test_log_interval_from_the_arguments_block_else_the_iteration_lines(iterations, arguments, interval):
    assert stitch._interval(_with(iterations, arguments)) == interval


@pytest.mark.parametrize("a, b, same", [(CK, CK + "/", True), (f" {CK}// ", CK, True), (CK + "X", CK, False),
                                        (CK, CK + "X", False), ("/runs/a", "/runs/b", False)])
def test_checkpoint_folders_are_compared_as_paths(a, b, same):
    assert stitch._same_dir(a, b) is same


def _plain(*iterations, saves=(), load=None, saving=()) -> ParsedLog:
    """A log of these iteration lines, with save (or only save-announcement) lines and one load line at the top."""
    lines = [format_checkpoint_loaded(load, CK)] if load else []
    for it in iterations:
        lines.append(_iteration(it))
        if it in saving:
            lines.append(format_checkpoint_saving(it, CK))
        if it in saves:
            lines.append(format_checkpoint_saved(it, CK))
    return logs.parse_log("\n".join(lines) + "\n")


def test_logs_without_load_lines_are_chained_by_their_first_iterations():
    """Each log after the first starts past iteration 1 with no load line: linked to the log before it, each
    link a failure naming both; the stitched run continues where the earlier log ended."""
    choice = stitch.choose([("q.log", _plain(30)), ("o.log", _plain(1)), ("p.log", _plain(10, 20))])
    assert choice.names == ("o.log", "p.log", "q.log")
    fix = "submit the resumed run's complete log, from its first line"
    assert choice.failures == (
        ("resume-unknown-checkpoint", "q.log starts at iteration 30 but has no 'loading checkpoint ... at iteration "
         "N' line, so which checkpoint it resumed from cannot be checked against p.log", fix),
        ("resume-unknown-checkpoint", "p.log starts at iteration 10 but has no 'loading checkpoint ... at iteration "
         "N' line, so which checkpoint it resumed from cannot be checked against o.log", fix))
    assert [r.iteration for r in choice.log.iterations] == [1, 10, 20, 30]


def test_a_log_starting_at_iteration_2_is_linked_too():
    choice = stitch.choose([("o.log", _plain(1)), ("p.log", _plain(2, 3))])
    assert choice.names == ("o.log", "p.log") and choice.failures[0][1].startswith("p.log starts at iteration 2 ")


def test_logs_starting_at_the_same_iteration_are_not_one_run():
    y = _plain(10, 20, 30)
    choice = stitch.choose([("x.log", _plain(10, 20)), ("y.log", y)])
    assert choice.names == ("y.log",) and choice.failures == () and choice.log is y
    assert choice.notes[-1] == ("2 logs, not one resumed run: judged y.log, whose iteration lines reach furthest "
                                "(30); ignored x.log (iterations 10-20)")


def test_the_run_order_is_by_first_iteration_not_by_the_second():
    """p.log starts first (its iteration-1 line); both reach 60: the later one in run order is judged."""
    choice = stitch.choose([("p.log", _plain(1, 50, 60)), ("q.log", _plain(10, 20, 60))])
    assert choice.names == ("p.log", "q.log") and choice.failures[0][1].startswith("q.log starts at iteration 10 ")


def test_a_resume_from_a_checkpoint_only_announced_is_unknown():
    """a.log announced the save at 20 but never finished it: b.log's load of 20 matches no saved checkpoint."""
    choice = stitch.choose([("a.log", _plain(10, 20, saving=(20,))), ("b.log", _plain(30, 40, load=20))])
    assert choice.names == ("b.log",)
    assert choice.failures == (("resume-unknown-checkpoint", f"b.log resumes from {CK} at iteration 20, a checkpoint "
                                "that no earlier log saved (another run's, or its log is missing)",
                                "submit the log of the run that saved it, or resume from a checkpoint of this run "
                                "(--load its --save folder)"),)
    linked = stitch.choose([("a.log", _plain(10, 20, saves=(20,))), ("b.log", _plain(30, 40, load=20))])
    assert linked.names == ("a.log", "b.log") and linked.failures == ()


def test_overlapping_iterations_that_disagree_name_the_loss():
    b = logs.parse_log("\n".join([format_checkpoint_loaded(20, CK), _iteration(30).replace(
        "lm loss: 9.700000E+00", "lm loss: 9.800000E+00")]) + "\n")
    choice = stitch.choose([("a.log", _plain(10, 20, 30, saves=(20,))), ("b.log", b)])
    assert choice.failures == (("resume-overlap-disagrees", "iteration 30 is in a.log and b.log with different lm "
                                "losses (9.7 and 9.8): these are not one run resumed from its checkpoint",
                                "submit the logs of one run only"),)


def test_one_resumed_log_alone_names_the_missing_logs():
    choice = stitch.choose([("b.log", _plain(30, 40, load=20))])
    assert choice.failures == (("resume-unknown-checkpoint", f"b.log resumes from {CK} at iteration 20, but no log "
                                "of the run before the resume was submitted: iterations 1-20 are in no log",
                                "submit every log of the run (the one that saved the checkpoint too), in one folder"),)


def test_without_iteration_lines_the_longest_log_is_judged_ties_by_name():
    parts = [("b.log", logs.parse_log("x\n" * 3)), ("a.log", logs.parse_log("x\n" * 5)),
             ("c.log", logs.parse_log("y\n" * 5)), ("d.log", logs.parse_log("y\n" * 4))]
    choice = stitch.choose(parts)
    assert choice.names == ("c.log",) and choice.log is parts[2][1]
    assert choice.notes == ("4 logs, none with an iteration line: judged c.log, the longest; ignored b.log, a.log, "
                            "d.log",)
    longest = stitch.choose(parts[:2] + parts[3:])            # the longest is not the last name
    assert longest.names == ("a.log",) and longest.log is parts[1][1]


@pytest.mark.parametrize("lines, found", [
    ([format_checkpoint_loading(20, CK)], ("loading", 20)),
    ([format_checkpoint_loaded(20, CK)], ("loaded", 20)),
    ([format_checkpoint_loaded(1, CK)], ("loaded", 1)),
    ([format_checkpoint_loaded(0, CK)], None),            # iteration 0: a model loaded to start from, no resume
    ([format_checkpoint_saved(20, CK)], None),
    ([format_checkpoint_loaded(0, CK), format_checkpoint_loading(30, CK),
      format_checkpoint_loaded(40, CK)], ("loading", 30)),
])
def test_the_resume_is_the_first_load_past_iteration_0(lines, found):
    load = stitch._resume(logs.parse_log("\n".join(lines) + "\n"))
    assert (load.event, load.iteration) == found if found else load is None


def test_of_two_logs_starting_together_the_resumed_one_comes_later():
    """Same first iteration and last iteration: the resumed log is later in run order, so it is the one judged."""
    choice = stitch.choose([("y.log", _plain(10, 20, load=5)), ("x.log", _plain(10, 20))])
    assert choice.names == ("y.log",) and choice.failures[0][0] == "resume-unknown-checkpoint"


def test_the_log_reaching_furthest_is_judged_even_when_it_starts_first():
    """p.log reaches 60 and starts first; q.log (10-20) and r.log (5-8) are not part of its run."""
    p = _plain(1, 30, 60)
    choice = stitch.choose([("q.log", _plain(10, 20)), ("p.log", p), ("r.log", _plain(5, 8))])
    assert choice.names == ("p.log",) and choice.log is p and choice.failures == ()
    assert choice.notes[-1] == ("3 logs, not one resumed run: judged p.log, whose iteration lines reach furthest "
                                "(60); ignored q.log (iterations 10-20), r.log (iterations 5-8)")


def test_every_log_left_out_of_a_stitched_run_is_named():
    choice = stitch.choose([("a.log", _plain(10, 20, saves=(20,))), ("b.log", _plain(30, 40, load=20)),
                            ("x.log", logs.parse_log("x\n")), ("y.log", logs.parse_log("y\n"))])
    assert choice.names == ("a.log", "b.log")
    assert choice.notes[-1] == ("ignored x.log (no iteration line; not part of this run), y.log (no iteration line; "
                                "not part of this run)")
