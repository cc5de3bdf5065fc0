"""Copies across a batch: two submissions whose timings and timestamps coincide beyond chance are one run.

Losses prove nothing here: every student who runs the course's command with the default seed prints the same
losses to the last digit (Megatron-LM repeats a run exactly on one GPU kind). What a run never repeats is its
timing: the wall-clock timestamps (microseconds) and, on Megatron-LM, the elapsed time per iteration (its scatter
between lines is milliseconds, printed to 0.1 ms). Measured over the real logs in the repository (33 Megatron-LM
runs, 7 of the reference trainer): no two distinct runs share a timestamp; two Megatron-LM runs agree within 0.1 ms
in at most 14% of their lines; the trainer's CUDA-graph timings are so steady (7.4 ms at almost every line) that
equal elapsed times prove nothing there, so they count only for a log whose own elapsed times scatter by
NOISE_MIN_MS or more. A pair is named a copy (both names, each grade gets a failing ``log-copy`` verdict) when:

- SAME_STAMPS or more of their iteration lines carry the same timestamp, or
- at least half of their lines (and 3) are separated by the same microseconds from the line before (a copy with
  its clock shifted), or
- their elapsed times agree within one print unit (0.1 ms) at NEAR_FRACTION or more of NEAR_MIN or more lines
  and both logs' elapsed times scatter by NOISE_MIN_MS or more (a copy whose timings were jittered by a print
  unit). A copy jittered by more than that, with timestamps rewritten to match, is not claimed here (docs/trust.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from statistics import median

from harness.evidence.logformat import TIMESTAMP_FORMAT, ParsedLog
from harness.judge.profiles import FAIL, Verdict

CHECK_ID = "log-copy"
LABEL = "the log is this submission's own run (no other submission's timings)"
EXPECTED = ("no other submission of the batch with the same timestamps, the same times between lines, or the same "
            "elapsed times (identical losses are normal: same flags, same seed)")
SAME_STAMPS = 2
SAME_DELTA_FRACTION = 0.5
SAME_DELTA_MIN = 3
NEAR_MS = 0.1 + 1e-9
NEAR_FRACTION = 0.9
NEAR_MIN = 10
NOISE_MIN_MS = 1.0
# annotate() reads the logs again in the grader's own process, outside the bounded workers that judged them: a
# submission whose logs are larger than this (a course run's is ~0.2 MB) is not compared, so the pass stays bounded
READ_LIMIT_BYTES = 64 << 20


@dataclass(frozen=True)
class Fingerprint:
    """The timing of one log: iteration -> (elapsed ms, throughput, timestamp text, microseconds since the line
    before or None); noise: the median |change| of the elapsed time from line to line."""

    points: dict
    noise: float

    @classmethod
    def of(cls, log: ParsedLog) -> "Fingerprint":
        points, prev = {}, None
        for rec in log.iterations:
            when = None
            if rec.timestamp:
                try:
                    when = datetime.strptime(rec.timestamp, TIMESTAMP_FORMAT)
                except ValueError:
                    when = None
            delta = round((when - prev).total_seconds() * 1e6) if when is not None and prev is not None else None
            points[rec.iteration] = (rec.elapsed_ms, rec.throughput, rec.timestamp, delta)
            prev = when
        ms = [p[0] for p in points.values()][1:]              # the first line carries the start-up time
        noise = median(abs(b - a) for a, b in zip(ms, ms[1:])) if len(ms) >= 3 else 0.0
        return cls(points, noise)


def compare(a: Fingerprint, b: Fingerprint) -> str | None:
    """Why two logs are one run ("identical timestamps at 20/21 iteration lines"), or None."""
    common = sorted(set(a.points) & set(b.points))
    if not common:
        return None
    n = len(common)
    stamps = sum(1 for i in common if a.points[i][2] and a.points[i][2] == b.points[i][2])
    if stamps >= SAME_STAMPS:
        return f"identical timestamps at {stamps}/{n} iteration lines"
    deltas = [i for i in common if a.points[i][3] is not None and b.points[i][3] is not None]
    same = sum(1 for i in deltas if a.points[i][3] == b.points[i][3])
    if same >= SAME_DELTA_MIN and same >= SAME_DELTA_FRACTION * len(deltas):
        return (f"identical times between lines (to the microsecond) at {same}/{len(deltas)} iteration lines: the "
                "same run with its clock shifted")
    if n >= NEAR_MIN and min(a.noise, b.noise) >= NOISE_MIN_MS:
        equal = sum(1 for i in common if a.points[i][0] == b.points[i][0])
        near = sum(1 for i in common if abs(a.points[i][0] - b.points[i][0]) <= NEAR_MS)
        if near >= NEAR_FRACTION * n:
            how = "identical" if equal == near else "within 0.1 ms"
            return (f"identical timings at {equal}/{n} iterations" if equal == near else
                    f"elapsed times {how} at {near}/{n} iterations ({equal} identical)")
    return None


def find_copies(logs: dict) -> dict:
    """{name: [(other name, why)]} for every submission that is a copy of another ({name: ParsedLog} in)."""
    prints = {name: Fingerprint.of(log) for name, log in logs.items() if log is not None and log.iterations}
    names = sorted(prints)
    out: dict = {}
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            why = compare(prints[x], prints[y])
            if why:
                out.setdefault(x, []).append((y, why))
                out.setdefault(y, []).append((x, why))
    return out


def verdict(name: str, matches: list, where: str = ""):
    """The failing ``log-copy`` verdict of one submission, naming every submission it shares its run with."""
    from harness.judge import criteria

    measured = "; ".join(f"copy of {other}'s log ({why})" for other, why in matches)
    message = criteria.FAILURE_TEMPLATE.format(
        status="FAIL", label=LABEL, criterion_id=CHECK_ID, measured=measured, expected=EXPECTED, where=where or name,
        artifacts=where or name, tail="    (see measured)",
        remedy="hand in the log of your own run: two submissions with one run's timings are graded as copies")
    return Verdict(CHECK_ID, LABEL, FAIL, measured, EXPECTED, where or name, message)


def annotate(grades: dict, folders: dict) -> list:
    """Copy detection over a graded batch: grades {key: grade dict} (harness.cli.grade's), folders {key: (name,
    folder)}; each judged submission's log is read again (bounded, as for grading), and each copy's grade gets the
    failing log-copy verdict, its verdict 'fail', the id in 'failed', and the copy as its root cause (every report
    shows it; a root cause the log had is kept after it). Returns the keys whose grade changed."""
    from pathlib import Path

    from harness.judge.submission import evidence, find_submission

    logs, names = {}, {}
    for key, grade in grades.items():
        if key not in folders or not grade.get("criteria"):
            continue                               # not judged (no log, refused, a grader error): nothing to compare
        name, folder = folders[key]
        try:
            sub = find_submission(Path(folder))
            size = sum(f.stat().st_size for unit in sub.logs for f, _ in unit)
            if size > READ_LIMIT_BYTES:
                continue                           # too large to read again here: no claim either way
            logs[key] = evidence(sub.logs).log if sub.logs else None
        except Exception:  # noqa: BLE001 - it was graded once; a log that cannot be read again is not a copy
            continue
        names[key] = name
    found = find_copies(logs)
    changed = []
    for key, matches in sorted(found.items()):
        grade = grades[key]
        v = verdict(names[key], [(names[k], why) for k, why in matches], grade.get("log") or names[key])
        grade["criteria"] = [*grade["criteria"], {"id": v.criterion_id, "status": v.status, "measured": v.measured,
                                                  "expected": v.expected, "where": v.where, "consequence_of": None,
                                                  "message": v.message}]
        grade["failed"] = [*grade.get("failed", []), CHECK_ID]
        if grade.get("verdict") == "pass":
            grade["verdict"] = "fail"
        earlier = grade.get("diagnosis")
        grade["diagnosis_id"], grade["diagnosis_cause"] = CHECK_ID, v.measured
        grade["diagnosis"] = f"{CHECK_ID}: {v.measured}" + (f" (and the log's own: {earlier})" if earlier else "")
        changed.append(key)
    return changed
