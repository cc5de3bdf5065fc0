"""`python -m harness grade DIR`: judge a folder of student submissions, one sub-folder each, in one go.

Each sub-folder holds the student's training log (*.log) and optionally its --save folder. Every submission is
judged exactly as `pytest -m gpu --from-log LOG --checkpoint-dir SAVE` judges it (harness.judge.submission), and
OUT gets grades.json, grades.md, grades.csv, grades-junit.xml and one <submission>/loss-curve.png each.
Exit code: 0 all passed, 1 any failed, 2 usage error.
"""

from __future__ import annotations

import csv
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.judge import criteria, plot
from harness.judge.submission import evidence, find_submission, judge_recorded


def add_arguments(parser) -> None:
    parser.add_argument("submissions", metavar="DIR", help="folder with one sub-folder per submission")
    parser.add_argument("--criteria", default="reference", metavar="PROFILE",
                        help="criteria profile: reference (default), course, megatron-lm, or a .toml path")
    parser.add_argument("--out", metavar="OUT", help="where the grades go (default: DIR/grades)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def grade_one(profile: criteria.Profile, folder: Path, out: Path) -> dict:
    """One submission's grade as a JSON-able dict; its picture is written to OUT/<name>/loss-curve.png."""
    sub = find_submission(folder)
    entry = {"submission": sub.name, "log": str(sub.log) if sub.log else None,
             "save_dir": str(sub.save_dir) if sub.save_dir else None}
    if sub.log is None:
        return {**entry, "verdict": "fail", "failed": ["submission"], "not_measured": [], "recipe": None,
                "diagnosis": sub.problem, "diagnosis_id": "no-log", "diagnosis_cause": sub.problem, "criteria": [],
                "loss_curve": None}
    ev = evidence(sub.logs, sub.save_dir)
    j = judge_recorded(profile, ev)
    picture = plot.loss_curve(out / sub.name / "loss-curve.png", ev.log, profile.for_recipe(j.recipe).golden,
                              f"{sub.name} (recipe {j.recipe or '?'})", j.verdict)
    return {**entry, "verdict": j.verdict, "failed": j.ids(criteria.FAIL), "not_measured": j.ids(criteria.NOT_MEASURABLE),
            "recipe": j.recipe, "recipe_detected_by": j.recipe_how, "provenance": list(j.provenance),
            "diagnosis": j.diagnosis.summary() if j.diagnosis else None,
            "diagnosis_id": j.diagnosis.cause_id if j.diagnosis else None,
            "diagnosis_cause": j.diagnosis.cause if j.diagnosis else None,
            "criteria": [{"id": v.criterion_id, "status": v.status, "measured": v.measured, "expected": v.expected,
                          "where": v.where, "consequence_of": v.consequence_of, "message": v.message}
                         for v in j.verdicts],
            "loss_curve": str(picture.relative_to(out)) if picture else None}


def markdown(grades: list, profile: str) -> str:
    """One table, a row per submission; root cause before the list of failed criteria."""
    rows = [f"# Grades (profile `{profile}`)", "",
            f"{sum(g['verdict'] == 'pass' for g in grades)} of {len(grades)} passed. n/m = not measured from a log "
            "alone (never counted as a pass).", "",
            "| submission | verdict | recipe | root cause | failed | not measured | loss curve |",
            "|---|---|---|---|---|---|---|"]
    for g in grades:
        picture = f"![]({g['loss_curve']})" if g["loss_curve"] else ""
        cause = f"**{g['diagnosis_id']}**: {g['diagnosis_cause']}".replace("|", "\\|") if g["diagnosis_id"] else ""
        own = [c["id"] for c in g["criteria"] if c["status"] == criteria.FAIL and not c["consequence_of"]]
        unreached = len(g["failed"]) - len(own) if g["criteria"] else 0
        failed = ", ".join(own) + (f" (+{unreached} not reached: consequences of the root cause)" if unreached else "")
        rows.append(f"| {g['submission']} | **{g['verdict'].upper()}** | {g['recipe'] or '?'} | {cause} | "
                    f"{failed or ', '.join(g['failed'])} | {', '.join(g['not_measured'])} | {picture} |")
    notes = [f"- {g['submission']}: " + "; ".join(g["provenance"]).replace("|", "\\|")
             for g in grades if g.get("provenance")]
    return "\n".join(rows + (["", "Logs (how each submission's logs were read, stitched or chosen):", *notes]
                             if notes else [])) + "\n"


def write_csv(path: Path, grades: list, ids: list) -> None:
    """A gradebook: one row per submission, one column per criterion."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["submission", "verdict", "recipe", "diagnosis", *ids])
        for g in grades:
            status = {c["id"]: c["status"] for c in g["criteria"]}
            w.writerow([g["submission"], g["verdict"], g["recipe"] or "", g["diagnosis"] or "",
                        *(status.get(i, "") for i in ids)])


def junit(grades: list, profile: str) -> ET.ElementTree:
    """One testcase per submission x criterion: failure for FAIL, skipped for not measured."""
    cases = [(g, c) for g in grades for c in g["criteria"]] + [(g, None) for g in grades if not g["criteria"]]
    suite = ET.Element("testsuite", name=f"grades-{profile}", tests=str(len(cases)),
                       failures=str(sum(1 for _, c in cases if c is None or c["status"] == criteria.FAIL)),
                       skipped=str(sum(1 for _, c in cases if c and c["status"] == criteria.NOT_MEASURABLE)))
    for g, c in cases:
        case = ET.SubElement(suite, "testcase", classname=g["submission"], name=c["id"] if c else "submission")
        if c is None:
            ET.SubElement(case, "failure", message=g["diagnosis"] or "not judged").text = g["diagnosis"]
        elif c["status"] == criteria.FAIL:
            ET.SubElement(case, "failure", message=c["message"].splitlines()[0]).text = c["message"]
        elif c["status"] == criteria.NOT_MEASURABLE:
            ET.SubElement(case, "skipped", message=c["measured"])
    return ET.ElementTree(suite)


def main(args) -> int:
    """Grade every sub-folder of DIR; 1 when any submission failed, 2 on a usage error."""
    root = Path(args.submissions).expanduser()
    if not root.is_dir():
        print(f"error: {root}: no such folder; give a folder with one sub-folder per submission", file=sys.stderr)
        return 2
    try:
        profile = criteria.load_profile(args.criteria)
    except criteria.CriteriaError as exc:
        print(f"error: --criteria {args.criteria}: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).expanduser() if args.out else root / "grades"
    folders = sorted(p for p in root.iterdir() if p.is_dir() and p.resolve() != out.resolve()
                     and not p.name.startswith("."))
    if not folders:
        print(f"error: {root}: no sub-folders; put each submission (its *.log, optionally its --save folder) "
              "in a folder of its own", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm

    grades = [grade_one(profile, f, out)
              for f in tqdm(folders, desc="grading", unit="submission", disable=args.no_progress, file=sys.stderr)]
    ids = profile.ids
    (out / "grades.json").write_text(json.dumps(grades, indent=2) + "\n")
    (out / "grades.md").write_text(markdown(grades, profile.name))
    write_csv(out / "grades.csv", grades, ids)
    tree = junit(grades, profile.name)
    ET.indent(tree)
    tree.write(out / "grades-junit.xml", encoding="utf-8", xml_declaration=True)
    failed = [g["submission"] for g in grades if g["verdict"] != "pass"]
    print(f"{len(grades) - len(failed)} of {len(grades)} submissions passed; grades in {out}/grades.md"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
