"""`python -m harness bench grade`: how fast `python -m harness grade` judges a large batch.

Generates N synthetic submissions from the recorded logs (the good recipe (a) and (b) runs and mutants of them:
NaN at 120, stopped at 150, loss too high, late skips), grades them with `python -m harness grade` in a fresh
process (interpreter start-up included), and reports submissions per second. Goal: 1,000 submissions in <= 60 s
on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.base import paths
from harness.base.proc import usable_cores
from harness.evidence import mutants

GOAL_S = 60.0


def variants() -> list:
    """(name, log text) of the kinds of submissions a batch holds."""
    a = (paths.RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log").read_text()
    b = (paths.RECORDED_LOGS / "reference_trainer_h200_recipe_b_seed1234.log").read_text()
    return [("good-a", a), ("good-b", b), ("nan", mutants.nan_at(120)(a)), ("stopped", mutants.stopped_at(150)(a)),
            ("high-loss", mutants.loss_too_high(a)), ("late-skips", mutants.skips_late()(a))]


def make_batch(root: Path, n: int) -> Path:
    """n submission folders, the variants in turn, each with its log as train.log."""
    kinds = variants()
    for i in range(n):
        name, text = kinds[i % len(kinds)]
        folder = root / f"student-{i:05d}-{name}"
        folder.mkdir(parents=True)
        (folder / "train.log").write_text(text)
    return root


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness bench grade", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=1000, help="number of submissions (default 1000)")
    p.add_argument("--jobs", type=int, default=0, help="passed to grade --jobs (default: one per core)")
    p.add_argument("--out", type=Path, default=None, help="also write the result there as JSON")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
        batch = make_batch(Path(tmp) / "submissions", args.n)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(paths.REPO), os.environ.get("PYTHONPATH", "")]))
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "harness", "grade", str(batch), "--out", str(Path(tmp) / "out"),
                               "--no-progress", "--jobs", str(args.jobs)], capture_output=True, text=True, env=env)
        wall = time.perf_counter() - started
        graded = len(json.loads((Path(tmp) / "out" / "grades.json").read_text()))
    cores = usable_cores()
    result = {"date": time.strftime("%Y-%m-%d"), "host": platform.node(), "cores": cores, "jobs": args.jobs or cores,
              "submissions": args.n, "graded": graded, "exit_code": done.returncode, "wall_s": round(wall, 2),
              "submissions_per_s": round(args.n / wall, 1), "goal": f"{1000 / GOAL_S:.1f}/s (1000 in {GOAL_S:g} s)",
              "met": args.n / wall >= 1000 / GOAL_S}
    if done.returncode not in (0, 1):
        print(done.stderr[-3000:], file=sys.stderr)
    print(json.dumps(result, indent=2))
    if args.out:
        paths.write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    return 0 if graded == args.n and done.returncode in (0, 1) else 1
