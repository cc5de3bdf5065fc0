"""OUT/grades.html, the one self-contained page a course grader opens in a browser, checked two ways:

- in a real headless browser (Debian's chromium: `chromium --headless --dump-dom`), on the example batch's committed
  page (results/grading-example/grades/grades.html, kept fresh by test_grading_example.py): the rendered DOM holds
  one row per grade, and each filter (by verdict, by root cause, both; set from the address as a grader's bookmark
  would) shows exactly the rows it should and counts them; the hostile folder name is text, never an element;
  every picture is an inline PNG. Skipped, saying so, where no chromium is installed (`apt-get install -y
  chromium`: 70 s measured on Debian 12, so CI does not install it);
- everywhere, with Python's HTML parser: the page's elements are only the ones the writer makes (no element and
  no on* attribute from any quoted text, over hostile names and causes), its policy forbids loading anything, and
  the example page's rows, cells and inline pictures match grades.json.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.report import gradebook
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "results" / "grading-example" / "grades"
PAGE = EXAMPLE / "grades.html"
WRITER_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "code", "p", "b", "div", "label", "select",
               "option", "span", "table", "thead", "tbody", "tr", "th", "td", "img", "script"}
NASTY = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "\"><svg onload=alert(1)>", "' onmouseover='x",
         "&lt;b&gt;", "</td></tr></table><h1>x", "a\x1b[2Jb", "\u202eevil", "é☃𝄞", "</script><script>alert(2)"]


class Elements(HTMLParser):
    """Every start tag with its attributes, and the rows of #grades."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.rows, self._row, self._cell = [], [], None, None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "tr" and "data-verdict" in dict(attrs):
            self._row = {"attrs": dict(attrs), "cells": [], "imgs": []}
        elif tag == "td" and self._row is not None:
            self._cell = ""
        elif tag == "img" and self._row is not None:
            self._row["imgs"].append(dict(attrs))

    def handle_endtag(self, tag):
        if tag == "td" and self._row is not None:
            self._row["cells"].append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def parse(text: str) -> Elements:
    parser = Elements()
    parser.feed(text)
    parser.close()
    return parser


def example_grades() -> list:
    data = json.loads((EXAMPLE / "grades.json").read_text())
    return data["grades"] if isinstance(data, dict) else data


def _grade(name: str, cause_id: str | None, cause: str, verdict: str = "fail") -> dict:
    crit = [{"id": "first-loss", "status": FAIL, "measured": cause, "expected": "x", "message": cause,
             "consequence_of": None},
            {"id": "gpu-memory", "status": NOT_MEASURABLE, "measured": "not measured", "expected": "", "message": "",
             "consequence_of": None}]
    return {"submission": name, "log": None, "save_dir": None, "verdict": verdict, "failed": ["first-loss"],
            "not_measured": ["gpu-memory"], "recipe": name, "recipe_detected_by": None, "provenance": [],
            "diagnosis": cause, "diagnosis_id": cause_id, "diagnosis_cause": cause, "criteria": crit,
            "loss_curve": f"submissions/{len(name)}/loss-curve.png"}


# ---------------------------------------------------------------- everywhere: Python's HTML parser


@pytest.mark.parametrize("text", NASTY)
def test_quoted_text_never_becomes_markup(text):
    grades = [_grade(text, text, text), _grade("ok", None, "", verdict=PASS)]
    page = gradebook.html_page(grades, text, {grades[0]["loss_curve"]: b"\x89PNG\r\n\x1a\n" + text.encode()})
    parsed = parse(page)
    assert {t for t, _ in parsed.tags} <= WRITER_TAGS
    assert not [(t, a) for t, a in parsed.tags for k in a if k.startswith("on")], "an event handler attribute"
    assert sum(t == "script" for t, _ in parsed.tags) == 1 and sum(t == "img" for t, _ in parsed.tags) == 1
    assert len(parsed.rows) == 2 and all(len(r["cells"]) == 7 for r in parsed.rows)
    assert parsed.rows[0]["cells"][0] == gradebook.visible(text)          # shown as text, exactly
    assert parsed.rows[0]["attrs"]["data-cause"] == text
    options = [a.get("value") for t, a in parsed.tags if t == "option"]
    assert text in options and gradebook.NO_CAUSE in options


def test_the_page_loads_nothing_from_outside():
    page = PAGE.read_text(encoding="utf-8")
    policy = [a["content"] for t, a in parse(page).tags if t == "meta" and a.get("http-equiv") ==
              "Content-Security-Policy"]
    assert policy and "default-src 'none'" in policy[0] and "img-src data:" in policy[0]
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:image/png;base64,)""", page), "a resource from outside"


def test_the_example_page_holds_every_grade_and_its_picture_inline():
    grades, parsed = example_grades(), parse(PAGE.read_text(encoding="utf-8"))
    assert [r["cells"][0] for r in parsed.rows] == [gradebook.visible(g["submission"]) for g in grades]
    assert [r["attrs"]["data-verdict"] for r in parsed.rows] == [g["verdict"] for g in grades]
    assert [r["attrs"]["data-cause"] for r in parsed.rows] == [g["diagnosis_id"] or gradebook.NO_CAUSE for g in grades]
    for row, g in zip(parsed.rows, grades):
        assert len(row["imgs"]) == (1 if g["loss_curve"] else 0), g["submission"]
        for img in row["imgs"]:
            png = base64.b64decode(img["src"].removeprefix("data:image/png;base64,"))
            assert png == (EXAMPLE / g["loss_curve"]).read_bytes()


# ---------------------------------------------------------------- a real browser


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def rendered(tmp_path: Path, fragment: str = "") -> Elements:
    """The DOM chromium holds after the page's script ran, the address ending in #fragment."""
    proc = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-extensions",
                           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                           PAGE.resolve().as_uri() + (f"#{fragment}" if fragment else "")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "<table" in proc.stdout, proc.stderr[-2000:]
    dom = parse(proc.stdout)
    dom.shown = re.search(r'id="shown">([^<]*)<', proc.stdout).group(1)
    return dom


needs_chromium = pytest.mark.skipif(_chromium() is None, reason="no chromium: `apt-get install -y chromium` (Debian)")


@needs_chromium
@pytest.mark.parametrize("fragment, verdict, cause", [
    ("", None, None), ("verdict=pass", "pass", None), ("verdict=fail", "fail", None), ("cause=nan", None, "nan"),
    ("cause=log-copy&verdict=fail", "fail", "log-copy"), ("verdict=pass&cause=nan", "pass", "nan"),
    (f"cause={gradebook.NO_CAUSE}", None, gradebook.NO_CAUSE),
])
def test_a_real_browser_shows_exactly_the_filtered_rows(tmp_path, fragment, verdict, cause):
    grades = example_grades()
    want = [gradebook.visible(g["submission"]) for g in grades
            if (verdict is None or g["verdict"] == verdict)
            and (cause is None or (g["diagnosis_id"] or gradebook.NO_CAUSE) == cause)]
    dom = rendered(tmp_path, fragment.replace("(", "%28").replace(")", "%29"))
    assert len(dom.rows) == len(grades)
    assert [r["cells"][0] for r in dom.rows if "hidden" not in r["attrs"]] == want
    assert dom.shown == f"{len(want)} of {len(grades)} shown"
    if verdict or cause:
        assert 0 < len(want) < len(grades) or fragment == "verdict=pass&cause=nan"


@needs_chromium
def test_a_real_browser_renders_the_hostile_name_as_text(tmp_path):
    dom = rendered(tmp_path)
    assert {t for t, _ in dom.tags} <= WRITER_TAGS
    assert not [(t, a) for t, a in dom.tags if t == "img" and not a.get("src", "").startswith("data:image/png")]
    assert any("<img src=x onerror=alert(1)>" in r["cells"][0] for r in dom.rows)
