"""Parity of a training log with Megatron-LM's recorded run, log interval by log interval.

    python -m harness parity TRAINER_LOG [--out DIR]

Compares lm loss on every iteration line, the skipped-iteration count on every line, and lm loss of every
validation line (periodic, final validation set, test set) with the recorded Megatron-LM log named in
fixtures/golden/megatron_parity.toml, and writes parity.md and parity.json: per-interval |delta|, the
largest |delta| and where, and every line outside its tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.base.errors import HarnessError
from harness.base import paths
from harness.evidence.logformat import ParsedLog
from harness.evidence.logs import parse_log_file

SPEC_FILE = paths.GOLDEN_DIR / "megatron_parity.toml"
SPEC_KEYS = {"reference_log": str, "seed": int, "loss_tol": float, "skipped_tol": int, "rationale": str}
MISSING = "missing from the trainer's log"
# Failure text: criterion, measured, expected, where, artifacts, remedy.
FAIL_TEMPLATE = ("megatron-parity: {bad} of {total} compared values outside tolerance; largest lm-loss |delta| "
                 "{largest:.4f} at {where} (tolerance {tol}).\n{lines}\nartifacts: {artifacts}\n"
                 "remedy: compare the trainer's numerics with Megatron-LM --fp16 (harness/train/step.py)")


class ParityError(HarnessError, ValueError):
    """A parity spec or log that cannot be compared; the message names the file and the fix."""


@dataclass(frozen=True)
class ParitySpec:
    """What to compare with, and how closely (fixtures/golden/megatron_parity.toml)."""

    reference_log: Path
    seed: int
    loss_tol: float
    skipped_tol: int
    rationale: str
    source: str = ""


@dataclass(frozen=True)
class Row:
    """One compared value: a metric at one log line."""

    metric: str               # "lm loss", "skipped", "validation lm loss", "final validation lm loss", ...
    iteration: int
    megatron: float | None
    trainer: float | None
    tolerance: float

    @property
    def delta(self) -> float | None:
        if self.megatron is None or self.trainer is None:
            return None
        return abs(self.trainer - self.megatron)

    @property
    def ok(self) -> bool:
        return self.delta is not None and self.delta <= self.tolerance + 1e-12


@dataclass(frozen=True)
class Parity:
    """Every row, and the summary a report needs."""

    rows: tuple
    spec: ParitySpec

    @property
    def failures(self) -> list:
        return [r for r in self.rows if not r.ok]

    @property
    def largest(self) -> Row | None:
        """The loss row with the largest |delta| (skipped counts are judged separately)."""
        losses = [r for r in self.rows if r.metric != "skipped" and r.delta is not None]
        return max(losses, key=lambda r: r.delta) if losses else None

    def to_dict(self) -> dict:
        big = self.largest
        log = self.spec.reference_log
        shown = log.relative_to(paths.REPO) if log.is_relative_to(paths.REPO) else log
        return {"reference_log": str(shown), "seed": self.spec.seed,
                "loss_tol": self.spec.loss_tol, "skipped_tol": self.spec.skipped_tol,
                "compared": len(self.rows), "outside_tolerance": len(self.failures),
                "largest_abs_delta": None if big is None else {"metric": big.metric, "iteration": big.iteration,
                                                               "abs_delta": big.delta},
                "rows": [{**asdict(r), "abs_delta": r.delta, "ok": r.ok} for r in self.rows]}

    def failure_message(self, artifacts: str = "") -> str:
        big = self.largest
        lines = "\n".join(f"  {r.metric} at iteration {r.iteration}: trainer {_num(r.trainer)}, Megatron-LM "
                          f"{_num(r.megatron)}" + (f", |delta| {r.delta:.4f}" if r.delta is not None else "")
                          for r in self.failures)
        return FAIL_TEMPLATE.format(bad=len(self.failures), total=len(self.rows),
                                    largest=big.delta if big else float("nan"),
                                    where=f"{big.metric} iteration {big.iteration}" if big else "-",
                                    tol=self.spec.loss_tol, lines=lines, artifacts=artifacts or "-")


def _num(value: float | None) -> str:
    return MISSING if value is None else f"{value:.6f}" if isinstance(value, float) else str(value)


def load_spec(path: Path = SPEC_FILE) -> ParitySpec:
    """Read and check the spec; errors name the file and the key."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ParityError(f"{path}: cannot read the parity spec ({exc})") from exc
    problems = [f"`{k}` missing" for k in SPEC_KEYS if k not in raw]
    problems += [f"`{k}` must be {t.__name__}, got {type(raw[k]).__name__}" for k, t in SPEC_KEYS.items()
                 if k in raw and not isinstance(raw[k], t)]
    problems += [f"unknown key `{k}`" for k in sorted(set(raw) - set(SPEC_KEYS))]
    if not problems and (raw["loss_tol"] < 0 or raw["skipped_tol"] < 0):
        problems.append("tolerances must be >= 0")
    if problems:
        raise ParityError(f"{path}: " + "; ".join(problems) + f" (keys: {', '.join(SPEC_KEYS)})")
    log = Path(raw["reference_log"])
    return ParitySpec(log if log.is_absolute() else paths.REPO / log, raw["seed"], raw["loss_tol"],
                      raw["skipped_tol"], raw["rationale"], str(path))


def _validation_metric(split: str) -> str:
    return {"periodic": "validation lm loss", "validation": "final validation lm loss",
            "test": "test lm loss"}.get(split, f"{split} lm loss")


def compare(megatron: ParsedLog, trainer: ParsedLog, spec: ParitySpec) -> Parity:
    """One row per Megatron value: its iteration lines' lm loss and skipped count, its validation lines."""
    if not megatron.iterations:
        raise ParityError(f"{spec.reference_log}: no iteration lines to compare with")
    mine = {r.iteration: r for r in trainer.iterations}
    rows = []
    for ref in megatron.iterations:
        got = mine.get(ref.iteration)
        if ref.lm_loss is not None:
            rows.append(Row("lm loss", ref.iteration, ref.lm_loss, got.lm_loss if got else None, spec.loss_tol))
        rows.append(Row("skipped", ref.iteration, ref.skipped, got.skipped if got else None, spec.skipped_tol))
    evals = {(v.iteration, v.split): v for v in trainer.validations}
    for ref in megatron.validations:
        got = evals.get((ref.iteration, ref.split))
        rows.append(Row(_validation_metric(ref.split), ref.iteration, ref.lm_loss, got.lm_loss if got else None,
                        spec.loss_tol))
    return Parity(tuple(rows), spec)


def compare_files(trainer_log: Path, spec: ParitySpec | None = None) -> Parity:
    """compare() on two log files (the Megatron one named by the spec)."""
    spec = spec or load_spec()
    return compare(parse_log_file(spec.reference_log), parse_log_file(trainer_log), spec)


def to_markdown(parity: Parity, title: str = "Reference trainer vs Megatron-LM core_v0.16.1") -> str:
    """A table per log interval: Megatron, trainer, |delta|, within tolerance."""
    d = parity.to_dict()
    big = d["largest_abs_delta"]
    head = [f"# {title}", "",
            f"Recorded Megatron-LM log: `{Path(d['reference_log']).name}`, seed {d['seed']}; tolerance "
            f"{d['loss_tol']} on losses, {d['skipped_tol']} on skipped counts.", "",
            f"Compared values: {d['compared']}; outside tolerance: {d['outside_tolerance']}; largest loss |delta|: "
            + (f"{big['abs_delta']:.6f} ({big['metric']}, iteration {big['iteration']})" if big else "-"), "",
            "| metric | iteration | Megatron-LM | trainer | abs delta | ok |", "|---|---:|---:|---:|---:|---|"]
    body = [f"| {r.metric} | {r.iteration} | {_num(r.megatron)} | {_num(r.trainer)} | "
            f"{'-' if r.delta is None else f'{r.delta:.6f}'} | {'yes' if r.ok else 'NO'} |" for r in parity.rows]
    return "\n".join(head + body) + "\n"


def write(parity: Parity, out_dir: Path) -> tuple[Path, Path]:
    """parity.md and parity.json into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / "parity.md", out_dir / "parity.json"
    md.write_text(to_markdown(parity))
    js.write_text(json.dumps(parity.to_dict(), indent=1) + "\n")
    return md, js


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness parity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trainer_log", type=Path)
    p.add_argument("--spec", type=Path, default=SPEC_FILE)
    p.add_argument("--out", type=Path, default=None, help="write parity.md and parity.json here")
    args = p.parse_args(argv)
    try:
        parity = compare_files(args.trainer_log, load_spec(args.spec))
    except (ParityError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        write(parity, args.out)
    print(to_markdown(parity))
    return 0 if not parity.failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
