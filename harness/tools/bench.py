"""Time the reference trainer alone on this GPU (graph against eager step), or the whole `pytest -m gpu` session.

    python -m harness bench --out results/bench-h200.json
    python -m harness bench suite [--run-dir DIR] [--skip-mutants] [--out results/bench-suite-h200.json]
    python -m harness bench grade [-n 1000] [--jobs N]      (grading speed: harness.tools.bench_grade)

One run at a time (concurrent runs share the GPU and would time each other); ms/iter is the trainer's own
median over the steady log intervals, as Megatron's `elapsed time per iteration (ms)` reports it.
`suite` runs the session `pytest -m gpu` runs, judges it the same way, and writes where the wall time goes (a
timeline of stages with their waits, the reference run's start-up/data/capture/training/saving, the judging) next
to its floor: one interpreter start with the imports, plus the GPU compute of every graphed run (a lower bound).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.base import paths
from harness.tools import bench_preprocess
from harness.report import plot
from harness.run.launch import DATASET_MARKER, ProgressPrinter
from harness.base.proc import LOAD_READY_MARKER, LOAD_WAIT_MARKER
from harness.run.runs import RunSpec, session_runs
from harness.run.session import DEFAULT_STAGE_TIMEOUT_S, Session, python_env
from harness.judge.profiles import FAIL, load_profile

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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["suite"]:
        return suite_main(argv[1:])
    if argv[:1] == ["grade"]:
        from harness.tools import bench_grade

        return bench_grade.main(argv[1:])
    if argv[:1] == ["preprocess"]:
        return bench_preprocess.main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m harness bench", description=__doc__)
    p.add_argument("--out", type=Path, default=paths.RESULTS_DIR / "bench-h200.json")
    p.add_argument("--run-dir", type=Path, default=paths.REPO / "runs" / "bench")
    args = p.parse_args(argv)
    result = bench(args.run_dir)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: (v if k != "runs" else {n: r["ms_per_iter_median"] for n, r in v.items()})
                      for k, v in result.items()}, indent=2))
    return 0


# ---- the whole session: `python -m harness bench suite` ----------------------------------------------------------
FLOOR_PROBE = ("import torch\nfrom harness.base.imports import import_megatron_core\nimport_megatron_core()\n"
               "if torch.cuda.is_available():\n"
               "    torch.zeros(1, device='cuda'); torch.cuda.synchronize()\n"
               "print(torch.cuda.is_available())")
INIT_PHASE = "megatron is initialized"
SETUP_PHASES = ("model is built", "dataloaders are built", "CUDA graphs are captured")


class StageClock(ProgressPrinter):
    """A progress printer that also notes when each stage's first line, dataset-build line, checkpoint-wait lines
    and phase lines arrived."""

    def __init__(self, stream=None):
        super().__init__(stream)
        self.seen: dict[str, dict[str, float]] = {}

    def for_stage(self, stage: str):
        marks = self.seen.setdefault(stage, {})

        def on_line(line: str) -> None:
            now = time.monotonic()
            marks.setdefault("first line", now)
            if DATASET_MARKER in line:
                marks.setdefault("dataset build", now)
            elif line.startswith(LOAD_WAIT_MARKER):
                marks.setdefault("load wait", now)
            elif line.startswith(LOAD_READY_MARKER):
                marks.setdefault("load ready", now)
            elif line.startswith("[after ") and "] datetime:" in line:
                marks.setdefault(line[len("[after "):line.index("]")], now)
            self.line(stage, line)
        return on_line


def measure_floor_imports(probes: int = 2, timeout_s: float = 300.0) -> dict:
    """A fresh interpreter importing torch and megatron.core (plus CUDA init when a GPU is present): the fastest
    of `probes` runs, one after another, once the session is over."""
    times, cuda = [], False
    for _ in range(probes):
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-c", FLOOR_PROBE], capture_output=True, text=True,
                                  timeout=timeout_s, env={**os.environ, **python_env()}, cwd=str(paths.REPO))
        except subprocess.TimeoutExpired:
            raise SystemExit(f"the floor probe `python -c 'import torch, megatron.core'` took over {timeout_s:g} s. "
                             "Fix: check that nothing else loads this machine, then run again") from None
        times.append(time.monotonic() - started)
        if done.returncode != 0:
            raise SystemExit(f"the floor probe `python -c 'import torch, megatron.core'` failed (exit "
                             f"{done.returncode}): {done.stderr.strip()[-500:]}. "
                             "Fix: run from the environment the suite is installed in")
        cuda = done.stdout.strip() == "True"
    return {"interpreter_imports_s": round(min(times), 3), "probes_s": [round(t, 3) for t in times],
            "cuda_init_included": cuda}


def _waits(spec: RunSpec, marks: dict, data_end: dict, t0: float, start: float) -> list[dict]:
    """What a training stage waited for, and how long (seconds)."""
    waits = []
    prep = "preprocess" + ("" if spec.recipe == "a" else f"-{spec.recipe}")
    if spec.nice and prep in data_end:
        waits.append({"on": prep, "how": "starts once its corpus is preprocessed (low-priority run)",
                      "waited_s": round(max(0.0, min(start, data_end[prep]) - t0), 3)})
    elif prep in data_end:
        asked = marks.get("dataset build")
        waited = max(0.0, data_end[prep] - asked) if asked is not None else None
        waits.append({"on": prep, "how": "--wait-for-data inside the trainer, from its dataset build line",
                      "waited_s": None if waited is None else round(waited, 3)})
    if spec.resume_from:
        began, ready = marks.get("load wait"), marks.get("load ready")
        waits.append({"on": f"train-{spec.resume_from}", "how": "--wait-for-load inside the trainer, set up and "
                      "captured: from its wait line until the source's save of the iteration it loads",
                      "waited_s": round(ready - began, 3) if began is not None and ready is not None else None,
                      "ended_s": round(ready - t0, 3) if ready is not None else None})
    return waits


def timeline(session: Session, clock: StageClock, t0: float) -> list[dict]:
    """One entry per stage of the session, start/end in seconds since the session started, with its waits."""
    rel = lambda t: round(t - t0, 3)  # noqa: E731
    entries, data_end, previous = [], {}, None
    for name, st in session.stages.items():
        start = st.started_at
        entries.append({"stage": name, "start_s": rel(start), "end_s": rel(start + st.duration_s),
                        "duration_s": round(st.duration_s, 3), "exit_code": st.returncode,
                        "waits": [] if previous is None else [{"on": previous, "how": "runs after it (same thread)",
                                                                "waited_s": 0.0}]})
        data_end[name] = start + st.duration_s
        previous = name
    for name, o in session.outcomes.items():
        st = o.stage
        if st is None or o.spec.derived_from or st.started_at is None:
            continue
        marks = clock.seen.get(st.name, {})
        first = marks.get("first line")
        entries.append({"stage": st.name, "start_s": rel(st.started_at), "end_s": rel(st.started_at + st.duration_s),
                        "duration_s": round(st.duration_s, 3), "exit_code": st.returncode,
                        "first_line_s": None if first is None else rel(first),
                        "waits": _waits(o.spec, marks, data_end, t0, st.started_at)})
    return sorted(entries, key=lambda e: (e["start_s"], e["stage"]))


def reference_breakdown(outcome, marks: dict, waited_s: float | None) -> dict:
    """Where the reference stage's seconds went; the parts add up to its duration (the trainer's phases, anchored
    where its `[after megatron is initialized]` line arrived)."""
    st, phases = outcome.stage, outcome.summary.get("phases_s") or {}
    out = {"stage": st.name, "duration_s": round(st.duration_s, 3), "phases_s": phases,
           "data_timings_s": outcome.summary.get("data_timings_s"),
           "torch_dynamo_imported": outcome.summary.get("torch_dynamo_imported")}
    if INIT_PHASE not in phases or INIT_PHASE not in marks or "training is done" not in phases:
        out["parts_s"] = None
        out["why_no_parts"] = "the trainer's phases or its `[after megatron is initialized]` line are missing"
        return out
    trainer_start = marks[INIT_PHASE] - phases[INIT_PHASE]  # monotonic time of the Trainer's t_start
    saves = sum(v for k, v in phases.items() if k.startswith("save of iteration"))
    at = {k: phases[k] for k in SETUP_PHASES if k in phases}
    built, loaded = at.get("model is built", phases[INIT_PHASE]), at.get("dataloaders are built")
    setup_end = max([phases[INIT_PHASE], *at.values()])
    startup = max(0.0, trainer_start - st.started_at)
    parts = {
        "interpreter_start_and_imports": startup,
        "megatron_init": phases[INIT_PHASE],
        "model_build": built - phases[INIT_PHASE],
        "data": (loaded - built) if loaded is not None else 0.0,
        "cuda_graph_capture": phases["CUDA graphs are captured"] - loaded if "CUDA graphs are captured" in at else 0.0,
        "training": max(0.0, phases["training is done"] - setup_end - saves),
        "saving": saves,
    }
    parts["final_evaluation_and_exit"] = max(0.0, st.duration_s - startup - phases["training is done"])
    out["parts_s"] = {k: round(v, 3) for k, v in parts.items()}
    out["data_waiting_for_preprocessing_s"] = waited_s
    out["first_line_after_s"] = round(marks["first line"] - st.started_at, 3) if "first line" in marks else None
    return out


def judge_session(session: Session, profile_name: str) -> tuple[dict, dict]:
    """The conftest's `judgements`: every graded run judged, loss curves drawn, report written; timed by part."""
    from harness.report.session_verdicts import draw_loss_curves, judge_runs, write_report

    timings = {}
    t = time.monotonic()
    profile = load_profile(profile_name)
    judged = judge_runs(session, profile)
    timings["judge_s"], t = time.monotonic() - t, time.monotonic()
    pictures = draw_loss_curves(session, profile, judged)
    timings["loss_curves_s"], t = time.monotonic() - t, time.monotonic()
    write_report(session, profile_name, judged, pictures)
    timings["report_s"] = time.monotonic() - t
    verdicts = {}
    for name, j in judged.items():
        failed = set(j.ids(FAIL))
        missed, extra = session.outcomes[name].spec.judge(failed)
        verdicts[name] = {"verdict": j.verdict, "failed": sorted(failed), "as_expected": not (missed or extra)}
    return {k: round(v, 3) for k, v in timings.items()}, verdicts


# The reference recipe alone on the GPU, after the session: the step time the floor counts every graphed iteration at.
SOLO = RunSpec("solo-step", "the reference recipe alone on the GPU, stopped at iteration 60 (the floor's step time)",
               extra_args=("--exit-interval", "60"), save=False, graded=False)


def gpu_compute(session: Session, ref, alone_ms: float | None = None) -> dict:
    """The session's GPU time, estimated: every graphed run's trained iterations at `alone_ms`, the median step of
    the recipe alone on the GPU (SOLO); without it, at the fastest 10-iteration interval any graphed run logged
    (an overestimate when every run shared the GPU throughout). Eager and CPU runs are left out: their steps wait
    on the host."""
    iters, ms = ref.summary.get("iterations"), ref.summary.get("ms_per_iter_median")
    runs = {name: o for name, o in session.outcomes.items() if name != SOLO.name
            and not o.spec.derived_from and o.summary.get("cuda_graphs") and o.summary.get("iterations")}
    intervals = [x for o in runs.values() for x in (o.summary.get("ms_per_iter_intervals") or [])]
    fastest = min(intervals or [ms or 0.0])
    step = alone_ms or fastest
    graphed = {name: o.summary["iterations"] - o.summary.get("start_iteration", 0) for name, o in runs.items()}
    total = sum(graphed.values())
    return {"reference_iterations": iters, "reference_ms_per_iter_median": ms,
            "fastest_interval_ms": round(fastest, 3) if fastest else None,
            "alone_ms_per_iter": round(alone_ms, 3) if alone_ms else None,
            "step_ms_counted": round(step, 3) if step else None,
            "step_from": "the solo-step run (the recipe alone on the GPU)" if alone_ms
                         else "the fastest interval of the session's runs (no solo-step run)",
            "graphed_iterations": graphed, "graphed_iterations_total": total,
            "gpu_compute_s": round(total * step / 1000.0, 3) if step else None}


def suite(run_dir: Path, specs: tuple[RunSpec, ...] | None = None, skip_mutants: bool = False,
          vocab_file: Path = paths.VOCAB_FILE, stage_timeout_s: float = DEFAULT_STAGE_TIMEOUT_S,
          profile: str = "reference", stream=None, floor_probes: int = 2, fork_server: bool = True) -> dict:
    """Run and judge the `pytest -m gpu` session (or `specs`), and say where its wall time went."""
    specs = session_runs(with_mutants=not skip_mutants) if specs is None else specs
    clock = StageClock(stream)
    t0 = time.monotonic()  # before the Session: its fork server starts importing at once
    session = Session(run_dir, vocab_file, stage_timeout_s, on_line=clock, fork_server=fork_server)
    plot.preload_in_background()  # as the GPU session fixture does
    prepared = session.run_all(specs, prepare=True)
    session.wall_s = session_s = time.monotonic() - t0
    if not prepared.ok:
        raise SystemExit("preprocessing failed, nothing was trained\n" + prepared.failure_message())
    session.dump()
    first_stage_start = min(st.started_at for st in session._stage_results() if st.started_at)
    last_stage_end = max(st.started_at + st.duration_s for st in session._stage_results() if st.started_at)
    t_judge = time.monotonic()
    judging, verdicts = judge_session(session, profile)
    judging["total_s"] = round(time.monotonic() - t_judge, 3)
    wall_s = time.monotonic() - t0
    stages = timeline(session, clock, t0)
    ref = session.outcomes.get("reference")
    if ref is None or ref.stage is None:
        raise SystemExit("the session has no `reference` run: the floor needs its ms/iter")
    ref_waits = next(e["waits"] for e in stages if e["stage"] == ref.stage.name)
    waited = next((w["waited_s"] for w in ref_waits if w["on"].startswith("preprocess")), None)
    breakdown = reference_breakdown(ref, clock.seen.get(ref.stage.name, {}), waited)
    floor = measure_floor_imports(floor_probes)
    alone_ms = None
    if ref.summary.get("cuda_graphs"):  # a GPU session: time the graphed step with the GPU to itself
        solo = session.train(SOLO)
        alone_ms = solo.summary.get("ms_per_iter_median") if solo.stage is not None and solo.stage.ok else None
    floor.update(gpu_compute(session, ref, alone_ms))
    floor["floor_s"] = round(floor["interpreter_imports_s"] + (floor["gpu_compute_s"] or 0.0), 3)
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": "python -m harness bench suite"
            + (" --skip-mutants" if skip_mutants else ""), "run_dir": str(run_dir),
            "device": ref.summary.get("device"), "gpu": ref.summary.get("gpu"), "versions": ref.summary.get("versions"),
            "wall_s": round(wall_s, 3), "floor_s": floor["floor_s"],
            "wall_over_floor": round(wall_s / floor["floor_s"], 2) if floor["floor_s"] else None,
            "session_s": round(session_s, 3), "before_first_stage_s": round(first_stage_start - t0, 3),
            "after_last_stage_s": round(t0 + session_s - last_stage_end, 3),
            "judging_s": judging, "floor": floor, "fork_server": session.fork_info, "timeline": stages,
            "reference": breakdown, "verdicts": verdicts,
            "not_measured": "pytest's own start-up and collection (this command runs the session directly)"}


def format_suite(result: dict) -> str:
    """The short human table: the stages, the reference run's parts, judging, wall against floor."""
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    rows = [f"{'stage':<34}{'start':>7}{'end':>7}{'dur':>7}  waits for"]
    for e in result["timeline"]:
        waits = ", ".join(f"{w['on']} ({fmt(w['waited_s'])} s)" for w in e["waits"])
        rows.append(f"{e['stage']:<34}{fmt(e['start_s']):>7}{fmt(e['end_s']):>7}{fmt(e['duration_s']):>7}  {waits}")
    parts = result["reference"].get("parts_s") or {}
    rows.append(f"reference ({fmt(result['reference']['duration_s'])} s): "
                + ", ".join(f"{k.replace('_', ' ')} {fmt(v)}" for k, v in parts.items()))
    rows.append(f"before the first stage: {fmt(result['before_first_stage_s'])} s; after the last stage: "
                f"{fmt(result['after_last_stage_s'])} s; judging: {fmt(result['judging_s']['total_s'])} s")
    f = result["floor"]
    rows.append(f"wall {fmt(result['wall_s'])} s against floor {fmt(result['floor_s'])} s "
                f"(imports {fmt(f['interpreter_imports_s'])} s + GPU compute {fmt(f['gpu_compute_s'])} s): "
                f"{result['wall_over_floor']}x")
    return "\n".join(rows)


def suite_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness bench suite",
                                description="Run and judge the `pytest -m gpu` session; write where its time goes.")
    p.add_argument("--run-dir", type=Path, default=None, help="default: runs/bench-suite-<time>")
    p.add_argument("--skip-mutants", action="store_true", help="the session of `pytest -m gpu --skip-mutants`")
    p.add_argument("--no-fork-server", action="store_true", help="every run a fresh interpreter (the old way)")
    p.add_argument("--out", type=Path, default=paths.RESULTS_DIR / "bench-suite-h200.json")
    args = p.parse_args(argv)
    run_dir = args.run_dir or paths.REPO / "runs" / time.strftime("bench-suite-%Y%m%d-%H%M%S")
    result = suite(run_dir, skip_mutants=args.skip_mutants, fork_server=not args.no_fork_server)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(format_suite(result))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
