"""Replay tolerances per precision, derived from replays of honest real runs by one stated rule.

    python -m harness replay-tolerance REPLAY_DIR [--logs DIR ...] [--holdout-seed 1234] [--write]

REPLAY_DIR holds what `python -m harness replay` wrote (replay.json and runs/<name>/replay-<name>.log); --logs are
the folders the replayed submissions' own logs came from (default: fixtures/logs). For every replayed submission
whose name is an honest real run (not a copy, not forged), every lm loss both logs print is compared: the training
loss at --train-iters is a "final" point, every other point an "interval" point. Per precision (the run's
arguments block: fp16, bf16, fp32):

- rule: tolerance = 1.5 x the largest |d| over the derivation runs (every seed but --holdout-seed), the rule the
  fp16 tolerance was made by;
- held out: the runs of --holdout-seed are checked against it (false alarms: held-out points over the tolerance);
- margin: how far the nearest forgery in REPLAY_DIR (a row named forged-*) lies beyond its precision's tolerance.

--write puts each precision the derivation covers into fixtures/golden/replay_tolerance.toml (fp16 is kept when
present: it was measured over 16 seeds); the report is printed as JSON either way.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from harness.base import paths
from harness.cli import replay
from harness.evidence.logs import parse_log_file

RULE_FACTOR = 1.5
SEED = re.compile(r"-s(\d+)$")


def _original(name: str, roots: list) -> Path | None:
    for root in roots:
        for suffix in (".log.gz", ".log"):
            hit = sorted(Path(root).rglob(f"{name}{suffix}"))
            if hit:
                return hit[0]
    return None


def deltas(replay_dir: Path, roots: list) -> list:
    """[(name, precision, seed, kind, |d|)] for every point of every honest replayed run."""
    rows = json.loads((replay_dir / "replay.json").read_text())
    out = []
    for row in rows:
        name = row["submission"]
        unjudged = row.get("status") == "not-replayed" and str(row.get("text", "")).startswith(
            "not judged: no replay tolerance")          # replayed, but its precision has no tolerance yet
        if name.startswith(("copy-", "forged-")) or row.get("status") not in ("reproduced", "not-reproduced") \
                and not unjudged:
            continue
        original = _original(name, roots)
        own = replay_dir / "runs" / name / f"replay-{name}.log"
        if original is None or not own.is_file():
            continue
        log, again = parse_log_file(original), parse_log_file(own)
        precision = replay.precision_of(log.arguments)
        seed = SEED.search(name)
        last = log.iterations[-1].train_iters if log.iterations else None
        mine, theirs = replay._points(log), replay._points(again)
        for key in set(mine) & set(theirs):
            a, b = mine[key], theirs[key]
            if math.isfinite(a) and math.isfinite(b):
                kind = "final" if key == ("train", last) else "interval"
                out.append((name, precision, int(seed.group(1)) if seed else None, kind, abs(a - b)))
    return out


def derive(points: list, holdout_seed: int) -> dict:
    """{precision: {final_tol, interval_tol, derived from, held out, false alarms, largest held-out |d|}}."""
    report = {}
    for precision in replay.PRECISIONS:
        mine = [p for p in points if p[1] == precision]
        derive_from = [p for p in mine if p[2] != holdout_seed]
        held = [p for p in mine if p[2] == holdout_seed]
        if not derive_from:
            continue
        tol = {}
        for kind in ("final", "interval"):
            measured = max((p[4] for p in derive_from if p[3] == kind), default=None)
            tol[kind] = None if measured is None else {"largest": round(measured, 6),
                                                       "tol": round(RULE_FACTOR * measured, 4)}
        alarms = [p for p in held if tol[p[3]] is not None and p[4] > tol[p[3]]["tol"]]
        report[precision] = {
            "final_tol": tol["final"] and tol["final"]["tol"], "interval_tol": tol["interval"] and tol["interval"]["tol"],
            "largest_final_d": tol["final"] and tol["final"]["largest"],
            "largest_interval_d": tol["interval"] and tol["interval"]["largest"],
            "derived_from": sorted({p[0] for p in derive_from}), "held_out": sorted({p[0] for p in held}),
            "held_out_points": len(held), "false_alarms": [f"{p[0]} {p[3]} |d| {p[4]:.4g}" for p in alarms],
            "largest_held_out_d": round(max((p[4] for p in held), default=0.0), 6)}
    return report


def forgery_margins(replay_dir: Path) -> list:
    rows = json.loads((replay_dir / "replay.json").read_text())
    return [f"{r['submission']}: {r.get('text')}" for r in rows if r["submission"].startswith("forged-")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness replay-tolerance", description=__doc__.split("\n")[0])
    parser.add_argument("replay_dir", type=Path)
    parser.add_argument("--logs", nargs="*", type=Path, default=[paths.FIXTURES / "logs"])
    parser.add_argument("--holdout-seed", type=int, default=1234)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    report = derive(deltas(args.replay_dir, args.logs), args.holdout_seed)
    report["forgeries"] = forgery_margins(args.replay_dir)
    print(json.dumps(report, indent=1))
    if args.write:
        _write(report)
    return 0


def _write(report: dict) -> None:
    path = replay.TOLERANCE_FILE
    text = path.read_text()
    for precision in ("bf16", "fp32"):
        r = report.get(precision)
        if not r or r["final_tol"] is None or r["interval_tol"] is None or f"[{precision}]" in text:
            continue
        text += (f"\n# {precision}: derived by python -m harness replay-tolerance (rule: 1.5 x the largest |d| of "
                 f"{len(r['derived_from'])} runs, {', '.join(r['derived_from'])}); largest final |d| "
                 f"{r['largest_final_d']}, interval {r['largest_interval_d']}; held out "
                 f"{', '.join(r['held_out'])}: {len(r['false_alarms'])} false alarm(s) over {r['held_out_points']} "
                 f"points, largest |d| {r['largest_held_out_d']}\n[{precision}]\ninterval_tol = {r['interval_tol']}\n"
                 f"final_tol = {r['final_tol']}\n")
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
