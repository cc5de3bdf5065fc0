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
    precision = precision_of(getattr(log, "arguments", None))
    if interval_tol is None or final_tol is None:
        measured = tolerances(precision)
        if measured is None:
            return Replayed(None, 0, 0.0, f"not judged: no replay tolerance was measured for {precision} runs "
                                          f"(fixtures/golden/replay_tolerance.toml); the log is neither "
                                          f"reproduced nor accused")
        interval_tol, final_tol = measured
    mine, theirs = _points(log), _points(replay)
    common = sorted(set(mine) & set(theirs), key=lambda k: (k[1], k[0]))
    if not common:
        return Replayed(None, 0, 0.0, "not compared: the log and its replay print no lm loss at the same iteration")
    # the final tolerance is measured at the end of training (lr at its minimum, the curves converged): it applies
    # to the training loss of iteration train_iters only, never to the last line of a run that stopped early
    last = log.iterations[-1].train_iters if log.iterations else None
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


# ---------------------------------------------------------------- the command


def add_arguments(parser) -> None:
    parser.add_argument("submissions", metavar="DIR", help="folder with one sub-folder per submission")
    parser.add_argument("--out", metavar="OUT", help="where replay.json, replay.md and the runs go (default: "
                                                     "DIR-replay beside DIR, never inside it)")
    add_jobs(parser, "trainer runs")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    add_time_limit(parser, 900.0, "wall-clock time per replay", old=("--timeout-s", "--timeout"))
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


def replay_one(name: str, folder: Path, out: Path, device: str, timeout_s: float, extra: tuple = ()) -> dict:
    """One submission: its log read (never executed), its replay run, the comparison; a JSON-able dict."""
    from harness.evidence.logs import parse_log_file
    from harness.judge.submission import evidence, find_submission
    from harness.run import failures
    from harness.run.launch import run_stage

    sub = find_submission(folder)
    if not sub.logs:
        return {"submission": name, "status": "not-replayed", "text": sub.problem or "no log"}
    log = evidence(sub.logs).log
    if not log.arguments:
        return {"submission": name, "status": "not-replayed", "text": "the log has no arguments block to replay"}
    if not any(r.lm_loss is not None for r in log.iterations):
        return {"submission": name, "status": "not-replayed",
                "text": "the log prints no lm loss: nothing to compare (its run stopped before a loss was logged)"}
    recipe = detect_recipe(log)[0] or DEFAULT_RECIPE
    run_dir = out / "runs" / name
    # the masked samples are shared by every replay of the same data and seed (harness.train.samples: keyed by
    # Megatron's dataset hash, which holds the seed), so many replays at once build each sample once
    argv, problems = replay_argv(log.arguments, _data(out, recipe), paths.VOCAB_FILE, run_dir / "index-cache",
                                 device, ("--sample-cache", str(out / "sample-cache"), *extra))
    if problems:
        return {"submission": name, "status": "not-replayed", "text": "; ".join(problems)}
    result = run_stage(failures.stage(f"replay-{name}", argv, timeout_s=timeout_s), run_dir)
    replay_log = run_dir / f"replay-{name}.log"
    replayed = compare(log, parse_log_file(replay_log)) if replay_log.is_file() else None
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
    """A submission's name as a folder name under OUT/runs: [A-Za-z0-9._-] only, never '.' or '..'."""
    import re

    slot = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100]
    return slot if slot.strip(".") else f"_{slot}"


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
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))
    out.mkdir(parents=True, exist_ok=True)
    for recipe in ("a", "b"):
        _data(out, recipe)                                      # built once, before the runs share it
    with ThreadPoolExecutor(jobs(args.jobs)) as pool:
        rows = list(pool.map(lambda f: replay_one(_slot(f.name), f, out, args.device, args.time_limit,
                                                  tuple(args.trainer_arg)), folders))
    (out / "replay.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["# Replays", "", "| submission | replay |", "|---|---|"]
    lines += [f"| {gradebook.md_cell(r['submission'])} | **{r['status']}**: {gradebook.md_cell(r['text'])} |"
              for r in rows]
    (out / "replay.md").write_text("\n".join(lines) + "\n")
    for r in rows:
        print(gradebook.visible(f"{r['submission']}: {r['status']}: {r['text']}"))
    if any(r["status"] == "not-reproduced" for r in rows):
        return EXIT_FAILED
    return EXIT_GRADER_ERROR if any(r.get("grader_fault") for r in rows) else EXIT_PASSED
