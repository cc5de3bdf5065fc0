"""Run a population of real Megatron-LM course runs at once on one GPU: the samples every band is derived from.

    python -m harness calibrate runs --megatron-lm CHECKOUT --out DIR [--only a b-mbs2 ...] [--shard 1/2]

The runs are data (fixtures/population/plan.toml): each group is a legitimate way through the chapter (recipe
(a) or (b), other seeds, the FAQ's variants, a resumed run, a launcher's rank-prefixed log); each [[mutant]] a
deliberately broken one. Every run is the checkout's own training script through torchrun with the course's flags
(harness.run.megatron_lm.plan_train), its own port, work and save folder. NVML follows each run's process tree;
a bare CUDA context is measured beside them (default module loading and CUDA_MODULE_LOADING=EAGER), so a run's
peak splits into this machine's context and the training's own memory. DIR gets logs/<run>[.<leg>].log and
records.json (one record per run: what ran, how it ended, its memory); checkpoints are deleted once a run is done.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from harness.base import paths
from harness.data import preprocess_argv
from harness.run.gpumem import NvmlSampler
from harness.base.proc import free_port
from harness.run.launch import run_stage

PLAN = paths.FIXTURES / "population" / "plan.toml"
SHAPES = ("plain", "tee", "resume")
RESUME_EXIT = 130          # the resumed shape stops here (after the save at 100; Megatron saves again on exit)
RUN_ESTIMATE_S = 150.0     # a run is not started when less than this is left (16 at once took 131-166 s)
PROBE = ("import os, time, torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); "
         "print('context ready', flush=True); time.sleep(1.5)")


@dataclass(frozen=True)
class PopRun:
    """One run of the population: a group's seed."""

    name: str
    group: str
    recipe: str
    seed: int
    extra: tuple[str, ...] = ()
    env: dict = field(default_factory=dict, hash=False)
    shape: str = "plain"
    variant: str | None = None
    mutant: bool = False
    why: str = ""
    drop: tuple[str, ...] = ()        # flags removed with their value (the course's literal command has no --save)
    kill_on: str | None = None        # SIGKILL the run's process group when a log line matches this regex
    keep: str | None = None           # "small": keep each checkpoint's small files (not the weights); "all"
    occupy_port: bool = False         # a listener holds the run's master port first (a port another job holds)
    mismatched_idx: bool = False      # the .idx of the other recipe's corpus beside this one's .bin


def load_plan(path: Path = PLAN) -> list[PopRun]:
    """Every run of the plan, groups first, in the file's order; errors name the file and the entry."""
    raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    runs = []
    for kind, mutant in (("group", False), ("mutant", True)):
        for entry in raw.get(kind, []):
            shape = entry.get("shape", "plain")
            if shape not in SHAPES or entry.get("recipe") not in ("a", "b") or not entry.get("seeds"):
                raise ValueError(f"{path}: [[{kind}]] {entry.get('name')!r}: needs recipe a|b, seeds, shape in {SHAPES}")
            if entry.get("keep") not in (None, "small", "all"):
                raise ValueError(f"{path}: [[{kind}]] {entry.get('name')!r}: keep must be 'small' or 'all'")
            for seed in entry["seeds"]:
                runs.append(PopRun(f"{entry['name']}-s{seed}", entry["name"], entry["recipe"], int(seed),
                                   tuple(entry.get("extra", ())), dict(entry.get("env", {})), shape,
                                   entry.get("variant"), mutant, entry.get("why", ""),
                                   tuple(entry.get("drop", ())), entry.get("kill_on"), entry.get("keep"),
                                   bool(entry.get("occupy_port", False)), bool(entry.get("mismatched_idx", False))))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: run names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return runs


def select(runs: list[PopRun], only: list[str] | None = None, shard: str | None = None) -> list[PopRun]:
    """Runs whose group or name matches one of `only` (globs), then shard "i/n" of them (round robin)."""
    if only:
        runs = [r for r in runs if any(fnmatch.fnmatch(r.group, p) or fnmatch.fnmatch(r.name, p) for p in only)]
    if shard:
        index, count = (int(x) for x in shard.split("/"))
        if not 1 <= index <= count:
            raise ValueError(f"--shard {shard}: expected i/n with 1 <= i <= n")
        runs = runs[index - 1::count]
    return runs


def context_probe(env: dict) -> dict:
    """NVML's view of a bare torch CUDA context in a fresh process (the part of any run's memory that belongs to
    this GPU, driver, CUDA and module-loading mode, not to the training)."""
    holder: dict = {}
    with NvmlSampler(lambda: holder.get("pid")) as sampler:
        proc = subprocess.Popen([sys.executable, "-c", PROBE], env={**os.environ, **env},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        holder["pid"] = proc.pid
        out, _ = proc.communicate(timeout=120)
    report = sampler.report()
    return {"env": env, "peak_mib": report.peak_mib, "method": report.method, "returncode": proc.returncode,
            "output": out[-400:]}


def build_helpers(root: Path) -> None:
    """Build Megatron's C++ dataset helpers once, before the runs: each run otherwise compiles them into the checkout
    on first use, and runs starting together race ("helpers_cpp...so: file too short", seen with 29 at once)."""
    folder = Path(root) / "megatron" / "core" / "datasets"
    if (folder / "Makefile").is_file():
        subprocess.run(["make", "-C", str(folder)], check=True, stdout=subprocess.DEVNULL)


def prepare_data(out: Path, recipes: set[str], vocab: Path) -> dict[str, Path]:
    """The course corpus of each recipe, preprocessed by the suite (the same .bin/.idx as Megatron's tool)."""
    from harness.evidence.recipe import load_recipe

    prefixes = {}
    for recipe in sorted(recipes):
        corpus = out / "data" / f"corpus-{recipe}.json"
        corpus.parent.mkdir(parents=True, exist_ok=True)
        layout = load_recipe().variants[recipe].corpus_layout
        subprocess.run([sys.executable, "-m", "harness.data.corpus", str(corpus), "--layout", layout], check=True)
        prefix = out / "data" / f"corpus-{recipe}"
        subprocess.run(preprocess_argv(corpus, prefix, vocab), check=True, stdout=subprocess.DEVNULL)
        prefixes[recipe] = Path(f"{prefix}_text_sentence")
    return prefixes


def _legs(run: PopRun, save_dir: Path) -> list[tuple[str, list[str]]]:
    """(log name, extra arguments) of each leg of a run."""
    from harness.evidence.recipe import load_recipe

    base = ["--seed", str(run.seed), *load_recipe().variants[run.recipe].extra_args, *run.extra]
    if run.shape == "resume":
        return [(f"{run.name}.1", [*base, "--exit-interval", str(RESUME_EXIT)]),
                (f"{run.name}.2", [*base, "--load", str(save_dir)])]
    return [(run.name, base)]


def drop_flags(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """argv without each of `flags` and the value that follows it; a flag followed by another flag (`--fp16
    --lr 1e-4`) has no value and is dropped alone."""
    kept, skip = [], False
    for arg in argv:
        if skip and not arg.startswith("--"):
            skip = False
            continue
        skip = arg in flags
        if not skip:
            kept.append(arg)
    return kept


SMALL_CHECKPOINT_FILES = ("common.pt", ".metadata", "metadata.json")


def keep_checkpoints(save_dir: Path, dest: Path, what: str) -> None:
    """Copy a run's --save folder to dest: everything ("all"), or only the tracker and each iteration's small
    files ("small": what the inspector reads without the weights)."""
    if not save_dir.is_dir():
        return
    if what == "all":
        shutil.copytree(save_dir, dest, dirs_exist_ok=True)
        return
    for f in save_dir.rglob("*"):
        if f.is_file() and (f.name in SMALL_CHECKPOINT_FILES or f.name == "latest_checkpointed_iteration.txt"):
            target = dest / f.relative_to(save_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, target)


def _mismatched(data: dict[str, Path], recipe: str, workdir: Path) -> Path:
    """A data prefix whose .bin is this recipe's and whose .idx is the other recipe's."""
    other = data["b" if recipe == "a" else "a"]
    prefix = workdir / "mismatched" / data[recipe].name
    prefix.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(f"{data[recipe]}.bin", f"{prefix}.bin")
    shutil.copy2(f"{other}.idx", f"{prefix}.idx")
    return prefix


def run_one(checkout, run: PopRun, data: dict[str, Path], out: Path, vocab: Path, deadline: float) -> dict:
    """Every leg of one run, each followed by NVML; the record of what ran and how it ended."""
    from harness.run.megatron_lm import plan_train

    save_dir, workdir = out / "ckpt" / run.name, out / "work" / run.name
    record = {**asdict(run), "legs": []}
    for log_name, extra in _legs(run, save_dir):
        left = deadline - time.monotonic()
        if left < RUN_ESTIMATE_S / (2 if run.shape == "resume" else 1):
            record["legs"].append({"log": None, "not_run": f"deadline: {left:.0f} s left"})
            break
        prefix = _mismatched(data, run.recipe, workdir) if run.mismatched_idx else data[run.recipe]
        port = free_port()
        plan = plan_train(checkout, prefix, vocab, save_dir, extra=extra, workdir=workdir,
                          timeout_s=max(60.0, left - 5), stall_s=240.0, master_port=port, name=log_name)
        spec = plan.stages[0]
        argv = drop_flags(list(spec.argv), run.drop)
        if run.shape == "tee":
            at = argv.index("torch.distributed.run") + 1
            argv[at:at] = ["--tee", "3", "--log-dir", str(workdir / "torchrun-logs")]
        spec = replace(spec, argv=tuple(argv), env={**(spec.env or {}), **run.env})
        holder: dict = {}
        listener = _occupy(port) if run.occupy_port else None
        try:
            with NvmlSampler(lambda: holder.get("pid")) as sampler:
                result = run_stage(spec, out / "logs", on_line=_killer(run.kill_on, holder),
                                   on_start=lambda p: holder.__setitem__("pid", p.pid), reraise_interrupt=False)
        finally:
            if listener is not None:
                listener.close()
        memory = sampler.report()
        record["legs"].append({
            "log": f"logs/{log_name}.log", "argv": list(spec.argv), "returncode": result.returncode,
            "timed_out": result.timed_out, "stalled": result.stalled, "duration_s": round(result.duration_s, 1),
            "killed_on": holder.get("killed_on"),
            "memory": {"peak_mib": memory.peak_mib, "method": memory.method, "gpu": memory.gpu_name,
                       "reason": memory.reason},
            "tail": list(result.tail[-8:]) if not result.ok else []})
        print(f"[population] {log_name}: exit {result.returncode} in {result.duration_s:.0f} s, "
              f"peak {memory.peak_mib} MiB", flush=True)
        if not result.ok and run.shape == "resume" and log_name.endswith(".1"):
            break
    if run.keep:
        keep_checkpoints(save_dir, out / "kept" / run.name, run.keep)
    shutil.rmtree(save_dir, ignore_errors=True)
    shutil.rmtree(workdir / "index-cache", ignore_errors=True)
    return record


def _occupy(port: int):
    """A socket listening on `port` (what another job holding the master port looks like to torchrun)."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", port))
    sock.listen(1)
    return sock


def _killer(pattern: str | None, holder: dict):
    """An on_line callback that SIGKILLs the stage's process group at the first line matching `pattern` (a run
    killed by the machine at that point: no handler, no last words)."""
    if not pattern:
        return None
    import re
    import signal

    regex = re.compile(pattern)

    def on_line(line: str) -> None:
        if "killed_on" not in holder and regex.search(line) and holder.get("pid"):
            holder["killed_on"] = line.strip()[:200]
            kill_tree(holder["pid"], signal.SIGKILL)
    return on_line


def kill_tree(pid: int, sig: int) -> None:
    """Send `sig` to a process and every descendant at once, children first listed (torchrun's workers run in a
    process group of their own: killing the launcher's group leaves them training)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def run_population(checkout_path: Path, runs: list[PopRun], out: Path, jobs: int, budget_s: float,
                   vocab: Path = paths.VOCAB_FILE) -> dict:
    """Run `runs` (at most `jobs` at a time, none started too close to the budget); write DIR/records.json."""
    from harness.run.checkout import detect

    started = time.monotonic()
    deadline = started + budget_s
    out.mkdir(parents=True, exist_ok=True)
    checkout = detect(checkout_path)
    build_helpers(checkout.root)
    data = prepare_data(out, {r.recipe for r in runs}, vocab)
    probes = [context_probe({}), context_probe({"CUDA_MODULE_LOADING": "EAGER"})]
    lock = threading.Lock()
    records: list[dict] = []

    def task(run: PopRun) -> None:
        record = run_one(checkout, run, data, out, vocab, deadline)
        with lock:
            records.append(record)
            _write(out, checkout, probes, records, started, jobs)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(task, r) for r in runs]:
            future.result()
    return _write(out, checkout, probes, records, started, jobs)


def _write(out: Path, checkout, probes, records, started, jobs) -> dict:
    import torch

    doc = {"schema": 1, "checkout": {"version": str(checkout.version), "commit": checkout.git_commit},
           "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]},
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if torch.cuda.is_available()
           else None,
           "date": time.strftime("%Y-%m-%d"), "concurrent_runs": jobs, "wall_s": round(time.monotonic() - started, 1),
           "context_probes": probes, "runs": sorted(records, key=lambda r: r["name"])}
    paths.write_text_atomic(out / "records.json", json.dumps(doc, indent=1))
    return doc
