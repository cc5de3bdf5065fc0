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

import hashlib
import itertools
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
# The fingerprint a judging worker hands back to the grader (copy detection runs on these alone, never on a
# submission's files): its first MAX_POINTS iteration lines (a course run logs 21, log-interval 1 gives 200), each
# timestamp text longer than MAX_STAMP_CHARS replaced by its digest (equal texts, equal digests).
MAX_POINTS = 1000
MAX_STAMP_CHARS = 64


def _stamp(text):
    if text is None or len(text) <= MAX_STAMP_CHARS:
        return text
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class Fingerprint:
    """The timing of one log: iteration -> (elapsed ms, timestamp text, microseconds since the line before or
    None) for its first MAX_POINTS iteration lines; noise: the median |change| of the elapsed time from line to
    line, over all of them."""

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
            points[rec.iteration] = (rec.elapsed_ms, _stamp(rec.timestamp), delta)
            prev = when
        ms = [p[0] for p in points.values()][1:]              # the first line carries the start-up time
        noise = median(abs(b - a) for a, b in zip(ms, ms[1:])) if len(ms) >= 3 else 0.0
        if len(points) > MAX_POINTS:
            points = dict(itertools.islice(points.items(), MAX_POINTS))
        return cls(points, noise)

    def to_json(self) -> dict:
        """JSON-able: {"noise": ms, "points": [[iteration, elapsed ms, timestamp, delta], ...]}."""
        return {"noise": self.noise, "points": [[i, *p] for i, p in self.points.items()]}

    @classmethod
    def from_json(cls, data) -> "Fingerprint":
        """What to_json wrote (from a judging worker); ValueError when it is not that."""
        if not isinstance(data, dict) or not isinstance(data.get("points"), list):
            raise ValueError("not a fingerprint")
        noise, rows = data.get("noise"), data["points"]
        if not isinstance(noise, (int, float)) or isinstance(noise, bool) or len(rows) > MAX_POINTS:
            raise ValueError("not a fingerprint")
        points = {}
        for row in rows:
            if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], int)
                    and isinstance(row[1], (int, float)) and (row[2] is None or isinstance(row[2], str))
                    and (row[3] is None or isinstance(row[3], int))):
                raise ValueError("not a fingerprint")
            if isinstance(row[2], str) and len(row[2]) > MAX_STAMP_CHARS + 7:     # 7: "sha256:"
                raise ValueError("not a fingerprint")
            points[row[0]] = (row[1], row[2], row[3])
        return cls(points, noise)


def compare(a: Fingerprint, b: Fingerprint) -> str | None:
    """Why two logs are one run ("identical timestamps at 20/21 iteration lines"), or None."""
    common = sorted(set(a.points) & set(b.points))
    if not common:
        return None
    n = len(common)
    stamps = sum(1 for i in common if a.points[i][1] and a.points[i][1] == b.points[i][1])
    if stamps >= SAME_STAMPS:
        return f"identical timestamps at {stamps}/{n} iteration lines"
    deltas = [i for i in common if a.points[i][2] is not None and b.points[i][2] is not None]
    same = sum(1 for i in deltas if a.points[i][2] == b.points[i][2])
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
    return matches({name: Fingerprint.of(log) for name, log in logs.items() if log is not None and log.iterations})


def matches(prints: dict) -> dict:
    """{name: [(other name, why)]} for every submission that is a copy of another ({name: Fingerprint} in; a
    fingerprint without points is compared with nothing)."""
    prints = {name: fp for name, fp in prints.items() if fp is not None and fp.points}
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


def annotate(grades: dict, prints: dict) -> dict:
    """Copy detection over a graded batch, on the fingerprints its judging workers returned (no file is read):
    grades {key: Grade}, prints {key: (name, Fingerprint)} of the judged submissions. Returns {key: Grade} of every
    copy: the grade with the failing log-copy verdict added (Grade.with_copy: verdict 'fail', the id in 'failed',
    the copy its root cause, shown by every report; a root cause the log had is kept after it)."""
    found = matches({key: fp for key, (_, fp) in prints.items() if key in grades and grades[key].criteria})
    changed = {}
    for key, pairs in sorted(found.items()):
        grade = grades[key]
        name = prints[key][0]
        changed[key] = grade.with_copy(verdict(name, [(prints[k][0], why) for k, why in pairs], grade.log or name))
    return changed
