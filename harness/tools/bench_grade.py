"""`python -m harness bench grade`: how fast `python -m harness grade` judges a large batch.

    python -m harness bench grade [-n 1000] [--jobs N] [--out FILE]
    python -m harness bench grade --batch DIR [--batch DIR ...] [--against TREE] [--repeat 3] [--out FILE]
    python -m harness bench grade --profile DIR [--against TREE] [--out FILE]

Without --batch: N synthetic submissions from the recorded logs (the good recipe (a) and (b) runs and mutants of
them: NaN at 120, stopped at 150, loss too high, late skips), graded by `python -m harness grade` in a fresh process
(interpreter start-up included); reports submissions per second. Goal: 1,000 submissions in <= 60 s on 2 cores.

--batch DIR (one sub-folder per submission, e.g. real logs): `python -m harness grade DIR` timed with this tree's
code and, with --against TREE (another checkout of this repository, e.g. `git worktree add /tmp/old 13328bc`), with
that tree's, run after run in turns (--repeat times each, the median reported), on this machine at the same time:
wall seconds, seconds per submission, and CPU seconds (the grader and its workers). The grades of both must agree
(verdict per submission), or the result says which differ.

--profile DIR: one `python -m harness grade DIR` under cProfile, its coordinator and every forked worker (each
worker's profile is taken inside it and summed): where the time goes, as text (--against TREE profiles that tree).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import statistics
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


def _synthetic(args) -> int:
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


# ---------------------------------------------------------------- a real batch, this tree against another


def commit_of(tree: Path) -> str:
    """The tree's commit (short), with +dirty when it has uncommitted changes to tracked files."""
    def git(*argv):
        return subprocess.run(["git", "-C", str(tree), *argv], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def _env(tree: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(tree)
    return env


def time_grade(tree: Path, batch: Path, out: Path, jobs: int) -> dict:
    """One `python -m harness grade BATCH` with TREE's code: wall seconds, CPU seconds of the grader and every
    worker, the exit code and {submission: verdict}."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "harness", "grade", str(batch), "--out", str(out), "--no-progress",
                           "--jobs", str(jobs)], capture_output=True, text=True, env=_env(tree), cwd=str(tree))
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        verdicts = {g["submission"]: g["verdict"] for g in json.loads((out / "grades.json").read_text())}
    except (OSError, ValueError):
        verdicts = {}
    return {"wall_s": wall, "cpu_s": cpu, "exit_code": done.returncode, "verdicts": verdicts,
            "stderr": done.stderr[-2000:] if done.returncode not in (0, 1) else ""}


def _summary(runs: list, n: int, commit: str) -> dict:
    wall, cpu = [r["wall_s"] for r in runs], [r["cpu_s"] for r in runs]
    return {"commit": commit, "wall_s": [round(w, 3) for w in wall], "cpu_s": [round(c, 3) for c in cpu],
            "median_wall_s": round(statistics.median(wall), 3),
            "per_submission_s": round(statistics.median(wall) / n, 4),
            "median_cpu_s": round(statistics.median(cpu), 3),
            "cpu_per_submission_s": round(statistics.median(cpu) / n, 4),
            "exit_codes": sorted({r["exit_code"] for r in runs})}


def compare(batches: list, against: Path | None, repeat: int, jobs: int) -> dict:
    """Each batch graded `repeat` times by this tree and by `against`, in turns (new, old, new, old, ...)."""
    trees = {"new": paths.REPO, **({"old": against} if against else {})}
    commits = {name: commit_of(tree) for name, tree in trees.items()}
    cores = usable_cores()
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": {"host": platform.node(), "nproc": os.cpu_count(),
                                                                   "usable_cores": cores, "jobs": jobs or cores,
                                                                   "python": platform.python_version()},
              "load_average_before": [round(x, 2) for x in os.getloadavg()], "repeat": repeat,
              "goal": "<= 0.05 s per distinct real submission on 2 cores, pictures included", "batches": []}
    for batch in batches:
        n = sum(1 for p in batch.iterdir() if p.is_dir() and not p.name.startswith("."))
        runs: dict = {name: [] for name in trees}
        with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
            for i in range(repeat):
                for name, tree in trees.items():
                    runs[name].append(time_grade(tree, batch, Path(tmp) / f"{name}-{i}", jobs))
        entry = {"batch": str(batch), "submissions": n,
                 **{name: _summary(r, n, commits[name]) for name, r in runs.items()}}
        if against:
            entry["speedup_wall"] = round(entry["old"]["median_wall_s"] / entry["new"]["median_wall_s"], 2)
            entry["speedup_cpu"] = round(entry["old"]["median_cpu_s"] / entry["new"]["median_cpu_s"], 2)
            new_v, old_v = runs["new"][0]["verdicts"], runs["old"][0]["verdicts"]
            entry["verdicts_agree"] = new_v == old_v
            if new_v != old_v:
                entry["verdicts_differ"] = {k: [old_v.get(k), new_v.get(k)] for k in set(new_v) | set(old_v)
                                            if old_v.get(k) != new_v.get(k)}
        errors = [r["stderr"] for rs in runs.values() for r in rs if r["stderr"]]
        if errors:
            entry["errors"] = errors[:2]
        result["batches"].append(entry)
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


# ---------------------------------------------------------------- where the time goes


PROFILE_SCRIPT = r"""
import cProfile, os, runpy, sys
from pathlib import Path
try:
    from harness.base import sandbox
except ImportError:                       # the layout before harness/ had its layers
    from harness import sandbox
work, argv = Path(sys.argv[1]), sys.argv[2:]
real = sandbox.run_all

def profiled(fn):
    def run(item):
        prof = cProfile.Profile()
        prof.enable()
        try:
            return fn(item)
        finally:
            prof.disable()
            prof.dump_stats(str(work / f"worker-{os.getpid()}.prof"))
    return run

sandbox.run_all = lambda items, fn, *a, **k: real(items, profiled(fn), *a, **k)
sys.argv = ["harness", *argv]
prof = cProfile.Profile()
prof.enable()
try:
    runpy.run_module("harness", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    prof.disable()
    prof.dump_stats(str(work / "coordinator.prof"))
"""


def _stats_text(stats, sort: str, limit: int) -> str:
    buf = io.StringIO()
    stats.stream = buf
    stats.sort_stats(sort).print_stats(limit)
    text = buf.getvalue()
    return text[text.index("   ncalls"):] if "   ncalls" in text else text


def profile(tree: Path, batch: Path, jobs: int) -> str:
    """`python -m harness grade BATCH` with TREE's code under cProfile: the coordinator's profile and the sum of
    every worker's, as text."""
    import pstats

    n = sum(1 for p in batch.iterdir() if p.is_dir() and not p.name.startswith("."))
    with tempfile.TemporaryDirectory(prefix="bench-grade-profile-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", PROFILE_SCRIPT, str(work), "grade", str(batch), "--out",
                               str(work / "out"), "--no-progress", "--jobs", str(jobs)], capture_output=True,
                              text=True, env=_env(tree), cwd=str(tree))
        wall = time.perf_counter() - started
        workers = sorted(work.glob("worker-*.prof"))
        coordinator = pstats.Stats(str(work / "coordinator.prof"))
        summed = pstats.Stats(*map(str, workers)) if workers else None
        per_worker = [pstats.Stats(str(w)).total_tt for w in workers]
    lines = [f"python -m harness grade {batch} --jobs {jobs or usable_cores()} under cProfile (profiling roughly "
             f"doubles the times), tree {tree} at {commit_of(tree)}, {time.strftime('%Y-%m-%d %H:%M')}, "
             f"{platform.node()}, nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}",
             f"{n} submissions, {len(workers)} worker profiles, exit code {done.returncode}, wall {wall:.2f} s "
             f"({wall / max(1, n):.3f} s per submission, profiled)", "",
             f"== the coordinator (one process): {coordinator.total_tt:.2f} s profiled, of which waiting in "
             "select() is the workers' time", "", "-- by cumulative time --",
             _stats_text(coordinator.strip_dirs(), "cumulative", 30), "-- by own time --",
             _stats_text(coordinator, "tottime", 15)]
    if summed is not None:
        lines += [f"== the workers ({len(workers)} forks, one per submission): {sum(per_worker):.2f} s in all, "
                  f"median {statistics.median(per_worker):.3f} s, max {max(per_worker):.3f} s per worker", "",
                  "-- by cumulative time, summed over the workers --", _stats_text(summed.strip_dirs(), "cumulative", 45),
                  "-- by own time, summed over the workers --", _stats_text(summed, "tottime", 25)]
    if done.returncode not in (0, 1):
        lines += ["== stderr", done.stderr[-3000:]]
    return "\n".join(lines) + "\n"


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness bench grade", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=1000, help="number of synthetic submissions (default 1000)")
    p.add_argument("--jobs", type=int, default=0, help="passed to grade --jobs (default: one per core)")
    p.add_argument("--out", type=Path, default=None, help="also write the result there (JSON; text for --profile)")
    p.add_argument("--batch", type=Path, action="append", default=[], metavar="DIR",
                   help="time grading this folder of submissions (repeatable)")
    p.add_argument("--against", type=Path, default=None, metavar="TREE",
                   help="another checkout of this repository, timed on the same batches in turns")
    p.add_argument("--repeat", type=int, default=3, help="runs of each tree per batch (default 3; the median counts)")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR", help="profile grading this folder")
    args = p.parse_args(argv)
    if args.profile:
        text = profile(args.against or paths.REPO, args.profile, args.jobs)
        print(text)
        if args.out:
            paths.write_text_atomic(args.out, text)
        return 0
    if not args.batch:
        return _synthetic(args)
    result = compare(args.batch, args.against, max(1, args.repeat), args.jobs)
    print(json.dumps(result, indent=2))
    if args.out:
        paths.write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    ok = all(e.get("verdicts_agree", True) and not e.get("errors") for e in result["batches"])
    return 0 if ok else 1
