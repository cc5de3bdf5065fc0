"""Every quoted byte survives every writer: an overflowing loss is drawn clipped (never a grader error), and one
escaping function (gradebook.visible) shows an undecodable name byte as \\xNN and never passes a terminal escape."""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import given, settings, strategies as st

from harness.cli import grade
from harness.report import gradebook, plot
from harness.judge.submission import evidence
from harness.base.paths import RECORDED_LOGS

LOG = (RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log").read_text()


@pytest.mark.parametrize("value", ["1.700000E+308", "-1.700000E+308"])
def test_an_overflowing_loss_is_drawn_clipped(tmp_path, value, monkeypatch):
    text = re.sub(r"lm loss: [0-9.E+-]+", f"lm loss: {value}", LOG, count=1)
    assert text != LOG
    (tmp_path / "train.log").write_text(text)
    ev = evidence(tmp_path / "train.log", None)
    png = plot.LossCurvePainter().png(ev.log, None, "overflow")
    assert png is not None and png.startswith(b"\x89PNG")
    monkeypatch.setattr(plot, "PLOT_CLIP", float("inf"))     # without the clip the axes overflow
    with pytest.raises((OverflowError, ValueError)):
        plot.LossCurvePainter().png(ev.log, None, "overflow")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40))
def test_every_name_byte_is_shown_escaped_the_same_way(raw):
    name = raw.decode("utf-8", "surrogateescape")
    shown = grade.display_name(name)
    assert shown == gradebook.visible(name)
    shown.encode("utf-8")                                    # every writer can encode it (strict)
    assert "\x1b" not in shown and "\r" not in shown and "\n" not in shown
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:                               # an undecodable byte is shown as its \xNN
        assert re.search(r"\\x[89a-f][0-9a-f]", shown), shown
        assert "\\udc" not in shown                          # never the surrogate's code point


def test_gradescope_lists_links_capped_with_a_count_and_escaped(tmp_path):
    from harness.cli import gradescope

    sub = tmp_path / "s"
    sub.mkdir()
    for i in range(8):
        os.symlink("/etc/passwd\x1b[2J", sub / f"l{i}")
    problem = gradescope.submission_problem(sub)
    assert "and 3 more" in problem and problem.count(" -> ") == 5
    assert "\x1b" not in problem and "\\x1b[2J" in problem
