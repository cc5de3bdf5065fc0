"""Acceptance criteria as data: load a TOML profile, judge a RunEvidence, and derive golden bands from runs.

A profile (fixtures/criteria/<name>.toml) is one table per criterion under ``[criteria.<id>]``; ``kind`` picks
a checker from the small vocabulary in ``KINDS``. Every criterion is evaluated and every failure is collected;
missing evidence is "not-measurable", never a pass. ``python -m harness.judge.criteria --help`` lists the commands.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.judge import fp16, logs
from harness.judge.evidence import RunEvidence
from harness.judge.layouts import LayoutError, layout_of, load_layout_bands
from harness.paths import CRITERIA_DIR, GOLDEN_DIR

PASS, FAIL, NOT_MEASURABLE = "pass", "fail", "not-measurable"
TAIL_LINES = 10

# The order is fixed: criterion, measured, expected, where, artifacts, last log lines, remedy.
FAILURE_TEMPLATE = (
    "{status}: {label} [{criterion_id}]\n"
    "  measured:  {measured}\n"
    "  expected:  {expected}\n"
    "  where:     {where}\n"
    "  artifacts: {artifacts}\n"
    "  last log lines:\n{tail}\n"
    "  remedy:    {remedy}"
)
PASS_TEMPLATE = "PASS: {label} [{criterion_id}]: measured {measured}; expected {expected}"
ERROR_TEMPLATE = "{file}: criterion {criterion_id!r}: {problem}"

PROFILE_FIELDS = {"name", "description", "extends", "golden", "drop", "criteria", "recipes"}
COMMON_FIELDS = {"id", "label", "kind", "rationale", "remedy", "needs"}
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
    "marker_present": KindSpec(("markers",), {}, "every listed harness.judge.logs.MARKERS id appears in the log"),
    "exit_code": KindSpec((), {"expected": 0}, "the trainer exited with this code and did not time out"),
    "ran_on_gpu": KindSpec((), {"expected": "cuda"}, "the trainer reported this device"),
    "first_loss_band": KindSpec(("lo", "hi"), {"metric": "lm loss"},
                                "first logged loss (first line that has it) within [lo, hi]"),
    "decreasing_trend": KindSpec((), {"metric": "lm loss", "window": 3, "min_drop": 0.5, "max_increases": 1},
                                 "windowed means: first - last >= min_drop, at most max_increases rises"),
    "final_loss_band": KindSpec(("lo", "hi"), {"metric": "lm loss", "require_complete": True},
                                "loss on the last iteration line within [lo, hi]; that line is --train-iters"),
    "golden_final_loss": KindSpec((), {"metric": "lm loss", "tol_scale": 1.0},
                                  "loss at the golden file's last iteration within its tolerance", True),
    "golden_curve": KindSpec((), {"metric": "lm loss", "tol_scale": 1.0, "max_misses": 2},
                             "per logged iteration |loss - golden| <= tol, up to max_misses misses", True),
    "no_nan": KindSpec((), {"after": 40},
                       "no divergence: every logged loss finite and no whole log interval skipped after iteration "
                       "`after` (overflow skips and Megatron's 'nan iterations' are judged by skips_only_before, "
                       "not here: harness.judge.fp16)"),
    "skips_only_before": KindSpec(("iteration",), {"max_fraction": 0.0},
                                  "skipped (overflow) steps after `iteration` are at most max_fraction of the steps "
                                  "after it (0: none at all)"),
    "checkpoint_iterations": KindSpec(("iterations",), {}, "iter_NNNNNNN/ exists with weights for each iteration"),
    "tracker_equals": KindSpec(("value",), {}, "latest_checkpointed_iteration.txt holds `value`"),
    "checkpoint_loads": KindSpec((), {}, "the newest checkpoint loads on CPU and its shapes match the model"),
    "resume_matches": KindSpec(("tol",), {"metric": "lm loss"},
                               "first loss logged after resuming within tol of the uninterrupted run"),
    "memory_band_mib": KindSpec(("lo", "hi"), {"layouts": ""},
                                "peak GPU memory seen by NVML within [lo, hi] MiB on 1 GPU; a multi-GPU run within "
                                "the band of its layout in the `layouts` file (none: not measured)"),
    "memory_own_band": KindSpec((), {"layouts": ""},
                                "the training's own peak memory (torch's allocator, max reserved) lies in the band "
                                "of this GPU kind's memory golden (harness.judge.memory_golden), NVML's total and "
                                "this machine's CUDA context reported beside it; several GPUs: the layout's bands"),
    "recipe_matches": KindSpec((), {"recipe": "course-recipe.toml"},
                               "the log's `arguments` block matches the course's recipe file (training flags)"),
    "cuda_graph_used": KindSpec((), {}, "the trainer's summary says its step ran as a CUDA graph (else the capture "
                                        "error)"),
}


class CriteriaError(ValueError):
    """A profile or golden file is wrong; the message names the file and the criterion."""


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


@dataclass(frozen=True)
class Band:
    """Tolerance band of one golden point, computed from repeated runs."""

    mean: float
    std: float
    tol: float
    n: int


# ---------------------------------------------------------------- bands and golden files


def compute_band(samples, rel_tol_floor: float, k: float = 3.0, abs_floor: float = 0.0) -> Band:
    """Band from the spread of runs: tol = max(k * sample std, rel_tol_floor * |mean|, abs_floor)."""
    values = [float(v) for v in samples]
    if not values:
        raise ValueError("compute_band needs at least one sample")
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return Band(mean=mean, std=std, tol=max(k * std, rel_tol_floor * abs(mean), abs_floor), n=len(values))


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


# ---------------------------------------------------------------- the course's recipe

DEFAULT_RECIPE = "a"


@dataclass(frozen=True)
class RecipeVariant:
    """One legitimate way through the chapter: its own flag values and how its log looks."""

    id: str
    title: str
    flags: dict
    sop_loss: bool
    corpus_layout: str
    extra_args: tuple = ()
    model_variant: bool = False          # a smaller model the FAQ allows (--hidden-size 64), with its own bands


@dataclass(frozen=True)
class Recipe:
    """The course's command as data (fixtures/criteria/course-recipe.toml)."""

    path: str
    flags: dict = field(hash=False)
    reported: dict = field(hash=False)       # flags shown when they differ, never failed (--seed)
    variants: dict = field(hash=False)
    allowed: dict = field(default_factory=dict, hash=False)  # flag -> values the course itself allows (the FAQ)

    def expected(self, recipe_id: str | None) -> dict:
        """Every judged flag with the course's value for one recipe."""
        return {**self.flags, **self.variants[recipe_id or DEFAULT_RECIPE].flags}


_RECIPES: dict = {}


def load_recipe(name: str = "course-recipe.toml") -> Recipe:
    """The recipe file (cached); errors name the file."""
    path = Path(name) if Path(name).is_absolute() else CRITERIA_DIR / name
    if path not in _RECIPES:
        raw = _read_toml(path)
        try:
            variants = {rid: RecipeVariant(rid, v["title"], dict(v["flags"]), bool(v["sop_loss"]),
                                           v["corpus_layout"], tuple(v.get("extra_args", ())),
                                           bool(v.get("model_variant", False)))
                        for rid, v in raw["recipes"].items()}
            allowed = {name: list(values) for name, values in raw.get("allowed", {}).items()}
            _RECIPES[path] = Recipe(str(path), dict(raw["flags"]), dict(raw.get("reported", {})), variants, allowed)
        except (KeyError, TypeError) as exc:
            raise CriteriaError(f"{path}: recipe file needs [flags], [recipes.<id>] with title, flags, sop_loss, "
                                f"corpus_layout: {exc!r}") from exc
    return _RECIPES[path]


def _printed(text: str):
    """A value as Megatron printed it: bool, int, float, or the text itself."""
    text = text.strip()
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _same(course, printed) -> bool:
    """Course value (TOML) equals the printed one: numbers by value, the rest exactly."""
    if isinstance(course, bool) or isinstance(printed, bool):
        return course is printed or course == printed and type(course) is type(printed)
    if _is_number(course) and _is_number(printed):
        return math.isclose(course, printed, rel_tol=1e-9, abs_tol=0.0)
    return str(course) == str(printed)


def recipe_deviations(recipe: Recipe, arguments: dict, recipe_id: str | None) -> tuple[list, list, list]:
    """(deviations that fail, reported differences, names the block does not print), each `name: course -> run`."""
    failing, reported, absent = [], [], []
    for name, course in {**recipe.expected(recipe_id), **recipe.reported}.items():
        if name not in arguments:
            absent.append(name)
        elif not _same(course, _printed(arguments[name])):
            allowed = any(_same(v, _printed(arguments[name])) for v in recipe.allowed.get(name, ()))
            note = " (allowed: the course's FAQ remedy)" if allowed else ""
            (reported if name in recipe.reported or allowed else failing).append(
                f"{name}: {course} -> {arguments[name]}{note}")
    return failing, reported, absent


def detect_recipe(log, recipe: Recipe | None = None) -> tuple[str | None, str]:
    """(recipe id, how it was recognised): from the arguments block, else from whether a sop loss is logged."""
    recipe = recipe or load_recipe()
    if log is None:
        return None, "no log"
    if log.arguments is not None:
        # the most specific recipe first: a model variant (hidden 64) also matches its base recipe's flags
        for rid, variant in sorted(recipe.variants.items(), key=lambda kv: -len(kv[1].flags)):
            if all(n in log.arguments and _same(v, _printed(log.arguments[n])) for n, v in variant.flags.items()):
                return rid, "arguments block: " + ", ".join(f"{n} {log.arguments[n]}" for n in variant.flags)
        return None, "arguments block matches neither recipe"
    with_lm = [r for r in log.iterations if r.lm_loss is not None]
    if not with_lm:
        return None, "no arguments block and no lm loss line"
    has_sop = any(r.sop_loss is not None for r in with_lm)
    rid = next((rid for rid, v in recipe.variants.items() if v.sop_loss == has_sop and not v.model_variant), None)
    return rid, f"no arguments block; iteration lines {'carry' if has_sop else 'have no'} sop loss"


# ---------------------------------------------------------------- loading profiles


def _profile_path(name_or_path: str | Path, near: Path | None = None) -> Path:
    """A path, or a profile name: <near>/<name>.toml when it exists, else fixtures/criteria/<name>.toml."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text:
        return Path(text) if near is None or Path(text).is_absolute() else near / text
    if near is not None and (near / f"{text}.toml").exists():
        return near / f"{text}.toml"
    return CRITERIA_DIR / f"{text}.toml"


def _read_toml(path: Path) -> dict:
    """Parse one TOML file, naming it on error."""
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CriteriaError(f"{path}: cannot read criteria: {exc}") from exc


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


def _is_number(value) -> bool:
    """int or float, not bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_params(kind: str, params: dict) -> str | None:
    """The first problem with a kind's parameters, or None."""
    for key in ("lo", "hi", "min_drop", "tol", "tol_scale"):
        if key in params and not _is_number(params[key]):
            return f"{key} must be a number, got {params[key]!r}"
    if "lo" in params and params["lo"] > params["hi"]:
        return f"lo ({params['lo']}) > hi ({params['hi']})"
    for key in ("window", "max_increases", "max_misses", "iteration", "value"):
        if key in params and (not isinstance(params[key], int) or isinstance(params[key], bool) or params[key] < 0):
            return f"{key} must be a non-negative integer, got {params[key]!r}"
    if params.get("window") == 0:
        return "window must be at least 1"
    if "metric" in params and params["metric"] not in METRICS:
        return f"unknown metric {params['metric']!r} (known: {', '.join(METRICS)})"
    if kind == "marker_present":
        unknown = [m for m in params["markers"] if m not in logs.MARKERS] if isinstance(params["markers"], list) \
            else [params["markers"]]
        if unknown or not params["markers"]:
            return f"unknown marker id(s) {unknown} (known: {', '.join(logs.MARKERS)})"
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
                     remedy=table["remedy"], params=params, needs=table.get("needs"), source=source)


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


@dataclass(frozen=True)
class Outcome:
    """What a checker found, before it is dressed as a Verdict."""

    status: str
    measured: str
    expected: str
    where: str
    missing: bool = False             # failed because the run never got that far (absent evidence)


def _missing(measured: str, expected: str, where: str) -> Outcome:
    """A failure for absent evidence: with a root cause, reported as its consequence."""
    return Outcome(FAIL, measured, expected, where, missing=True)


def _fmt(value: float | None) -> str:
    """A loss for messages."""
    return "none" if value is None else f"{value:.4f}"


def _at(it: int, line_no: int) -> str:
    """A 'where' for a log line."""
    return f"iteration {it}, log line {line_no}"


def _log_end(log) -> str:
    """A 'where' for something absent from the whole log."""
    cut = ", last line cut off" if log.truncated_last_line else ""
    return f"whole log ({log.lines_total} lines{cut})"


def _unmeasured(reason: str, expected: str, where: str = "-") -> Outcome:
    """Missing evidence: never a pass."""
    return Outcome(NOT_MEASURABLE, f"not measured: {reason}", expected, where)


def _no_log(expected: str) -> Outcome:
    """The run has no training log to read."""
    return _unmeasured("no training log", expected)


def _check_marker_present(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """Every marker line present."""
    wanted = c.params["markers"]
    expected = "log lines: " + "; ".join(repr(logs.MARKERS[m].strip()) for m in wanted)
    if ev.log is None:
        return _no_log(expected)
    missing = [m for m in wanted if m not in ev.log.markers]
    if missing:
        found = [f"{m} (line {ev.log.markers[m]})" for m in wanted if m in ev.log.markers]
        measured = "missing " + "; ".join(repr(logs.MARKERS[m].strip()) for m in missing)
        return _missing(measured + (f"; found {', '.join(found)}" if found else ""), expected, _log_end(ev.log))
    lines = [ev.log.markers[m] for m in wanted]
    return Outcome(PASS, "found at log line(s) " + ", ".join(map(str, lines)), expected, f"log line {lines[0]}")


def _check_exit_code(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """The process ended with the expected code, in time."""
    expected = f"exit code {c.params['expected']}, no timeout"
    if ev.timed_out:
        return Outcome(FAIL, f"timed out (exit code {ev.exit_code})", expected, "process end")
    if ev.exit_code is None:
        return _unmeasured("no exit code recorded (log judged on its own)", expected)
    status = PASS if ev.exit_code == c.params["expected"] else FAIL
    return Outcome(status, f"exit code {ev.exit_code}", expected, "process end")


def _check_ran_on_gpu(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """The trainer ran on the expected device."""
    expected = f"device {c.params['expected']}"
    if ev.device is None:
        return _unmeasured("the trainer's device was not recorded", expected)
    status = PASS if ev.device == c.params["expected"] else FAIL
    return Outcome(status, f"device {ev.device}", expected, "trainer start")


def _check_first_loss_band(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """The first logged loss lies in the band."""
    lo, hi, metric = c.params["lo"], c.params["hi"], c.params["metric"]
    expected = f"first logged {metric} in [{lo}, {hi}]"
    if ev.log is None:
        return _no_log(expected)
    series = metric_series(ev.log, metric)
    if not series:
        return _missing(f"no line with {metric} ({len(ev.log.iterations)} iteration lines)", expected,
                        _log_end(ev.log))
    it, value, line_no = series[0]
    return Outcome(PASS if lo <= value <= hi else FAIL, f"{_fmt(value)} at iteration {it}", expected,
                   _at(it, line_no))


def _windows(values: list, window: int) -> list:
    """Consecutive chunks covering all values, len(values) // window of them, sizes differing by at most one."""
    count = len(values) // window
    size, extra = divmod(len(values), count)
    chunks, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        chunks.append(values[start:end])
        start = end
    return chunks


def _check_decreasing_trend(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """Windowed means fall by min_drop overall with few rises: robust to per-line noise."""
    window, min_drop, max_rises, metric = (c.params[k] for k in ("window", "min_drop", "max_increases", "metric"))
    expected = (f"first minus last window mean of {metric} >= {min_drop} (windows of ~{window} logged values), "
                f"at most {max_rises} rise(s) between consecutive window means")
    if ev.log is None:
        return _no_log(expected)
    series = metric_series(ev.log, metric)
    if len(series) < 2 * window:
        return _missing(f"only {len(series)} logged {metric} value(s), need {2 * window}", expected,
                        _log_end(ev.log))
    where = f"iterations {series[0][0]}-{series[-1][0]}, log lines {series[0][2]}-{series[-1][2]}"
    bad = next(((it, v, ln) for it, v, ln in series if not math.isfinite(v)), None)
    if bad:
        return Outcome(FAIL, f"non-finite {metric} {bad[1]} at iteration {bad[0]}", expected, _at(bad[0], bad[2]))
    means = [sum(w) / len(w) for w in _windows([v for _, v, _ in series], window)]
    drop, rises = means[0] - means[-1], sum(b > a for a, b in zip(means, means[1:]))
    measured = (f"drop {drop:.4f} ({means[0]:.4f} -> {means[-1]:.4f}), {rises} rise(s) over {len(means)} "
                f"window means")
    return Outcome(PASS if drop >= min_drop and rises <= max_rises else FAIL, measured, expected, where)


def _check_final_loss_band(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """The loss on the last iteration line lies in the band, and that line ends the run."""
    lo, hi, metric = c.params["lo"], c.params["hi"], c.params["metric"]
    expected = f"{metric} in [{lo}, {hi}] on the last iteration line" + (
        ", which is --train-iters" if c.params["require_complete"] else "")
    if ev.log is None:
        return _no_log(expected)
    if not ev.log.iterations:
        return _missing("no iteration line in the log", expected, _log_end(ev.log))
    last = ev.log.iterations[-1]
    where = _at(last.iteration, last.line_no)
    if c.params["require_complete"] and last.iteration < last.train_iters:
        cut = "; the log's last line is cut off" if ev.log.truncated_last_line else ""
        return _missing(f"the log stops at iteration {last.iteration} of {last.train_iters}{cut}", expected, where)
    series = metric_series(ev.log, metric)
    if not series or series[-1][0] != last.iteration:
        return _missing(f"no {metric} at the last iteration {last.iteration}", expected, where)
    it, value, line_no = series[-1]
    return Outcome(PASS if lo <= value <= hi else FAIL, f"{_fmt(value)} at iteration {it}", expected,
                   _at(it, line_no))


def _golden_series(c: Criterion, golden: Golden) -> GoldenSeries:
    """The golden series a criterion compares with."""
    return golden.metrics[c.params["metric"]]


def _no_golden(c: Criterion) -> Outcome:
    """The profile has no golden values for the run's recipe."""
    return _unmeasured("this profile has no golden values for the run's recipe", f"{c.params['metric']} golden values")


def _golden_source(golden: Golden, ev: RunEvidence) -> str:
    """The golden file and the GPU it was calibrated on; a run on another GPU kind is judged by the same bands, and
    the text says they were calibrated elsewhere (no other GPU kind has been measured)."""
    from harness.judge.memory_golden import slug

    made_on = golden.provenance.get("gpu")
    text = Path(golden.path).name + (f", calibrated on {made_on}" if made_on else "")
    here = ev.memory.gpu_name if ev.memory is not None else None
    if made_on and here and slug(here) != slug(made_on):
        text += f"; this run's GPU ({here}) has no golden values of its own: judged by these, calibrated elsewhere"
    return text


def _check_golden_final_loss(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """The loss at the golden's last iteration agrees with the golden value."""
    if golden is None:
        return _no_golden(c)
    series, metric, scale = _golden_series(c, golden), c.params["metric"], c.params["tol_scale"]
    it = series.iterations[-1]
    mean, tol = series.at(it)
    expected = f"{metric} {mean:.4f} +/- {tol * scale:.4f} at iteration {it} ({_golden_source(golden, ev)})"
    if ev.log is None:
        return _no_log(expected)
    found = {i: (v, ln) for i, v, ln in metric_series(ev.log, metric)}
    if it not in found:
        return _missing(f"no {metric} at iteration {it} (log ends at iteration {ev.log.last_iteration})",
                        expected, _log_end(ev.log))
    value, line_no = found[it]
    ok = abs(value - mean) <= tol * scale
    return Outcome(PASS if ok else FAIL, f"{_fmt(value)} (off by {abs(value - mean):.4f})", expected,
                   _at(it, line_no))


def _check_golden_curve(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """Each logged point near its golden value; a few misses (noise) allowed, missing points count as misses."""
    if golden is None:
        return _no_golden(c)
    series, metric, scale, allowed = (_golden_series(c, golden), c.params["metric"], c.params["tol_scale"],
                                      c.params["max_misses"])
    expected = (f"|{metric} - golden| <= tol at each of {len(series.iterations)} iterations "
                f"{series.iterations[0]}-{series.iterations[-1]} ({_golden_source(golden, ev)}), "
                f"at most {allowed} miss(es)")
    if ev.log is None:
        return _no_log(expected)
    found = {i: (v, ln) for i, v, ln in metric_series(ev.log, metric)}
    missing = [it for it in series.iterations if it not in found]
    off = [(abs(found[it][0] - m) / (t * scale) if t else math.inf, it, found[it][0], m, t * scale)
           for it, m, t in zip(series.iterations, series.mean, series.tol) if it in found]
    off = [o for o in off if not o[0] <= 1.0]          # nan counts as a miss
    misses = len(missing) + len(off)
    parts = [f"{misses} miss(es) of {len(series.iterations)}"]
    where = _log_end(ev.log)
    if off:
        _, it, v, m, t = max(off, key=lambda o: o[0] if math.isfinite(o[0]) else math.inf)
        parts.append(f"worst at iteration {it}: {_fmt(v)} vs {m:.4f} +/- {t:.4f}")
        where = _at(it, found[it][1])
    if missing:
        parts.append("missing iteration(s) " + ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else ""))
    return Outcome(PASS if misses <= allowed else FAIL, "; ".join(parts), expected, where,
                   missing=misses > allowed and len(missing) > allowed)


def _check_no_nan(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """The run did not diverge: finite losses, and no whole log interval skipped after the loss-scale search."""
    after = c.params["after"]
    expected = (f"every logged loss finite and no log interval after iteration {after} skipped whole (an occasional "
                "overflow skip is normal fp16 loss scaling)")
    if ev.log is None:
        return _no_log(expected)
    if not ev.log.iterations:
        return _missing("no iteration line in the log", expected, _log_end(ev.log))
    found = fp16.divergence(ev.log.iterations, after)
    if found:
        what, r = found
        return Outcome(FAIL, what, expected, _at(r.iteration, r.line_no))
    lowest = min((r.loss_scale for r in ev.log.iterations if r.loss_scale is not None), default=None)
    nan_skips = sum(r.nan or 0 for r in ev.log.iterations if r.iteration != 1)
    return Outcome(PASS, f"finite losses in {len(ev.log.iterations)} iteration lines; lowest loss scale "
                         f"{_scale(lowest)}; {nan_skips} overflowed step(s) counted as 'nan iterations' (skipped, "
                         "as fp16 loss scaling does)", expected, _log_end(ev.log))


def _scale(value) -> str:
    """A loss scale for messages."""
    return "not logged" if value is None else f"{value:g}"


def _check_skips_only_before(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """Skipped steps after the initial fp16 loss-scale search stay at most max_fraction of the steps after it."""
    limit, most = c.params["iteration"], c.params["max_fraction"]
    expected = (f"skipped iterations only in log intervals ending at or before iteration {limit}" if most == 0 else
                f"at most {most:.1%} of the steps after iteration {limit} skipped (fp16 overflows now and then)")
    if ev.log is None:
        return _no_log(expected)
    if not ev.log.iterations:
        return _missing("no iteration line in the log", expected, _log_end(ev.log))
    uncounted = _without_counter(ev.log, "skipped", "number of skipped iterations")
    if uncounted:
        return _unmeasured(uncounted, expected, _log_end(ev.log))
    count = fp16.skips_after(ev.log.iterations, limit)
    # Megatron's iteration-1 line is extra: the next line's counter covers iteration 1 again (no reset after it).
    counted = [r for r in ev.log.iterations if r.iteration != 1] or list(ev.log.iterations)
    early = sum(r.skipped for r in counted if r.iteration <= limit)
    measured = (f"{early} skipped up to iteration {limit}; after it {count.skipped} of {count.steps} steps "
                f"({count.fraction:.1%})")
    if count.skipped and count.fraction > most:
        r = count.first
        return Outcome(FAIL, measured + f"; first in the interval ending at iteration {r.iteration}", expected,
                       _at(r.iteration, r.line_no))
    return Outcome(PASS, measured, expected, _log_end(ev.log))


def _without_counter(log, attr: str, key: str) -> str | None:
    """Why a counter cannot be judged (iteration lines without it), or None when every line has it."""
    absent = [r for r in log.iterations if getattr(r, attr) is None]
    if not absent:
        return None
    return (f"{len(absent)} of {len(log.iterations)} iteration lines have no '{key}' counter "
            f"(first at log line {absent[0].line_no}); an absent counter is not 0")


def _no_checkpoints(expected: str) -> Outcome:
    """The run's --save directory was not inspected."""
    return _unmeasured("no checkpoint directory inspected", expected)


def _check_checkpoint_iterations(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """Each iter_NNNNNNN/ exists and holds recognisable weights."""
    wanted = c.params["iterations"]
    expected = " and ".join(f"iter_{i:07d}/" for i in wanted) + " with weights"
    report = ev.checkpoints
    if report is None:
        return _no_checkpoints(expected)
    missing = [i for i in wanted if i not in report.iterations]
    found = ", ".join(f"iter_{i:07d}" for i in report.iterations) or "none"
    if missing:
        return _missing(f"missing {', '.join(f'iter_{i:07d}/' for i in missing)} (found: {found})", expected,
                        report.save_dir)
    if report.format is None:
        return Outcome(FAIL, f"found {found} but no weights files recognised", expected, report.save_dir)
    return Outcome(PASS, f"found {found} ({report.format})", expected, report.save_dir)


def _check_tracker_equals(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """latest_checkpointed_iteration.txt names the last checkpoint."""
    expected = f"latest_checkpointed_iteration.txt = {c.params['value']}"
    report = ev.checkpoints
    if report is None:
        return _no_checkpoints(expected)
    status = PASS if report.tracker == c.params["value"] else FAIL
    return Outcome(status, f"tracker = {report.tracker}", expected, report.save_dir)


def _check_checkpoint_loads(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """The newest checkpoint loads and matches the model's shapes."""
    expected = "newest checkpoint loads on CPU, parameter names and shapes match the model"
    report = ev.checkpoints
    if report is None:
        return _no_checkpoints(expected)
    ok = report.loaded and report.shapes_ok
    measured = f"loaded={report.loaded}, shapes_ok={report.shapes_ok}, {report.num_parameters} parameters"
    if report.problems:
        measured += "; " + "; ".join(report.problems)
    return Outcome(PASS if ok else FAIL, measured, expected, report.save_dir)


def _check_resume_matches(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """The first loss after resuming agrees with the uninterrupted run at the same iteration."""
    tol, metric = c.params["tol"], c.params["metric"]
    expected = f"first {metric} after resume within {tol} of the uninterrupted run at the same iteration"
    if ev.resume_log is None or ev.log is None:
        return _unmeasured("no resumed run" if ev.resume_log is None else "no training log", expected)
    resumed = metric_series(ev.resume_log, metric)
    if not resumed:  # name how the resumed run's log ends: its own error is the root cause, not the source's log
        tail = [line.strip()[:160] for line in ev.resume_log.lines if line.strip()][-3:]
        ends = f"; its log ends: {' / '.join(tail)}" if tail else "; its log is empty"
        return _missing(f"the resumed run logged no {metric}{ends}", expected,
                        "resumed run's " + _log_end(ev.resume_log))
    it, value, line_no = resumed[0]
    where = f"resumed run: {_at(it, line_no)}"
    base = {i: v for i, v, _ in metric_series(ev.log, metric)}
    if it not in base:
        return Outcome(FAIL, f"{_fmt(value)} at iteration {it}, but the uninterrupted run has no {metric} there",
                       expected, where)
    diff = abs(value - base[it])
    return Outcome(PASS if diff <= tol else FAIL, f"{_fmt(value)} vs {_fmt(base[it])} (off by {diff:.4f})",
                   expected, where)


_LAYOUT_BANDS: dict = {}


def _layout_bands(name: str) -> dict:
    """A layout file's bands, read once."""
    if name not in _LAYOUT_BANDS:
        _LAYOUT_BANDS[name] = load_layout_bands(name)
    return _LAYOUT_BANDS[name]


def _check_memory_band_mib(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """Peak GPU memory as NVML saw it lies in the band of the run's layout: lo/hi on 1 GPU, else the layout file's."""
    layout, how = layout_of(ev)
    if layout is None:
        return _unmeasured(f"the run's parallel layout is unknown ({how}), so no band applies",
                           "peak GPU memory in the band of the run's layout")
    if layout.world_size == 1:
        lo, hi, source = c.params["lo"], c.params["hi"], "the 1-GPU band"
    else:
        band = _layout_bands(c.params["layouts"]).get(layout) if c.params["layouts"] else None
        if band is None:
            known = ", ".join(b.layout.name() for b in _layout_bands(c.params["layouts"]).values()) \
                if c.params["layouts"] else "none"
            where = f"layouts file {c.params['layouts']}" if c.params["layouts"] else "this profile"
            return _unmeasured(f"no memory band is calibrated for {layout.name()} in {where} (calibrated: {known}); "
                               "measure that layout's per-rank peaks on the GPU and add them",
                               f"peak GPU memory per GPU in the band of {layout.name()}", f"layout from {how}")
        lo, hi, source = band.lo, band.hi, f"{c.params['layouts']} {band.key}"
    expected = (f"peak GPU memory per GPU in [{lo}, {hi}] MiB for {layout.name()} ({source}; NVML, includes CUDA "
                f"context)")
    mem = ev.memory
    if mem is None or mem.peak_mib is None:
        reason = "no NVML memory trace" if mem is None else f"{mem.method}: {mem.reason or 'no peak'}"
        return _unmeasured(reason + (" (needs a live GPU run)" if c.needs == "gpu-live" else ""), expected)
    peaks = [mem.peak_mib] + [r.peak_mib for r in mem.ranks]   # every rank is judged; the worst decides
    status = PASS if all(lo <= peak <= hi for peak in peaks) else FAIL
    measured = f"{mem.peak_mib:.0f} MiB ({mem.method}, {mem.samples} samples)"
    if len(mem.ranks) > 1:
        measured = (f"highest {measured}; per rank: "
                    + "; ".join(f"{r.label()} {r.peak_mib:.0f} MiB" for r in mem.ranks))
    return Outcome(status, measured, expected, f"GPU {mem.gpu_name or '?'}, {layout.name()} (layout from {how})")


def _check_memory_own_band(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """The training's own memory (allocator peak reserved) in this GPU kind's band; the context is reported."""
    from harness.judge import memory_golden

    layout, how = layout_of(ev)
    if layout is None or layout.world_size > 1:  # several GPUs (or an unknown split): each rank's NVML band
        return _check_memory_band_mib(replace(c, params={**c.params, "lo": 0, "hi": 0}), ev, golden)
    mem = ev.memory
    doc, why = memory_golden.select(mem.gpu_name if mem else None)
    if doc is None:
        return _unmeasured(why, "the training's own peak GPU memory in a calibrated band")
    lo, hi = doc["own_band_mib"]["lo"], doc["own_band_mib"]["hi"]
    expected = (f"the training's own peak memory (torch allocator, max reserved) in [{lo}, {hi}] MiB ({why}); "
                "the CUDA context of this machine is reported, not judged")
    own = (ev.extra.get("summary") or {}).get("torch_max_reserved_mib")
    if mem is None or mem.peak_mib is None:
        reason = "no NVML memory trace" if mem is None else f"{mem.method}: {mem.reason or 'no peak'}"
        return _unmeasured(reason + (" (needs a live GPU run)" if c.needs == "gpu-live" else ""), expected)
    if own is None:
        return _unmeasured("the trainer recorded no allocator peak (summary.json: torch_max_reserved_mib)", expected)
    context = mem.peak_mib - own
    measured = (f"own {own:.0f} MiB + context {context:.0f} MiB = {mem.peak_mib:.0f} MiB total on "
                f"{mem.gpu_name or 'this GPU'} ({mem.method}; the course says about 2-4 GB in total)")
    return Outcome(PASS if lo <= own <= hi else FAIL, measured, expected,
                   f"GPU {mem.gpu_name or '?'}, {layout.name() if layout else '1 GPU'}")


def _check_recipe_matches(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """Every training flag in the log's `arguments` block has the course's value; --seed is only reported."""
    recipe = load_recipe(c.params["recipe"])
    rid, how = detect_recipe(ev.log, recipe)
    expected = (f"the course's training flags ({len(recipe.expected(rid))} judged, recipe "
                f"{rid or DEFAULT_RECIPE}: {recipe.variants[rid or DEFAULT_RECIPE].title})")
    if ev.log is None:
        return _no_log(expected)
    if ev.log.arguments is None:
        return _unmeasured("the log has no `arguments` block (Megatron-LM prints it at start-up), so the flags "
                           "cannot be compared", expected, _log_end(ev.log))
    failing, reported, absent = recipe_deviations(recipe, ev.log.arguments, rid)
    where = f"arguments block at log line {ev.log.arguments_line}"
    notes = ([f"reported, not judged: {'; '.join(reported)}"] if reported else []) + (
        [f"not printed: {', '.join(absent)}"] if absent else [])
    if failing:
        return Outcome(FAIL, f"{len(failing)} deviation(s): " + "; ".join(failing + notes), expected, where)
    return Outcome(PASS, "; ".join([f"no deviation ({how})"] + notes), expected, where)
def _check_cuda_graph_used(c: Criterion, ev: RunEvidence, golden) -> Outcome:
    """The reference trainer recorded that the captured graph ran; a capture error is the measurement."""
    expected = "whole step captured in one CUDA graph and replayed (summary.json: cuda_graphs true)"
    summary = ev.extra.get("summary") or {}
    if "cuda_graphs" not in summary:
        return _unmeasured("the trainer wrote no summary.json (or not the reference trainer)", expected)
    if summary["cuda_graphs"]:
        return Outcome(PASS, "CUDA graph captured and replayed", expected, "trainer setup")
    if summary.get("cuda_graph_error"):
        return Outcome(FAIL, f"capture failed, the run fell back to the eager step: {summary['cuda_graph_error']}",
                       expected, "trainer setup (log line 'WARNING: CUDA graph capture failed')")
    why = (f"the run failed during {summary['failed_in']} before capture: {summary.get('error')}"
           if summary.get("failed_in") == "setup" else f"eager step on device {summary.get('device')}")
    return Outcome(FAIL, f"no CUDA graph: {why}", expected, "trainer setup")


CHECKERS = {kind: globals()[f"_check_{kind}"] for kind in KINDS}


def _tail_lines(ev: RunEvidence) -> list:
    """The last log lines, from the parsed log or the log file."""
    if ev.log is not None and getattr(ev.log, "lines", None):
        return ev.log.tail(TAIL_LINES)
    if ev.log_path and Path(ev.log_path).is_file():
        return Path(ev.log_path).read_text(errors="replace").split("\n")[-TAIL_LINES:]
    return []


ROOT_CAUSE_TEMPLATE = "  ROOT CAUSE [{cause_id}]: {cause}\n  fix first: {remedy}\n"
CONSEQUENCE_REMEDY = "none of its own: not reached because of the root cause above; fix that first"


def render_message(c: Criterion, outcome: Outcome, ev: RunEvidence, cause=None) -> str:
    """The verdict text: one line for a pass; else the root cause first (when the run failed), then FAILURE_TEMPLATE.

    A criterion that failed only because the run never got that far gets no remedy of its own: it would be the
    wrong one (a dataset remedy for a run that died on an import error).
    """
    if outcome.status == PASS:
        return PASS_TEMPLATE.format(label=c.label, criterion_id=c.id, measured=outcome.measured,
                                    expected=outcome.expected)
    tail = "\n".join(f"    | {line}" for line in _tail_lines(ev)) or "    (no log lines)"
    remedy = CONSEQUENCE_REMEDY if cause is not None and outcome.missing else c.remedy
    text = FAILURE_TEMPLATE.format(status=outcome.status.upper(), label=c.label, criterion_id=c.id,
                                   measured=outcome.measured, expected=outcome.expected, where=outcome.where,
                                   artifacts=ev.run_dir, tail=tail, remedy=remedy)
    if cause is None:
        return text
    head, _, rest = text.partition("\n")
    return head + "\n" + ROOT_CAUSE_TEMPLATE.format(cause_id=cause.cause_id, cause=cause.cause,
                                                   remedy=cause.remedy) + rest


def _with_parsed_log(ev: RunEvidence) -> RunEvidence:
    """Evidence whose log is parsed (from log_path when only the path is known)."""
    if ev.log is None and ev.log_path and Path(ev.log_path).is_file():
        return replace(ev, log=logs.parse_log_file(ev.log_path))
    return ev


def _log_text(ev: RunEvidence) -> str:
    """The whole log as text ('' when there is none)."""
    if ev.log is not None and ev.log.lines:
        return "\n".join(ev.log.lines)
    if ev.log_path and Path(ev.log_path).is_file():
        with open(ev.log_path, errors="replace") as fh:  # bounded: a submitted log may be any size
            return fh.read(2 * logs.KEEP_CHARS)
    return ""


def root_cause(ev: RunEvidence):
    """The diagnosis of a run that failed (crashed, timed out, stopped early, or went NaN); None for a healthy run.

    A recorded log has no exit code: one that stops before --train-iters was stopped, killed or cut, so the
    diagnose table sees it as stalled, and a log with no known cause gets `log-ends-early` rather than a hang.
    """
    from harness.judge import diagnose as dg

    log, text = ev.log, _log_text(ev)
    last = log.iterations[-1] if log is not None and log.iterations else None
    incomplete = last is None or last.iteration < last.train_iters
    nan = log is not None and fp16.divergence(log.iterations) is not None
    crashed = ev.timed_out or ev.exit_code not in (None, 0)
    if not (crashed or incomplete or nan):
        return None
    recorded = ev.exit_code is None and not ev.timed_out
    rules = [r for r in dg.RULES if not (recorded and r.id == "timeout")]
    found = dg.diagnose("train", ev.exit_code, text, timed_out=ev.timed_out, stalled=recorded and incomplete,
                        rules=rules)
    if found is not None:
        return found
    last_line = dg.Outcome("train", ev.exit_code, text).last_line
    if ev.exit_code not in (None, 0):
        return dg.Diagnosis("crashed", f"the run exited with code {ev.exit_code} and its log names no known cause; "
                                       f"last line: {last_line}",
                            "read the traceback at the end of the log", last_line)
    where = "no iteration line" if last is None else f"iteration {last.iteration} of {last.train_iters}"
    error = dg.first_python_error(text)
    if error:
        return dg.Diagnosis("crashed", f"the log stops at {where} after an error its log names no known cause for: "
                                       f"{error}", "read the traceback that ends with that line in the log", error)
    return dg.Diagnosis("log-ends-early", f"the log stops at {where} with no error in it: the run was stopped "
                                          "(--exit-interval), killed, or the log was cut",
                        "submit the complete log of a run that reached --train-iters (it ends with the test-set "
                        "loss line)", last_line)


@dataclass(frozen=True)
class Judgement:
    """One run judged: the course recipe it followed, the root cause when it failed, one verdict per criterion."""

    profile: str
    recipe: str | None
    recipe_how: str
    diagnosis: object                # harness.judge.diagnose.Diagnosis | None
    verdicts: tuple
    provenance: tuple = ()           # how the judged log was read, stitched or chosen (RunEvidence.provenance)

    def ids(self, status: str) -> list:
        """Criterion ids with this status, in profile order."""
        return [v.criterion_id for v in self.verdicts if v.status == status]

    @property
    def verdict(self) -> str:
        """'fail' when any criterion failed; not-measured criteria are listed, never counted as passes."""
        return "fail" if self.ids(FAIL) else "pass"


def judge(profile: Profile, evidence: RunEvidence, live: bool = False, exclude=frozenset()) -> Judgement:
    """Judge every criterion of the run's recipe variant of the profile, never stopping at a failure.

    live=True: the run was made now, so a criterion that cannot be measured fails (with the reason).
    exclude: kinds that do not apply to this run (resume_matches for a run that nothing resumes).
    """
    ev = _with_parsed_log(evidence)
    recipe_id, how = detect_recipe(ev.log)
    variant = profile.for_recipe(recipe_id)
    cause = root_cause(ev)
    verdicts = []
    for c in (c for c in variant.criteria if c.kind not in exclude):
        outcome = CHECKERS[c.kind](c, ev, variant.golden)
        if live and outcome.status == NOT_MEASURABLE:
            outcome = Outcome(FAIL, f"{outcome.measured} (in a live run every criterion must be measured)",
                              outcome.expected, outcome.where, missing=True)
        consequence = cause.cause_id if cause is not None and outcome.status == FAIL and outcome.missing else None
        verdicts.append(Verdict(criterion_id=c.id, label=c.label, status=outcome.status, measured=outcome.measured,
                                expected=outcome.expected, where=outcome.where,
                                message=render_message(c, outcome, ev, cause if outcome.status != PASS else None),
                                consequence_of=consequence))
    return Judgement(profile.name, recipe_id, how, cause, tuple(verdicts), tuple(ev.provenance))


def evaluate(profile: Profile, evidence: RunEvidence, live: bool = False, exclude=frozenset()) -> list:
    """judge()'s verdicts as a list."""
    return list(judge(profile, evidence, live, exclude).verdicts)


def evidence_from_log_text(text: str, run_dir: str = "(recorded log)", log_path: str | None = None) -> RunEvidence:
    """Evidence that a log alone can give: exit code, device, checkpoints and memory stay unmeasured."""
    return RunEvidence(run_dir=run_dir, log=logs.parse_log(text), log_path=log_path)


def evidence_from_log_file(path: str | Path) -> RunEvidence:
    """evidence_from_log_text for a log file, read as any tool wrote it (harness.judge.logread); the artifacts path
    is the log's folder."""
    path = Path(path)
    return RunEvidence(run_dir=str(path.parent), log=logs.parse_log_file(path), log_path=str(path))


# ---------------------------------------------------------------- command line


def _cmd_check(args) -> int:
    """Judge a log with a profile; exit 1 when any criterion fails."""
    verdicts = evaluate(load_profile(args.profile), evidence_from_log_file(args.log))
    for v in verdicts:
        print(v.message if v.status == PASS else v.message + "\n")
    return int(any(v.status == FAIL for v in verdicts))


def _cmd_golden(args) -> int:
    """Write a golden file from one or more logs (one per run/seed)."""
    runs = {Path(p).stem: logs.parse_log_file(p) for p in args.logs}
    provenance = json.loads(args.provenance) if args.provenance else {}
    doc = build_golden(runs, provenance, rel_tol_floor=args.rel_tol_floor, k=args.k)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}: {len(runs)} run(s)")
    return 0


def main(argv: list | None = None) -> int:
    """CLI: `check` a log against a profile, or compute a `golden` file from logs."""
    parser = argparse.ArgumentParser(prog="python -m harness.judge.criteria")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="judge a training log with a criteria profile")
    check.add_argument("--profile", default="reference")
    check.add_argument("--log", required=True)
    check.set_defaults(func=_cmd_check)
    golden = sub.add_parser("golden", help="compute a golden-values file (bands from the spread of runs)")
    golden.add_argument("--out", required=True)
    golden.add_argument("--provenance", help="JSON object: gpu, versions, date, seeds, ...")
    golden.add_argument("--rel-tol-floor", type=float, default=0.02)
    golden.add_argument("--k", type=float, default=3.0, help="tolerance = max(k * std, floor)")
    golden.add_argument("logs", nargs="+")
    golden.set_defaults(func=_cmd_golden)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
