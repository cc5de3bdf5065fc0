"""The four grades files of `python -m harness grade`, each read back by the reader it is written for, compared with
verdicts computed independently (criteria.judge on the same logs), never with another of the grader's files.

- grades.csv through csv.DictReader: the header is exactly the fixed columns then the profile's ids (a lost or
  shifted column fails), every row's verdict, recipe, diagnosis and every criterion's status;
- grades-junit.xml through xml.etree: suite counts, one testcase per submission x criterion named by the criterion
  id, <failure> exactly for the failed ones (its message the verdict's first line), <skipped> for not measured;
- grades.json against a schema (SCHEMA below: keys, types, allowed values) and then value by value;
- grades.md: one table row per submission, the verdict of each, and the "N of M passed" line.

test_gradebook_properties.py covers hostile text and random bytes; this module covers meaning.
"""

from __future__ import annotations

import argparse
import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli import grade
from harness.judge import criteria
from harness.report import gradebook
from harness.evidence import mutants
from harness.base.paths import FIXTURES, RECORDED_LOGS
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, load_profile

PROFILES = ("reference", "course")
GOOD_A = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
GOOD_B = RECORDED_LOGS / "reference_trainer_h200_recipe_b_seed1234.log"
FIXED_COLUMNS = ["submission", "verdict", "detected_recipe", "diagnosis"]
PROVENANCE_ID = "log-provenance"     # judge_recorded's last verdict: which logs were judged (not a profile criterion)
# judge_recorded's own verdicts, after the profile's: log-provenance and log-consistent (harness.judge.consistency)
GRADER_IDS = {PROVENANCE_ID, "log-consistent"}

# grades.json: key -> allowed types (a tuple) or allowed values (a set); criteria entries likewise
SCHEMA = {"submission": (str,), "log": (str, type(None)), "save_dir": (str, type(None)),
          "verdict": set(gradebook.VERDICTS), "failed": (list,), "not_measured": (list,),
          "recipe": (str, type(None)), "recipe_detected_by": (str, type(None)),
          "diagnosis": (str, type(None)), "diagnosis_id": (str, type(None)), "diagnosis_cause": (str, type(None)),
          "criteria": (list,), "loss_curve": (str, type(None))}
OPTIONAL = {"provenance": (list,)}
CRITERION_SCHEMA = {"id": (str,), "status": {PASS, FAIL, NOT_MEASURABLE},
                    "measured": (str,), "expected": (str,), "where": (str, type(None)),
                    "consequence_of": (str, type(None)), "message": (str,)}


def schema_problems(doc, schema: dict, optional: dict, where: str) -> list:
    """Every way `doc` breaks `schema` (missing or unknown key, wrong type, value outside its set)."""
    if not isinstance(doc, dict):
        return [f"{where}: not an object"]
    problems = [f"{where}: missing {k!r}" for k in schema if k not in doc]
    problems += [f"{where}: unknown key {k!r}" for k in doc if k not in schema and k not in optional]
    for key, rule in {**schema, **optional}.items():
        if key not in doc:
            continue
        value = doc[key]
        if isinstance(rule, set) and value not in rule:
            problems.append(f"{where}.{key}: {value!r} not one of {sorted(rule)}")
        elif isinstance(rule, tuple) and not isinstance(value, rule):
            problems.append(f"{where}.{key}: {type(value).__name__}, expected {'/'.join(t.__name__ for t in rule)}")
    return problems


def _submissions(root: Path) -> dict:
    """name -> train.log path (None: a folder without a log); passing, failing and crashed runs of both recipes."""
    text_a = GOOD_A.read_text()
    logs_by_name = {
        "good-a": text_a,
        "good-b": GOOD_B.read_text(),
        "loss-too-high": mutants.loss_too_high(text_a),
        "stopped-at-120": mutants.stopped_at(120)(text_a),
        "late-skips": mutants.skips_late()(text_a),
        "cuda-oom": (FIXTURES / "diagnoses" / "cuda-oom.log").read_text(),
    }
    found = {}
    for name, text in logs_by_name.items():
        (root / name).mkdir(parents=True)
        found[name] = root / name / "train.log"
        found[name].write_text(text)
    (root / "no-log").mkdir()
    found["no-log"] = None
    return found


@pytest.fixture(scope="module", params=PROFILES)
def graded(request, tmp_path_factory) -> tuple:
    """(profile, {name: independent Judgement or None}, OUT) after one `grade` run in this process."""
    profile = load_profile(request.param)
    root = tmp_path_factory.mktemp(f"batch-{request.param}")
    found = _submissions(root / "in")
    parser = argparse.ArgumentParser()
    grade.add_arguments(parser)
    out = root / "out"
    args = parser.parse_args([str(root / "in"), "--out", str(out), "--criteria", request.param, "--jobs", "1",
                              "--no-progress", "--no-copy-detection"])    # made from two logs: copies by design
    code = grade.main(args)
    assert code == grade.EXIT_FAILED    # some submissions fail
    judged = {name: None if log is None else criteria.judge(profile, criteria.evidence_from_log_file(log))
              for name, log in found.items()}
    return profile, judged, out


def _verdict(j) -> str:
    """The submission's verdict from its independent Judgement (a folder without a log fails)."""
    return "fail" if j is None else j.verdict


def test_submissions_cover_pass_fail_and_not_measured(graded):
    """The batch is worth reading back: passes, failures and not-measured criteria all occur."""
    profile, judged, _ = graded
    statuses = {v.status for j in judged.values() if j for v in j.verdicts}
    assert statuses == {PASS, FAIL, NOT_MEASURABLE}
    verdicts = {_verdict(j) for j in judged.values()}
    # the course's own final-loss band (6-7) fails every real run; the reference profile passes the good ones
    assert "fail" in verdicts and ("pass" in verdicts) == (profile.name == "reference")


def test_csv_read_by_dictreader_has_every_column_and_every_criterion(graded):
    profile, judged, out = graded
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        header = reader.fieldnames
    assert header == FIXED_COLUMNS + profile.ids, "grades.csv's header lost, gained or moved a column"
    assert [r["submission"] for r in rows] == sorted(judged)
    for row in rows:
        assert None not in row and all(v is not None for v in row.values()), row   # no cell without a column
        j = judged[row["submission"]]
        assert row["verdict"] == _verdict(j), row
        if j is None:
            assert row["diagnosis"].startswith("no-log") and all(row[cid] == "" for cid in profile.ids)
            continue
        assert row["detected_recipe"] == (j.recipe or "")
        assert row["diagnosis"] == (gradebook.csv_cell(j.diagnosis.summary()) if j.diagnosis else "")
        assert {cid: row[cid] for cid in profile.ids} == {v.criterion_id: v.status for v in j.verdicts}


def test_junit_read_by_an_xml_parser_names_every_case_and_failure(graded):
    profile, judged, out = graded
    suite = ET.parse(out / "grades-junit.xml").getroot()
    expected_cases = {}
    for name, j in judged.items():
        if j is None:
            expected_cases[(name, "submission")] = ("failure", None)
            continue
        for v in j.verdicts:
            kind = {PASS: None, FAIL: "failure", NOT_MEASURABLE: "skipped"}[v.status]
            expected_cases[(name, v.criterion_id)] = (kind, v.message.splitlines()[0] if kind == "failure" else None)
    cases = {(c.get("classname"), c.get("name")): c for c in suite.findall("testcase")}
    ours = {k: v for k, v in cases.items() if k[1] not in GRADER_IDS}
    assert set(ours) == set(expected_cases)
    assert {k[0] for k in cases if k[1] in GRADER_IDS} == {n for n, j in judged.items() if j is not None}
    for key, (kind, first_line) in expected_cases.items():
        children = [e.tag for e in cases[key]]
        assert children == ([kind] if kind else []), (key, children)
        if first_line is not None:
            assert cases[key].find("failure").get("message") == first_line
    fails = sum(kind == "failure" for kind, _ in expected_cases.values())
    skips = sum(kind == "skipped" for kind, _ in expected_cases.values())
    provenance = [c for k, c in cases.items() if k[1] in GRADER_IDS]
    assert int(suite.get("tests")) == len(expected_cases) + len(provenance)
    assert int(suite.get("failures")) == fails + sum(c.find("failure") is not None for c in provenance)
    assert int(suite.get("skipped")) == skips + sum(c.find("skipped") is not None for c in provenance)
    assert int(suite.get("errors")) == 0
    assert suite.get("name") == f"grades-{profile.name}"


def test_json_matches_the_schema_and_the_independent_verdicts(graded):
    profile, judged, out = graded
    doc = json.loads((out / "grades.json").read_text(encoding="utf-8"))
    assert isinstance(doc, list) and len(doc) == len(judged)
    problems = []
    for i, g in enumerate(doc):
        problems += schema_problems(g, SCHEMA, OPTIONAL, f"[{i}]")
        for k, c in enumerate(g.get("criteria", [])):
            problems += schema_problems(c, CRITERION_SCHEMA, {}, f"[{i}].criteria[{k}]")
    assert not problems, "\n".join(problems)
    for g in doc:
        j = judged[g["submission"]]
        assert g["verdict"] == _verdict(j)
        if j is None:
            assert g["criteria"] == [] and g["failed"] == ["submission"] and g["diagnosis_id"] == "no-log"
            continue
        mine = [c for c in g["criteria"] if c["id"] not in GRADER_IDS]
        assert [(c["id"], c["status"], c["measured"], c["expected"]) for c in mine] == [
            (v.criterion_id, v.status, v.measured, v.expected) for v in j.verdicts]
        assert [c for c in g["failed"] if c not in GRADER_IDS] == j.ids(FAIL)
        assert [c for c in g["not_measured"] if c not in GRADER_IDS] == j.ids(NOT_MEASURABLE)
        assert g["recipe"] == j.recipe
        assert g["diagnosis_id"] == (j.diagnosis.cause_id if j.diagnosis else None)


def test_markdown_has_one_row_per_submission_with_its_verdict(graded):
    profile, judged, out = graded
    md = (out / "grades.md").read_text(encoding="utf-8")
    table = [line for line in md.splitlines() if line.startswith("| ")]
    header, rows = table[0], table[1:]
    assert header.startswith("| submission | verdict |")
    assert len(rows) == len(judged)
    for row, name in zip(rows, sorted(judged)):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[0] == gradebook.md_cell(name) and cells[1] == f"**{_verdict(judged[name]).upper()}**", row
    passed = sum(_verdict(j) == "pass" for j in judged.values())
    assert f"{passed} of {len(judged)} passed." in md
