"""What a Megatron-LM log proves about the device, the memory and the checkpoints of its run.

Megatron-LM core_v0.16.1 prints, on a GPU run, its CUDA allocator statistics (``report_memory`` in
megatron/training/utils.py: ``[Rank 0] (after 10 iterations) memory (MB) | allocated: ... | max reserved: 364.00``),
torch's NCCL process group speaks in its own lines (``ProcessGroupNCCL.cpp``), and the arguments block names the
device choices (``distributed_backend``, the reference trainer's ``device``). Its saves print ``saving checkpoint at
iteration N ...`` and, once written, ``successfully saved checkpoint from iteration N ...``; ``save ... None`` in the
arguments block is a run without ``--save``. The memory band for the log's ``max reserved`` is derived from the real
logs kept in fixtures (``python -m harness log-evidence derive``), one band per model/micro-batch variant.
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import sys
from pathlib import Path

from harness.judge import bands
from harness.evidence import logs
from harness.base.paths import GOLDEN_DIR

MEMORY_BANDS = "megatron_log_memory_h200.json"
BAND_RULE = {"k_std": 3.0, "rel_tol_floor": 0.10}   # the memory bands' rule: tol = max(3 std, 10% of mean)
# every real Megatron-LM log kept in fixtures (the reference trainer's log is not Megatron-LM's: left out)
REAL_LOG_GLOBS = ("fixtures/logs/population/*.log*", "fixtures/logs/runs-h200/*.log*", "fixtures/logs/core_v*.log")
COURSE_VARIANT = {"hidden_size": "128", "micro_batch_size": "4"}
_NCCL = re.compile(r"ProcessGroupNCCL|NCCL INFO|NCCL version|\bnccl\b.*\binitiali[sz]ed", re.IGNORECASE)
_CPU = re.compile(r"(?:using|running on|device[:=])\s*(?:the\s+)?cpu\b", re.IGNORECASE)
SCAN_LINES = 20000                                   # lines scanned for device evidence (bounded)


def gpu_evidence(log) -> tuple:
    """(proofs, refutations) of a GPU run, each a list of texts naming the log line."""
    proofs, refutes = [], []
    if log.memory:
        m = log.memory[0]
        proofs.append(f"Megatron's CUDA allocator report `[Rank {m.rank}] {m.label} memory (MB) | allocated: "
                      f"{m.allocated:g} ...` (log line {m.line_no}, {len(log.memory)} such lines)")
    nccl = next(((i, t) for i, t in enumerate(log.lines[:SCAN_LINES], start=1) if _NCCL.search(t)), None)
    if nccl:
        proofs.append(f"the NCCL process group speaks (log line {nccl[0]}: {nccl[1].strip()[:80]!r})")
    device, backend = log.argument("device"), log.argument("distributed_backend")
    if device == "cuda":
        proofs.append(f"arguments block: device cuda (log line {log.arguments_line})")
    if device == "cpu":
        refutes.append(f"arguments block: device cpu (log line {log.arguments_line})")
    if backend == "gloo" and not log.memory:
        refutes.append(f"arguments block: distributed_backend gloo and no CUDA memory report (log line "
                       f"{log.arguments_line})")
    cpu = next(((i, t) for i, t in enumerate(log.lines[:SCAN_LINES], start=1) if _CPU.search(t)), None)
    if cpu and not log.memory:
        refutes.append(f"a CPU line (log line {cpu[0]}: {cpu[1].strip()[:80]!r})")
    return proofs, refutes


# ---------------------------------------------------------------- memory: Megatron's own report


def memory_variant(log) -> tuple:
    """(band key, how): the model width and micro batch the log's memory depends on."""
    hidden, mbs = log.argument("hidden_size"), log.argument("micro_batch_size")
    if log.arguments is None or hidden is None or mbs is None:
        hidden, mbs, how = COURSE_VARIANT["hidden_size"], COURSE_VARIANT["micro_batch_size"], \
            "no arguments block: the course's --hidden-size 128 --micro-batch-size 4 assumed"
    else:
        how = f"arguments block: hidden_size {hidden}, micro_batch_size {mbs}"
    return f"hidden{hidden}-mbs{mbs}", how


def _training_report(m) -> bool:
    """A report of the training steps (`(after K iterations)`), not one around a checkpoint save (a save adds its
    buffers, and a run without --save never prints those)."""
    return m.label.startswith("(after ") and "iteration" in m.label and "save" not in m.label


def peak(log):
    """The training's memory report with the highest max reserved (every rank's), or None."""
    return max((m for m in log.memory if _training_report(m)), key=lambda m: (m.max_reserved, -m.line_no),
               default=None)


def derive_memory_bands(paths: list) -> dict:
    """The bands document: per variant the max reserved of each real log, band [min - tol, max + tol]."""
    samples: dict = {}
    for path in paths:
        log = logs.parse_log_file(path)
        top = peak(log)
        if top is None:
            continue
        key, _ = memory_variant(log)
        samples.setdefault(key, {})[Path(path).name] = top.max_reserved
    out = {}
    for key, runs in sorted(samples.items()):
        b = bands.compute_band(list(runs.values()), BAND_RULE["rel_tol_floor"], BAND_RULE["k_std"])
        lo, hi = min(runs.values()) - b.tol, max(runs.values()) + b.tol
        out[key] = {"lo": round(lo, 1), "hi": round(hi, 1), "mean": round(b.mean, 2), "std": round(b.std, 2),
                    "tol": round(b.tol, 2), "n": b.n, "samples": runs}
    return {"schema": 1, "what": "Megatron-LM's own `max reserved` (MB, torch's CUDA allocator) from its report_memory "
                                  "lines of the training steps (`(after K iterations)`; the lines around a checkpoint "
                                  "save are left out: a run without --save has none), the highest of each log",
            "band_rule": "band [min - tol, max + tol], tol = max(3 std, 10% of the mean): the rule of the "
                         "reference trainer's memory band",
            "provenance": {"gpu": "NVIDIA H200", "logs": sorted(Path(p).name for p in paths),
                           "made_by": "python -m harness log-evidence derive"},
            "bands": out}


def real_logs(root: Path | None = None) -> list:
    """The real Megatron-LM logs the bands are derived from."""
    root = root or Path(__file__).resolve().parents[2]
    return sorted(p for g in REAL_LOG_GLOBS for p in glob.glob(str(root / g)))


_BANDS: dict = {}


def memory_bands(name: str = MEMORY_BANDS) -> dict:
    """The derived bands (fixtures/golden/<name>), read once."""
    if name not in _BANDS:
        _BANDS[name] = json.loads((GOLDEN_DIR / name).read_text())
    return _BANDS[name]


# ---------------------------------------------------------------- checkpoints: the log's save lines


def log_saves(log, wanted: list) -> tuple:
    """(ok, measured, where, absent): whether the log shows a completed save for each wanted iteration.

    ok is None when the log cannot tell (no arguments block and no save line: the run's output may be elsewhere).
    absent: a save missing only because the log stops before that iteration (a consequence, not its own failure).
    """
    save = logs.save_argument(log)
    where = f"arguments block at log line {log.arguments_line}" if log.arguments_line else "whole log"
    if save is not None and save == "None":
        interval = log.argument("save_interval")
        return (False, "the arguments block says `save ... None`: the run had no --save, so Megatron-LM saved no "
                       "checkpoint" + (f" (--save-interval {interval} without --save saves nothing)"
                                       if interval not in (None, "") else "") + "; the course's command lacks --save: add `--save DIR` (e.g. "
                       "--save checkpoints/bert) to it", where, False)
    saves = logs.completed_saves(log)
    if save is None and not saves:
        return None, "the log has no arguments block and no checkpoint save line", "whole log", False
    last = log.last_iteration or 0
    done = [it for it in wanted if it in saves and None not in saves[it]]
    begun = [it for it in wanted if it in saves and saves[it][1] is None]
    orphan = [it for it in wanted if it in saves and saves[it][0] is None]
    never = [it for it in wanted if it not in saves]
    found = ", ".join(f"{it}" + ("" if s and d else " (begun, not finished)" if s else " (finished, never begun)")
                      for it, (s, d) in sorted(saves.items()))
    if not begun and not never and not orphan:
        lines = ", ".join(str(saves[it][1]) for it in wanted)
        return True, f"completed saves at iteration(s) {', '.join(map(str, done))} (`successfully saved` at log " \
                     f"line(s) {lines})", f"log line {saves[wanted[0]][1]}", False
    parts = []
    if begun:
        parts.append("save(s) begun but never finished at iteration(s) " + ", ".join(map(str, begun)) +
                     " (`saving checkpoint` without `successfully saved`)")
    if orphan:
        parts.append("`successfully saved` without its `saving checkpoint` line at iteration(s) " +
                     ", ".join(map(str, orphan)) + " (Megatron prints both: the log was altered or cut)")
    if never:
        parts.append("no `saving checkpoint at iteration` line for " + ", ".join(map(str, never)))
    at = saves[begun[0]][0] if begun else saves[orphan[0]][1] if orphan else None
    return (False, "; ".join(parts) + f" (saves in the log: {found or 'none'}; --save {save or '(not printed)'})",
            f"log line {at}" if at else "whole log", not begun and not orphan and all(it > last for it in never))


def wanted_saves(iterations: list, log) -> list:
    """The iterations the run must have saved: the profile's, and those the run's own --save-interval and
    --train-iters make Megatron save (every multiple of the interval, and the last iteration)."""
    wanted = set(iterations)
    if log is None:
        return sorted(wanted)
    interval, last = log.int_argument("save_interval"), log.int_argument("train_iters")
    if interval is None or last is None:
        return sorted(wanted)
    if interval > 0 and logs.saves_enabled(log):
        wanted |= set(range(interval, last + 1, interval)) | {last}
    return sorted(wanted)



# ---------------------------------------------------------------- loss windows in iterations


def iteration_windows(series: list, width: int, interval: int) -> list:
    """The values in consecutive windows of about `width` iterations: each logged point stands for the `interval`
    iterations it ends, so a run logged at any --log-interval gets the same windows (span // width of them)."""
    first, last = series[0][0], series[-1][0]
    covered = last - first + interval
    count = covered // width
    chunks = [[] for _ in range(count)]
    for it, value, _ in series:
        chunks[min(count - 1, (it - first) * count // covered)].append(value)
    return [w for w in chunks if w]


def main(argv: list | None = None) -> int:
    """CLI: `derive` the memory bands from the real logs (writes fixtures/golden/<MEMORY_BANDS>)."""
    parser = argparse.ArgumentParser(prog="python -m harness log-evidence")
    parser.add_argument("command", choices=["derive"])
    parser.add_argument("--out", default=str(GOLDEN_DIR / MEMORY_BANDS))
    args = parser.parse_args(argv)
    doc = derive_memory_bands(real_logs())
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}: " + ", ".join(f"{k} [{b['lo']}, {b['hi']}] MB ({b['n']} logs)"
                                              for k, b in doc["bands"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
