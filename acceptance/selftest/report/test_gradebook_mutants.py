"""Exact texts of the grades writers on small hand-made grades: each escaping rule character by character (CSV
formula starts, Markdown punctuation and entities, XML-forbidden characters, terminal escapes with their widths),
the Markdown table's rows, header and notes, the CSV's columns in order, and the JUnit suite's counts, kinds and
messages. (Written against the mutation run's survivors in harness.report.gradebook; the read-back of a real batch
is test_gradebook_readback.py, hostile text test_gradebook_properties.py.)"""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET

import pytest

from harness.report import gradebook
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS

IDS = ["first-loss", "final-loss", "gpu-memory"]


def _criterion(cid: str, status: str, message: str = "", measured: str = "", consequence_of=None) -> dict:
    return {"id": cid, "status": status, "measured": measured, "expected": "", "where": None,
            "consequence_of": consequence_of, "message": message}


def _grade(name: str, verdict: str, criteria_: list, **extra) -> dict:
    g = {"submission": name, "log": None, "save_dir": None, "verdict": verdict,
         "failed": [c["id"] for c in criteria_ if c["status"] == FAIL],
         "not_measured": [c["id"] for c in criteria_ if c["status"] == NOT_MEASURABLE],
         "recipe": None, "recipe_detected_by": None, "diagnosis": None, "diagnosis_id": None,
         "diagnosis_cause": None, "criteria": criteria_, "loss_curve": None}
    return {**g, **extra}


def _batch() -> list:
    """A passing run, a failing one with a root cause (one own failure, one consequence), one without criteria
    (no log), one the grader failed on, one a cluster task that died, one interrupted."""
    good = _grade("alice", "pass", [_criterion("first-loss", PASS), _criterion("final-loss", PASS),
                                     _criterion("gpu-memory", NOT_MEASURABLE, measured="no nvidia-smi log")],
                  recipe="A", loss_curve="submissions/alice/loss-curve.png", provenance=["train.log read whole"])
    bad = _grade("bob", "fail", [_criterion("first-loss", FAIL, message="FAIL: first loss 12\nroot cause: lr"),
                                 _criterion("final-loss", FAIL, message="FAIL: final loss", consequence_of="first-loss"),
                                 _criterion("gpu-memory", NOT_MEASURABLE, measured="")],
                 recipe="B", diagnosis="lr-too-high: the lr is 0.01", diagnosis_id="lr-too-high",
                 diagnosis_cause="the lr is 0.01")
    no_log = _grade("carol", "fail", [], failed=["submission"], diagnosis="no-log: no *.log in the folder",
                    diagnosis_id="no-log", diagnosis_cause="no *.log in the folder")
    error = _grade("dave", "error", [], diagnosis="grader-error: boom\nsecond line", diagnosis_id="grader-error",
                   diagnosis_cause="boom")
    died = _grade("erin", "died", [], diagnosis="")
    interrupted = _grade("frank", "incomplete", [], diagnosis="incomplete: not graded")
    return [good, bad, no_log, error, died, interrupted]


# ---------------------------------------------------------------- escaping, one rule at a time


def test_visible_writes_each_non_printable_character_at_its_width():
    assert gradebook.visible("plain é☃𝄞") == "plain é☃𝄞"
    assert gradebook.visible("a\x1b[2Jb\x00") == "a\\x1b[2Jb\\x00"
    assert gradebook.visible("\x85\u202eevil\u2028") == "\\x85\\u202eevil\\u2028"
    assert gradebook.visible("tag\U000e0001") == "tag\\U000e0001"


@pytest.mark.parametrize("char, shown", [("\x00", "\\x00"), ("\xff", "\\xff"), ("\u0100", "\\u0100"),
                                         ("\uffff", "\\uffff"), ("\U00010000", "\\U00010000"),
                                         ("\U0010ffff", "\\U0010ffff")])
def test_escape_char_widths_change_exactly_at_0x100_and_0x10000(char, shown):
    assert gradebook._escape_char(char) == shown


@pytest.mark.parametrize("value, cell", [(None, ""), ("", ""), (0, "0"), (1.5, "1.5"), ("a=b", "a=b"),
                                         ("=SUM(A1)", "'=SUM(A1)"), ("+1", "'+1"), ("-2", "'-2"), ("@x", "'@x"),
                                         ("\tx", "'\tx"), ("\rx", "'\rx"), ("a\0b", "a\\x00b"),
                                         ("\0=x", "\\x00=x"), ("x-", "x-")])
def test_csv_cell_guards_formula_starts_and_nul(value, cell):
    assert gradebook.csv_cell(value) == cell


@pytest.mark.parametrize("value, cell", [
    (None, ""), (0, ""), ("", ""), ("plain text", "plain text"),
    ("two\nlines\r\nthree", "two lines three"),
    ("\\`*_{}[]()#+!|~", "\\\\\\`\\*\\_{}\\[\\]()#+!\\|\\~"),
    ("a&b<c>d", "a&b\\<c>d"), ("&amp;", "\\&amp;"), ("&#x3c;", "\\&#x3c;"),
    ("lr: 0.0001 -> 0.01; 1 deviation(s)", "lr: 0.0001 -> 0.01; 1 deviation(s)"),
    ("hidden_dropout _x_ a_ _b", "hidden_dropout \\_x\\_ a\\_ \\_b"),
    ("# h", "\\# h"), ("> q", "\\> q"), ("- l", "\\- l"), ("+1", "\\+1"), ("=x", "\\=x"), ("a # b", "a # b"),
    ("\x1b[0m", "\\\\x1b\\[0m"), ("-=.", "\\-=."),
])
def test_md_cell_escapes_markup_entities_breaks_and_controls(value, cell):
    assert gradebook.md_cell(value) == cell


def test_xml_text_writes_only_forbidden_characters_escaped():
    allowed = "\t\n\r \ud7ff\ue000\ufffd\U00010000\U0010ffff<&>"
    assert gradebook.xml_text(allowed) == allowed
    assert gradebook.xml_text("a\x00b\x08\x0b\x0c\x1f\ud800\udfff\ufffe\uffff") == (
        "a\\x00b\\x08\\x0b\\x0c\\x1f\\ud800\\udfff\\ufffe\\uffff")
    assert gradebook.xml_text(None) == "" and gradebook.xml_text(0) == "0" and gradebook.xml_text("") == ""


def test_json_is_indented_by_two_ascii_escaped_and_ends_with_a_newline():
    assert gradebook.to_json([{"a": "é", "b": [1]}]) == (
        '[\n  {\n    "a": "\\u00e9",\n    "b": [\n      1\n    ]\n  }\n]\n')


# ---------------------------------------------------------------- Markdown


def test_markdown_table_of_a_batch_exactly():
    md = gradebook.markdown(_batch(), "ref|x")
    assert md == "\n".join([
        "# Grades (profile `ref\\|x`)",
        "",
        "1 of 6 passed. not measured: a criterion its files cannot show (`not-measurable` in grades.json and grades.csv), never counted as a pass.",
        "",
        "| submission | verdict | recipe | root cause | failed | not measured | loss curve |",
        "|---|---|---|---|---|---|---|",
        "| alice | **PASS** | A |  |  | gpu-memory | ![](submissions/alice/loss-curve.png) |",
        "| bob | **FAIL** | B | **lr-too-high**: the lr is 0.01 | first-loss (+1 not reached: consequences of "
        "the root cause) | gpu-memory |  |",
        "| carol | **FAIL** | ? | **no-log**: no \\*.log in the folder | submission |  |  |",
        "| dave | **ERROR** | ? | **grader-error**: boom |  |  |  |",
        "| erin | **DIED** | ? |  |  |  |  |",
        "| frank | **INCOMPLETE** | ? |  |  |  |  |",
        "",
        "Logs (how each submission's logs were read, stitched or chosen):",
        "- alice: train.log read whole",
    ]) + "\n"


def test_markdown_incomplete_banner_counts_what_was_graded_and_lists_what_is_not_a_submission():
    grades = _batch()
    md = gradebook.markdown(grades, "reference", incomplete=True,
                            not_graded=(("grades-old", "an earlier run's grades"), ("x|y", "<why>")))
    lines = md.splitlines()
    assert lines[:8] == [
        "# Grades (profile `reference`)",
        "",
        "**INCOMPLETE**: the grader was interrupted after 5 of 6 submissions; the rest are marked `incomplete`. "
        "Run it again to grade them.",
        "",
        "1 of 6 passed. not measured: a criterion its files cannot show (`not-measurable` in grades.json and grades.csv), never counted as a pass.",
        "",
        "Not a submission, not graded: grades-old (an earlier run's grades)  ",
        "Not a submission, not graded: x\\|y (\\<why>)  ",
    ]
    assert lines[8:10] == ["", "| submission | verdict | recipe | root cause | failed | not measured | loss curve |"]


def test_markdown_without_notes_or_banner_and_only_consequences_failed():
    """No provenance: no Logs section; failures that are all consequences: only the count of them is shown."""
    g = _grade("x", "fail", [_criterion("first-loss", FAIL, consequence_of="recipe"),
                             _criterion("final-loss", FAIL, consequence_of="recipe")], recipe="A")
    md = gradebook.markdown([g], "reference", incomplete=False, not_graded=())
    assert md.splitlines()[-1] == "| x | **FAIL** | A |  |  (+2 not reached: consequences of the root cause) |  |  |"
    assert "INCOMPLETE" not in md and "Not a submission" not in md and "Logs (" not in md
    assert md.splitlines()[2] == "0 of 1 passed. not measured: a criterion its files cannot show (`not-measurable` in grades.json and grades.csv), never counted as a pass."


# ---------------------------------------------------------------- CSV


def test_csv_gradebook_exactly():
    text = gradebook.csv_text(_batch()[:3] + [_grade("=evil", "fail", [_criterion("final-loss", FAIL)],
                                                     recipe="@A", diagnosis="-x")], IDS)
    assert text == "\r\n".join([
        "submission,verdict,detected_recipe,diagnosis,first-loss,final-loss,gpu-memory",
        "alice,pass,A,,pass,pass,not-measurable",
        "bob,fail,B,lr-too-high: the lr is 0.01,fail,fail,not-measurable",
        "carol,fail,,no-log: no *.log in the folder,,,",
        "'=evil,fail,'@A,'-x,,fail,",
    ]) + "\r\n"
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert [len(r) for r in rows] == [7] * 5


def test_csv_quotes_what_needs_quoting():
    g = _grade('a,"b"\nc', "fail", [], diagnosis="x")
    assert gradebook.csv_text([g], ["id"]) == 'submission,verdict,detected_recipe,diagnosis,id\r\n"a,""b""\nc",fail,,x,\r\n'


# ---------------------------------------------------------------- JUnit


def test_junit_counts_kinds_and_messages_of_a_batch():
    suite = ET.fromstring(gradebook.junit_bytes(_batch(), "ref\x01"))
    # 3 + 3 criteria, then the 4 grades without criteria in their order
    assert suite.tag == "testsuite"
    assert suite.attrib == {"name": "grades-ref\\x01", "tests": "10", "failures": "3", "errors": "2", "skipped": "3"}
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("alice", "first-loss"), ("alice", "final-loss"), ("alice", "gpu-memory"),
        ("bob", "first-loss"), ("bob", "final-loss"), ("bob", "gpu-memory"),
        ("carol", "submission"), ("dave", "submission"), ("erin", "submission"), ("frank", "submission")]
    children = [[(e.tag, e.attrib, e.text) for e in c] for c in cases]
    assert children == [
        [], [], [("skipped", {"type": "not-measurable", "message": "no nvidia-smi log"}, None)],
        [("failure", {"message": "FAIL: first loss 12"}, "FAIL: first loss 12\nroot cause: lr")],
        [("failure", {"message": "FAIL: final loss"}, "FAIL: final loss")],
        [("skipped", {"type": "not-measurable", "message": ""}, None)],
        [("failure", {"message": "no-log: no *.log in the folder"}, "no-log: no *.log in the folder")],
        [("error", {"message": "grader-error: boom"}, "grader-error: boom\nsecond line")],
        [("error", {"message": "not judged"}, "not judged")],
        [("skipped", {"message": "incomplete: not graded"}, "incomplete: not graded")],
    ]


def test_junit_empty_failure_message_and_a_passing_grade_without_criteria():
    """A FAIL with no message has an empty message attribute; a grade without criteria is one testcase, a
    failure unless it is an error or was not graded (even a `pass`: nothing was judged)."""
    grades = [_grade("a\x02", "fail", [_criterion("final-loss", FAIL, message="")]),
              _grade("b", "pass", [], diagnosis="nothing\x0bjudged")]
    suite = ET.fromstring(gradebook.junit_bytes(grades, "p"))
    assert suite.attrib == {"name": "grades-p", "tests": "2", "failures": "2", "errors": "0", "skipped": "0"}
    first, second = suite.findall("testcase")
    assert first.attrib == {"classname": "a\\x02", "name": "final-loss"}
    assert [(e.tag, e.attrib, e.text) for e in first] == [("failure", {"message": ""}, None)]
    assert [(e.tag, e.attrib, e.text) for e in second] == [("failure", {"message": "nothing\\x0bjudged"},
                                                            "nothing\\x0bjudged")]


def test_junit_bytes_are_indented_utf8_with_a_declaration():
    data = gradebook.junit_bytes([_grade("é", "pass", [_criterion("final-loss", PASS)])], "reference")
    assert data == ("<?xml version='1.0' encoding='utf-8'?>\n"
                    '<testsuite name="grades-reference" tests="1" failures="0" errors="0" skipped="0">\n'
                    '  <testcase classname="é" name="final-loss" />\n'
                    "</testsuite>").encode("utf-8")
    tree = gradebook.junit([], "reference")
    assert ET.tostring(tree.getroot(), encoding="unicode") == (
        '<testsuite name="grades-reference" tests="0" failures="0" errors="0" skipped="0" />')


def test_the_writers_agree_on_one_batch():
    """The JSON holds every grade as given; the CSV has a row per grade; the JUnit file one case per criterion."""
    grades = _batch()
    assert json.loads(gradebook.to_json(grades)) == grades
    rows = list(csv.reader(io.StringIO(gradebook.csv_text(grades, IDS), newline="")))
    assert [r[:2] for r in rows[1:]] == [[g["submission"], g["verdict"]] for g in grades]
    assert rows[4][3] == "grader-error: boom\nsecond line"     # a line break stays inside its quoted cell
    assert gradebook.VERDICTS == ("pass", "fail", "error", "incomplete")
    assert gradebook.CSV_FORMULA_START == ("=", "+", "-", "@", "\t", "\r")


def test_markdown_lists_are_joined_with_their_separators():
    """Two own failures, two not-measured ids and two provenance notes, each list joined with its separator; a
    grade without criteria shows its `failed` list as given."""
    g = _grade("x", "fail", [_criterion("first-loss", FAIL), _criterion("final-loss", FAIL),
                             _criterion("gpu-memory", NOT_MEASURABLE), _criterion("recipe", NOT_MEASURABLE)],
               recipe="A", provenance=["a.log read", "b.log stitched"])
    bare = _grade("y", "fail", [], failed=["submission", "log"])
    lines = gradebook.markdown([g, bare], "reference").splitlines()
    assert lines[6:8] == ["| x | **FAIL** | A |  | first-loss, final-loss | gpu-memory, recipe |  |",
                          "| y | **FAIL** | ? |  | submission, log |  |  |"]
    assert lines[-1] == "- x: a.log read; b.log stitched"
