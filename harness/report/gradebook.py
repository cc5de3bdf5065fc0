"""The grades of a batch as files, each escaped for its reader: JSON, Markdown, a CSV gradebook, JUnit XML, and the
terminal. Each writer takes a list of grades (harness.judge.grade_record.Grade, or the dict its to_dict() gives).
Everything in a grade may come from a student (folder names, quoted log lines), so:

- CSV: a cell starting with = + - @ TAB or CR gets a leading apostrophe (a spreadsheet would run it as a formula);
- Markdown: only what Markdown would read as markup is backslash-escaped (so the file reads well raw: `a -> b`,
  `deviation(s)`): `\\` `` ` `` `*` `[` `]` `|` `~` `<` always, `_` unless inside a word, `&` before an entity,
  a block marker (`#` `>` `+` `-` `=`) at the start; line breaks become spaces;
- XML: characters XML 1.0 forbids (most control characters, lone surrogates, U+FFFE/U+FFFF) are written as \\xNN;
- terminal: control characters and escape sequences are shown as \\xNN / \\uNNNN, never sent to the terminal.
"""

from __future__ import annotations

import csv
import io
import json
import re
import xml.etree.ElementTree as ET

from harness.judge.grade_record import Grade, as_dict
from harness.judge.profiles import FAIL, NOT_MEASURABLE

# one id per criterion state in every machine-read file (grades.json, grades.csv, JUnit's `type`), one label in every
# human-read one (grades.md, grades.html); a JUnit <skipped> is how JUnit spells it, typed with the id
STATE_LABELS = {"pass": "pass", FAIL: "fail", NOT_MEASURABLE: "not measured"}
VERDICTS = ("pass", "fail", "error", "incomplete")  # error: the grader failed on it; incomplete: not graded (interrupted)
CSV_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# what Markdown (CommonMark + GFM tables, strikethrough) would read as markup inside a line: a backslash escape
# keeps each literal; `_` inside a word (hidden_dropout) and `&` that starts no entity are never markup
_MARKDOWN_SPECIAL = re.compile(r"([\\`*\[\]|~<])|(?<![^\W_])_|_(?![^\W_])|&(?=#?\w+;)")
_MARKDOWN_BLOCK_START = ("#", ">", "+", "-", "=")
_XML_FORBIDDEN = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def visible(text: str) -> str:
    """`text` with every non-printable character (controls, escape sequences, bidi overrides) written as \\xNN,
    \\uNNNN or \\UNNNNNNNN; printable text unchanged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape_char(c) for c in text)


def _escape_char(c: str) -> str:
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:          # a byte that was not UTF-8 (surrogateescape): shown as that byte
        return f"\\x{n - 0xDC00:02x}"
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def csv_cell(value) -> str:
    """A CSV cell a spreadsheet shows as text: a formula start gets an apostrophe; NUL is made visible."""
    text = "" if value is None else str(value)
    text = text.replace("\0", "\\x00")
    return "'" + text if text.startswith(CSV_FORMULA_START) else text


def md_cell(value) -> str:
    """Text for one Markdown table cell: no control characters, no line breaks, pipes/HTML/markup escaped."""
    text = visible(" ".join(str(value or "").splitlines()))
    text = _MARKDOWN_SPECIAL.sub(lambda m: "\\" + m.group(), text)
    return "\\" + text if text.startswith(_MARKDOWN_BLOCK_START) else text


def xml_text(value) -> str:
    """Text XML 1.0 can hold: forbidden characters written as \\xNN (ElementTree escapes & < > itself)."""
    text = "" if value is None else str(value)
    return _XML_FORBIDDEN.sub(lambda m: _escape_char(m.group()), text)


def to_json(grades: list) -> str:
    """grades.json: the list of grades (ASCII-escaped, so any text is valid JSON): json.dumps(list, indent=2),
    made of each Grade's own grade.json text (made once per grade) indented one level."""
    if not grades:
        return "[]\n"
    items = [(g.json_text if isinstance(g, Grade) else json.dumps(g, indent=2) + "\n")[:-1] for g in grades]
    return "[\n" + ",\n".join("  " + item.replace("\n", "\n  ") for item in items) + "\n]\n"


def markdown(grades: list, profile: str, incomplete: bool = False, not_graded: tuple = ()) -> str:
    """One table, a row per submission; root cause before the list of failed criteria."""
    grades = [as_dict(g) for g in grades]
    done = [g for g in grades if g["verdict"] != "incomplete"]
    rows = [f"# Grades (profile `{md_cell(profile)}`)", ""]
    if incomplete:
        rows += [f"**INCOMPLETE**: the grader was interrupted after {len(done)} of {len(grades)} submissions; the "
                 "rest are marked `incomplete`. Run it again to grade them.", ""]
    rows += [f"{sum(g['verdict'] == 'pass' for g in grades)} of {len(grades)} passed. {STATE_LABELS[NOT_MEASURABLE]}: "
             f"a criterion its files cannot show (`{NOT_MEASURABLE}` in grades.json and grades.csv), never counted as "
             "a pass.", ""]
    if not_graded:
        rows += [f"Not a submission, not graded: {md_cell(name)} ({md_cell(why)})  " for name, why in not_graded] + [""]
    rows += [f"| submission | verdict | recipe | root cause | failed | {STATE_LABELS[NOT_MEASURABLE]} | loss curve |",
             "|---|---|---|---|---|---|---|"]
    for g in grades:
        picture = f"![]({g['loss_curve']})" if g.get("loss_curve") else ""
        cause = f"**{md_cell(g['diagnosis_id'])}**: {md_cell(g['diagnosis_cause'])}" if g.get("diagnosis_id") else ""
        own = [c["id"] for c in g["criteria"] if c["status"] == FAIL and not c["consequence_of"]]
        unreached = len(g["failed"]) - len(own) if g["criteria"] else 0
        failed = ", ".join(own) + (f" (+{unreached} not reached: consequences of the root cause)" if unreached else "")
        rows.append(f"| {md_cell(g['submission'])} | **{g['verdict'].upper()}** | {md_cell(g.get('recipe') or '?')} | "
                    f"{cause} | {md_cell(failed or ', '.join(g['failed']))} | {md_cell(', '.join(g['not_measured']))} "
                    f"| {picture} |")
    notes = [f"- {md_cell(g['submission'])}: {md_cell('; '.join(g['provenance']))}"
             for g in grades if g.get("provenance")]
    if notes:
        rows += ["", "Logs (how each submission's logs were read, stitched or chosen):", *notes]
    return "\n".join(rows) + "\n"


def csv_text(grades: list, ids: list) -> str:
    """A gradebook: one row per submission, one column per criterion (named by its id); the recipe the run was
    judged as is `detected_recipe`, so it never shares a name with the `recipe` criterion."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(["submission", "verdict", "detected_recipe", "diagnosis", *ids])
    for g in map(as_dict, grades):
        status = {c["id"]: c["status"] for c in g["criteria"]}
        w.writerow([csv_cell(v) for v in (g["submission"], g["verdict"], g.get("recipe") or "", g.get("diagnosis") or "",
                                          *(status.get(i, "") for i in ids))])
    return buf.getvalue()


def junit(grades: list, profile: str) -> ET.ElementTree:
    """One testcase per submission x criterion: failure for FAIL, skipped for not measured; a submission without
    criteria is one testcase: failure (fail), error (the grader failed) or skipped (not graded: interrupted)."""
    grades = [as_dict(g) for g in grades]
    cases = [(g, c) for g in grades for c in g["criteria"]] + [(g, None) for g in grades if not g["criteria"]]
    # "died": a cluster task that ended without a result (harness.cli.cluster): the grader's side, an error
    kind = {"fail": "failure", "pass": "failure", "error": "error", "died": "error", "incomplete": "skipped"}
    suite = ET.Element("testsuite", name=xml_text(f"grades-{profile}"), tests=str(len(cases)),
                       failures=str(sum(1 for g, c in cases if (c is None and kind[g["verdict"]] == "failure")
                                        or (c and c["status"] == FAIL))),
                       errors=str(sum(1 for g, c in cases if c is None and kind[g["verdict"]] == "error")),
                       skipped=str(sum(1 for g, c in cases if (c is None and g["verdict"] == "incomplete")
                                       or (c and c["status"] == NOT_MEASURABLE))))
    for g, c in cases:
        case = ET.SubElement(suite, "testcase", classname=xml_text(g["submission"]),
                             name=xml_text(c["id"] if c else "submission"))
        if c is None:
            text = xml_text(g.get("diagnosis") or "not judged")
            ET.SubElement(case, kind[g["verdict"]], message=text.splitlines()[0] if text else "").text = text
        elif c["status"] == FAIL:
            message = xml_text(c["message"])
            ET.SubElement(case, "failure", message=(message.splitlines() or [""])[0]).text = message
        elif c["status"] == NOT_MEASURABLE:
            ET.SubElement(case, "skipped", type=NOT_MEASURABLE, message=xml_text(c["measured"]))
    tree = ET.ElementTree(suite)
    ET.indent(tree)
    return tree


def junit_bytes(grades: list, profile: str) -> bytes:
    """grades-junit.xml as UTF-8 bytes with its declaration."""
    buf = io.BytesIO()
    junit(grades, profile).write(buf, encoding="utf-8", xml_declaration=True)
    return buf.getvalue()
