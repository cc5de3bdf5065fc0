"""Criteria as data: the profile, recipe and golden-values files, loaded and checked, and the records they hold.

A profile (fixtures/criteria/<name>.toml) is one table per criterion under ``[criteria.<id>]``; ``kind`` picks
a checker from the small vocabulary in ``KINDS`` (the checkers: harness.judge.kinds). Errors name the file and the
criterion. harness.judge.criteria judges a run with them and re-exports every name defined here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.judge.bands import compute_band  # noqa: F401  (re-exported: golden bands use them)
from harness.judge.layouts import LayoutError, load_layout_bands
from harness.base.errors import CriteriaError
from harness.base.paths import CRITERIA_DIR, GOLDEN_DIR
from harness.evidence.recipe import (DEFAULT_RECIPE, _is_number,  # noqa: F401
                                     _read_toml, load_recipe)
from harness.evidence.logformat import MARKERS

PASS, FAIL, NOT_MEASURABLE = "pass", "fail", "not-measurable"
ERROR_TEMPLATE = "{file}: criterion {criterion_id!r}: {problem}"

PROFILE_FIELDS = {"name", "description", "extends", "golden", "drop", "criteria", "recipes"}
COMMON_FIELDS = {"id", "label", "kind", "rationale", "remedy", "needs", "log_evidence"}
REQUIRED_COMMON = ("label", "kind", "rationale", "remedy")
METRICS = ("lm loss", "sop loss", "validation lm loss")
NEEDS = ("gpu-live",)


@dataclass(frozen=True)
class KindSpec:
    """What a kind needs: required fields, optional fields with defaults, one line of documentation."""

    required: tuple
    optional: dict
    doc: str
    uses_golden: bool = False


KINDS = {
    "marker_present": KindSpec(("markers",), {}, "every listed harness.evidence.logs.MARKERS id appears in the log"),
    "exit_code": KindSpec((), {"expected": 0}, "the trainer exited with this code and did not time out"),
    "ran_on_gpu": KindSpec((), {"expected": "cuda"}, "the trainer reported this device"),
    "first_loss_band": KindSpec(("lo", "hi"), {"metric": "lm loss", "by_iteration": 0},
                                "first logged loss (first line that has it) within [lo, hi]; by_iteration > 0: the "
                                "band holds for a first line at or before that iteration (a later one is a mean "
                                "over steps that already learned: not measured, and says so)"),
    "decreasing_trend": KindSpec((), {"metric": "lm loss", "window": 3, "window_iters": 0, "min_drop": 0.5,
                                      "max_increases": 1},
                                 "windowed means: first - last >= min_drop, at most max_increases rises; windows of "
                                 "window_iters iterations (any --log-interval), else of `window` logged values"),
    "final_loss_band": KindSpec(("lo", "hi"), {"metric": "lm loss", "require_complete": True},
                                "loss on the last iteration line within [lo, hi]; that line is --train-iters"),
    "golden_final_loss": KindSpec((), {"metric": "lm loss", "tol_scale": 1.0},
                                  "loss at the golden file's last iteration within its tolerance", True),
    "golden_curve": KindSpec((), {"metric": "lm loss", "tol_scale": 1.0, "max_misses": 2},
                             "per logged iteration |loss - golden| <= tol, up to max_misses misses", True),
    "no_nan": KindSpec((), {"after": 40},
                       "no divergence: every logged loss finite and no whole log interval skipped after iteration "
                       "`after` (overflow skips and Megatron's 'nan iterations' are judged by skips_only_before, "
                       "not here: harness.evidence.fp16)"),
    "skips_only_before": KindSpec(("iteration",), {"max_fraction": 0.0},
                                  "skipped (overflow) steps after `iteration` are at most max_fraction of the steps "
                                  "after it (0: none at all)"),
    "checkpoint_iterations": KindSpec(("iterations",), {}, "iter_NNNNNNN/ exists with weights for each iteration"),
    "tracker_equals": KindSpec(("value",), {}, "latest_checkpointed_iteration.txt holds `value`"),
    "checkpoint_loads": KindSpec((), {}, "the newest checkpoint loads on CPU and its shapes match the model"),
    "resume_matches": KindSpec(("tol",), {"metric": "lm loss"},
                               "first loss logged after resuming within tol of the uninterrupted run"),
    "memory_band_mib": KindSpec(("lo", "hi"), {"layouts": "", "log_band": ""},
                                "peak GPU memory seen by NVML within [lo, hi] MiB on 1 GPU; a multi-GPU run within "
                                "the band of its layout in the `layouts` file (none: not measured); a recorded log "
                                "with `log_band`: its own report lines' max reserved in their band"),
    "memory_own_band": KindSpec((), {"layouts": "", "log_band": ""},
                                "the training's own peak memory (torch's allocator, max reserved) lies in the band "
                                "of this GPU kind's memory golden (harness.judge.memory_golden), NVML's total and "
                                "this machine's CUDA context reported beside it; several GPUs: the layout's bands; "
                                "a recorded log (no NVML trace) with `log_band`: its own report lines' max reserved "
                                "in the band of the trainer that wrote it"),
    "recipe_matches": KindSpec((), {"recipe": "course-recipe.toml"},
                               "the log's `arguments` block matches the course's recipe file (training flags)"),
    "cuda_graph_used": KindSpec((), {}, "the trainer's summary says its step ran as a CUDA graph (else the capture "
                                        "error)"),
}


@dataclass(frozen=True)
class Criterion:
    """One acceptance criterion, as loaded from a profile."""

    id: str
    label: str
    kind: str
    rationale: str
    remedy: str
    params: dict = field(default_factory=dict, hash=False)
    needs: str | None = None
    source: str = ""
    log_evidence: str = ""           # what in a Megatron-LM log proves or refutes it (docs/criteria.md)


@dataclass(frozen=True)
class GoldenSeries:
    """Golden values of one metric: per iteration a mean and a tolerance."""

    iterations: tuple
    mean: tuple
    tol: tuple

    def at(self, iteration: int) -> tuple | None:
        """(mean, tol) at an iteration, or None."""
        if iteration not in self.iterations:
            return None
        i = self.iterations.index(iteration)
        return self.mean[i], self.tol[i]


@dataclass(frozen=True)
class Golden:
    """A golden-values file: provenance plus series per metric."""

    path: str
    provenance: dict = field(hash=False)
    metrics: dict = field(hash=False)


@dataclass(frozen=True)
class Profile:
    """A named set of criteria, with the golden values they compare against."""

    name: str
    path: str
    description: str
    criteria: tuple
    golden: Golden | None = None
    extends: str | None = None
    recipe: str | None = None                                            # the course recipe these values are for
    variants: dict = field(default_factory=dict, hash=False, compare=False)  # recipe id -> Profile

    def for_recipe(self, recipe_id: str | None) -> "Profile":
        """This profile's criteria and golden values for one course recipe (itself when it has none)."""
        return self.variants.get(recipe_id, self)

    @property
    def ids(self) -> list:
        """Criterion ids in evaluation order."""
        return [c.id for c in self.criteria]

    def by_id(self, criterion_id: str) -> Criterion:
        """The criterion with this id (KeyError if absent)."""
        for c in self.criteria:
            if c.id == criterion_id:
                return c
        raise KeyError(criterion_id)


@dataclass(frozen=True)
class Verdict:
    """The judgement of one criterion on one run."""

    criterion_id: str
    label: str
    status: str                      # "pass" | "fail" | "not-measurable"
    measured: str
    expected: str
    where: str
    message: str
    consequence_of: str | None = None   # root-cause id when the criterion failed because the run never got there
    grader: bool = False                # not judged: the suite cannot read this evidence yet (its limitation, not
                                        # the student's); a live run keeps it not measured, grade counts it an error


# ---------------------------------------------------------------- golden files


def metric_series(log, metric: str) -> list:
    """[(iteration, value, line_no)] of a metric in a ParsedLog."""
    if metric == "validation lm loss":
        return [(v.iteration, v.lm_loss, v.line_no) for v in log.validations
                if v.split == "periodic" and v.lm_loss is not None]
    attr = {"lm loss": "lm_loss", "sop loss": "sop_loss"}[metric]
    return [(r.iteration, getattr(r, attr), r.line_no) for r in log.iterations if getattr(r, attr) is not None]


def golden_metric(runs: dict, metric: str, rel_tol_floor: float, k: float) -> dict:
    """One metric of a golden file: iterations common to all runs, raw samples per run, computed band."""
    per_run = {name: {it: v for it, v, _ in metric_series(log, metric)} for name, log in runs.items()}
    common = sorted(set.intersection(*(set(s) for s in per_run.values())))
    bands = [compute_band([per_run[n][it] for n in per_run], rel_tol_floor, k) for it in common]
    return {"iterations": common, "samples": {n: [s[it] for it in common] for n, s in per_run.items()},
            "mean": [round(b.mean, 7) for b in bands], "std": [round(b.std, 7) for b in bands],
            "tol": [round(b.tol, 7) for b in bands]}


def build_golden(runs: dict, provenance: dict, rel_tol_floor: float = 0.02, k: float = 3.0,
                 metrics=("lm loss", "validation lm loss")) -> dict:
    """A golden-values document from {run name: ParsedLog}; the band is computed, never typed."""
    provenance = {**provenance, "runs": len(runs), "run_names": sorted(runs)}
    return {"schema": 1, "provenance": provenance, "band_rule": {"k_std": k, "rel_tol_floor": rel_tol_floor},
            "metrics": {m: golden_metric(runs, m, rel_tol_floor, k) for m in metrics}}


def load_golden(path: str | Path) -> Golden:
    """Read and check a golden-values file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CriteriaError(f"{path}: cannot read golden values: {exc}") from exc
    metrics = {}
    for name, m in data.get("metrics", {}).items():
        lengths = {len(m.get(key, ())) for key in ("iterations", "mean", "tol")}
        if len(lengths) != 1:
            raise CriteriaError(f"{path}: metric {name!r}: iterations, mean and tol differ in length")
        metrics[name] = GoldenSeries(tuple(m["iterations"]), tuple(m["mean"]), tuple(m["tol"]))
    return Golden(path=str(path), provenance=data.get("provenance", {}), metrics=metrics)


# ---------------------------------------------------------------- loading profiles


_LAYOUT_BANDS: dict = {}


def _layout_bands(name: str) -> dict:
    """A layout file's bands, read once."""
    if name not in _LAYOUT_BANDS:
        _LAYOUT_BANDS[name] = load_layout_bands(name)
    return _LAYOUT_BANDS[name]


def _profile_path(name_or_path: str | Path, near: Path | None = None) -> Path:
    """A path, or a profile name: <near>/<name>.toml when it exists, else fixtures/criteria/<name>.toml."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text:
        return Path(text) if near is None or Path(text).is_absolute() else near / text
    if near is not None and (near / f"{text}.toml").exists():
        return near / f"{text}.toml"
    return CRITERIA_DIR / f"{text}.toml"


def _merged_raw(path: Path, seen: tuple = ()) -> dict:
    """The profile's raw tables with its `extends` chain applied; criteria remember the file that set them."""
    path = path.resolve()
    if path in seen:
        raise CriteriaError(f"{path}: `extends` cycle: {' -> '.join(str(p) for p in (*seen, path))}")
    raw = _read_toml(path)
    own = {cid: {**table, "__source__": str(path)} for cid, table in raw.get("criteria", {}).items()}
    recipes = {rid: {"golden": table.get("golden"),
                     "criteria": {cid: {**t, "__source__": str(path)} for cid, t in table.get("criteria", {}).items()}}
               for rid, table in raw.get("recipes", {}).items()}
    if "extends" not in raw:
        return {"criteria": own, "golden": raw.get("golden"), "recipes": recipes}
    base = _merged_raw(_profile_path(raw["extends"], near=path.parent), (*seen, path))
    criteria = {cid: t for cid, t in base["criteria"].items() if cid not in set(raw.get("drop", ()))}
    for cid, table in own.items():
        criteria[cid] = {**criteria.get(cid, {}), **table}
    golden = raw.get("golden", base.get("golden"))
    merged = {rid: {"golden": r["golden"], "criteria": dict(r["criteria"])} for rid, r in base["recipes"].items()}
    for rid, r in recipes.items():
        into = merged.setdefault(rid, {"golden": None, "criteria": {}})
        if r["golden"] is not None:
            into["golden"] = r["golden"]
        for cid, table in r["criteria"].items():
            into["criteria"][cid] = {**into["criteria"].get(cid, {}), **table}
    return {"criteria": criteria, "golden": golden, "recipes": merged}


def _check_params(kind: str, params: dict) -> str | None:
    """The first problem with a kind's parameters, or None."""
    for key in ("lo", "hi", "min_drop", "tol", "tol_scale"):
        if key in params and not _is_number(params[key]):
            return f"{key} must be a number, got {params[key]!r}"
    if "lo" in params and params["lo"] > params["hi"]:
        return f"lo ({params['lo']}) > hi ({params['hi']})"
    for key in ("window", "window_iters", "by_iteration", "max_increases", "max_misses", "iteration", "value"):
        if key in params and (not isinstance(params[key], int) or isinstance(params[key], bool) or params[key] < 0):
            return f"{key} must be a non-negative integer, got {params[key]!r}"
    if params.get("window") == 0:
        return "window must be at least 1"
    if "metric" in params and params["metric"] not in METRICS:
        return f"unknown metric {params['metric']!r} (known: {', '.join(METRICS)})"
    if kind == "marker_present":
        unknown = [m for m in params["markers"] if m not in MARKERS] if isinstance(params["markers"], list) \
            else [params["markers"]]
        if unknown or not params["markers"]:
            return f"unknown marker id(s) {unknown} (known: {', '.join(MARKERS)})"
    if kind in ("memory_band_mib", "memory_own_band") and params["layouts"]:
        try:
            _layout_bands(params["layouts"])
        except LayoutError as exc:
            return str(exc)
    if kind == "checkpoint_iterations" and not (isinstance(params["iterations"], list) and params["iterations"]):
        return "iterations must be a non-empty list of integers"
    return None


def _criterion(cid: str, table: dict) -> Criterion:
    """Build one Criterion from its merged table, or raise CriteriaError naming file and id."""
    source = table.get("__source__", "?")
    table = {k: v for k, v in table.items() if k != "__source__"}

    def error(problem: str) -> CriteriaError:
        """The error for this criterion."""
        return CriteriaError(ERROR_TEMPLATE.format(file=source, criterion_id=cid, problem=problem))

    if table.get("id", cid) != cid:
        raise error(f"id field {table['id']!r} differs from the table name")
    missing = [k for k in REQUIRED_COMMON if not table.get(k)]
    if missing:
        raise error(f"missing field(s): {', '.join(missing)}")
    spec = KINDS.get(table["kind"])
    if spec is None:
        raise error(f"unknown kind {table['kind']!r} (known: {', '.join(KINDS)})")
    missing = [k for k in spec.required if k not in table]
    if missing:
        raise error(f"kind {table['kind']!r} needs field(s): {', '.join(missing)}")
    unknown = sorted(set(table) - COMMON_FIELDS - set(spec.required) - set(spec.optional))
    if unknown:
        raise error(f"unknown field(s) for kind {table['kind']!r}: {', '.join(unknown)}")
    if table.get("needs") not in (None, *NEEDS):
        raise error(f"unknown needs {table['needs']!r} (known: {', '.join(NEEDS)})")
    params = {**spec.optional, **{k: table[k] for k in (*spec.required, *spec.optional) if k in table}}
    problem = _check_params(table["kind"], params)
    if problem:
        raise error(problem)
    return Criterion(id=cid, label=table["label"], kind=table["kind"], rationale=table["rationale"],
                     remedy=table["remedy"], params=params, needs=table.get("needs"), source=source,
                     log_evidence=table.get("log_evidence", ""))


def _resolve_golden(raw: dict, criteria: list) -> Golden | None:
    """Load the profile's golden file and check every golden criterion finds its metric in it."""
    users = [c for c in criteria if KINDS[c.kind].uses_golden]
    if not raw.get("golden"):
        if users and raw.get("golden") != "":
            raise CriteriaError(ERROR_TEMPLATE.format(file=users[0].source, criterion_id=users[0].id,
                                                      problem="compares with golden values but the profile "
                                                              "names no `golden` file"))
        return None
    path = Path(raw["golden"])
    path = path if path.is_absolute() else GOLDEN_DIR / path
    golden = load_golden(path)
    for c in users:
        if c.params["metric"] not in golden.metrics:
            raise CriteriaError(ERROR_TEMPLATE.format(file=c.source, criterion_id=c.id,
                                                      problem=f"metric {c.params['metric']!r} not in {path}"))
    return golden


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a profile by name (fixtures/criteria/<name>.toml) or path, applying `extends`."""
    path = _profile_path(name_or_path)
    if not path.exists():
        known = sorted(p.stem for p in CRITERIA_DIR.glob("*.toml"))
        raise CriteriaError(f"{path}: no such criteria profile (known: {', '.join(known)})")
    top, raw = _read_toml(path), _merged_raw(path)
    unknown = sorted(set(top) - PROFILE_FIELDS)
    if unknown:
        raise CriteriaError(f"{path}: unknown top-level key(s) {', '.join(unknown)} (known: "
                            f"{', '.join(sorted(PROFILE_FIELDS))})")
    criteria = [_criterion(cid, table) for cid, table in raw["criteria"].items()]
    if not criteria:
        raise CriteriaError(f"{path}: the profile has no [criteria.<id>] tables")
    base = Profile(name=top.get("name", path.stem), path=str(path), description=top.get("description", ""),
                   criteria=tuple(criteria), golden=_resolve_golden(raw, criteria), extends=top.get("extends"),
                   recipe=DEFAULT_RECIPE)
    for rid, override in raw["recipes"].items():
        if rid not in load_recipe().variants:
            raise CriteriaError(f"{path}: [recipes.{rid}]: no such course recipe (known: "
                                f"{', '.join(load_recipe().variants)})")
        unknown = sorted(set(override["criteria"]) - set(raw["criteria"]))
        if unknown:
            raise CriteriaError(f"{path}: [recipes.{rid}] overrides criteria the profile lacks: {', '.join(unknown)}")
        table = {cid: {**t, **override["criteria"].get(cid, {})} for cid, t in raw["criteria"].items()}
        variant = [_criterion(cid, t) for cid, t in table.items()]
        golden = raw["golden"] if override["golden"] is None else override["golden"]
        base.variants[rid] = replace(base, criteria=tuple(variant), recipe=rid,
                                     golden=_resolve_golden({"golden": golden}, variant), variants={})
    base.variants.setdefault(DEFAULT_RECIPE, base)
    return base


# ---------------------------------------------------------------- evaluation
