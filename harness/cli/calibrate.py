"""Measure the golden values: the reference recipe with several seeds, concurrently, on this GPU.

    python -m harness calibrate --seeds 1234 1235 1236 --out fixtures/golden/reference_trainer_h200.json
    python -m harness calibrate --recipe b --out fixtures/golden/reference_trainer_h200_recipe_b.json

Writes the golden file (loss curve per log interval, validation loss; bands from the seed spread by
compute_band) and a calibration summary (peak NVML memory, ms/iter per seed, the memory band
derived from the samples) next to it; nothing is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from harness.evidence import logs
from harness.judge.layouts import memory_band  # the rule of every memory band, 1 GPU or a parallel layout

from harness.base import paths
from harness.run.runs import RunSpec
from harness.run.session import Session
from harness.train.args import COURSE_FLAGS
from harness.evidence.recipe import load_recipe
from harness.judge.profiles import build_golden


def seed_runs(seeds: list[int], recipe: str = "a") -> tuple[RunSpec, ...]:
    return tuple(RunSpec(f"seed{s}", f"course recipe ({recipe}), --seed {s}", extra_args=("--seed", str(s)),
                         recipe=recipe) for s in seeds)


def calibrate(seeds: list[int], out: Path, run_dir: Path, recipe: str = "a", write_memory: bool = True) -> dict:
    session = Session(run_dir)
    started = time.monotonic()
    prepared = session.run_all(seed_runs(seeds, recipe), prepare=True)
    if not prepared.ok:
        raise SystemExit(prepared.failure_message())
    outcomes = session.outcomes
    failed = [n for n, o in outcomes.items() if not (o.stage and o.stage.ok)]
    if failed:
        raise SystemExit("calibration runs failed: " + "; ".join(outcomes[n].stage.failure_message() for n in failed))
    parsed = {name: logs.parse_log_file(o.stage.log_path) for name, o in outcomes.items()}
    summaries = {name: o.summary for name, o in outcomes.items()}
    any_summary = next(iter(summaries.values()))
    provenance = {
        "trainer": "bert-acceptance reference trainer (python -m harness train), course flags",
        "gpu": any_summary.get("gpu"), "versions": any_summary.get("versions"),
        "date": time.strftime("%Y-%m-%d"), "seeds": seeds,
        "flags": " ".join([*COURSE_FLAGS, *load_recipe().variants[recipe].extra_args]),
        "recipe": recipe, "data": "course corpus recipe (random.seed(42), 2000 lines): "
                                  + load_recipe().variants[recipe].title,
        "command": f"python -m harness calibrate --recipe {recipe} --seeds {' '.join(map(str, seeds))} --out {out}",
        "concurrent_runs": len(seeds),
    }
    golden = build_golden(parsed, provenance)
    peaks = [o.memory.peak_mib for o in outcomes.values() if o.memory and o.memory.peak_mib]
    summary = {
        "wall_s": round(time.monotonic() - started, 1),
        "per_seed": {n: {"final_lm_loss": parsed[n].lm_losses[-1][1] if parsed[n].lm_losses else None,
                         "ms_per_iter_median": summaries[n].get("ms_per_iter_median"),
                         "peak_mib": outcomes[n].memory.peak_mib if outcomes[n].memory else None,
                         "memory_method": outcomes[n].memory.method if outcomes[n].memory else None,
                         "torch_max_allocated_mib": summaries[n].get("torch_max_allocated_mib"),
                         "cuda_graphs": summaries[n].get("cuda_graphs")} for n in outcomes},
        "memory_band_mib": memory_band(peaks) if peaks else None,
        "ms_per_iter_median_of_seeds": statistics.median(
            [s["ms_per_iter_median"] for s in summaries.values() if s.get("ms_per_iter_median")] or [0]),
    }
    golden["provenance"]["calibration"] = summary
    out.write_text(json.dumps(golden, indent=1))
    if recipe == "a" and write_memory:
        summary["memory_golden"] = str(write_memory_golden(outcomes, summaries, provenance))
    return summary


def write_memory_golden(outcomes: dict, summaries: dict, provenance: dict) -> Path:
    """fixtures/golden/memory/<gpu kind>.json: the band on the training's own memory (allocator peak reserved)."""
    from harness.judge import memory_golden

    own = {n: s.get("torch_max_reserved_mib") for n, s in summaries.items()}
    if not all(own.values()):
        raise SystemExit(f"calibration runs recorded no allocator peak (torch_max_reserved_mib): {own}")
    gpu = provenance.get("gpu")
    try:
        import torch

        capability = ".".join(map(str, torch.cuda.get_device_capability(0))) if torch.cuda.is_available() else None
    except Exception:  # the capability is provenance only
        capability = None
    samples = {n: {"own_mib": own[n], "nvml_peak_mib": outcomes[n].memory.peak_mib if outcomes[n].memory else None,
                   "context_mib": (outcomes[n].memory.peak_mib - own[n]) if outcomes[n].memory
                   and outcomes[n].memory.peak_mib else None} for n in own}
    doc = memory_golden.document(gpu, capability, samples, memory_band(list(own.values())),
                                 {**provenance, "env_module_loading": os.environ.get("CUDA_MODULE_LOADING", "default")})
    path = memory_golden.MEMORY_DIR / f"{memory_golden.slug(gpu)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    return path


def runs_main(argv) -> int:
    """`python -m harness calibrate runs`: the population of real Megatron-LM runs (harness.run.population)."""
    from harness.run import population

    p = argparse.ArgumentParser(prog="python -m harness calibrate runs", description=population.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--megatron-lm", type=Path, required=True, metavar="CHECKOUT", help="a Megatron-LM checkout")
    p.add_argument("--out", type=Path, required=True, help="folder for logs/ and records.json")
    p.add_argument("--plan", type=Path, default=population.PLAN, help="the run plan (default: %(default)s)")
    p.add_argument("--only", nargs="+", metavar="GLOB", help="groups or run names to run (default: all)")
    p.add_argument("--shard", metavar="I/N", help="run every N-th selected run, starting with the I-th")
    p.add_argument("--jobs", type=int, default=14, help="runs at a time on the GPU (default: %(default)s)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="no run starts later than this minus a run's length (default: %(default)s)")
    args = p.parse_args(argv)
    runs = population.select(population.load_plan(args.plan), args.only, args.shard)
    doc = population.run_population(args.megatron_lm, runs, args.out, args.jobs, args.budget_s)
    done = sum(bool(r["legs"]) and all(leg.get("returncode") == 0 for leg in r["legs"]) for r in doc["runs"])
    print(f"{done} of {len(runs)} runs completed in {doc['wall_s']} s; records in {args.out / 'records.json'}")
    return 0


def collect_main(argv) -> int:
    """`python -m harness calibrate collect RUNS_DIR... --out FILE`: the compact population document."""
    from harness.judge import derive_bands as population

    p = argparse.ArgumentParser(prog="python -m harness calibrate collect", description=population.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", type=Path, help="folders written by `python -m harness calibrate runs`")
    p.add_argument("--out", type=Path, default=population.DEFAULT_POPULATION)
    p.add_argument("--plan", default="fixtures/population/plan.toml", help="the plan the runs came from, as recorded")
    args = p.parse_args(argv)
    doc = population.collect(args.run_dirs, args.plan)
    paths.write_text_atomic(args.out, json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"{len(doc['runs'])} runs ({sum(r['ok'] for r in doc['runs'])} completed) -> {args.out}")
    return 0


def derive_main(argv) -> int:
    """`python -m harness calibrate derive`: bands from the population, false alarms on the held-out runs."""
    from harness.judge import derive_bands as population

    p = argparse.ArgumentParser(prog="python -m harness calibrate derive", description=population.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--population", type=Path, default=population.DEFAULT_POPULATION)
    p.add_argument("--out", type=Path, default=paths.FIXTURES / "population" / "bands-h200.json",
                   help="the derived bands and their evaluation (default: %(default)s)")
    p.add_argument("--report", type=Path, default=paths.RESULTS_DIR / "population" / "REPORT.md",
                   help="a Markdown summary of the derivation (default: %(default)s)")
    p.add_argument("--golden-dir", type=Path, default=paths.GOLDEN_DIR,
                   help="where the per-family golden files go (population_<family>_h200.json)")
    args = p.parse_args(argv)
    doc, runs = population.load(args.population)
    bands = population.derive(doc, runs)
    evaluation = population.evaluate(bands, runs)
    memory = population.memory_summary(doc, runs)
    paths.write_text_atomic(args.out, json.dumps({"bands": bands, "evaluation": evaluation, "memory": memory},
                                                 indent=1) + "\n")
    for family in bands["families"]:
        golden = population.golden_document(bands, family)
        paths.write_text_atomic(args.golden_dir / f"population_{family}_h200.json", json.dumps(golden, indent=1) + "\n")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    paths.write_text_atomic(args.report, population.report_markdown(doc, runs, bands, evaluation, memory))
    print(f"derived from {bands['derivation_runs']} runs; held out {evaluation['held_out']}: "
          f"{len(evaluation['false_alarms'])} false alarm(s) (rate {evaluation['false_alarm_rate']:.1%}); "
          f"smallest held-out margins {evaluation['smallest_held_out_margin']}")
    for fa in evaluation["false_alarms"]:
        print(f"  FALSE ALARM {fa['name']}: {'; '.join(fa['failed'])}")
    for m in evaluation["mutants"]:
        print(f"  mutant {m['name']}: {'; '.join(m['failed']) or 'NOT CAUGHT'} (margins {m['margins']})")
    for family, fam in bands["families"].items():
        print(f"  {family}: final-loss band {fam['final_loss_band']} from {len(fam['runs'])} runs")
    print(f"  skips after {bands['skips']['after']}: max {bands['skips']['max_fraction']:.1%} "
          f"(largest in derivation {bands['skips']['largest_derivation_fraction']:.1%})")
    return 0


def validate_main(argv) -> int:
    """`python -m harness calibrate validate [--population FILE ...]`: the committed bands judged on runs made after
    them."""
    from harness.judge import derive_bands as population

    p = argparse.ArgumentParser(prog="python -m harness calibrate validate", description=validate_main.__doc__)
    p.add_argument("--population", type=Path, nargs="+", default=list(population.FRESH_POPULATIONS),
                   help="runs none of the bands came from, as `collect` writes them; several files are judged as "
                        "one set (default: every batch made after the bands, %(default)s)")
    p.add_argument("--bands", type=Path, default=paths.FIXTURES / "population" / "bands-h200.json",
                   help="the derived bands (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the validation as JSON here")
    args = p.parse_args(argv)
    try:
        runs = population.load_batches(args.population)
    except ValueError as exc:
        p.error(f"--population: {exc}")
    bands = json.loads(args.bands.read_text())["bands"]
    result = population.validate(bands, runs)
    if args.out:
        paths.write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    print(f"{result['healthy']} healthy runs the bands never saw: {len(result['false_alarms'])} false alarm(s) "
          f"(rate {result['false_alarm_rate']:.1%}); smallest margins {result['smallest_margin']}")
    for fa in result["false_alarms"]:
        print(f"  FALSE ALARM {fa['name']}: {'; '.join(fa['failed'])}")
    for m in result["mutants"]:
        print(f"  mutant {m['name']}: {'; '.join(m['failed']) or 'NOT CAUGHT'} (margins {m['margins']})")
    for name in result["failed_runs"]:
        print(f"  run {name} did not complete")
    return 1 if result["false_alarms"] or not all(m["failed"] for m in result["mutants"]) else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = {"runs": runs_main, "collect": collect_main, "derive": derive_main, "validate": validate_main}
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    p = argparse.ArgumentParser(prog="python -m harness calibrate", description=__doc__)
    p.add_argument("--seeds", type=int, nargs="+", default=[1234, 1235, 1236])
    p.add_argument("--out", type=Path, default=paths.GOLDEN_DIR / "reference_trainer_h200.json")
    p.add_argument("--run-dir", type=Path, default=paths.REPO / "runs" / "calibration")
    p.add_argument("--recipe", default="a", choices=sorted(load_recipe().variants),
                   help="course recipe: a = binary head on 10-line documents, b = --bert-no-binary-head on one-line ones")
    args = p.parse_args(argv)
    summary = calibrate(args.seeds, args.out, args.run_dir, args.recipe)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
