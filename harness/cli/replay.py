"""Replay: re-run each submission's own flags and seed with the reference trainer and compare every printed lm loss.

A log's numbers are a function of its flags, its seed, its release and its GPU kind (Megatron-LM repeats a run to
the last printed digit on one GPU kind), and the reference trainer reproduces Megatron-LM within a measured
tolerance per iteration (fixtures/golden/replay_tolerance.toml). So a log whose losses its own arguments block
does not give again is not the run it says it is: its seed or flags were edited, or its numbers were made up.

``python -m harness replay DIR [--out OUT] [--jobs N] [--device cuda]``: one trainer run per submission (N at once
on one GPU; default one per usable CPU core; OUT defaults to DIR-replay beside DIR), each on the course's corpus for its recipe (built once), then ``replay.json`` and ``replay.md``:
"reproduced (max |d| 0.004 over 25 points)" or "not reproduced at iteration 50: 9.04 in the log, 9.31 from its
flags and seed". Nothing in a submission is executed: its arguments block becomes trainer flags through an
allowlist (the trainer's own Megatron-named flags; values parsed as numbers or matched against the flag's choices).

Exit codes (harness.cli.args): 0 every replayed log reproduced; 1 one was not; 2 interrupted; 3 a replay did not
finish (the grader's or the machine's fault); 4 usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.base import paths
from harness.cli.args import (EXIT_FAILED, EXIT_GRADER_ERROR, EXIT_INTERRUPTED, EXIT_PASSED, EXIT_USAGE, add_jobs,
                              add_time_limit, default_out, exit_codes_help, jobs, not_a_folder)
from harness.evidence.recipe import DEFAULT_RECIPE, detect_recipe

EXIT_CODES_HELP = exit_codes_help(passed="every replayed log reproduced", failed="a log not reproduced",
                                  grader_error="a replay did not finish: the grader's or the machine's fault")
TOLERANCE_FILE = paths.GOLDEN_DIR / "replay_tolerance.toml"
# block entries never passed on: where the run read and wrote, and how it logged (the replay logs every interval
# the log has, and writes nothing but its log)
NOT_REPLAYED = {"data_path", "vocab_file", "data_cache_path", "save", "load", "save_interval", "ckpt_format",
                "ckpt_step", "exit_interval", "no_load_optim", "no_load_rng", "distributed_backend", "num_workers",
                "dataloader_type", "spec", "attention_backend", "partitions"}
# Megatron-LM arguments that change the numbers and that the trainer does not implement: a log whose value differs
# from the course's recorded run cannot be replayed by the trainer (Megatron-LM's own replay, through checkout mode,
# can)
UNSUPPORTED = ("swiglu", "normalization", "position_embedding_type", "untie_embeddings_and_output_weights",
               "apply_residual_connection_post_layernorm", "add_bias_linear", "num_query_groups",
               "group_query_attention", "rampup_batch_size", "train_samples", "lr_warmup_init", "lr_warmup_samples",
               "lr_decay_samples", "weight_decay_incr_style", "vocab_extra_ids", "use_rotary_position_embeddings",
               "data_parallel_size", "context_parallel_size")
COURSE_LOG = paths.RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"


PRECISIONS = ("fp16", "bf16", "fp32")


def precision_of(arguments: dict | None) -> str:
    """The precision a log's arguments block says its run trained in: bf16, fp16, or neither (fp32)."""
    arguments = arguments or {}
    if str(arguments.get("bf16", "")).strip() == "True":
        return "bf16"
    if str(arguments.get("fp16", "")).strip() == "True":
        return "fp16"
    return "fp32"


def tolerances(precision: str = "fp16", path: Path = TOLERANCE_FILE) -> tuple | None:
    """(per-interval tolerance, tolerance of the last iteration's training loss) measured for runs of this
    precision, or None when none was measured (such a replay is not judged: fixtures/golden/replay_tolerance.toml)."""
    data = tomllib.loads(path.read_text())
    table = data.get(precision)
    if not isinstance(table, dict):
        return None
    return float(table["interval_tol"]), float(table["final_tol"])


# ---------------------------------------------------------------- the log's arguments -> the trainer's flags


def _trainer_actions() -> dict:
    """dest -> argparse action of the trainer's Megatron-named flags (its own suite flags are never replayed)."""
    from harness.train.args import build_parser

    parser = build_parser()
    suite = next(g for g in parser._action_groups if g.title and g.title.startswith("bert-acceptance"))
    own = {a.dest for a in suite._group_actions}
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest not in own and a.dest != "help"
            and a.help != argparse.SUPPRESS and a.dest not in NOT_REPLAYED}


def trainer_flags(arguments: dict, course: dict | None = None) -> tuple:
    """(flags, problems): the trainer's command-line flags for a log's arguments block, and why it cannot be
    replayed (an unsupported argument off the course's value, a value that is not what the flag takes)."""
    flags, problems = [], []
    for dest, action in sorted(_trainer_actions().items()):
        raw = arguments.get(dest)
        if raw is None or raw == "None":
            continue
        option = action.option_strings[0]
        if action.nargs == 0:                                    # a switch: store_true / store_false
            if raw not in ("True", "False"):
                problems.append(f"{dest} is {raw!r}, not True or False")
            elif (raw == "True") == bool(action.const):
                flags.append(option)
            continue
        if action.type in (int, float):
            try:
                value = action.type(raw)
            except ValueError:
                problems.append(f"{dest} is {raw!r}, not a number")
                continue
            if isinstance(value, float) and not math.isfinite(value):
                problems.append(f"{dest} is {raw!r}, not a finite number")
                continue
            flags += [option, raw]
        elif action.choices is not None:
            if raw not in action.choices:
                problems.append(f"{dest} is {raw!r}: the trainer implements {', '.join(map(str, action.choices))}")
                continue
            flags += [option, raw]
        elif dest == "split":
            if not all(p.strip().isdigit() for p in raw.split(",")):
                problems.append(f"split is {raw!r}, not numbers separated by commas")
                continue
            flags += [option, raw]
    if (arguments.get("tensor_model_parallel_size") or "1") != "1":
        problems.append("tensor_model_parallel_size is not 1: a replay runs on one GPU")
    course = course if course is not None else _course_arguments()
    for name in UNSUPPORTED:
        if name in arguments and name in course and arguments[name] != course[name]:
            problems.append(f"{name} is {arguments[name]} (the course's run: {course[name]}); the trainer does not "
                            "implement it")
    return flags, problems


def _course_arguments() -> dict:
    from harness.evidence.logs import parse_log_file

    return parse_log_file(COURSE_LOG).arguments or {}


def replay_argv(arguments: dict, data_prefix: Path, vocab_file: Path, cache_dir: Path, device: str = "cuda",
                extra: tuple = ()) -> tuple:
    """(argv, problems) of the trainer run that replays a log: its own flags and seed, the course's data."""
    flags, problems = trainer_flags(arguments)
    argv = [sys.executable, "-m", "harness.train", *flags, "--data-path", str(data_prefix), "--vocab-file",
            str(vocab_file), "--data-cache-path", str(cache_dir), "--device", device, *extra]
    return argv, problems


# ---------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Replayed:
    """How a replay compares with its log: every lm loss both print, point by point."""

    reproduced: bool | None          # None: nothing to compare (the reason is in text)
    points: int
    max_delta: float
    text: str
    worst: tuple = ()                # (what, iteration, in the log, from its flags and seed, tolerance)


def _points(log) -> dict:
    """(what, iteration) -> lm loss: the training lines and the validation lines (periodic, final, test)."""
    out = {("train", r.iteration): r.lm_loss for r in log.iterations if r.lm_loss is not None}
    for v in log.validations:
        if v.lm_loss is not None:
            out[(f"validation ({v.split})" if v.split != "periodic" else "validation", v.iteration)] = v.lm_loss
    return out


def compare(log, replay, interval_tol: float | None = None, final_tol: float | None = None) -> Replayed:
    """Point by point: a point is reproduced when |log - replay| is within the tolerance of its iteration (the
    training loss at the run's last iteration, train_iters: final_tol; every other point: interval_tol); a
    non-finite loss must be non-finite in both. The tolerances are those measured for the log's precision; a
    precision with none measured is not judged (never accused by another precision's numbers)."""
    last = log.iterations[-1].train_iters if log.iterations else None
    return compare_points(_points(log), _points(replay), precision_of(getattr(log, "arguments", None)), last,
                          interval_tol, final_tol)


def compare_points(mine: dict, theirs: dict, precision: str, last, interval_tol: float | None = None,
                   final_tol: float | None = None) -> Replayed:
    """compare() on (what, iteration) -> lm loss tables: the log's (as its bounded worker returned them) and the
    replay's; `last` is the log's train_iters."""
    if interval_tol is None or final_tol is None:
        measured = tolerances(precision)
        if measured is None:
            return Replayed(None, 0, 0.0, f"not judged: no replay tolerance was measured for {precision} runs "
                                          f"(fixtures/golden/replay_tolerance.toml); the log is neither "
                                          f"reproduced nor accused")
        interval_tol, final_tol = measured
    common = sorted(set(mine) & set(theirs), key=lambda k: (k[1], k[0]))
    if not common:
        return Replayed(None, 0, 0.0, "not compared: the log and its replay print no lm loss at the same iteration")
    # the final tolerance is measured at the end of training (lr at its minimum, the curves converged): it applies
    # to the training loss of iteration train_iters only, never to the last line of a run that stopped early
    worst, max_d, bad = None, 0.0, None
    for key in common:
        a, b = mine[key], theirs[key]
        tol = final_tol if key == ("train", last) else interval_tol
        if not (math.isfinite(a) and math.isfinite(b)):
            d = 0.0 if math.isfinite(a) == math.isfinite(b) else math.inf
        else:
            d = abs(a - b)
        if d > max_d or worst is None:
            max_d, worst = max(d, max_d), (key[0], key[1], a, b, tol)
        if d > tol and bad is None:
            bad = (key[0], key[1], a, b, tol)
    if bad is not None:
        what, it, a, b, tol = bad
        where = f"iteration {it}" + ("" if what == "train" else f" ({what})")
        margin = abs(a - b) / tol if tol > 0 else math.inf
        return Replayed(False, len(common), max_d, f"not reproduced at {where}: {a:.6g} in the log, {b:.6g} from its "
                        f"flags and seed (|d| {abs(a - b):.3g} > {tol:g}, {margin:.3g}x the {precision} tolerance "
                        f"measured on honest runs)", bad)
    return Replayed(True, len(common), max_d, f"reproduced (max |d| {max_d:.3g} over {len(common)} points, "
                    f"{precision} tolerances)", worst)


# ---------------------------------------------------------------- bounds on what a replay may start

# A replay trains the model its log's arguments block describes. Before a trainer starts, that model's size, its
# tokens per step, accumulation steps and iterations are bounded by FACTOR times the course's recorded run (a
# `hidden_size 4096` block would otherwise start a ~1 G-parameter trainer): over it, the log is not replayed and
# the row says which bound (the student's log asks for a run the course never sets; raise FACTOR to replay it).
FACTOR = 4
VOCAB_ROWS = 30592        # bert-base-uncased's 30522 rows padded to Megatron's multiple of 128


def _positive_int(arguments: dict, name: str, default: int) -> int:
    raw = arguments.get(name)
    if raw is None or str(raw).strip() in ("", "None"):
        return default
    text = str(raw).strip()
    if not text.isascii() or not text.isdigit() or len(text) > 12 or int(text) <= 0:
        raise ValueError(f"{name} is {text[:40]!r}, not a positive whole number")
    return int(text)


def _measures(arguments: dict, defaults: dict | None = None) -> dict:
    """What a run of these arguments costs: parameters, tokens per micro-batch, accumulation steps, iterations,
    evaluation batches. Raises ValueError naming a size that is not a positive whole number."""
    d = defaults or {}
    get = lambda name, fallback: _positive_int(arguments, name, d.get(name, fallback))  # noqa: E731
    h, layers, seq = get("hidden_size", 128), get("num_layers", 4), get("seq_length", 128)
    ffn = get("ffn_hidden_size", 4 * h)
    positions = get("max_position_embeddings", seq)
    mbs, gbs = get("micro_batch_size", 4), get("global_batch_size", 16)
    iters, eval_iters = get("train_iters", 200), get("eval_iters", 10)
    return {"parameters": layers * (4 * h * h + 2 * h * ffn) + (VOCAB_ROWS + positions) * h,
            "tokens per micro-batch": mbs * seq, "accumulation steps": max(1, gbs // mbs),
            "iterations": iters, "evaluation batches": eval_iters,
            "attention heads": get("num_attention_heads", 8), "layers": layers}


def bound_problems(arguments: dict, course: dict | None = None, factor: float = FACTOR) -> list:
    """Why a log's run is too large to replay: each measure over `factor` times the course's run's."""
    course = course if course is not None else _course_arguments()
    base = {k: int(v) for k, v in course.items() if isinstance(v, str) and v.isdigit()}
    reference = _measures(course, base)
    try:
        mine = _measures(arguments, base)
    except ValueError as exc:
        return [f"{exc}: the log's model cannot be sized, so no trainer is started"]
    return [f"{what} {mine[what]:,} is over {factor:g}x the course's run ({reference[what]:,}): a replay of it is not "
            f"started (the bound keeps a replay's size, memory and time near the course's)"
            for what in mine if mine[what] > factor * reference[what]]


# ---------------------------------------------------------------- a submission's log, read in a bounded worker


def read_submission(folder) -> dict:
    """In a bounded worker (harness.base.sandbox): the submission's logs found and parsed, and only what a replay
    needs sent back (its arguments block, its lm losses, its train_iters and recipe), or why it has none."""
    from harness.base import sandbox
    from harness.judge.submission import evidence, find_submission

    from harness.cli.grade import refusal

    sandbox.phase("looking for links leaving the folder")
    refused = refusal(Path(folder))          # the same refusal as grade's: a link out of the folder is never read
    if refused:
        return {"problem": refused}
    sandbox.phase("finding the logs")
    sub = find_submission(Path(folder))
    if not sub.logs:
        return {"problem": sub.problem or "no log"}
    sandbox.phase("reading the log")
    log = evidence(sub.logs).log
    return {"arguments": {str(k): str(v) for k, v in (log.arguments or {}).items()},
            "points": [[what, it, loss] for (what, it), loss in _points(log).items()],
            "last": log.iterations[-1].train_iters if log.iterations else None,
            "recipe": detect_recipe(log)[0] or DEFAULT_RECIPE}


def read_bounded(folder, budget=None) -> dict:
    """read_submission in its own bounded worker; a worker that raised or ran over its budget is {"problem": ...}
    naming the cause: a refusal of the submission (a link, an unreadable file) or the budget it exceeded."""
    from harness.base import sandbox

    budget = budget or sandbox.Budget()
    return _outcome_read(sandbox.run_one(str(folder), read_submission, budget), budget)


def _outcome_read(outcome, budget) -> dict:
    """A read worker's outcome as read_bounded's dict."""
    from harness.base import sandbox

    if outcome.ok and isinstance(outcome.value, dict):
        return outcome.value
    if outcome.status == sandbox.RAISED:
        return {"problem": f"refused: {outcome.error}{' while ' + outcome.phase if outcome.phase else ''} (the "
                           f"submission's content)", "refused": True}
    return {"problem": f"not read: {outcome.text(budget)} (the budget --time-limit/--memory-limit: raise it for "
                       f"this submission alone)", "budget": True}


# ---------------------------------------------------------------- the command


def add_arguments(parser) -> None:
    from harness.base import sandbox

    parser.add_argument("submissions", metavar="DIR", help="folder with one sub-folder per submission")
    parser.add_argument("--out", metavar="OUT", help="where replay.json, replay.md and the runs go (default: "
                                                     "DIR-replay beside DIR, never inside it)")
    add_jobs(parser, "trainer runs")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    add_time_limit(parser, 900.0, "wall-clock time per replay", old=("--timeout-s", "--timeout"))
    parser.add_argument("--memory-limit", type=int, default=sandbox.DEFAULT_MEMORY_MB, metavar="MB",
                        help=f"the address space of the bounded worker that reads one submission's log (default "
                             f"{sandbox.DEFAULT_MEMORY_MB} MB; its wall clock: {sandbox.DEFAULT_TIME_S:g} s)")
    parser.add_argument("--trainer-arg", action="append", default=[], metavar="ARG",
                        help="one more trainer argument for every replay (repeatable; e.g. a CPU smoke's limits)")
    parser.epilog = EXIT_CODES_HELP


def _data(out: Path, recipe: str) -> Path:
    """The course's corpus for a recipe, preprocessed once under OUT/data (what the student's run read)."""
    from harness.data.corpus import write_corpus
    from harness.data.preprocess import preprocess
    from harness.evidence.recipe import load_recipe

    layout = load_recipe().variants[recipe].corpus_layout
    prefix = out / "data" / f"corpus-{recipe}"
    done = Path(f"{prefix}_text_sentence.idx")
    if not done.is_file():
        prefix.parent.mkdir(parents=True, exist_ok=True)
        corpus = write_corpus(out / "data" / f"corpus-{recipe}.json", layout)
        preprocess(corpus, prefix, paths.VOCAB_FILE, "BertWordPieceLowerCase", ("text",), split_sentences=True)
    return Path(f"{prefix}_text_sentence")


def replay_one(name: str, folder: Path, out: Path, device: str, timeout_s: float, extra: tuple = (),
               read: dict | None = None, slot: str | None = None) -> dict:
    """One submission: its log read in a bounded worker (never executed; `read` when main read it already), the
    run it asks for bounded against the course's, its replay run in OUT/runs/SLOT, the comparison; a JSON-able
    dict. Whatever the submission holds is a row, never an exception."""
    from harness.evidence.logs import parse_log_file
    from harness.run import failures
    from harness.run.launch import run_stage

    slot = slot or _slot(name)
    read = read if read is not None else read_bounded(folder)
    if "problem" in read:
        return {"submission": name, "status": "not-replayed", "text": read["problem"]}
    arguments = read["arguments"]
    if not arguments:
        return {"submission": name, "status": "not-replayed", "text": "the log has no arguments block to replay"}
    mine = {(what, it): loss for what, it, loss in read["points"] if isinstance(loss, (int, float))}
    if not any(what == "train" for what, _ in mine):
        return {"submission": name, "status": "not-replayed",
                "text": "the log prints no lm loss: nothing to compare (its run stopped before a loss was logged)"}
    recipe = read["recipe"]
    too_large = bound_problems(arguments)
    if too_large:
        return {"submission": name, "status": "not-replayed", "recipe": recipe, "text": "; ".join(too_large)}
    run_dir = out / "runs" / slot
    # the masked samples are shared by every replay of the same data and seed (harness.train.samples: keyed by
    # Megatron's dataset hash, which holds the seed), so many replays at once build each sample once
    argv, problems = replay_argv(arguments, _data(out, recipe), paths.VOCAB_FILE, run_dir / "index-cache",
                                 device, ("--sample-cache", str(out / "sample-cache"), *extra))
    if problems:
        return {"submission": name, "status": "not-replayed", "text": "; ".join(problems)}
    result = run_stage(failures.stage(f"replay-{slot}", argv, timeout_s=timeout_s), run_dir)
    replay_log = run_dir / f"replay-{slot}.log"
    replayed = (compare_points(mine, _points(parse_log_file(replay_log)), precision_of(arguments), read["last"])
                if replay_log.is_file() else None)
    if not result.ok or replayed is None:
        tail = " | ".join(line.strip() for line in result.tail[-3:]) if getattr(result, "tail", None) else ""
        return {"submission": name, "status": "not-replayed", "recipe": recipe, "argv": argv[3:], "grader_fault": True,
                "text": f"the replay did not finish (exit {result.returncode}{'; ' + tail if tail else ''}): the "
                        f"grader's or this machine's fault, not the student's ({replay_log})"}
    if replayed.reproduced is None:
        return {"submission": name, "status": "not-replayed", "recipe": recipe, "argv": argv[3:],
                "text": replayed.text}
    return {"submission": name, "status": "reproduced" if replayed.reproduced else "not-reproduced", "recipe": recipe,
            "argv": argv[3:], "text": replayed.text, **{k: v for k, v in asdict(replayed).items() if k != "text"}}


def _slot(name: str) -> str:
    """A submission's name as a folder name under OUT/runs: [A-Za-z0-9._-] only, never '.' or '..'; a name that
    had to change gets a digest of the original, so `a b` and `a_b` never share a slot."""
    import hashlib
    import re

    slot = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100]
    slot = slot if slot.strip(".") else f"_{slot}"
    if slot != name:
        slot += "-" + hashlib.sha256(os.fsencode(name)).hexdigest()[:10]
    return slot


def slots(names: list) -> list:
    """One distinct slot per name, also on case-insensitive file systems (Alice and alice)."""
    taken, out = set(), []
    for name in names:
        slot, n = _slot(name), 1
        while slot.lower() in taken:
            n += 1
            slot = f"{_slot(name)}-{n}"
        taken.add(slot.lower())
        out.append(slot)
    return out


def _check_out(root: Path, out: Path, folders: list) -> str | None:
    """Why OUT cannot take the replays (None: it can): DIR itself or inside it, or inside / holding a submission."""
    from harness.base.paths import inside

    if inside(root, out):
        return f"--out {out}: is, or is inside, DIR {root}; the replays go elsewhere (e.g. DIR-replays beside DIR)"
    for folder in folders:
        if inside(folder, out) or inside(out, folder):
            return (f"--out {out}: is, or is inside, or holds the submission folder {folder}; the replays go "
                    "elsewhere (e.g. DIR-replays beside DIR)")
    if out.is_symlink():
        return f"--out {out}: is a symlink; give a real folder"
    return None


def main(args) -> int:
    """Replay every sub-folder of DIR; the exit code is one of harness.cli.args' (the module docstring)."""
    try:
        return _main(args)
    except KeyboardInterrupt:
        print("interrupted: replays not finished are not in replay.json", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(args) -> int:
    from harness.base.paths import inside
    from harness.report import gradebook

    root = Path(args.submissions).expanduser()
    problem = not_a_folder(root, "replay")
    out = Path(args.out).expanduser() if args.out else default_out(root, "replay")
    if problem is None and inside(root, out):
        problem = f"--out {out}: is inside DIR, where it would be taken for a submission; give a folder elsewhere"
    if problem or args.jobs < 0 or not args.time_limit > 0:
        print(f"error: {problem or '--jobs N >= 0 (0: one per core) and --time-limit S > 0'}", file=sys.stderr)
        return EXIT_USAGE
    from harness.base import sandbox

    budget = sandbox.Budget(min(args.time_limit, sandbox.DEFAULT_TIME_S), getattr(args, "memory_limit", sandbox.DEFAULT_MEMORY_MB))
    if not budget.memory_mb > 0:
        print("error: --memory-limit: give a positive number of MB", file=sys.stderr)
        return EXIT_USAGE
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))
    why = _check_out(root, out, folders)
    if why:
        print(f"error: {gradebook.visible(why)}", file=sys.stderr)
        return EXIT_USAGE
    out.mkdir(parents=True, exist_ok=True)
    names = [gradebook.visible(f.name) for f in folders]
    # every log read first, each in its own bounded worker: this process sees only what a worker returns
    reads: dict = {}
    sandbox.run_all(folders, lambda f: read_submission(f), max(1, min(jobs(args.jobs), os.cpu_count() or 1)), budget,
                    lambda f, outcome: reads.__setitem__(f, _outcome_read(outcome, budget)))
    if any("problem" not in r for r in reads.values()):
        for recipe in ("a", "b"):
            _data(out, recipe)                                  # built once, before the runs share it

    def one(job):
        folder, name, slot = job
        try:
            return {"slot": slot, **replay_one(name, folder, out, args.device, args.time_limit,
                                               tuple(args.trainer_arg), reads[folder], slot)}
        except Exception as exc:   # noqa: BLE001 - the grader's own fault for this row; the others go on
            return {"submission": name, "slot": slot, "status": "error",
                    "text": f"the grader failed on this replay ({type(exc).__name__}: {exc}); report it"}

    with ThreadPoolExecutor(jobs(args.jobs)) as pool:
        rows = list(pool.map(one, zip(folders, names, slots([f.name for f in folders]))))
    (out / "replay.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["# Replays", "", "| submission | replay |", "|---|---|"]
    lines += [f"| {gradebook.md_cell(r['submission'])} | **{r['status']}**: {gradebook.md_cell(r['text'])} |"
              for r in rows]
    (out / "replay.md").write_text("\n".join(lines) + "\n")
    for r in rows:
        print(gradebook.visible(f"{r['submission']}: {r['status']}: {r['text']}"))
    if any(r["status"] == "not-reproduced" for r in rows):
        return EXIT_FAILED
    return EXIT_GRADER_ERROR if any(r.get("grader_fault") or r["status"] == "error" for r in rows) else EXIT_PASSED
