"""The session's verdict as files: report.json (machine-readable) and report.md (for a grader).

Per run: what ran, how it ended, timings, memory, and one verdict per criterion; for mutants, whether
exactly the intended criteria failed. Results committed under results/ are these files.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from pathlib import Path

from harness.evidence.records import RankMemory
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS

STATUS_MARK = {PASS: "pass", FAIL: "FAIL", NOT_MEASURABLE: "n/m"}


def failed_ids(verdicts) -> set[str]:
    return {v.criterion_id for v in verdicts if v.status == FAIL}


def run_entry(outcome, judged) -> dict:
    """One run's block of the report; `judged` is a criteria.Judgement (or a plain list of verdicts)."""
    verdicts = list(getattr(judged, "verdicts", judged))
    cause = getattr(judged, "diagnosis", None)
    spec, stage, memory = outcome.spec, outcome.stage, outcome.memory
    entry = {
        "name": spec.name,
        "description": spec.description,
        "command": list(stage.argv) if stage else None,
        "exit_code": stage.returncode if stage else None,
        "timed_out": bool(stage and stage.timed_out),
        "seconds": round(outcome.seconds, 2),
        "log": str(stage.log_path) if stage else None,
        "ms_per_iter_median": outcome.summary.get("ms_per_iter_median"),
        "cuda_graphs": outcome.summary.get("cuda_graphs"),
        "memory": asdict(memory) if memory else None,
        "torch_max_allocated_mib": outcome.summary.get("torch_max_allocated_mib"),
        "trainer_phases_s": outcome.summary.get("phases_s"),
        "recipe": getattr(judged, "recipe", None),
        "diagnosis": None if cause is None else {"id": cause.cause_id, "cause": cause.cause, "remedy": cause.remedy,
                                                 "evidence": cause.evidence},
        "verdicts": [{"id": v.criterion_id, "label": v.label, "status": v.status, "measured": v.measured,
                      "expected": v.expected, "where": v.where, "consequence_of": v.consequence_of}
                     for v in verdicts],
    }
    if spec.is_mutant:
        failed = failed_ids(verdicts)
        entry["expected_failures"] = sorted(spec.expected_failures)
        entry["actual_failures"] = sorted(failed)
        entry["tolerated_failures"] = sorted(spec.tolerated_failures)
        entry["caught_exactly"] = spec.judge(failed) == ([], [])
    return entry


def build(profile_name: str, outcomes: dict, verdicts_by_run: dict, extra: dict | None = None) -> dict:
    """The whole report as a JSON-able dict."""
    versions = next((o.summary.get("versions") for o in outcomes.values() if o.summary.get("versions")), {})
    gpu = next((o.summary.get("gpu") for o in outcomes.values() if o.summary.get("gpu")), None)
    return {
        "profile": profile_name,
        "gpu": gpu,
        "versions": versions,
        "host": platform.node(),
        "runs": [run_entry(outcomes[name], verdicts) for name, verdicts in verdicts_by_run.items()],
        **(extra or {}),
    }


def markdown(report: dict) -> str:
    """A grader's summary: reference verdicts, then the mutant matrix."""
    out = [f"# bert-acceptance report (profile `{report['profile']}`)", "",
           f"GPU: {report.get('gpu') or 'none'}; versions: {report.get('versions')}", ""]
    if report.get("wall_s") is not None:
        out += [f"Session wall time: {report['wall_s']:.1f} s", ""]
    runs = report["runs"]
    good = [r for r in runs if "expected_failures" not in r]
    pictures = report.get("loss_curves") or {}
    for run in good:
        out += [f"## {run['name']}: {run['description']}", ""]
        if run.get("diagnosis"):
            d = run["diagnosis"]
            out += [f"**Root cause [{d['id']}]:** {d['cause']}  ", f"**Fix first:** {d['remedy']}", ""]
        out += [f"recipe {run.get('recipe') or '?'}, exit code {run['exit_code']}, {_rounded(run['seconds'])} s, "
                f"median {_rounded(run['ms_per_iter_median'])} ms/iter, CUDA graphs: {run['cuda_graphs']}", ""]
        ranks = (run.get("memory") or {}).get("ranks") or []
        if len(ranks) > 1:
            out += ["GPU memory per rank (NVML peak): " + "; ".join(
                f"{RankMemory(**r).label()} {r['peak_mib']:.0f} MiB" for r in ranks), ""]
        if pictures.get(run["name"]):
            out += [f"![loss curve of {run['name']}]({pictures[run['name']]})", ""]
        out += ["| criterion | status | measured | expected |", "|---|---|---|---|"]
        out += [f"| {v['id']} | {_mark(v)} | {v['measured']} | {v['expected']} |" for v in run["verdicts"]]
        out.append("")
    mutants = [r for r in runs if "expected_failures" in r]
    if mutants:
        ids = [v["id"] for v in mutants[0]["verdicts"]]
        out += ["## Mutants (x = failed as intended, (x) = tolerated; every mutant must fail exactly its intended criteria)", "",
                "| mutant | " + " | ".join(ids) + " | caught exactly |",
                "|---|" + "---|" * (len(ids) + 1)]
        for run in mutants:
            cells = [_cell(i, set(run["actual_failures"]), set(run["expected_failures"]),
                           set(run.get("tolerated_failures", ()))) for i in ids]
            out.append(f"| {run['name']} | " + " | ".join(cells) + f" | {'yes' if run['caught_exactly'] else 'NO'} |")
        out.append("")
    return "\n".join(out)


def _rounded(value, digits: int = 1) -> str:
    """A time as a reader uses it: 37.64834403991699 -> 37.6 (the JSON report keeps every digit); none: n/a."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.{digits}f}"
    return "n/a" if value is None else str(value)


def _mark(v: dict) -> str:
    """A verdict's status; a failure caused by the run's root cause says so."""
    mark = STATUS_MARK.get(v["status"], v["status"])
    return f"{mark} (consequence of {v['consequence_of']})" if v.get("consequence_of") else mark


def _cell(criterion_id: str, failed: set, expected: set, tolerated: set) -> str:
    """x: failed as intended; (x): a tolerated failure; MISSED / UNEXPECTED: the mutant matrix is wrong."""
    if criterion_id in expected:
        return "x" if criterion_id in failed else "MISSED"
    if criterion_id in failed:
        return "(x)" if criterion_id in tolerated else "UNEXPECTED"
    return ""


def write(run_dir: Path, report: dict) -> tuple[Path, Path]:
    run_dir = Path(run_dir)
    json_path, md_path = run_dir / "report.json", run_dir / "report.md"
    json_path.write_text(json.dumps(report, indent=2, default=str))
    md_path.write_text(markdown(report))
    return json_path, md_path
