"""Bands from a population of real runs, by one stated rule, checked on runs held out of the derivation.

    python -m harness calibrate collect RUNS_DIR... --out fixtures/population/megatron_core_v0.16.1_h200.json
    python -m harness calibrate derive [--population FILE] [--write]

`collect` turns what `python -m harness calibrate runs` left (records.json and the logs) into one compact JSON:
per run its group, recipe, variant, seed and shape, its curve and counters per logged iteration, its validation
losses, its NVML peak and this machine's bare-context probe; a resumed run is stitched from its two logs. The raw
logs are not needed after that.

`derive` splits the healthy runs: within each group (recipes a and b, the FAQ's micro-batch and hidden-size
variants) the runs in seed order alternate, derivation / held out; every run of a resumed, rank-prefixed or
EAGER-loading group is held out (another log shape or machine, judged by bands it never contributed to). From the derivation part alone, by RULE:
- golden curve (lm loss at every logged iteration, validation lm loss): mean +/- max(K_STD x sample std,
  REL_FLOOR x |mean|) of the family's derivation runs (compute_band);
- skips after the loss-scale search: the largest fraction seen in any derivation run, times SKIP_FACTOR, with
  SKIP_FLOOR as the least (a family whose derivation runs never skipped still allows an occasional overflow);
- the final-loss band of a model variant (hidden 64): its golden final value +/- its tolerance.
Then every held-out run is judged by those bands (false alarms: a healthy run failed), and every mutant's margin
to the band it must leave is reported.
"""

from __future__ import annotations

import collections
import json
import math
import statistics
from pathlib import Path

from harness.evidence import fp16, logs
from harness.judge.bands import compute_band, margin as band_margin, within as within_band
from harness.evidence.logformat import IterationRecord
from harness.evidence.recipe import load_recipe, recipe_deviations

K_STD = 4.0
REL_FLOOR = 0.005
SKIP_FACTOR = 2.0
SKIP_FLOOR = 0.05
SEARCH_END = 40                      # the loss-scale search is over by then (17-18 skipped steps from 2^32)
FAMILIES = {"a": "a", "a-mbs1": "a", "a-mbs2": "a", "a-resume": "a", "a-tee": "a", "a-eager": "a",
            "b": "b", "b-mbs1": "b", "b-mbs2": "b", "b-resume": "b", "b-tee": "b", "b-eager": "b",
            "a-h64": "a-h64", "b-h64": "b-h64"}
# other log shapes and machines: judged, never derived from
HELD_OUT_GROUPS = ("a-resume", "a-tee", "a-eager", "b-resume", "b-tee", "b-eager")
DERIVATION_GROUPS = tuple(g for g in FAMILIES if g not in HELD_OUT_GROUPS)
RULE = (f"golden: mean +/- max({K_STD:g} x sample std, {REL_FLOOR:g} x |mean|) per logged iteration over the "
        f"family's derivation runs; skips after iteration {SEARCH_END}: at most max(largest derivation fraction x "
        f"{SKIP_FACTOR:g}, {SKIP_FLOOR:g}); divergence: a non-finite logged loss or a whole interval "
        f"skipped after iteration {SEARCH_END}; split: each group alternates by seed, resumed/prefixed/EAGER runs all held out")
DEFAULT_POPULATION = Path(__file__).resolve().parents[2] / "fixtures" / "population" / "megatron_core_v0.16.1_h200.json"
FRESH_POPULATION = DEFAULT_POPULATION.with_name("fresh_megatron_core_v0.16.1_h200.json")   # made after the bands
FRESH_POPULATION_2 = DEFAULT_POPULATION.with_name("fresh2_megatron_core_v0.16.1_h200.json")  # a second batch
FRESH_POPULATIONS = (FRESH_POPULATION, FRESH_POPULATION_2)   # plan-fresh.toml, plan-fresh2.toml


# ---------------------------------------------------------------- collect


def _curve(parsed) -> dict:
    """A parsed log's iteration lines and validations as compact lists."""
    return {"iterations": [[r.iteration, r.lm_loss, r.sop_loss, r.skipped, r.nan, r.loss_scale, r.learning_rate]
                           for r in parsed.iterations],
            "validation": [[v.iteration, v.split, v.lm_loss] for v in parsed.validations]}


def collect(run_dirs: list[Path], plan: str = "fixtures/population/plan.toml") -> dict:
    """One compact document from the records and logs of one or more `runs` folders (a later folder's record of a
    run replaces an earlier failed one)."""
    runs, probes, meta = {}, [], {}
    for folder in run_dirs:
        doc = json.loads((folder / "records.json").read_text())
        probes += doc.get("context_probes", [])
        meta = {k: doc[k] for k in ("checkout", "versions", "gpu", "capability") if k in doc} or meta
        for rec in doc["runs"]:
            legs = [leg for leg in rec["legs"] if leg.get("log")]
            ok = bool(legs) and len(legs) == len(rec["legs"]) and all(leg["returncode"] == 0 for leg in legs)
            if rec["name"] in runs and runs[rec["name"]]["ok"] and not ok:
                continue
            parsed = [logs.parse_log_file(folder / leg["log"]) for leg in legs]
            entry = {k: rec[k] for k in ("name", "group", "recipe", "seed", "extra", "env", "shape", "variant",
                                         "mutant", "why")}
            entry.update(ok=ok, returncode=[leg["returncode"] for leg in rec["legs"] if "returncode" in leg],
                         duration_s=[leg.get("duration_s") for leg in legs],
                         peak_mib=max((leg["memory"]["peak_mib"] or 0 for leg in legs), default=None),
                         memory_method=legs[0]["memory"]["method"] if legs else None,
                         legs=[_curve(p) for p in parsed],
                         arguments={k: parsed[0].arguments.get(k) for k in ("micro_batch_size", "global_batch_size",
                                                                            "hidden_size", "seed", "lr")}
                         if parsed and parsed[0].arguments else None)
            runs[rec["name"]] = entry
    return {"schema": 1, "provenance": {**meta, "rule_module": __name__, "runs": len(runs),
                                        "command": f"python -m harness calibrate runs (plan {plan}), then "
                                                   "python -m harness calibrate collect"},
            "context_probes": probes, "runs": [runs[n] for n in sorted(runs)]}


# ---------------------------------------------------------------- the population as runs


class Run:
    """One population run, its legs stitched by iteration (a resumed log continues from its load)."""

    def __init__(self, raw: dict):
        self.raw = raw
        self.name, self.group, self.ok = raw["name"], raw["group"], raw["ok"]
        self.family = FAMILIES.get(self.group) if not raw["mutant"] else raw.get("recipe")
        points: dict = {}
        validation: dict = {}
        for leg in raw["legs"]:
            for it, lm, sop, skipped, nan, scale, lr in leg["iterations"]:
                if raw["shape"] == "resume" and it == 1 and it in points:
                    continue
                points[it] = (lm, sop, skipped, nan, scale)
            for it, split, lm in leg["validation"]:
                validation[(it, split)] = lm
        self.points = dict(sorted(points.items()))
        self.validation = validation

    def series(self, metric: str) -> dict:
        """{iteration: value}, finite values only (fp16 evaluation with --micro-batch-size 1 prints NAN validation
        losses in healthy runs: an overflow in one eval micro-batch, the training loss unaffected)."""
        if metric == "validation lm loss":
            values = {it: v for (it, split), v in self.validation.items() if split == "periodic"}
        else:
            values = {it: p[0] for it, p in self.points.items()}
        return {it: v for it, v in values.items() if v is not None and math.isfinite(v)}

    def records(self) -> list:
        """IterationRecord-like objects for harness.evidence.fp16."""
        return [IterationRecord(iteration=it, train_iters=200, consumed_samples=0, elapsed_ms=0.0,
                                     learning_rate=0.0, global_batch_size=16, loss_scale=p[4], lm_loss=p[0],
                                     sop_loss=p[1], skipped=p[2], nan=p[3]) for it, p in self.points.items()]


def load(path: Path = DEFAULT_POPULATION) -> tuple[dict, list[Run]]:
    doc = json.loads(Path(path).read_text())
    return doc, [Run(r) for r in doc["runs"]]


def load_batches(paths) -> list[Run]:
    """The runs of several collected files as one set (the batches made after the bands); ValueError naming any run
    that two files both hold."""
    runs = [run for path in paths for run in load(path)[1]]
    counts = collections.Counter(r.name for r in runs)
    twice = sorted(name for name, n in counts.items() if n > 1)
    if twice:
        raise ValueError(f"run(s) {', '.join(twice)} appear in more than one population file: give each batch once")
    return runs


def split(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """(derivation, held out): healthy runs of each derivation group alternate by seed; all else is held out."""
    derivation, held = [], []
    for group in DERIVATION_GROUPS:
        members = sorted((r for r in runs if r.group == group and r.ok and not r.raw["mutant"]),
                         key=lambda r: r.raw["seed"])
        derivation += members[0::2]
        held += members[1::2]
    held += [r for r in runs if r.group not in DERIVATION_GROUPS and r.ok and not r.raw["mutant"]]
    return derivation, held


# ---------------------------------------------------------------- derive


def golden_of(runs: list[Run], metric: str) -> dict:
    """mean/std/tol per iteration common to every run, by RULE."""
    longest = max(len(r.series(metric)) for r in runs)
    runs = [r for r in runs if len(r.series(metric)) == longest]   # a run with a NAN validation point is left out
    per = [r.series(metric) for r in runs]
    common = sorted(set.intersection(*(set(s) for s in per)))
    bands = [compute_band([s[it] for s in per], REL_FLOOR, K_STD) for it in common]
    return {"iterations": common, "samples": {r.name: [r.series(metric)[it] for it in common] for r in runs},
            "mean": [round(b.mean, 7) for b in bands], "std": [round(b.std, 7) for b in bands],
            "tol": [round(b.tol, 7) for b in bands], "runs": len(runs)}


def derive(doc: dict, runs: list[Run]) -> dict:
    """Every band, from the derivation part of the population."""
    derivation, held = split(runs)
    families = {}
    for family in sorted({r.family for r in derivation}):
        members = [r for r in derivation if r.family == family]
        families[family] = {
            "runs": [r.name for r in members],
            "golden": {m: golden_of(members, m) for m in ("lm loss", "validation lm loss")},
        }
        g = families[family]["golden"]["lm loss"]
        families[family]["final_loss_band"] = [round(g["mean"][-1] - g["tol"][-1], 3),
                                               round(g["mean"][-1] + g["tol"][-1], 3)]
    worst_skips = max(fp16.skips_after(r.records(), SEARCH_END).fraction for r in derivation)
    return {"rule": RULE, "derivation_runs": len(derivation), "held_out_runs": len(held),
            "held_out": [r.name for r in held], "families": families,
            "skips": {"after": SEARCH_END, "largest_derivation_fraction": round(worst_skips, 4),
                      "max_fraction": round(max(worst_skips * SKIP_FACTOR, SKIP_FLOOR), 4)},
            "provenance": doc["provenance"]}


def golden_document(bands: dict, family: str) -> dict:
    """A golden-values file (load_golden's schema) for one family."""
    fam = bands["families"][family]
    return {"schema": 1, "provenance": {**bands["provenance"], "family": family, "runs": len(fam["runs"]),
                                        "run_names": fam["runs"], "rule": bands["rule"],
                                        "held_out_runs": bands["held_out_runs"]},
            "band_rule": {"k_std": K_STD, "rel_tol_floor": REL_FLOOR}, "metrics": fam["golden"]}


# ---------------------------------------------------------------- evaluate


def _curve_misses(run: Run, golden: dict) -> tuple[int, float]:
    """(points outside the golden band or missing, smallest margin to an edge over the points inside), by the
    grader's own point test (bands.within)."""
    series, misses, smallest = run.series("lm loss"), 0, math.inf
    for it, mean, tol in zip(golden["iterations"], golden["mean"], golden["tol"]):
        if it not in series or not within_band(series[it], mean, tol):
            misses += 1
        else:
            smallest = min(smallest, band_margin(series[it], mean, tol))
    return misses, smallest


def judge_run(run: Run, bands: dict, max_misses: int = 2) -> dict:
    """What the population's bands say about one run: the failed checks and the margins."""
    family = run.family if run.family in bands["families"] else None
    fails, margins = [], {}
    recipe = load_recipe()   # the grader's own recipe check, on the flags the compact record kept
    arguments = {name: value for name, value in (run.raw.get("arguments") or {}).items() if value is not None}
    failing, _, _ = recipe_deviations(recipe, arguments, run.family if run.family in recipe.variants else None)
    fails += [f"recipe: {deviation}" for deviation in failing]
    recs = run.records()
    found = fp16.divergence(recs, bands["skips"]["after"])
    if found:
        fails.append(f"no-nan: {found[0]}")
    skips = fp16.skips_after(recs, bands["skips"]["after"])
    margins["skips"] = round(bands["skips"]["max_fraction"] - skips.fraction, 4)
    if skips.fraction > bands["skips"]["max_fraction"]:
        fails.append(f"skips-early-only: {skips.fraction:.1%} of the steps after {bands['skips']['after']}")
    if family:
        g = bands["families"][family]["golden"]["lm loss"]
        misses, margin = _curve_misses(run, g)
        margins["curve"] = round(margin, 4) if margin != math.inf else None
        if misses > max_misses:
            fails.append(f"golden-curve: {misses} points outside")
        it, mean, tol = g["iterations"][-1], g["mean"][-1], g["tol"][-1]    # golden-final-loss's point
        final = run.series("lm loss").get(it)
        margins["final"] = None if final is None else round(band_margin(final, mean, tol), 4)
        if final is None or not within_band(final, mean, tol):
            fails.append(f"golden-final-loss: {final} outside {mean} +/- {tol} at iteration {it}")
    return {"name": run.name, "group": run.group, "family": family, "failed": fails, "margins": margins}


def _held_out_summary(results: list[dict]) -> dict:
    """Healthy runs judged by bands they did not come from: the false alarms, their rate, the smallest margins."""
    smallest = {}
    for key in ("curve", "final", "skips"):
        values = [h["margins"][key] for h in results if h["margins"].get(key) is not None]
        smallest[key] = min(values) if values else None
    return {"false_alarms": [h for h in results if h["failed"]],
            "false_alarm_rate": round(sum(bool(h["failed"]) for h in results) / max(1, len(results)), 4),
            "smallest_margin": smallest}


def evaluate(bands: dict, runs: list[Run]) -> dict:
    """False alarms on the held-out runs; each mutant's verdict and margin."""
    _, held = split(runs)
    held_results = [judge_run(r, bands) for r in held]
    mutants = [judge_run(r, bands) for r in runs if r.raw["mutant"] and r.ok]
    summary = _held_out_summary(held_results)
    return {"held_out": len(held_results), "false_alarms": summary["false_alarms"],
            "false_alarm_rate": summary["false_alarm_rate"], "smallest_held_out_margin": summary["smallest_margin"],
            "held_out_results": held_results, "mutants": mutants, "failed_runs": [r.name for r in runs if not r.ok]}


def validate(bands: dict, runs: list[Run]) -> dict:
    """Committed bands against runs made after them (fixtures/population/plan-fresh*.toml): none of these runs
    contributed to a band, so every healthy one is held out; a false alarm is a healthy run failed."""
    healthy = [judge_run(r, bands) for r in runs if r.ok and not r.raw["mutant"]]
    mutants = [judge_run(r, bands) for r in runs if r.ok and r.raw["mutant"]]
    return {"bands_rule": bands["rule"], "bands_derivation_runs": bands["derivation_runs"], "runs": len(runs),
            "healthy": len(healthy), **_held_out_summary(healthy), "results": healthy, "mutants": mutants,
            "failed_runs": [r.name for r in runs if not r.ok]}


def memory_summary(doc: dict, runs: list[Run]) -> dict:
    """Peaks per group and mode, with the bare-context probe of the same mode subtracted (the training's own)."""
    probe = {}
    for p in doc.get("context_probes", []):
        mode = p["env"].get("CUDA_MODULE_LOADING", "default")
        if p.get("peak_mib"):
            probe.setdefault(mode, []).append(p["peak_mib"])
    out = {"context_probe_mib": {m: statistics.median(v) for m, v in probe.items()}, "groups": {}}
    for r in runs:
        if not r.ok or not r.raw.get("peak_mib"):
            continue
        mode = (r.raw.get("env") or {}).get("CUDA_MODULE_LOADING", "default")
        ctx = out["context_probe_mib"].get(mode)
        g = out["groups"].setdefault(r.group, {"mode": mode, "peaks": [], "own": []})
        g["peaks"].append(r.raw["peak_mib"])
        if ctx is not None:
            g["own"].append(r.raw["peak_mib"] - ctx)
    return out


def report_markdown(doc: dict, runs: list[Run], bands: dict, evaluation: dict, memory: dict) -> str:
    """The derivation as a page: what ran, the rule, the bands, the held-out false alarms, the mutants' margins."""
    prov = doc["provenance"]
    groups: dict = {}
    for r in runs:
        groups.setdefault(r.group, []).append(r)
    derivation, held = split(runs)
    lines = ["# Bands from a population of real Megatron-LM runs", "",
             f"Megatron-LM {prov.get('checkout', {}).get('version')} (`pretrain_bert.py` through the no-TE launcher), "
             f"{prov.get('gpu')} (compute capability {prov.get('capability')}), torch {prov.get('versions', {}).get('torch')}, "
             f"CUDA {prov.get('versions', {}).get('cuda')}, Python {prov.get('versions', {}).get('python')}; the course's "
             "flags plus each group's, 16-29 runs at once on one GPU. Made by `python -m harness calibrate runs` "
             "(plan: `fixtures/population/plan.toml`), kept as `fixtures/population/megatron_core_v0.16.1_h200.json` "
             "(`collect`), derived by `python -m harness calibrate derive`.", "",
             "| group | runs | completed | derivation | held out | final lm loss (min-max) |", "|---|---:|---:|---:|---:|---|"]
    for g, members in sorted(groups.items()):
        finals = [m.series("lm loss").get(200) for m in members if m.ok]
        finals = [f for f in finals if f is not None]
        span = f"{min(finals):.3f}-{max(finals):.3f}" if finals else "-"
        lines.append(f"| {g} | {len(members)} | {sum(m.ok for m in members)} | "
                     f"{sum(m in derivation for m in members)} | {sum(m in held for m in members)} | {span} |")
    lines += ["", f"**Rule.** {bands['rule']}.", "",
              "| family | derivation runs | final-loss band (golden 200 +/- tol) | widest curve tolerance |",
              "|---|---:|---|---:|"]
    for family, fam in bands["families"].items():
        lines.append(f"| {family} | {len(fam['runs'])} | {fam['final_loss_band']} | "
                     f"{max(fam['golden']['lm loss']['tol']):.4f} |")
    sk = bands["skips"]
    lines += ["", f"Skips after iteration {sk['after']}: at most {sk['max_fraction']:.2%} of the steps (largest in a "
                  f"derivation run: {sk['largest_derivation_fraction']:.2%}).", "",
              f"**Held out: {evaluation['held_out']} runs, {len(evaluation['false_alarms'])} false alarm(s) "
              f"(rate {evaluation['false_alarm_rate']:.1%}).** Smallest margins to a band edge over the held-out runs: "
              f"{evaluation['smallest_held_out_margin']}.", ""]
    for fa in evaluation["false_alarms"]:
        lines.append(f"- false alarm `{fa['name']}`: {'; '.join(fa['failed'])}")
    lines += ["", "| mutant | why | caught by | margins (negative: outside) |", "|---|---|---|---|"]
    for m in evaluation["mutants"]:
        why = next((r.raw["why"] for r in runs if r.name == m["name"]), "")
        lines.append(f"| {m['name']} | {why} | {'; '.join(m['failed']) or 'NOT CAUGHT'} | {m['margins']} |")
    lines += ["", "Memory (NVML per-process peak; the bare-context probe of the same CUDA module-loading mode "
                  f"subtracted): probes {memory['context_probe_mib']} MiB.", "", "| group | mode | peaks (MiB) |",
              "|---|---|---|"]
    for g, m in sorted(memory["groups"].items()):
        lines.append(f"| {g} | {m['mode']} | {sorted(set(m['peaks']))} |")
    return "\n".join(lines) + "\n"
