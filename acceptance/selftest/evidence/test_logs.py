"""Self-tests of harness.evidence.logs: the recorded Megatron log parsed exactly, formatters that reproduce Megatron's lines."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.evidence import logs
from harness.base.paths import RECORDED_LOGS
from harness.evidence.logformat import (ITERATION_FIELDS, IterationRecord, MemoryRecord, ParsedLog, TIMESTAMP_FORMAT, format_checkpoint_loaded, format_checkpoint_loading, format_checkpoint_saved, format_checkpoint_saving, format_datetime_marker, format_iteration, format_memory_record, format_validation, format_validation_block, format_validation_record)

RECORDED = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
LINE_200 = (" [2026-11-29 14:17:59.537060] iteration      200/     200 | consumed samples:         3200 | elapsed time"
            " per iteration (ms): 86.8 | throughput per GPU (TFLOP/s/GPU): 0.7 | learning rate: 1.000000E-05 |"
            " global batch size:    16 | lm loss: 8.159132E+00 | sop loss: 6.956014E-01 | loss scale: 65536.0 |"
            " grad norm: 3.751 | number of skipped iterations:   0 | number of nan iterations:   0 |")
NOISE = [
    "megatron-lm/megatron/core/optimizer/__init__.py:24: UserWarning: Apex is not installed.",
    "  warnings.warn(",
    "Traceback (most recent call last):",
    '  File "pretrain_bert.py", line 12, in <module>',
    "RuntimeError: iteration 5/10 | is not an iteration line",
    "[rank0]:[W1129 14:17:19.308021282 ProcessGroupNCCL.cpp:5188] Guessing device ID based on global rank.",
    "NCCL INFO Channel 00/32 : 0[0] -> 1[1] via P2P/CUMEM",
    "\x1b[33mWARNING\x1b[0m: one_logger package is required",
    "Evaluating iter 3/10",
    "progress  10%\rprogress  50%\rprogress 100%",
    "skipping training (--skip-train is on) ...",
    "",
    "    evaluate .......................................: (505.18, 505.18)",
]


@pytest.fixture(scope="module")
def recorded() -> ParsedLog:
    """The recorded Megatron core_v0.16.1 log, parsed once."""
    return logs.parse_log_file(RECORDED)


def _by_iteration(parsed: ParsedLog) -> dict:
    """Iteration records keyed by iteration."""
    return {r.iteration: r for r in parsed.iterations}


# ---------------------------------------------------------------- the recorded log, exactly


def test_recorded_iteration_lines(recorded):
    """21 iteration lines: 1, 10, 20, ..., 200 (the first iteration is always logged)."""
    assert [r.iteration for r in recorded.iterations] == [1, *range(10, 201, 10)]
    assert {r.train_iters for r in recorded.iterations} == {200}


def test_recorded_first_loss_line(recorded):
    """The course's initial loss is the first line that has an lm loss: iteration 20, 10.35."""
    first = recorded.first_loss_record
    assert (first.iteration, first.lm_loss, first.sop_loss, first.line_no) == (20, 10.35269, 0.691367, 831)
    assert (first.skipped, first.grad_norm, first.learning_rate) == (7, 7.741, 3e-05)


@pytest.mark.parametrize("iteration, lm_loss", [(50, 9.278323), (100, 8.511337), (200, 8.159132)])
def test_recorded_losses(recorded, iteration, lm_loss):
    """The measured curve of docs/MEASURED.md: 9.28 / 8.51 / 8.16."""
    assert _by_iteration(recorded)[iteration].lm_loss == lm_loss


def test_recorded_last_line_fields(recorded):
    """Every field of the iteration-200 line."""
    rec = _by_iteration(recorded)[200]
    assert rec == IterationRecord(iteration=200, train_iters=200, consumed_samples=3200, elapsed_ms=86.8,
                                       learning_rate=1e-05, global_batch_size=16, loss_scale=65536.0, throughput=0.7,
                                       lm_loss=8.159132, sop_loss=0.6956014, grad_norm=3.751, skipped=0, nan=0,
                                       timestamp="2026-11-29 14:17:59.537060", line_no=898)
    assert recorded.last_iteration == 200


def test_recorded_skipped_intervals(recorded):
    """fp16 loss-scale search: 1 + 10 + 7 = 18 skipped, no lm loss while the whole interval was skipped."""
    early = [(r.iteration, r.skipped, r.lm_loss, r.learning_rate, r.loss_scale) for r in recorded.iterations[:3]]
    assert early == [(1, 1, None, 0.0, 4294967296.0), (10, 10, None, 0.0, 8388608.0), (20, 7, 10.35269, 3e-05, 65536.0)]
    assert all(r.skipped == 0 and r.nan == 0 for r in recorded.iterations[3:])
    assert recorded.iterations[0].sop_loss is None and recorded.iterations[0].grad_norm is None


def test_recorded_lm_losses(recorded):
    """lm_losses leaves out the fully skipped intervals."""
    assert [it for it, _ in recorded.lm_losses] == list(range(20, 201, 10))


def test_recorded_validations(recorded):
    """Periodic validation every 50, then the final validation and test sets at 200."""
    got = [(v.iteration, v.split, v.lm_loss) for v in recorded.validations]
    assert got == [(50, "periodic", 9.163213), (100, "periodic", 8.431524), (150, "periodic", 8.262242),
                   (200, "periodic", 8.110321), (200, "validation", 8.125695), (200, "test", 8.107215)]
    last = recorded.validations[3]
    assert (last.lm_ppl, last.sop_loss, last.sop_ppl, last.line_no) == (3328.647, 0.6943263, 2.00236, 905)


def test_recorded_memory(recorded):
    """Six report_memory lines; the first after iteration 1."""
    assert len(recorded.memory) == 6
    first = recorded.memory[0]
    assert first == MemoryRecord(rank=0, after_iterations=1, allocated=121.39, max_allocated=212.27,
                                      reserved=296.0, max_reserved=296.0, line_no=820, label="(after 1 iterations)")
    assert [m.after_iterations for m in recorded.memory] == [1, 10, 100, 100, 200, 200]
    assert max(m.max_allocated for m in recorded.memory) == 249.30


def test_recorded_checkpoints(recorded):
    """Saving/saved at 100 and 200 in torch_dist format to /tmp/ckpt_docs."""
    got = [(c.event, c.iteration, c.path, c.fmt, c.line_no) for c in recorded.checkpoints]
    assert got == [("saving", 100, "/tmp/ckpt_docs", "torch_dist", 859), ("saved", 100, "/tmp/ckpt_docs", None, 877),
                   ("saving", 200, "/tmp/ckpt_docs", "torch_dist", 908), ("saved", 200, "/tmp/ckpt_docs", None, 909)]


def test_recorded_markers(recorded):
    """The setup lines, in order, at their line numbers; no problems, nothing truncated."""
    assert recorded.markers == {"building_datasets": 780, "building_bert_datasets": 786, "finished_datasets": 800,
                                "after_dataloaders": 801, "done_setup": 802, "training": 806, "after_training": 913}
    assert (recorded.lines_total, recorded.truncated_last_line, recorded.problems) == (954, False, ())


def test_recorded_lines_round_trip(recorded):
    """Every recognised line is reproduced byte for byte by the formatters."""
    line = lambda rec: recorded.lines[rec.line_no - 1]  # noqa: E731 - a local lookup
    assert all(format_iteration(r) == line(r) for r in recorded.iterations)
    assert all(format_validation_record(v) == line(v) for v in recorded.validations)
    assert all(format_memory_record(m) == line(m) for m in recorded.memory)
    for c in recorded.checkpoints:
        text = (format_checkpoint_saving(c.iteration, c.path, c.fmt, c.timestamp) if c.event == "saving"
                else format_checkpoint_saved(c.iteration, c.path, c.timestamp))
        assert text == line(c)


def test_validation_block_matches_recorded_rules(recorded):
    """The dash rules around a validation line are len(line) + 1 long, as Megatron prints them."""
    v = recorded.validations[3]
    block = format_validation_block(v.iteration, v.lm_loss, v.sop_loss, lm_ppl=v.lm_ppl,
                                         sop_ppl=v.sop_ppl).split("\n")
    assert block == list(recorded.lines[v.line_no - 2:v.line_no + 1])


def test_validation_ppl_is_megatrons():
    """Without a given PPL the formatter computes exp(min(20, loss)), as Megatron does."""
    assert "lm loss PPL: 3.328646E+03" in format_validation(200, 8.110321)
    assert "lm loss PPL: 4.851652E+08" in format_validation(200, 25.0)


def test_format_iteration_of_documented_line():
    """The example line of docs/MEASURED.md parses and formats back exactly."""
    assert format_iteration(logs.parse_iteration_line(LINE_200)) == LINE_200


def test_format_iteration_without_timestamp_uses_now():
    """A record without timestamp gets the given time, in Megatron's format."""
    rec = replace(logs.parse_iteration_line(LINE_200), timestamp=None)
    text = format_iteration(rec, now=datetime(2030, 1, 2, 3, 4, 5, 6))
    assert text == LINE_200.replace("2026-11-29 14:17:59.537060", "2030-01-02 03:04:05.000006")


def test_unknown_fields_kept_in_extra_and_in_place():
    """Fields newer Megatron versions add are kept verbatim, in their position."""
    line = LINE_200.replace(" elapsed", " skipped samples:            8 | elapsed").replace(
        " grad norm: 3.751 |", " grad norm: 3.751 | num zeros: 12 | params norm: 123.456 |")
    rec = logs.parse_iteration_line(line)
    assert rec.extra == {"skipped samples": "           8", "num zeros": "12", "params norm": "123.456"}
    assert format_iteration(rec) == line


def test_extra_without_layout_goes_before_loss_scale():
    """A trainer-built record puts extra fields after the losses, like Megatron's extra loss keys."""
    rec = replace(logs.parse_iteration_line(LINE_200), extra={"mlm acc": "0.5"}, field_order=())
    assert "sop loss: 6.956014E-01 | mlm acc: 0.5 | loss scale:" in format_iteration(rec)


@pytest.mark.parametrize("spelling", ["nan", "NAN", "NaN"])
def test_nan_loss_parses(spelling):
    """A nan loss, however spelled, is parsed as nan (not dropped)."""
    rec = logs.parse_iteration_line(LINE_200.replace("8.159132E+00", spelling))
    assert math.isnan(rec.lm_loss)


def test_malformed_iteration_line_is_a_problem_not_a_crash():
    """An iteration line without its required fields is reported with its line number."""
    parsed = logs.parse_log("hello\n iteration 5/10 | lm loss: 1.0 |\n")
    assert parsed.iterations == () and parsed.problems[0].startswith("line 2: iteration line without")


def test_checkpoint_load_lines_round_trip():
    """The resume lines the trainer writes parse back to loading/loaded records."""
    text = "\n".join([format_checkpoint_loading(100, "/ck", "torch_dist"),
                      format_checkpoint_loaded(100, "/ck")]) + "\n"
    got = [(c.event, c.iteration, c.path, c.fmt) for c in logs.parse_log(text).checkpoints]
    assert got == [("loading", 100, "/ck", "torch_dist"), ("loaded", 100, "/ck", None)]


def test_markers_match_whole_lines_only():
    """`training ...` is the start marker; `skipping training ...` is not; datetime markers match by prefix."""
    text = "skipping training (--skip-train is on) ...\n" + format_datetime_marker("after dataloaders are built") \
        + "\ntraining ...\n"
    assert logs.parse_log(text).markers == {"after_dataloaders": 2, "training": 3}


def test_cli_prints_json(capsys):
    """`python -m harness log LOG` prints the parsed run as JSON."""
    assert logs.main([str(RECORDED)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (len(data["iterations"]), data["first_loss_record"]["iteration"], data["last_iteration"]) == (21, 20, 200)
    assert "lines" not in data


# ---------------------------------------------------------------- properties


def _as_printed(value: float, fmt: str) -> float:
    """The value a reader gets back after Megatron prints it with this format."""
    return float(fmt.format(value))


_pos = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False)
_loss = st.one_of(st.none(), _pos.map(lambda v: _as_printed(v, "{:.6E}")))
_stamps = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2099, 1, 1)).map(
    lambda d: d.strftime(TIMESTAMP_FORMAT))
_key = st.text(alphabet="abcdefghijklmnopqrstuvwxyz ", min_size=1, max_size=12).map(str.strip).filter(
    lambda k: k and k not in dict((f[0], 0) for f in ITERATION_FIELDS))
_value = st.text(alphabet="0123456789.E+-abc", min_size=1, max_size=10)


@st.composite
def iteration_records(draw) -> IterationRecord:
    """Any record whose values survive Megatron's print formats."""
    iteration = draw(st.integers(1, 10**7))
    return IterationRecord(
        iteration=iteration, train_iters=draw(st.integers(iteration, 10**8)),
        consumed_samples=draw(st.integers(0, 10**11)),
        elapsed_ms=_as_printed(draw(st.floats(0, 1e6)), "{:.1f}"),
        learning_rate=_as_printed(draw(st.floats(0, 1.0)), "{:.6E}"),
        global_batch_size=draw(st.integers(1, 99999)),
        loss_scale=_as_printed(draw(st.floats(1, 2.0**40)), "{:.1f}"),
        throughput=draw(st.one_of(st.none(), st.floats(0, 1e4).map(lambda v: _as_printed(v, "{:.1f}")))),
        lm_loss=draw(_loss), sop_loss=draw(_loss),
        grad_norm=draw(st.one_of(st.none(), st.floats(0, 1e5).map(lambda v: _as_printed(v, "{:.3f}")))),
        skipped=draw(st.integers(0, 999)), nan=draw(st.integers(0, 999)), timestamp=draw(_stamps),
        extra=draw(st.dictionaries(_key, _value, max_size=2)))


@settings(max_examples=150, deadline=None)
@given(iteration_records())
def test_property_format_then_parse_is_identity(rec):
    """Any record -> Megatron's line -> the same record."""
    assert logs.parse_iteration_line(format_iteration(rec), rec.line_no) == rec


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(iteration_records(), st.lists(st.sampled_from(NOISE), max_size=3),
                          st.sampled_from(["", "\x1b[32m", "progress 10%\r"])), min_size=1, max_size=8))
def test_property_noise_interleaved(items):
    """Warnings, tracebacks, NCCL chatter, ANSI colour and \\r progress never hide or invent iteration lines."""
    lines, expected = [], []
    for rec, noise, prefix in items:
        lines.extend(noise)
        reset = "\x1b[0m" if prefix.startswith("\x1b") else ""
        lines.append(prefix + format_iteration(rec) + reset)
        expected.append(replace(rec, line_no=len(lines)))
    parsed = logs.parse_log("\n".join(lines) + "\n")
    assert list(parsed.iterations) == expected
    assert parsed.problems == () and not parsed.truncated_last_line


@settings(max_examples=40, deadline=None)
@given(st.lists(iteration_records(), min_size=1, max_size=6), st.data())
def test_property_truncated_last_line(records, data):
    """A log cut anywhere parses without crashing; a partial last line is flagged and ignored."""
    text = "".join(format_iteration(r) + "\nsome noise\n" for r in records)
    cut = data.draw(st.integers(0, len(text)))
    parsed = logs.parse_log(text[:cut])
    complete = text[:cut].count("\n")
    assert parsed.truncated_last_line == (cut > 0 and text[cut - 1] != "\n")
    assert [r.line_no for r in parsed.iterations] == [n for n in range(1, complete + 1, 2)]
    assert all(r.line_no <= complete for r in parsed.iterations)


def test_two_ranks_lines_interleaved_in_one_merged_log_are_a_problem_not_a_crash():
    """Seen on 2 H200s (TP=2, both ranks printing into torchrun's one pipe): rank 1's memory line began before
    rank 0's newline. The garbled line is reported; every other line is parsed as usual."""
    from harness.evidence.logs import parse_log

    garbled = ("[Rank 0] (after 10 iterations) memory (MB) | allocated: 212.29 | max allocated: 301.85 | reserved: "
               "434.00[Rank 1] (after 10 iterations) memory (MB) | allocated: 212.29 | max allocated: 301.85 | "
               "reserved: 434.00 | max reserved: 434.00")
    iteration = (" [2026-12-01 02:02:50.000000] iteration       20/     200 | consumed samples:          320 | "
                 "elapsed time per iteration (ms): 7.4 | learning rate: 3.000000E-05 | global batch size:    16 | "
                 "lm loss: 1.035779E+01 | loss scale: 65536.0 | grad norm: 7.962 | number of skipped iterations:   7 |"
                 " number of nan iterations:   0 |")
    parsed = parse_log("\n".join([garbled, iteration, ""]))
    assert [r.iteration for r in parsed.iterations] == [20] and parsed.iterations[0].lm_loss == 10.35779
    assert len(parsed.problems) == 1 and parsed.problems[0].startswith("line 1:")
