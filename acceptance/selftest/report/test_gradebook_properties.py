"""Property tests of the grades writers: any bytes as a log, any folder name, and text that attacks each format
give valid JSON, CSV (same rows and columns read back, no formula), Markdown table rows (right number of cells),
JUnit XML (parsed by xml.etree), terminal text without control characters, and never an exception."""

from __future__ import annotations

import csv
import io
import json
import re
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness.cli import grade
from harness.report import gradebook
from harness.base.paths import RECORDED_LOGS
from harness.judge.profiles import FAIL, NOT_MEASURABLE, load_profile

PROFILE = load_profile("reference")
GOOD = (RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log").read_bytes()
MD_COLUMNS = 7
NASTY = ["=HYPERLINK(\"http://x\")", "+1", "-2", "@SUM(A1)", "\tx", "\rx", "a|b", "x\\|y", "<script>", "&amp;",
         "![](http://track/x.png)", "[a](javascript:1)", "line\nbreak", "\x1b[2J\x1b]0;t\x07", "\x00\x01\x0b\x0c",
         "\ud800", "\ufffe\uffff", "\u202eevil", "`code`", "**b**", "\\", "é☃𝄞"]
# folder names as the file system gives them: any bytes but '/' and NUL, not hidden (hidden folders are skipped)
NAMES = st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"/", b"_").replace(b"\0", b"_")).filter(
    lambda b: not b.startswith(b".")).map(os.fsdecode)


def md_cells(row: str) -> list:
    """The cells of one Markdown table row, splitting at pipes that no backslash escapes (GFM)."""
    cells, cell, i = [], "", 0
    while i < len(row):
        if row[i] == "\\" and i + 1 < len(row):
            cell += row[i:i + 2]
            i += 2
            continue
        if row[i] == "|":
            cells.append(cell)
            cell = ""
        else:
            cell += row[i]
        i += 1
    cells.append(cell)
    return cells[1:-1]   # outside the leading and trailing pipe


def check_outputs(grades: list) -> None:
    """Every writer's output is valid for its reader and holds every grade."""
    assert json.loads(gradebook.to_json(grades)) == grades
    text = gradebook.csv_text(grades, PROFILE.ids)
    rows = list(csv.reader(io.StringIO(text, newline="")))
    header = rows[0]
    assert len(header) == len(set(header))
    records = list(csv.DictReader(io.StringIO(text, newline="")))
    assert len(records) == len(grades) and all(len(r) == len(header) and None not in r for r in records)
    for row in rows[1:]:
        bad = [c for c in row if c.startswith(gradebook.CSV_FORMULA_START)]
        assert not bad, f"CSV cells a spreadsheet would run as formulas: {bad}"
    md = gradebook.markdown(grades, PROFILE.name, incomplete=True, not_graded=(("x|y\n<z>", "why|\n"),))
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table) == len(grades) + 1
    for line in table:
        assert len(md_cells(line)) == MD_COLUMNS, line
        assert not re.search(r"(?<!\\)<", line) and all(c.isprintable() for c in line), line   # no tag can open
    root = ET.fromstring(gradebook.junit_bytes(grades, PROFILE.name))
    assert len(root.findall("testcase")) == sum(len(g["criteria"]) or 1 for g in grades)
    assert all(c.isprintable() for c in gradebook.visible("".join(str(g) for g in grades)))


def _grade(tmp_path: Path, name: str, log: bytes | None) -> dict:
    """grade_safely on a folder `name` holding `log` as train.log (no log when None)."""
    root = tmp_path / "dir"
    root.mkdir(exist_ok=True)
    folder = root / name
    folder.mkdir()
    if log is not None:
        (folder / "train.log").write_bytes(log)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    task = grade.Task(0, str(folder), grade.display_name(name), grade.slot_name(name), str(out), "reference")
    return grade.grade_safely(task).to_dict()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, log=st.binary(max_size=3000))
@example(name="=cmd|' -C calc'!A0", log=b"\x1b[2J")
@example(name="a|b\n<i>&", log=GOOD[:20000] + b"\xff\xfe\x00 iteration 1/ 200 | \x1b]0;x\x07\n")
def test_any_log_bytes_and_folder_name_give_valid_outputs(name, log, tmp_path_factory):
    """A random log under a random folder name is graded without an exception, and every output is valid."""
    g = _grade(tmp_path_factory.mktemp("prop"), name, log)
    assert g["verdict"] in ("pass", "fail"), g["diagnosis"]
    check_outputs([g])


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=30)), min_size=3, max_size=3))
def test_hostile_text_in_any_field_gives_valid_outputs(texts):
    """Hostile text as the submission name, a diagnosis and a criterion's message: every writer stays valid."""
    name, cause, message = texts
    graded = {"submission": name, "log": None, "save_dir": None, "verdict": "fail", "failed": ["final-loss"],
              "not_measured": ["gpu-memory"], "recipe": cause, "recipe_detected_by": None, "diagnosis": cause,
              "diagnosis_id": cause, "diagnosis_cause": message,
              "criteria": [{"id": "final-loss", "status": FAIL, "measured": message, "expected": "6-7",
                            "where": None, "consequence_of": None, "message": message},
                           {"id": "gpu-memory", "status": NOT_MEASURABLE, "measured": cause,
                            "expected": "", "where": None, "consequence_of": None, "message": ""}],
              "loss_curve": None}
    incomplete = {**graded, "verdict": "incomplete", "criteria": [], "failed": []}
    check_outputs([graded, incomplete])


@pytest.mark.parametrize("text", NASTY)
def test_terminal_text_has_no_control_characters(text):
    """What grade prints: every control character and bidi override shown as an escape."""
    shown = gradebook.visible(text)
    assert shown.isprintable() and ("\x1b" not in shown)
    if text.isprintable():
        assert shown == text
