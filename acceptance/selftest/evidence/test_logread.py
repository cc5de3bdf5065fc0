"""Self-tests of harness.evidence.logread: the recorded Megatron log, written as real tools write it (rank prefixes,
timestamps, CRLF, colour codes, UTF-16, a BOM, gzip, two streams, interleaved ranks), parses to the clean log's
records, field by field."""

from __future__ import annotations

import gzip
import re
import time
from dataclasses import replace

import pytest

from harness.evidence import logread, logs
from harness.base.paths import RECORDED_LOGS
from harness.evidence.logformat import ParsedLog

RECORDED = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
TEXT = RECORDED.read_text()
LINES = TEXT.split("\n")[:-1]
FIELDS = ("markers", "iterations", "validations", "memory", "checkpoints", "lines_total", "truncated_last_line",
          "problems", "arguments", "arguments_line")


@pytest.fixture(scope="module")
def clean() -> ParsedLog:
    return logs.parse_log_file(RECORDED)


def _same(parsed: ParsedLog, clean: ParsedLog, lines: bool = True) -> None:
    """Every field equal to the clean parse (and the lines as Megatron printed them, unless told otherwise)."""
    for name in FIELDS:
        assert getattr(parsed, name) == getattr(clean, name), name
    assert (parsed.first_loss_record, parsed.last_iteration) == (clean.first_loss_record, clean.last_iteration)
    if lines:
        assert parsed.lines == clean.lines


def _write(path, data) -> ParsedLog:
    (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)
    return logs.parse_log_file(path)


def _prefixed(prefix) -> str:
    return "".join(f"{prefix(i)}{line}\n" for i, line in enumerate(LINES))


def test_clean_log_has_no_read_notes(clean):
    """A plain UTF-8 Megatron log is read as written: no notes; its lone `[rank0]:` warning keeps its prefix."""
    assert clean.source == ()
    assert any(line.startswith("[rank0]:[W1129") for line in clean.lines)


@pytest.mark.parametrize("name,prefix,says", [
    ("torchrun-tee", lambda i: "[default0]:", "rank prefixes"),
    ("pytorch-rank", lambda i: "[rank0]:", "rank prefixes"),
    ("srun-label", lambda i: "0: ", "srun --label"),
    ("srun-and-torchrun", lambda i: "0: [default0]:", "srun --label"),
    ("iso-timestamp", lambda i: f"2026-11-29T14:17:{i % 60:02d}.{i:03d}Z ", "ISO timestamps"),
    ("clock-timestamp", lambda i: f"[14:17:{i % 60:02d}] ", "[HH:MM:SS] timestamps"),
    ("timestamp-then-rank", lambda i: f"2026-11-29 14:17:{i % 60:02d},123 [default0]:", "rank prefixes"),
])
def test_wrapped_lines_parse_as_the_clean_log(name, prefix, says, clean, tmp_path):
    """Every line wrapped by a launcher or a timestamping tool: the same records, the same lines, and a note."""
    parsed = _write(tmp_path / "slurm-12345.out", _prefixed(prefix))
    _same(parsed, clean)
    assert any(says in note for note in parsed.source), parsed.source


def test_windows_line_endings(clean, tmp_path):
    parsed = _write(tmp_path / "train.log", TEXT.replace("\n", "\r\n").encode())
    _same(parsed, clean)
    assert parsed.source == (f"train.log: Windows line endings (CRLF) on {len(LINES)} lines",)


def test_carriage_returns_alone_end_lines_when_no_newline_does(clean, tmp_path):
    """Classic Mac endings (a bare CR after every line): the same records and lines, and a note; a CR inside a line
    of a normal log (a progress bar) stays part of its line."""
    parsed = _write(tmp_path / "train.log", TEXT.replace("\n", "\r").encode())
    _same(parsed, clean)
    assert parsed.source == ("train.log: lines end in a carriage return alone (CR), read as line ends",)
    bar = "\n".join([*LINES[:5], "progress 10%\rprogress 50%\rprogress 100%", *LINES[5:]]) + "\n"
    kept = _write(tmp_path / "bar.log", bar)
    assert "progress 10%\rprogress 50%\rprogress 100%" in kept.lines and kept.source == ()


def test_colour_codes(clean, tmp_path):
    """ANSI colour around every line: records unchanged (the lines keep their codes, as a terminal got them)."""
    parsed = _write(tmp_path / "train.log", "".join(f"\x1b[1;32m{line}\x1b[0m\n" for line in LINES))
    _same(parsed, clean, lines=False)
    assert [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in parsed.lines] == list(clean.lines)


@pytest.mark.parametrize("codec,bom,says", [
    ("utf-16-le", b"\xff\xfe", "encoding UTF-16-LE (byte-order mark)"),
    ("utf-16-be", b"\xfe\xff", "encoding UTF-16-BE (byte-order mark)"),
    ("utf-8", b"\xef\xbb\xbf", "encoding UTF-8 (byte-order mark)"),
])
def test_encodings_by_byte_order_mark(codec, bom, says, clean, tmp_path):
    """PowerShell's `>` writes UTF-16 LE with a BOM; Notepad UTF-8 with one: decoded by the BOM, and said."""
    parsed = _write(tmp_path / "train.log", bom + TEXT.encode(codec))
    _same(parsed, clean)
    assert parsed.source == (f"train.log: {says}",)


@pytest.mark.parametrize("name", ["train.log.gz", "train.log"])
def test_gzip_by_magic_bytes(name, clean, tmp_path):
    """Compressed logs are read decompressed, whether or not the name says .gz; gzip of UTF-16 too."""
    parsed = _write(tmp_path / name, gzip.compress(TEXT.encode()))
    _same(parsed, clean)
    assert parsed.source == (f"{name}: gzip-compressed, read decompressed",)
    both = _write(tmp_path / "u16.log.gz", gzip.compress(b"\xff\xfe" + TEXT.encode("utf-16-le")))
    _same(both, clean)


def test_everything_at_once(clean, tmp_path):
    """gzip of UTF-16 with CRLF, timestamps and torchrun prefixes: still the clean log."""
    text = "".join(f"2026-11-29T14:17:59Z [default0]:{line}\r\n" for line in LINES)
    parsed = _write(tmp_path / "x.log.gz", gzip.compress(b"\xff\xfe" + text.encode("utf-16-le")))
    _same(parsed, clean)
    assert len(parsed.source) == 4, parsed.source


def test_stdout_and_stderr_in_two_files(clean, tmp_path):
    """Megatron's lines in train.out, Python's warnings in train.err: read one after the other, every record the
    clean log's (numbered on through both files)."""
    err_lines = [line for line in LINES if "Warning" in line or line.startswith("  warnings.warn")]
    out_lines = [line for line in LINES if line not in err_lines]
    (tmp_path / "train.out").write_text("\n".join(out_lines) + "\n")
    (tmp_path / "train.err").write_text("\n".join(err_lines) + "\n")
    parsed = logs.parse_log_files([tmp_path / "train.out", tmp_path / "train.err"])
    strip = lambda recs: [replace(r, line_no=0) for r in recs]  # noqa: E731 - line numbers move, records must not
    for name in ("iterations", "validations", "memory", "checkpoints"):
        assert strip(getattr(parsed, name)) == strip(getattr(clean, name)), name
    assert parsed.arguments == clean.arguments and set(parsed.markers) == set(clean.markers)
    assert parsed.lines_total == clean.lines_total and parsed.problems == ()
    assert parsed.source == ("2 files read as one log, in this order: train.out, train.err",)


def _two_ranks(echo_warnings: bool) -> str:
    """Rank 0 prints the setup, rank 1 (the last) the iteration and validation lines, as Megatron does with two
    GPUs; with echo_warnings every warning is printed by both ranks too."""
    clean = logs.parse_log(TEXT)
    last_rank = {r.line_no for r in (*clean.iterations, *clean.validations)}
    out = []
    for i, line in enumerate(LINES, start=1):
        out.append(f"[default{1 if i in last_rank else 0}]:{line}")
        if echo_warnings and "Warning" in line:
            out.append(f"[default1]:{line}")
    return "\n".join(out) + "\n"


def test_two_ranks_interleaved_iteration_lines_from_the_last_rank(clean, tmp_path):
    parsed = _write(tmp_path / "train.log", _two_ranks(echo_warnings=False))
    _same(parsed, clean)
    assert any("rank 0's lines judged, iteration and validation lines from rank 1" in n for n in parsed.source)


def test_two_ranks_each_printing_warnings(clean, tmp_path):
    """Rank 1's own lines between rank 0's (inside its arguments block too) change nothing but the numbering."""
    lines = _two_ranks(echo_warnings=True).split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("[default0]:  adam_beta1 "))
    lines.insert(at, "[default1]:some rank-1 warning")
    parsed = _write(tmp_path / "train.log", "\n".join(lines))
    assert parsed.arguments == clean.arguments
    assert [(r.iteration, r.lm_loss) for r in parsed.iterations] == [(r.iteration, r.lm_loss) for r in clean.iterations]
    assert len(parsed.validations) == len(clean.validations) and parsed.problems == ()


def test_same_rank_on_every_iteration_line_both_ranks_judges_rank_0(tmp_path):
    """When rank 0 prints iteration lines itself (a student's script), rank 0's are judged, not rank 1's."""
    line = next(line for line in LINES if "iteration      200/" in line)
    other = line.replace("8.159132E+00", "9.000000E+00")
    parsed = _write(tmp_path / "t.log", f"[default0]:{line}\n[default1]:{other}\n")
    assert [r.lm_loss for r in parsed.iterations] == [8.159132]


def test_truncated_last_line_through_the_reader(tmp_path):
    cut = TEXT[:TEXT.index("iteration      200/") + 30]
    parsed = _write(tmp_path / "t.log", cut.encode("utf-16-le").join([b"\xff\xfe", b""]))
    assert parsed.truncated_last_line and parsed.last_iteration == 190


def test_reader_streams_in_bounded_chunks(tmp_path):
    """read_lines is a generator over chunks: a line longer than MAX_LINE_CHARS is cut, not held whole."""
    path = tmp_path / "long.log"
    path.write_bytes(b"x" * (3 * logread.CHUNK_BYTES) + b"\nnext\n")
    info = logread.ReadInfo(str(path))
    lines = logread.read_lines(path, info)
    first = next(lines)
    assert len(first) == logread.MAX_LINE_CHARS and list(lines) == ["next"] and info.cut_lines == 1


@pytest.mark.parametrize("hostile", [
    "[Rank 0] (a) memory (MB) | allocated: 1" + " " * 60000 + "x|",
    "saving checkpoint at iteration 1 to " + "a in b " * 9000 + "format x",
    "successfully saved checkpoint from iteration 1 to " + "[ t 1/1, p 1/1 ] " * 3500 + "z",
    " loading checkpoint from " + " at iteration 1" * 4000 + " x",
    " iteration 1/2 |" + " |" * 30000,
    "[" * 60000, "0: " * 20000, "[default0]:" * 6000, "2026-11-29T14:17:59" * 3000,
])
def test_no_catastrophic_backtracking(hostile, tmp_path):
    """Hostile lines near the length cap parse in well under a second each."""
    start = time.perf_counter()
    _write(tmp_path / "h.log", (hostile + "\n") * 3)
    assert time.perf_counter() - start < 2.0


def test_a_cut_gzip_log_reads_what_is_there_and_says_so(tmp_path):
    """A gzip log cut short (an interrupted upload) is read up to the cut, never an exception; the note says so."""
    import gzip

    from harness.evidence import logs

    data = gzip.compress(RECORDED.read_bytes())
    cut = tmp_path / "train.log.gz"
    cut.write_bytes(data[: int(len(data) * 0.95)])
    parsed = logs.parse_log_file(cut)
    whole = logs.parse_log(RECORDED.read_text())
    assert 0 < len(parsed.iterations) < len(whole.iterations)
    assert parsed.iterations == whole.iterations[: len(parsed.iterations)]
    assert any("the gzip stream is cut short or corrupt" in note for note in parsed.source), parsed.source
    (tmp_path / "garbage.log").write_bytes(b"\x1f\x8b" + bytes(range(256)))
    assert logs.parse_log_file(tmp_path / "garbage.log").iterations == ()
