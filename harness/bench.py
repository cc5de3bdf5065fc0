"""Time the reference trainer alone on this GPU: the whole-step CUDA graph against the eager step.

    python -m harness.bench --out results/bench-h200.json

One run at a time (concurrent runs share the GPU and would time each other); ms/iter is the trainer's own
median over the steady log intervals, as Megatron's `elapsed time per iteration (ms)` reports it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from harness import paths
from harness.run.runs import RunSpec
from harness.run.session import Session

VARIANTS = (
    RunSpec("bench-cuda-graph", "course flags, whole step captured in one CUDA graph (the default)", save=False),
    RunSpec("bench-eager", "course flags, eager step (--cuda-graph off)", extra_args=("--cuda-graph", "off"),
            save=False),
)


def bench(run_dir: Path) -> dict:
    session = Session(run_dir)
    prepared = session.prepare_data()
    if not prepared.ok:
        raise SystemExit(prepared.failure_message())
    results = {}
    for spec in VARIANTS:
        session.outcomes[spec.name] = outcome = session.train(spec)
        results[spec.name] = {"description": spec.description, "exit_code": outcome.stage.returncode,
                              "wall_s": round(outcome.seconds, 2), **{k: outcome.summary.get(k) for k in (
                                  "ms_per_iter_median", "ms_per_iter_intervals", "cuda_graphs", "phases_s", "gpu",
                                  "versions")}}
    graph, eager = (results[v.name]["ms_per_iter_median"] for v in VARIANTS)
    return {"date": time.strftime("%Y-%m-%d"), "runs": results,
            "speedup": round(eager / graph, 2) if graph and eager else None,
            "megatron_lm_pretrain_bert_ms_per_iter": "87-126 (docs/MEASURED.md, core_v0.16.1 on an H200)"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.bench", description=__doc__)
    p.add_argument("--out", type=Path, default=paths.RESULTS_DIR / "bench-h200.json")
    p.add_argument("--run-dir", type=Path, default=paths.REPO / "runs" / "bench")
    args = p.parse_args(argv)
    result = bench(args.run_dir)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: (v if k != "runs" else {n: r["ms_per_iter_median"] for n, r in v.items()})
                      for k, v in result.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
