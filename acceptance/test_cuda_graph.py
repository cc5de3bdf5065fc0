"""The CUDA graph changes speed, not numbers: the graphed reference run and an eager run log the same losses.

Both runs are in the GPU session (harness/run/runs.py: `reference` and `eager`, --cuda-graph off, to iteration 50).
The tolerance lives in fixtures/golden/cuda_graph_parity_h200.toml; the measured differences are written to
RUN/cuda-graph-parity.json.
"""

from __future__ import annotations

import json
import tomllib

import pytest

from harness.evidence import logs
from harness.base.paths import GOLDEN_DIR

pytestmark = pytest.mark.gpu

PARITY_FILE = GOLDEN_DIR / "cuda_graph_parity_h200.toml"


def _values(log) -> dict:
    """(kind, iteration) -> (lm loss, skipped count) of every logged iteration and periodic validation."""
    out = {("train", r.iteration): (r.lm_loss, r.skipped) for r in log.iterations}
    out.update({("validation", v.iteration): (v.lm_loss, 0) for v in log.validations if v.split == "periodic"})
    return out


def test_graph_and_eager_steps_give_the_same_losses(gpu_session, settings):
    if settings.skip_mutants:
        pytest.skip("--skip-mutants: the eager run was not trained")
    tol = tomllib.loads(PARITY_FILE.read_text())["lm-loss"]["tol"]
    graph, eager = gpu_session.outcomes["reference"], gpu_session.outcomes.get("eager")
    if eager is None:
        pytest.skip("the eager run was not part of this session")
    for outcome in (graph, eager):
        assert outcome.stage is not None and outcome.stage.ok, (
            outcome.stage.failure_message() if outcome.stage else f"{outcome.spec.name} never ran")
    assert graph.summary.get("cuda_graphs") is True, f"the reference run did not replay a graph: {graph.summary}"
    assert eager.summary.get("cuda_graphs") is False, f"the eager run used a graph: {eager.summary}"
    g, e = _values(logs.parse_log_file(graph.stage.log_path)), _values(logs.parse_log_file(eager.stage.log_path))
    common = sorted(k for k in e if k in g and e[k][0] is not None and g[k][0] is not None)
    diffs = {f"{kind} {it}": {"graph": g[(kind, it)][0], "eager": e[(kind, it)][0],
                              "abs_diff": abs(g[(kind, it)][0] - e[(kind, it)][0])} for kind, it in common}
    worst = max((d["abs_diff"] for d in diffs.values()), default=None)
    (gpu_session.run_dir / "cuda-graph-parity.json").write_text(
        json.dumps({"tol": tol, "max_abs_diff": worst, "values": diffs}, indent=1))
    skips = {k: (g[k][1], e[k][1]) for k in e if k in g and g[k][1] != e[k][1]}
    assert len(common) >= 4, f"too few values logged by both runs to compare: {common}"
    assert not skips, f"skipped-step counts differ (graph, eager): {skips}"
    assert worst <= tol, (f"graph and eager lm losses differ by up to {worst:.6f} (tol {tol}, {PARITY_FILE.name}): "
                          f"{json.dumps(diffs, indent=1)}")
