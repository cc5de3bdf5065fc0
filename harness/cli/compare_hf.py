"""`python -m harness compare-hf`: the course's BERT trained with Megatron-LM and with Hugging Face Transformers,
side by side, on the same GPU in one session, and a report of what the two frameworks do differently.

One run directory (--run-dir, default OUT/runs): the course corpus and its .bin/.idx (the session's own stages,
as `pytest -m gpu` makes them), the masked samples built once, then one training at a time so that no run's step
time is another's: the suite's reference trainer (`python -m harness train`: megatron-core's BertModel, Megatron's
fp16 regime, Megatron-LM's log lines, the step captured as one CUDA graph), optionally the same run eager
(--megatron-eager), the counts of its batches (harness.train.batch_stats), then the Hugging Face side
(harness.train.hf_bert: BertForPreTraining in a plain PyTorch loop, next-sentence prediction), optionally again with
sentence-order pairs (--hf-sop). Every run gets the course's flags plus the same FLAGS after `--` (a smaller model
or fewer iterations for a smoke test), each with an NVML sampler on its process tree. Then OUT/compare.json (every
number, and the table of differences, each row backed by a measured number or a line of the two scripts),
OUT/compare.md, OUT/compare.png and OUT/megatron-vs-hf.md (the student page, docs/megatron-vs-hf.md when committed).
`--from-json FILE` writes the reports again from a compare.json without training.

Exit status: 0 when every run finished, 1 when one did not (the reports say which and why), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from harness.base import paths

MEGATRON, MEGATRON_EAGER, HF, HF_SOP = "megatron", "megatron-eager", "hf", "hf-sop"
# flags compare-hf sets itself on every run: a FLAG among them would point one side elsewhere
OWN_FLAGS = ("--data-path", "--vocab-file", "--save", "--load", "--corpus", "--out", "--device", "--binary-task",
             "--summary-json", "--data-cache-path", "--sample-cache", "--bert-no-binary-head", "--cuda-graph",
             "--tokenizer-type", "--split")
HF_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
          "TRANSFORMERS_VERBOSITY": "error"}
INSTALL_FIX = "install the comparison's extra: python -m pip install -e '.[compare]' (transformers >= 4.40)"


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, type=Path, metavar="OUT",
                        help="where compare.json, compare.md, compare.png and megatron-vs-hf.md go")
    parser.add_argument("--run-dir", type=Path, default=None, metavar="DIR",
                        help="data, logs and checkpoints of the runs (default OUT/runs)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: the smoke mode (fp32 on both sides)")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per stage (default 900 s)")
    parser.add_argument("--hf-sop", action="store_true",
                        help="also train the Hugging Face side on sentence-order pairs (Megatron's binary task)")
    parser.add_argument("--megatron-eager", action="store_true",
                        help="also run the reference trainer without its CUDA graph (--cuda-graph off)")
    parser.add_argument("--from-json", type=Path, default=None, metavar="FILE",
                        help="no training: write the reports again from this compare.json")
    parser.add_argument("--page", type=Path, default=None, metavar="FILE",
                        help="the student page's path (default OUT/megatron-vs-hf.md; docs/megatron-vs-hf.md)")
    parser.add_argument("flags", nargs=argparse.REMAINDER, metavar="-- FLAGS",
                        help="trainer flags for every run, after `--` (e.g. -- --num-layers 2 --train-iters 10)")


def check_flags(flags: list[str]) -> str | None:
    """Why these FLAGS cannot be given to both sides, or None."""
    taken = [f for f in flags if f.split("=", 1)[0] in OWN_FLAGS]
    if taken:
        return (f"{' '.join(taken)}: compare-hf sets this itself on every run (data, vocab, device, outputs, "
                "recipe (a) with its binary head); leave it out")
    from harness.train.args import build_parser

    try:
        build_parser().parse_args([*flags, "--data-path", "x", "--vocab-file", "x"])
    except SystemExit:
        return f"{' '.join(flags)}: not flags of `python -m harness train` (see python -m harness train --help)"
    return None


def transformers_missing() -> str | None:
    import importlib.util

    return None if importlib.util.find_spec("transformers") else f"transformers is not installed: {INSTALL_FIX}"


# ---- the runs -------------------------------------------------------------------------------------------
def _stage_with_memory(session, name: str, argv: list[str], env: dict | None = None):
    """One stage of the session with an NVML sampler on its process tree (as Session.train runs a trainer)."""
    from harness.run.gpumem import NvmlSampler
    from harness.run.launch import StageSpec, run_stage
    from harness.run.session import python_env

    started: dict = {}
    spec = StageSpec(name, tuple(argv), session.stage_timeout_s, env=python_env(env), cwd=str(paths.REPO),
                     base_env=session.base_env)
    with NvmlSampler(lambda: started.get("pid")) as sampler:
        result = run_stage(spec, session.run_dir, on_line=session.on_line, cancel=session.cancel,
                           on_start=lambda popen: started.update(pid=popen.pid))
    session.stages[name] = result
    return result, sampler.report()


def hf_argv(session, flags: list[str], device: str, task: str, out: Path) -> list[str]:
    from harness.train.args import COURSE_FLAGS

    return [sys.executable, "-m", "harness.train.hf_bert", *COURSE_FLAGS, *flags, "--device", device,
            "--vocab-file", str(session.vocab_file), "--corpus", str(session.run_dir / "corpus.json"),
            "--out", str(out), "--binary-task", task]


def run_all(args, flags: list[str], say) -> dict:
    """Every stage, one after the other; returns {run name: raw results} for gather()."""
    from harness.run.runs import RunSpec
    from harness.run.session import Session

    run_dir = Path(args.run_dir or args.out / "runs")
    session = Session(run_dir, paths.VOCAB_FILE, stage_timeout_s=args.timeout_s)
    raw: dict = {"run_dir": str(run_dir), "stages": {}}
    t0 = time.monotonic()
    prepared = session.prepare_data("a")
    raw["stages"]["data"] = {"ok": prepared.ok, "seconds": round(time.monotonic() - t0, 3),
                             "headline": None if prepared.ok else prepared.headline()}
    if not prepared.ok:
        say(prepared.failure_message())
        return raw
    device_flags = ("--device", args.device)
    t0 = time.monotonic()
    samples = session.prepare_samples("a", (*flags, *device_flags))
    raw["stages"]["samples"] = {"ok": samples.ok, "seconds": round(time.monotonic() - t0, 3)}
    specs = [RunSpec(MEGATRON, "the suite's reference trainer: the course's recipe (a) on megatron-core",
                     extra_args=(*flags, *device_flags))]
    if args.megatron_eager:
        specs.append(RunSpec(MEGATRON_EAGER, "the same, its step eager (--cuda-graph off), not saved",
                             extra_args=(*flags, *device_flags, "--cuda-graph", "off"), save=False))
    for spec in specs:
        say(f"training {spec.name}: {spec.description}")
        outcome = session.train(spec)
        raw[spec.name] = {"outcome": outcome, "spec": spec, "argv": session.train_argv(spec)}
    stats_out = run_dir / MEGATRON / "batch-stats.json"
    stats_argv = [sys.executable, "-m", "harness.train.batch_stats", *session.train_argv(specs[0])[3:],
                  "--json-out", str(stats_out)]
    stats = session.stage("megatron-batches", stats_argv)
    raw["megatron_batches"] = json.loads(stats_out.read_text()) if stats.ok and stats_out.is_file() else {
        "not_measured": f"{stats.headline()} ({stats.log_path})"}
    tasks = [(HF, "nsp")] + ([(HF_SOP, "sop")] if args.hf_sop else [])
    for name, task in tasks:
        say(f"training {name}: BertForPreTraining, binary task {task}")
        out = run_dir / name
        argv = hf_argv(session, flags, args.device, task, out)
        result, memory = _stage_with_memory(session, f"train-{name}", argv, HF_ENV)
        raw[name] = {"stage": result, "memory": memory, "argv": argv, "out": out, "task": task}
    return raw


# ---- gathering ------------------------------------------------------------------------------------------
def tree_size(folder: Path) -> dict:
    """Bytes and files under a folder, links not followed; {} when it is missing."""
    if not folder.is_dir():
        return {}
    files, total, kinds = 0, 0, {}
    for root, dirs, names in os.walk(folder, followlinks=False):
        for name in names:
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                continue
            size = path.stat().st_size
            files += 1
            total += size
            suffix = path.suffix or name
            kinds[suffix] = kinds.get(suffix, 0) + size
    return {"path": str(folder), "bytes": total, "files": files, "bytes_by_kind": dict(sorted(kinds.items()))}


def _command(argv) -> str:
    """A run's command as a reader can type it: `python -m ...`, paths kept."""
    argv = list(argv)
    if argv and argv[0] == sys.executable:
        argv[0] = "python"
    return " ".join(argv)


def _first(pattern: str, lines):
    """The first match of `pattern` in `lines`, or None."""
    import re

    rx = re.compile(pattern)
    return next((m for m in map(rx.search, lines) if m), None)


def megatron_run(entry: dict, batches: dict | None) -> dict:
    """A reference-trainer run from its log, summary.json, NVML report and --save folder."""
    from harness.evidence.logs import parse_log_file

    outcome = entry["outcome"]
    stage = outcome.stage
    log = parse_log_file(stage.log_path) if stage is not None and Path(stage.log_path).is_file() else None
    summary = outcome.summary or {}
    run = {"framework": "megatron-core", "what": entry["spec"].description, "binary_task": "sop",
           "ok": bool(stage and stage.ok), "failure": None if stage and stage.ok else
           (stage.headline() if stage else "never started"), "command": _command(entry["argv"]),
           "log": str(stage.log_path) if stage else None, "cuda_graphs": summary.get("cuda_graphs")}
    lines = log.lines if log is not None else ()
    curve = {"iteration": [], "mlm": [], "binary": [], "learning_rate": [], "loss_scale": [], "skipped": [],
             "grad_norm": []}
    for r in (log.iterations if log is not None else ()):
        for key, value in (("iteration", r.iteration), ("mlm", r.lm_loss), ("binary", r.sop_loss),
                           ("learning_rate", r.learning_rate), ("loss_scale", r.loss_scale),
                           ("skipped", r.skipped), ("grad_norm", r.grad_norm)):
            curve[key].append(value)
    run["curve"] = curve
    run["skipped_steps"] = sum(s or 0 for s in curve["skipped"]) if curve["skipped"] else None
    params = _first(r"number of parameters on .*: (\d+)", lines)
    vocab = _first(r"padded vocab \(size: (\d+)\) with (\d+) dummy tokens \(new size: (\d+)\)", lines)
    run["parameters"] = {"count": int(params.group(1)) if params else None,
                         "vocab_size": int(vocab.group(3)) if vocab else None,
                         "vocab_size_unpadded": int(vocab.group(1)) if vocab else None}
    first_line = next((r for r in (log.iterations if log else ()) if r.lm_loss is not None), None)
    run["log_line"] = lines[first_line.line_no - 1].strip() if first_line is not None and first_line.line_no else None
    run["ms_per_iter_median"] = summary.get("ms_per_iter_median")
    run["setup_s"] = summary.get("setup_s")
    run["initialized_s"] = (summary.get("phases_s") or {}).get("megatron is initialized")
    run["wall_s"] = round(outcome.seconds, 3)
    run["data_ms_per_iter_median"] = None   # not in the loop: every batch is on the GPU before the first step
    run["memory"] = {"torch_max_allocated_mib": summary.get("torch_max_allocated_mib"),
                     "torch_max_reserved_mib": summary.get("torch_max_reserved_mib"),
                     "nvml_peak_mib": outcome.memory.peak_mib if outcome.memory else None}
    run["gpu"] = summary.get("gpu")
    run["versions"] = summary.get("versions")
    saves = [c for c in (log.checkpoints if log else ()) if c.event == "saving"]
    if outcome.save_dir is not None and saves:
        last = saves[-1]
        run["checkpoint"] = {"format": last.fmt, "iteration": last.iteration,
                             **tree_size(Path(outcome.save_dir) / f"iter_{last.iteration:07d}"),
                             "save_s": (summary.get("phases_s") or {}).get(f"save of iteration {last.iteration} took")}
    else:
        run["checkpoint"] = None
    run["batches"] = batches
    return run


def hf_run(entry: dict) -> dict:
    """A Hugging Face run from its summary.json and log_history.jsonl (both written by harness.train.hf_bert)."""
    stage, out = entry["stage"], Path(entry["out"])
    summary_file, history = out / "summary.json", out / "log_history.jsonl"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    lines = history.read_text(encoding="utf-8").splitlines() if history.is_file() else []
    records = [json.loads(line) for line in lines if line.strip()]
    run = {"framework": "transformers", "binary_task": entry["task"],
           "what": f"BertForPreTraining in a plain PyTorch loop, binary head trained on {entry['task'].upper()} pairs",
           "ok": stage.ok, "failure": None if stage.ok else stage.headline(), "command": _command(entry["argv"]),
           "log": str(stage.log_path), "cuda_graphs": False}
    keys = (("iteration", "iteration"), ("mlm", "mlm_loss"), ("binary", "binary_loss"),
            ("learning_rate", "learning_rate"), ("loss_scale", "loss_scale"), ("skipped", "skipped"),
            ("grad_norm", "grad_norm"))
    run["curve"] = {mine: [r.get(theirs) for r in records] for mine, theirs in keys}
    run["steps"] = summary.get("steps")
    run["skipped_steps"] = summary.get("skipped_steps")
    run["parameters"] = summary.get("parameters")
    run["log_line"] = next((line for line in lines if '"mlm_loss": null' not in line), None)
    for key in ("ms_per_iter_median", "data_ms_per_iter_median", "setup_s", "gpu", "versions", "tokenization",
                "data", "model", "precision", "epochs_started"):
        run[key] = summary.get(key)
    run["initialized_s"] = None
    run["wall_s"] = round(stage.duration_s, 3)
    memory = entry["memory"]
    run["memory"] = {"torch_max_allocated_mib": summary.get("torch_max_allocated_mib"),
                     "torch_max_reserved_mib": summary.get("torch_max_reserved_mib"),
                     "nvml_peak_mib": memory.peak_mib if memory else None}
    saved = sorted((int(k), v) for k, v in (summary.get("save_s") or {}).items())
    if saved:
        iteration, seconds = saved[-1]
        folder = out / f"checkpoint-{iteration}"
        size = tree_size(folder)
        weights = folder / "model.safetensors"
        run["checkpoint"] = {"format": "safetensors (save_pretrained) + torch.save of optimizer, scheduler, scaler, "
                                       "RNG", "iteration": iteration, **size,
                             "weights_bytes": weights.stat().st_size if weights.is_file() else None, "save_s": seconds}
    else:
        run["checkpoint"] = None
    run["batches"] = summary.get("batches")
    return run


def _throughput(run: dict) -> None:
    """Tokens per step (positions and real tokens) and per second, from the batch counts and the median step."""
    batches, ms = run.get("batches") or {}, run.get("ms_per_iter_median")
    run["tokens_per_step"] = batches.get("positions_per_step")
    run["tokens_per_s"] = run["tokens_per_step"] / (ms / 1000.0) if ms and run["tokens_per_step"] else None
    real = batches.get("real_tokens_per_step")
    run["real_tokens_per_s"] = real / (ms / 1000.0) if ms and real else None


def gather(args, flags: list[str], raw: dict) -> dict:
    """compare.json's content: the configuration, every run, and the differences (harness.cli.compare_hf_rows)."""
    from harness.cli import compare_hf_rows as rows
    from harness.train.args import COURSE_FLAGS, parse_args

    course = parse_args([*COURSE_FLAGS, *flags, "--data-path", "-", "--vocab-file", str(paths.VOCAB_FILE),
                         "--device", args.device])
    runs = {}
    batches = raw.get("megatron_batches")
    for name in (MEGATRON, MEGATRON_EAGER):
        if name in raw:
            runs[name] = megatron_run(raw[name], batches)
    if MEGATRON_EAGER in runs:
        runs[MEGATRON_EAGER]["checkpoint"] = None
    for name in (HF, HF_SOP):
        if name in raw:
            runs[name] = hf_run(raw[name])
    for run in runs.values():
        _throughput(run)
    config = {k: getattr(course, k) for k in (
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings",
        "micro_batch_size", "global_batch_size", "train_iters", "lr", "min_lr", "lr_decay_iters", "lr_decay_style",
        "lr_warmup_fraction", "adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "clip_grad", "fp16", "bf16",
        "hidden_dropout", "attention_dropout", "mask_prob", "short_seq_prob", "seed", "log_interval", "save_interval",
        "split", "init_method_std", "make_vocab_size_divisible_by")}
    config["device"] = args.device
    config["flags"] = list(flags)
    doc = {"schema": rows.SCHEMA, "date": time.strftime("%Y-%m-%d"), "command": _own_command(args, flags),
           "commit": _commit(), "device": args.device, "config": config, "stages": raw.get("stages", {}),
           "runs": runs}
    doc["schedule"] = rows.schedule_check(course, runs)
    doc["differences"] = rows.differences(doc)
    return doc


def _own_command(args, flags) -> str:
    parts = ["python -m harness compare-hf", "--out", str(args.out), "--device", args.device]
    parts += ["--hf-sop"] if args.hf_sop else []
    parts += ["--megatron-eager"] if args.megatron_eager else []
    return " ".join(parts + (["--", *flags] if flags else []))


def _commit() -> str | None:
    """The checkout's commit, `+dirty` when tracked files differ from it (the numbers are then not that commit's)."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=paths.REPO, capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=paths.REPO,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    return (commit + ("+dirty" if dirty.stdout.strip() else "")) if commit else None


def write_reports(doc: dict, out: Path, page: Path | None) -> list[Path]:
    from harness.cli import compare_hf_report as report

    out.mkdir(parents=True, exist_ok=True)
    written = [out / "compare.json", out / "compare.md", out / "compare.png", page or out / "megatron-vs-hf.md"]
    paths.write_text_atomic(written[0], json.dumps(doc, indent=1, default=str) + "\n")
    paths.write_text_atomic(written[1], report.markdown(doc))
    report.draw(doc, written[2])
    written[3].parent.mkdir(parents=True, exist_ok=True)
    paths.write_text_atomic(written[3], report.page(doc))
    return written


def main(args) -> int:
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    flags = list(args.flags)
    if flags[:1] == ["--"]:
        flags = flags[1:]
    if args.from_json is not None:
        try:
            doc = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            say(f"error: {args.from_json}: not a readable compare.json ({exc}); give the file compare-hf wrote")
            return 2
        for path in write_reports(doc, args.out, args.page):
            print(path)
        return 0
    problem = check_flags(flags) or transformers_missing()
    if problem:
        say(f"error: {problem}")
        return 2
    raw = run_all(args, flags, say)
    doc = gather(args, flags, raw)
    for path in write_reports(doc, args.out, args.page):
        print(path)
    failed = [name for name, run in doc["runs"].items() if not run["ok"]]
    if not raw.get("stages", {}).get("data", {}).get("ok", False) or failed or not doc["runs"]:
        say(f"not every run finished: {', '.join(failed) or 'data preparation'}; compare.md says why")
        return 1
    return 0
