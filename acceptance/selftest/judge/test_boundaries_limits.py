"""Boundary tests of the caps outside the criteria (their thresholds are data, tested in test_criteria_edges.py):
each cap at the value, one under and one over. A cap too large to reach in a test (2 GiB of text, 5,000 records)
is lowered for the test through the module's own constant, so what is tested is the comparison, not the number.

- harness.evidence.logs: records per kind (kept whole below 3 x MAX_RECORDS, else the first and last MAX_RECORDS),
  the lines kept of a huge log (the first and the last KEEP_CHARS characters);
- harness.evidence.logread: decompressed text read up to MAX_DECOMPRESSED_BYTES;
- harness.report.plot: titles up to MAX_TITLE characters;
- harness.run.launch: the tail of a stage's output (TAIL_LINES), the lines a failure message quotes
  (MESSAGE_TAIL_LINES);
- harness.cli.gradescope: points >= 0, total > 0, a profile's points summing to > 0.
"""

from __future__ import annotations

import gzip
import re
import sys

import pytest

from harness.cli import gradescope
from harness.evidence import logread, logs
from harness.report import plot
from harness.base.paths import RECORDED_LOGS
from harness.run import launch
from harness.judge.profiles import load_profile

REAL_LOG = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
ITERATION_LINE = next(line for line in REAL_LOG.read_text().splitlines() if logs.parse_iteration_line(line))


def iteration_lines(n: int) -> str:
    """n real Megatron iteration lines, numbered 1..n."""
    return "".join(re.sub(r"iteration +\d+/ +\d+", f"iteration {i:8d}/{n:8d}", ITERATION_LINE) + "\n"
                   for i in range(1, n + 1))


# ---------------------------------------------------------------- records per kind


@pytest.mark.parametrize("cap", [3, 5])
def test_records_kept_whole_up_to_three_caps_minus_one(monkeypatch, cap):
    """Below 3 x cap every record is kept; at 3 x cap the middle cap go (2 x cap kept), then it grows again."""
    monkeypatch.setattr(logs, "MAX_RECORDS", cap)
    for n, dropped in ((3 * cap - 2, 0), (3 * cap - 1, 0), (3 * cap, cap), (3 * cap + 1, cap)):
        parsed = logs.parse_log(iteration_lines(n))
        its = [r.iteration for r in parsed.iterations]
        if not dropped:
            assert its == list(range(1, n + 1)), n
            assert not any("not kept" in p for p in parsed.problems), n
        else:
            assert len(its) + dropped == n, (n, len(its))
            assert its[:cap] == list(range(1, cap + 1)) and its[-cap:] == list(range(n - cap + 1, n + 1)), n
            assert f"{dropped} more iteration records not kept" in " ".join(parsed.problems), (n, parsed.problems)


# ---------------------------------------------------------------- lines kept of a huge log


def test_lines_kept_are_the_first_and_last_keep_chars(monkeypatch):
    """Lines of 9 characters (10 with the newline), cap 100: 20 lines are kept whole, 21 lose exactly one."""
    monkeypatch.setattr(logs, "KEEP_CHARS", 100)
    for n, skipped in ((19, 0), (20, 0), (21, 1), (22, 2)):
        lines = [f"line {i:04d}" for i in range(n)]
        parsed = logs.parse_log("\n".join(lines) + "\n")
        if not skipped:
            assert list(parsed.lines) == lines, n
        else:
            assert parsed.lines[:10] == tuple(lines[:10]) and parsed.lines[-10:] == tuple(lines[-10:]), n
            assert parsed.lines[10].startswith(f"[... {skipped} lines not kept"), parsed.lines[10]
            assert len(parsed.lines) == 21


# ---------------------------------------------------------------- decompressed bytes


@pytest.mark.parametrize("extra", [-1, 0])
def test_gzip_text_up_to_the_cap_is_read_whole(tmp_path, monkeypatch, extra):
    cap = 4000
    monkeypatch.setattr(logread, "MAX_DECOMPRESSED_BYTES", cap)
    monkeypatch.setattr(logread, "CHUNK_BYTES", 256)
    body = ("x" * 99 + "\n") * (cap // 100)
    text = body[: cap + extra - 1] + "\n" if extra else body
    assert len(text.encode()) == cap + extra
    path = tmp_path / "train.log"
    path.write_bytes(gzip.compress(text.encode()))
    info = logread.ReadInfo(str(path))
    assert "\n".join(logread.read_lines(path, info)) + "\n" == text
    assert info.compressed == "gzip" and not info.truncated_last_line


def test_gzip_text_over_the_cap_stops_at_the_cap_and_says_so(tmp_path, monkeypatch):
    cap = 4000
    monkeypatch.setattr(logread, "MAX_DECOMPRESSED_BYTES", cap)
    monkeypatch.setattr(logread, "CHUNK_BYTES", 256)
    text = ("y" * 99 + "\n") * 80                        # 8000 bytes
    path = tmp_path / "bomb.log"
    path.write_bytes(gzip.compress(text.encode()))
    info = logread.ReadInfo(str(path))
    got = "\n".join(logread.read_lines(path, info))
    assert info.stopped and "read no further" in info.stopped
    assert cap <= len(got) + 1 < cap + 256 + 100         # stopped within one chunk past the cap, not at the end
    assert text.startswith(got) and any("read no further" in n for n in info.notes())


# ---------------------------------------------------------------- plot titles


def test_title_cap():
    cap = plot.MAX_TITLE
    for n in (cap - 1, cap):
        assert plot.plain_title("a" * n) == "a" * n
    for n in (cap + 1, cap + 50):
        cut = plot.plain_title("b" * n)
        assert len(cut) == cap and cut.endswith("...") and cut.startswith("b" * (cap - 3))


# ---------------------------------------------------------------- a stage's tail


def printer_stage(n: int) -> launch.StageSpec:
    code = f"import sys\nfor i in range({n}): print('out', i)\nsys.exit(3)"
    return launch.StageSpec("tail", (sys.executable, "-c", code), timeout_s=60)


@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_stage_tail_and_message_tail_at_their_caps(tmp_path, delta):
    n = launch.TAIL_LINES + delta
    result = launch.run_stage(printer_stage(n), tmp_path / str(delta))
    assert result.returncode == 3
    assert list(result.tail) == [f"out {i}" for i in range(max(0, n - launch.TAIL_LINES), n)]
    message = result.failure_message()
    quoted = min(launch.MESSAGE_TAIL_LINES, len(result.tail))
    assert f"last {quoted} log lines" in message
    assert f"out {n - quoted}" in message and f"out {n - quoted - 1}\n" not in message + "\n"


def test_message_tail_under_its_cap_quotes_every_line(tmp_path):
    n = launch.MESSAGE_TAIL_LINES - 1
    result = launch.run_stage(printer_stage(n), tmp_path)
    assert f"last {n} log lines" in result.failure_message() and "out 0" in result.failure_message()


# ---------------------------------------------------------------- weights


def weights(tmp_path, body: str):
    path = tmp_path / "w.toml"
    path.write_text(body)
    return gradescope.load_weights(path)


def test_points_zero_is_allowed_and_any_negative_refused(tmp_path):
    assert weights(tmp_path, "[points]\nrecipe = 0\n").points == {"recipe": 0}
    assert weights(tmp_path, "[points]\nrecipe = 0.001\n").points == {"recipe": 0.001}
    for bad in ("-0.001", "-1", "true"):
        with pytest.raises(gradescope.GradescopeError, match="a number >= 0"):
            weights(tmp_path, f"[points]\nrecipe = {bad}\n")


def test_total_must_be_above_zero(tmp_path):
    assert weights(tmp_path, "total = 0.001\n[points]\nrecipe = 1\n").total == 0.001
    for bad in ("0", "-1", "true"):
        with pytest.raises(gradescope.GradescopeError, match="a number > 0"):
            weights(tmp_path, f"total = {bad}\n[points]\nrecipe = 1\n")


def test_a_profile_needs_points_summing_above_zero(tmp_path):
    profile = load_profile("course")
    zero = "\n".join(f'"{cid}" = 0' for cid in profile.ids)
    with pytest.raises(gradescope.GradescopeError, match="0 points"):
        weights(tmp_path, "total = 10\n[points]\n" + zero + "\n").max_scores(profile)
    one = zero.replace(f'"{profile.ids[-1]}" = 0', f'"{profile.ids[-1]}" = 0.5')
    maxima = weights(tmp_path, "total = 10\n[points]\n" + one + "\n").max_scores(profile)
    assert maxima[profile.ids[-1]] == 10 and sum(maxima.values()) == 10
