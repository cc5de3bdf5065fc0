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


# ---------------------------------------------------------------- grades.html

_HTML_SCRIPT = """
function applyFilters() {
  var v = document.getElementById('verdict').value, c = document.getElementById('cause').value, shown = 0;
  var rows = document.querySelectorAll('#grades tbody tr');
  for (var i = 0; i < rows.length; i++) {
    var ok = (!v || rows[i].dataset.verdict === v) && (!c || rows[i].dataset.cause === c);
    rows[i].hidden = !ok;
    if (ok) shown++;
  }
  document.getElementById('shown').textContent = shown + ' of ' + rows.length + ' shown';
  var h = [];
  if (v) h.push('verdict=' + encodeURIComponent(v));
  if (c) h.push('cause=' + encodeURIComponent(c));
  if (location.hash.slice(1) !== h.join('&')) history.replaceState(null, '', h.length ? '#' + h.join('&') : '#');
}
function fromHash() {
  var parts = location.hash.slice(1).split('&');
  for (var i = 0; i < parts.length; i++) {
    var kv = parts[i].split('='), el = document.getElementById(kv[0]);
    if ((kv[0] === 'verdict' || kv[0] === 'cause') && el) el.value = decodeURIComponent(kv[1] || '');
  }
  applyFilters();
}
document.getElementById('verdict').addEventListener('change', applyFilters);
document.getElementById('cause').addEventListener('change', applyFilters);
window.addEventListener('hashchange', fromHash);
fromHash();
"""
_HTML_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;width:100%}th,td{border:1px solid #ccc;padding:4px 6px;vertical-align:top;text-align:left}
th{background:#f0f0f0;position:sticky;top:0}.pass{color:#176f2c;font-weight:bold}.fail{color:#b00020;font-weight:bold}
.error,.died{color:#8a4b00;font-weight:bold}.incomplete{color:#555;font-weight:bold}
img{width:320px;height:auto}code{font-size:90%}.filters{margin:1em 0}.filters label{margin-right:1.5em}
"""
NO_CAUSE = "(none)"          # the cause filter's value for a grade without a root cause


def read_pictures(out, grades: list) -> dict:
    """The loss curves the grades name (OUT/submissions/<slot>/loss-curve.png, the grader's own files) as
    html_page takes them: read through no symlink and only inside OUT; one that cannot be read is left out."""
    from pathlib import Path

    from harness.base.paths import inside

    out, found = Path(out), {}
    for g in map(as_dict, grades):
        rel = g.get("loss_curve")
        path = out / rel if rel else None
        if path is None or path.is_symlink() or not inside(out, path):
            continue
        try:
            found[rel] = path.read_bytes()
        except OSError:
            pass
    return found


def _html_options(values, empty: str) -> str:
    from html import escape

    return "".join([f'<option value="">{escape(empty)}</option>',
                    *(f'<option value="{escape(v, quote=True)}">{escape(v)}</option>' for v in values)])


def html_page(grades: list, profile: str, pictures: dict | None = None, incomplete: bool = False) -> str:
    """grades.html: one self-contained page a course grader opens in a browser: the table of grades.md, filters by
    verdict and by root cause (also from the address: grades.html#verdict=fail&cause=nan), each loss curve inline
    as a data: URI (pictures: its grades' loss_curve path -> PNG bytes; a picture not given is left out). Every
    quoted text is HTML-escaped; the page loads nothing (its Content-Security-Policy forbids it)."""
    import base64
    from html import escape

    pictures = pictures or {}
    grades = [as_dict(g) for g in grades]
    label = STATE_LABELS[NOT_MEASURABLE]
    verdicts = [v for v in (*VERDICTS, "died") if any(g["verdict"] == v for g in grades)]
    causes = sorted({g.get("diagnosis_id") or NO_CAUSE for g in grades})
    rows = []
    for g in grades:
        own = [c["id"] for c in g["criteria"] if c["status"] == FAIL and not c["consequence_of"]]
        unreached = len(g["failed"]) - len(own) if g["criteria"] else 0
        failed = ", ".join(own or ([] if g["criteria"] else g["failed"]))
        if unreached:
            failed += f" (+{unreached} not reached: consequences of the root cause)"
        cause = (f"<b>{escape(g['diagnosis_id'])}</b>: {escape(visible(g.get('diagnosis_cause') or ''))}"
                 if g.get("diagnosis_id") else "")
        png = pictures.get(g.get("loss_curve") or "")
        picture = (f'<img alt="loss curve of {escape(visible(g["submission"]), quote=True)}" '
                   f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">' if png else "")
        rows.append(
            f'<tr data-verdict="{escape(g["verdict"], quote=True)}" '
            f'data-cause="{escape(g.get("diagnosis_id") or NO_CAUSE, quote=True)}">'
            f'<td>{escape(visible(g["submission"]))}</td><td class="{escape(g["verdict"], quote=True)}">'
            f'{escape(g["verdict"].upper())}</td><td>{escape(visible(g.get("recipe") or "?"))}</td><td>{cause}</td>'
            f'<td>{escape(visible(failed))}</td><td>{escape(visible(", ".join(g["not_measured"])))}</td>'
            f'<td>{picture}</td></tr>')
    passed = sum(g["verdict"] == "pass" for g in grades)
    banner = ('<p><b>INCOMPLETE</b>: the grader was interrupted; the submissions marked incomplete were not graded. '
              'Run it again to grade them.</p>' if incomplete else "")
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">",
        f"<title>Grades (profile {escape(visible(profile))})</title><style>{_HTML_STYLE}</style></head><body>",
        f"<h1>Grades (profile <code>{escape(visible(profile))}</code>)</h1>", banner,
        f'<p id="summary">{passed} of {len(grades)} passed. {escape(label)}: a criterion its files cannot show '
        f"(<code>{escape(NOT_MEASURABLE)}</code> in grades.json and grades.csv), never counted as a pass.</p>",
        '<div class="filters"><label>verdict <select id="verdict">' + _html_options(verdicts, "all") + "</select></label>"
        '<label>root cause <select id="cause">' + _html_options(causes, "all") + "</select></label>"
        f'<span id="shown">{len(grades)} of {len(grades)} shown</span></div>',
        '<table id="grades"><thead><tr><th>submission</th><th>verdict</th><th>recipe</th><th>root cause</th>'
        f"<th>failed</th><th>{escape(label)}</th><th>loss curve</th></tr></thead><tbody>",
        *rows,
        "</tbody></table>",
        f"<script>{_HTML_SCRIPT}</script>",
        "</body></html>",
    ]) + "\n"
