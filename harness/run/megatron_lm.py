"""Grade a student's own Megatron-LM checkout: what it is, what it needs, and the stages that run it.

    checkout = detect(path, have_te=False, have_apex=False)     # version, scripts, legacy tokenizer, TE import
    plan = plan_preprocess(checkout, corpus, prefix, vocab, workdir)
    done = run_preprocess(plan, run_dir)                        # runs twice when issue #1052 bites
    reason = cannot_run_reason(checkout)                        # say it BEFORE launching
    spec = train_stage(checkout, done.data_prefix, vocab, save_dir)

Everything the suite adds to the course's commands is data (``ADAPTERS``, keyed by version ranges) and comes
back as ``Adaptation(what, why)`` records, so the report shows exactly what ran. The student's files are never
edited: offline NLTK, the local Hugging Face tokenizer and the no-TE launcher (harness/run/no_te_launch.py, which
starts the unchanged BERT script when Transformer Engine is absent) live outside the checkout.

Detection and the adapters live in harness.run.checkout; this module plans and runs the stages, and keeps the
compatibility matrix and the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

from harness.base.errors import InputError
from harness.evidence.diagnose import RULES, Diagnosis, diagnose, missing_files
from harness.run.launch import DATASET_MARKER, StageResult, StageSpec, run_stage
from harness.base.proc import free_port
from harness.run.no_te_launch import wants_local_spec
from harness.train.args import COURSE_FLAGS
# detection and the adapters live in harness.run.checkout; every name stays importable from here
from harness.run.checkout import (  # noqa: F401
    Adaptation, Adapter, CANNOT_RUN_TE, CANNOT_RUN_TE_FIX, Checkout,
    CheckoutError, Context, HF_TOKENIZER_NAME, NOT_A_CHECKOUT_FIX, NO_TE_LAUNCHER, PREPROCESS_TOOL, TE_SPEC, TRAIN_SCRIPTS, build_hf_tokenizer_dir, detect, imports_te_spec_at_import_time,
    probe_modules, python_too_old, select_adapters, _adaptation, _check_flags, _script_imports_te_spec)

PREPROCESS_TIMEOUT_S = 300.0
PREPROCESS_STALL_S = 120.0
TRAIN_TIMEOUT_S = 600.0
TRAIN_STALL_S = 60.0      # Megatron's sample-index build on 1-sentence documents spins silently for hours

NO_OUTPUT = ("stage '{name}' exited 0 {runs} time(s) but these outputs are missing: {missing}")
RERUN_WHY = ("Megatron-LM issue #1052: with --split-sentences and the default --partitions 1 the tool writes "
             "{ss} and exits 0 without .bin/.idx; the identical second run encodes it")


# ---------------------------------------------------------------- plans


@dataclass(frozen=True)
class Plan:
    """Stages to run for one pipeline step, what they must leave behind, and every adaptation made."""

    stages: tuple[StageSpec, ...]
    adaptations: tuple[Adaptation, ...]
    expected: tuple[Path, ...] = ()
    workdir: Path | None = None


def _stage_env(checkout: Checkout, adapters: Sequence[Adapter], extra_pythonpath: Sequence[str] = (),
               base: dict | None = None) -> dict[str, str]:
    """PYTHONPATH = adapters' folders, extra, the checkout (so `megatron` is the checkout's), then the caller's."""
    path = [p for a in adapters for p in a.pythonpath] + [str(p) for p in extra_pythonpath] + [str(checkout.root)]
    env = {"PYTHONPATH": os.pathsep.join(path + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH")
                                                 else [])), "PYTHONUNBUFFERED": "1"}
    env.update(base or {})
    for adapter in adapters:
        env.update(dict(adapter.env))
    return env


def _pythonpath_adaptation(checkout: Checkout) -> Adaptation:
    """Why the checkout goes first on PYTHONPATH."""
    return Adaptation(f"PYTHONPATH={checkout.root} (first, before site-packages)",
                      "`import megatron` must resolve to the checkout: megatron is a namespace package, and an "
                      "installed megatron-core wheel would otherwise supply megatron.core next to the checkout's "
                      "megatron.training (the tool itself only appends the checkout to sys.path)")


def _prepare_workdir(workdir: Path, adapters: Sequence[Adapter], vocab_file: Path) -> None:
    """Create the stage's working directory and, when an adapter wants it, the local tokenizer folder."""
    workdir.mkdir(parents=True, exist_ok=True)
    if any(a.hf_tokenizer_dir for a in adapters) and not (workdir / HF_TOKENIZER_NAME / "tokenizer.json").is_file():
        build_hf_tokenizer_dir(vocab_file, workdir / HF_TOKENIZER_NAME)


def expected_outputs(output_prefix: str | os.PathLike, json_keys: Sequence[str] = ("text",),
                     split_sentences: bool = True) -> tuple[Path, ...]:
    """`{prefix}_{key}_{sentence|document}.bin/.idx`, as tools/preprocess_data.py names them."""
    level = "sentence" if split_sentences else "document"
    return tuple(Path(f"{output_prefix}_{key}_{level}{ext}") for key in json_keys for ext in (".bin", ".idx"))


def preprocess_argv(checkout: Checkout, corpus_json: Path, output_prefix: Path, vocab_file: Path,
                    python: str = sys.executable, workers: int = 1) -> list[str]:
    """The course's preprocessing command against the checkout's tool (absolute paths: cwd is the workdir)."""
    return [python, str(checkout.root / PREPROCESS_TOOL), "--input", str(corpus_json), "--output-prefix",
            str(output_prefix), "--vocab-file", str(vocab_file), "--tokenizer-type", "BertWordPieceLowerCase",
            "--split-sentences", "--workers", str(workers), "--json-keys", "text"]


def plan_preprocess(checkout: Checkout, corpus_json: str | os.PathLike, output_prefix: str | os.PathLike,
                    vocab_file: str | os.PathLike, workdir: str | os.PathLike, *, python: str = sys.executable,
                    timeout_s: float = PREPROCESS_TIMEOUT_S, stall_s: float = PREPROCESS_STALL_S,
                    nltk_stand_in: bool = True, extra_pythonpath: Sequence[str] = (), workers: int = 1) -> Plan:
    """The checkout's preprocess tool with the course's flags plus adapters; a second identical run (#1052)."""
    if checkout.preprocess_tool is None:
        raise CheckoutError(f"{checkout.root / PREPROCESS_TOOL} is missing", path=checkout.root,
                            fix=NOT_A_CHECKOUT_FIX)
    corpus_json, output_prefix, vocab_file, workdir = (Path(p).resolve() for p in
                                                        (corpus_json, output_prefix, vocab_file, workdir))
    adapters = select_adapters(checkout, "preprocess", Context(checkout, nltk_stand_in=nltk_stand_in))
    _check_flags(checkout, adapters)
    _prepare_workdir(workdir, adapters, vocab_file)
    argv = preprocess_argv(checkout, corpus_json, output_prefix, vocab_file, python, workers) + [
        f for a in adapters for f in a.flags]
    env = _stage_env(checkout, adapters, extra_pythonpath)
    stages = tuple(StageSpec(name, argv, timeout_s, env=env, cwd=str(workdir), stall_timeout_s=stall_s)
                   for name in ("preprocess", "preprocess-rerun"))
    adaptations = (_pythonpath_adaptation(checkout),) + tuple(_adaptation(a, workdir) for a in adapters)
    return Plan(stages, _at("preprocess", adaptations), expected_outputs(output_prefix), workdir)


def _at(stage: str, adaptations: Iterable[Adaptation]) -> tuple[Adaptation, ...]:
    """The adaptations, labelled with the stage they applied to."""
    return tuple(replace(a, stage=stage) for a in adaptations)


def preprocess_stages(checkout: Checkout, corpus_json, output_prefix, vocab_file, workdir, **kw) -> list[StageSpec]:
    """The two preprocess stages (the second runs only when the first left no .bin/.idx): see run_preprocess."""
    return list(plan_preprocess(checkout, corpus_json, output_prefix, vocab_file, workdir, **kw).stages)


@dataclass(frozen=True)
class PreprocessResult:
    """How preprocessing ended: each stage run, the outputs still missing, and the diagnosis when it failed."""

    results: tuple[StageResult, ...]
    expected: tuple[Path, ...]
    missing: tuple[str, ...]
    adaptations: tuple[Adaptation, ...]
    diagnosis: Diagnosis | None = None

    @property
    def ok(self) -> bool:
        """Every stage that ran exited 0 and every expected output exists."""
        return bool(self.results) and self.results[-1].ok and not self.missing

    @property
    def data_prefix(self) -> Path | None:
        """What --data-path takes: the .bin/.idx path without extension."""
        return self.expected[0].with_suffix("") if self.ok else None

    def failure_message(self) -> str:
        """Headline, command, artifacts, last log lines, cause and remedy."""
        last = self.results[-1]
        if not last.ok:
            return last.failure_message()
        lines = [NO_OUTPUT.format(name=last.name, runs=len(self.results), missing=", ".join(self.missing)),
                 last.failure_message().split("\n", 1)[1]]
        if self.diagnosis is not None:
            lines += [f"likely cause [{self.diagnosis.cause_id}]: {self.diagnosis.cause}",
                      f"remedy: {self.diagnosis.remedy}"]
        return "\n".join(lines)


def run_preprocess(plan: Plan, run_dir: str | os.PathLike, on_line=None) -> PreprocessResult:
    """Run the first stage; when it exits 0 without outputs run the identical second; diagnose what is left."""
    results: list[StageResult] = []
    adaptations = list(plan.adaptations)
    for index, spec in enumerate(plan.stages):
        if index:
            ss = _split_file_of(spec.argv)
            adaptations.append(Adaptation(f"ran the identical preprocess command again ({spec.name})",
                                          RERUN_WHY.format(ss=ss), "preprocess"))
        results.append(run_stage(spec, run_dir, on_line=on_line))
        if not results[-1].ok or not missing_files(plan.expected):
            break
    missing = tuple(missing_files(plan.expected))
    diagnosis = _preprocess_diagnosis(results, missing) if results[-1].ok and missing else None
    return PreprocessResult(tuple(results), plan.expected, missing, tuple(adaptations), diagnosis)


def _split_file_of(argv: Sequence[str]) -> str:
    """INPUT_ss.EXT, the sentence-split file tools/preprocess_data.py writes next to --input."""
    stem, ext = os.path.splitext(argv[list(argv).index("--input") + 1])
    return f"{stem}_ss{ext}"


def _preprocess_diagnosis(results: Sequence[StageResult], missing: Sequence[str]) -> Diagnosis | None:
    """The diagnose table's verdict on an exit 0 without outputs; after two runs, #1052 is ruled out."""
    rules = RULES if len(results) < 2 else tuple(r for r in RULES if r.id != "preprocess-split-sentences")
    last = results[-1]
    text = last.log_path.read_text(errors="replace") if last.log_path.is_file() else ""
    return diagnose(last.name, last.returncode, text, missing_outputs=missing, duration_s=last.duration_s,
                    argv=last.argv, rules=rules)


def cannot_run_reason(checkout: Checkout, have_te: bool | None = None,
                      train_script: str | os.PathLike | None = None,
                      python_version: Sequence[int] = tuple(sys.version_info[:2])) -> str | None:
    """Why the BERT script cannot start here (said before launching), with the fix; None when it can."""
    too_old = python_too_old(checkout, python_version)
    if too_old:
        return too_old
    script = Path(train_script) if train_script else checkout.train_script
    have_te = checkout.have_te if have_te is None else have_te
    if script is None or not script.is_file():
        where = script or " or ".join(str(checkout.root / s) for s in TRAIN_SCRIPTS)
        return f"no BERT training script at {where}. Fix: pass --train-script FILE, or a checkout that has one"
    ctx = train_context(replace(checkout, have_te=have_te), train_script)
    if _script_imports_te_spec(ctx) and not have_te and not any(a.launcher for a in select_adapters(
            ctx.checkout, "train", ctx)):
        return CANNOT_RUN_TE.format(script=script, spec=TE_SPEC) + ". Fix: " + CANNOT_RUN_TE_FIX
    return None


def train_context(checkout: Checkout, train_script: str | os.PathLike | None = None) -> Context:
    """What the training adapters' conditions look at: the checkout, and the script that will run."""
    script = Path(train_script) if train_script else None
    return Context(checkout, imports_te_spec=imports_te_spec_at_import_time(script) if script and script.is_file()
                   else None)


def plan_train(checkout: Checkout, data_prefix: str | os.PathLike, vocab_file: str | os.PathLike,
               save_dir: str | os.PathLike, train_script: str | os.PathLike | None = None, nproc: int = 1,
               extra: Sequence[str] = (), *, workdir: str | os.PathLike | None = None, python: str = sys.executable,
               timeout_s: float = TRAIN_TIMEOUT_S, stall_s: float = TRAIN_STALL_S, master_port: int | None = None,
               extra_pythonpath: Sequence[str] = (), name: str = "train-checkout") -> Plan:
    """torchrun [no_te_launch.py] SCRIPT, the course flags, --data-path/--vocab-file/--save and the adapters."""
    script = Path(train_script).resolve() if train_script else checkout.train_script
    if script is None:
        raise CheckoutError(cannot_run_reason(checkout, True) or "no training script", path=checkout.root,
                            fix="pass --train-script FILE")
    save_dir, vocab_file = Path(save_dir).resolve(), Path(vocab_file).resolve()
    workdir = Path(workdir).resolve() if workdir else save_dir.parent
    adapters = select_adapters(checkout, "train", train_context(checkout, train_script))
    _check_flags(checkout, adapters)
    _prepare_workdir(workdir, adapters, vocab_file)
    cache = workdir / "index-cache"
    args = [*COURSE_FLAGS, "--data-path", str(Path(data_prefix)), "--vocab-file", str(vocab_file), "--save",
            str(save_dir), "--data-cache-path", str(cache), *(f for a in adapters for f in a.flags), *extra]
    if not wants_local_spec(args):  # the launcher changes nothing without --spec local: do not record it
        adapters = tuple(a for a in adapters if not a.launcher)
    launcher = [str(NO_TE_LAUNCHER)] if any(a.launcher for a in adapters) else []
    argv = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
            str(master_port or free_port()), *launcher, str(script), *args]
    env = _stage_env(checkout, adapters, extra_pythonpath, {"NCCL_NVLS_ENABLE": "0",
                                                             "CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    spec = StageSpec(name, argv, timeout_s, env=env, cwd=str(workdir), stall_timeout_s=stall_s,
                     stall_after_marker=DATASET_MARKER)
    adaptations = (_pythonpath_adaptation(checkout),
                   Adaptation(f"--save {save_dir}", "the course's command has no --save; the checkpoint criteria "
                                                    "need iter_0000100/ and iter_0000200/"),
                   Adaptation(f"--data-cache-path {cache}", "a fresh index cache: Megatron reuses a stale sample "
                                                           "index whose cache key ignores the data's contents"),
                   Adaptation("NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=1",
                              "NVLink multicast off on shared machines; one CUDA connection as Megatron expects"),
                   *(_adaptation(a, workdir) for a in adapters))
    if train_script:
        adaptations += (Adaptation(f"training script {script}", "--train-script: the student's own script"),)
    return Plan((spec,), _at("train", adaptations), (save_dir / "latest_checkpointed_iteration.txt",), workdir)


def train_stage(checkout: Checkout, data_prefix, vocab_file, save_dir, train_script=None, nproc: int = 1,
                extra: Sequence[str] = (), **kw) -> StageSpec:
    """The training stage of plan_train (its adaptations: plan_train(...).adaptations)."""
    return plan_train(checkout, data_prefix, vocab_file, save_dir, train_script, nproc, extra, **kw).stages[0]


# ---------------------------------------------------------------- compatibility matrix

OUTCOMES = ("pass", "fail", "cannot-run", "not-run")
ROW_KEYS = ("version", "commit", "checkout", "stage", "outcome", "detail", "adaptations")


def version_matrix_row(checkout: Checkout, stage: str, outcome: str, detail: str = "",
                       adaptations: Iterable[Adaptation] = ()) -> dict:
    """One cell of the version x stage table, JSON-able."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    return {"version": str(checkout.version), "commit": checkout.git_commit, "checkout": str(checkout.root),
            "stage": stage, "outcome": outcome, "detail": detail, "adaptations": [a.what for a in adaptations]}


def row_from_result(checkout: Checkout, result: StageResult | PreprocessResult | None, stage: str,
                    adaptations: Iterable[Adaptation] = (), reason: str | None = None) -> dict:
    """A matrix row from how a stage ended (None with a reason: not launched)."""
    if result is None:
        return version_matrix_row(checkout, stage, "cannot-run" if reason else "not-run", reason or "", adaptations)
    if result.ok:
        return version_matrix_row(checkout, stage, "pass", "", adaptations)
    diagnosis = getattr(result, "diagnosis", None) or _diagnosis_of(result)
    detail = f"[{diagnosis.cause_id}] {diagnosis.cause}" if diagnosis else result.failure_message().splitlines()[0]
    return version_matrix_row(checkout, stage, "fail", detail, adaptations)


def _diagnosis_of(result) -> Diagnosis | None:
    """The diagnose table's verdict for a failed StageResult (None for other kinds of result)."""
    last = result.results[-1] if isinstance(result, PreprocessResult) else result
    text = last.log_path.read_text(errors="replace") if last.log_path.is_file() else ""
    return diagnose(last.name, last.returncode, text, timed_out=last.timed_out, stalled=last.stalled,
                    duration_s=last.duration_s, argv=last.argv)


def load_rows(path: str | os.PathLike) -> list[dict]:
    """Rows from RESULTS.json (a list of rows, or {"rows": [...]}); errors name the file and the row."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read results ({exc})", path=path, fix="pass a JSON file of matrix rows") from None
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise InputError("expected a list of rows or {\"rows\": [...]}", path=path, fix="see version_matrix_row")
    for index, row in enumerate(rows):
        missing = [k for k in ("version", "stage", "outcome") if not isinstance(row, dict) or k not in row]
        if missing:
            raise InputError(f"row {index} lacks {', '.join(missing)}", path=path, fix="see version_matrix_row")
    return rows


def matrix_markdown(rows: Sequence[dict]) -> str:
    """Version x stage table (outcome per cell), then each version's failures and adaptations."""
    stages = list(dict.fromkeys(r["stage"] for r in rows))
    versions = list(dict.fromkeys(_version_label(r) for r in rows))
    cell = {(_version_label(r), r["stage"]): r for r in rows}
    out = ["| Megatron-LM | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    for version in versions:
        out.append(f"| {version} | " + " | ".join(cell[(version, s)]["outcome"] if (version, s) in cell else ""
                                                  for s in stages) + " |")
    for version in versions:
        notes = [r for r in rows if _version_label(r) == version and (r.get("detail") or r.get("adaptations"))]
        if notes:
            out += ["", f"### {version}"]
        for r in notes:
            out += [f"- {r['stage']}: {r['outcome']}" + (f": {r['detail']}" if r.get("detail") else "")]
            out += [f"  - {what}" for what in r.get("adaptations") or ()]
    return "\n".join(out) + "\n"


def _version_label(row: dict) -> str:
    """`0.16.1` or `0.20.0 @ abcdef123456`."""
    return row["version"] + (f" @ {row['commit'][:12]}" if row.get("commit") else "")


def write_matrix(rows: Sequence[dict], json_path: str | os.PathLike | None = None,
                 md_path: str | os.PathLike | None = None) -> str:
    """Write the rows as JSON and the table as markdown (each optional); return the markdown."""
    text = matrix_markdown(rows)
    if json_path:
        Path(json_path).write_text(json.dumps({"rows": list(rows)}, indent=2) + "\n", encoding="utf-8")
    if md_path:
        Path(md_path).write_text(text, encoding="utf-8")
    return text


def run_summary(checkout: "Checkout", log_path, memory=None) -> dict:
    """What the report's header and run line show for a checkout's run (the reference trainer writes this itself in
    summary.json): GPU, versions, iterations and the median of Megatron's own ms/iteration (first interval out)."""
    from statistics import median

    import torch

    from harness.evidence.logs import parse_log_file

    try:
        log = parse_log_file(log_path)
    except OSError:
        log = None
    intervals = [r.elapsed_ms for r in (log.iterations[1:] if log else []) if r.elapsed_ms is not None]
    return {"gpu": getattr(memory, "gpu_name", None),
            "device": "cuda" if memory is not None and getattr(memory, "saw_process", False) else None,
            "iterations": log.iterations[-1].iteration if log and log.iterations else 0,
            "ms_per_iter_median": round(median(intervals), 2) if intervals else None,
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                         "megatron_lm": str(checkout.version), "python": sys.version.split()[0]}}


# ---------------------------------------------------------------- speed against the reference trainer

REFERENCE_VARIANT = "bench-cuda-graph"   # python -m harness bench: the reference trainer as `pytest -m gpu` runs it


def speed_ratio(report: dict, bench: dict, variant: str = REFERENCE_VARIANT) -> dict:
    """The checkout's run (report.json) against the reference trainer (harness.tools.bench JSON): wall and ms/iter ratios."""
    from statistics import median

    from harness.evidence.logs import parse_log_file

    run, reference = report["runs"][0], bench["runs"][variant]
    intervals = [r.elapsed_ms for r in parse_log_file(run["log"]).iterations[1:]]  # the first holds the warm-up
    megatron = {"checkout": (report.get("checkout") or {}).get("version"), "iterations": 200,
                "wall_s": run["seconds"], "ms_per_iter_median": round(median(intervals), 2) if intervals else None}
    ours = {"variant": variant, "iterations": 200, "wall_s": reference["wall_s"],
            "ms_per_iter_median": round(reference["ms_per_iter_median"], 2)}
    ratio = lambda a, b: round(a / b, 2) if a and b else None  # noqa: E731
    return {"megatron_lm": megatron, "reference_trainer": ours,
            "wall_ratio": ratio(megatron["wall_s"], ours["wall_s"]),
            "ms_per_iter_ratio": ratio(megatron["ms_per_iter_median"], ours["ms_per_iter_median"])}


# ---------------------------------------------------------------- command line


def describe(checkout: Checkout) -> dict:
    """Detection, each stage's adapters and the pre-check, JSON-able (the `detect` command)."""
    plan = {stage: [asdict(_adaptation(a, Path("WORKDIR"))) for a in select_adapters(checkout, stage)]
            for stage in ("preprocess", "train")}
    info = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(checkout).items()}
    info["version"] = str(checkout.version)
    return {"checkout": info, "adapters": plan, "cannot_run": cannot_run_reason(checkout)}


def _cmd_detect(args) -> int:
    """Print what the suite sees in a checkout and what it would add."""
    probes = probe_modules(("transformer_engine", "apex"), args.python)
    checkout = detect(args.path, have_te=probes["transformer_engine"], have_apex=probes["apex"])
    print(json.dumps(describe(checkout), indent=2))
    return 0


def _cmd_table(args) -> int:
    """Render RESULTS.json as the compatibility table."""
    text = write_matrix(load_rows(args.results), args.json, args.markdown)
    sys.stdout.write(text)
    return 0


def _cmd_speed(args) -> int:
    """Print (and write) Megatron-LM's time per 200 iterations next to the reference trainer's."""
    try:
        report, bench = (json.loads(Path(p).read_text(encoding="utf-8")) for p in (args.report, args.bench))
        result = speed_ratio(report, bench)
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise InputError(f"cannot compare speed ({exc!r})", path=args.report,
                         fix="pass a checkout run's report.json and python -m harness bench's JSON") from None
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: `detect PATH`, `table RESULTS.json [--markdown OUT.md] [--json OUT.json]` or `speed REPORT BENCH`."""
    parser = argparse.ArgumentParser(prog="python -m harness checkout", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    det = sub.add_parser("detect", help="what the suite sees in a Megatron-LM checkout and what it would add")
    det.add_argument("path")
    det.add_argument("--python", default=sys.executable, help="the Python that will run the checkout")
    det.set_defaults(func=_cmd_detect)
    table = sub.add_parser("table", help="version x stage x outcome table from matrix rows")
    table.add_argument("results", help="JSON: a list of rows (version_matrix_row) or {\"rows\": [...]}")
    table.add_argument("--markdown", help="also write the table here")
    table.add_argument("--json", help="also write the normalised rows here")
    table.set_defaults(func=_cmd_table)
    speed = sub.add_parser("speed", help="Megatron-LM's wall time per 200 iterations against the reference trainer")
    speed.add_argument("report", help="report.json of a --megatron-lm run")
    speed.add_argument("bench", help="JSON of python -m harness bench (the reference trainer alone)")
    speed.add_argument("--out", help="also write the result here")
    speed.set_defaults(func=_cmd_speed)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
