"""The course's recipe as data (fixtures/criteria/course-recipe.toml), how a log's arguments block compares with
it, and which recipe a log ran: a fact about the log, computed once and carried on its evidence.

The trainer and the session read the recipe to start runs; the criteria read it to judge them.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.errors import CriteriaError
from harness.base.paths import CRITERIA_DIR
from harness.evidence.logformat import printed_value


def _read_toml(path: Path) -> dict:
    """Parse one TOML file, naming it on error."""
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CriteriaError(f"{path}: cannot read criteria: {exc}") from exc


def _is_number(value) -> bool:
    """int or float, not bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
        elif not _same(course, printed := printed_value(arguments[name])):
            allowed = any(_same(v, printed) for v in recipe.allowed.get(name, ()))
            note = " (allowed: the course's FAQ remedy)" if allowed else ""
            (reported if name in recipe.reported or allowed else failing).append(
                f"{name}: {course} -> {_quoted(arguments[name])}{note}")
    return failing, reported, absent


QUOTE_MAX_CHARS = 60   # a flag's value as the log printed it, in a deviation: enough for any real value


def _quoted(value: str) -> str:
    """The run's value as the log gave it, cut to QUOTE_MAX_CHARS: a student's log decides its length, and each
    deviation is repeated in the grades table, the root cause and every failing criterion's message."""
    value = str(value)
    return value if len(value) <= QUOTE_MAX_CHARS else f"{value[:QUOTE_MAX_CHARS]}... ({len(value)} chars)"


def detect_recipe(log, recipe: Recipe | None = None) -> tuple[str | None, str]:
    """(recipe id, how it was recognised): from the arguments block, else from whether a sop loss is logged.
    Computed once per log and recipe file, and carried on the log (ParsedLog.fact)."""
    recipe = recipe or load_recipe()
    if log is None:
        return None, "no log"
    return log.fact(("recipe", recipe.path), lambda parsed: _detect_recipe(parsed, recipe))


def _detect_recipe(log, recipe: Recipe) -> tuple[str | None, str]:
    """detect_recipe, computed."""
    if log.arguments is not None:
        # the most specific recipe first: a model variant (hidden 64) also matches its base recipe's flags
        for rid, variant in sorted(recipe.variants.items(), key=lambda kv: -len(kv[1].flags)):
            if all(n in log.arguments and _same(v, log.argument(n)) for n, v in variant.flags.items()):
                return rid, "arguments block: " + ", ".join(f"{n} {log.arguments[n]}" for n in variant.flags)
        return None, "arguments block matches neither recipe"
    with_lm = [r for r in log.iterations if r.lm_loss is not None]
    if not with_lm:
        return None, "no arguments block and no lm loss line"
    has_sop = any(r.sop_loss is not None for r in with_lm)
    rid = next((rid for rid, v in recipe.variants.items() if v.sop_loss == has_sop and not v.model_variant), None)
    return rid, f"no arguments block; iteration lines {'carry' if has_sop else 'have no'} sop loss"
