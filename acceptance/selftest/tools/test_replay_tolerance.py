"""harness.tools.replay_tolerance: tolerances per precision from replays of honest real runs, by the stated rule
(1.5 x the largest |d| of the derivation runs), checked on held-out seeds, with the nearest forgery's margin."""

from __future__ import annotations

import gzip
import json

from harness.base.paths import FIXTURES
from harness.tools import replay_tolerance as rt

ROUND11 = FIXTURES / "logs" / "runs-h200-round11"


def _replay_dir(tmp_path, names: dict) -> object:
    """A replay folder as `python -m harness replay` writes it: each run's replay log is its own real log with the
    final training loss moved by the given delta."""
    rows = []
    for name, delta in names.items():
        text = gzip.decompress((ROUND11 / f"{name}.log.gz").read_bytes()).decode()
        lines = text.split("\n")
        last = max(i for i, line in enumerate(lines) if " iteration      200/" in line)
        old = lines[last].split("lm loss: ")[1].split(" ")[0]
        lines[last] = lines[last].replace(f"lm loss: {old}", f"lm loss: {float(old) + delta:E}")
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / f"replay-{name}.log").write_text("\n".join(lines))
        rows.append({"submission": name, "status": "reproduced"})
    rows.append({"submission": "forged-seed77", "status": "not-reproduced", "text": "not reproduced at iteration 200"})
    (tmp_path / "replay.json").write_text(json.dumps(rows))
    return tmp_path


def test_the_rule_the_held_out_seed_and_the_forgery(tmp_path):
    folder = _replay_dir(tmp_path, {"core_v0.16.1-bf16-a-s1": 0.004, "core_v0.16.1-bf16-a-s2": -0.006,
                                    "core_v0.16.1-bf16-a-s1234": 0.0095, "core_v0.16.1-fp32-a-s1": 0.002})
    points = rt.deltas(folder, [ROUND11])
    assert {p[1] for p in points} == {"bf16", "fp32"}          # the precision is the log's own arguments block
    report = rt.derive(points, holdout_seed=1234)
    bf16 = report["bf16"]
    assert abs(bf16["largest_final_d"] - 0.006) < 1e-3 and abs(bf16["final_tol"] - 0.009) < 2e-3
    assert bf16["held_out"] == ["core_v0.16.1-bf16-a-s1234"] and len(bf16["false_alarms"]) == 1   # 0.0095 > 0.009
    assert bf16["interval_tol"] == 0.0 and report["fp32"]["derived_from"] == ["core_v0.16.1-fp32-a-s1"]
    assert rt.forgery_margins(folder) == ["forged-seed77: not reproduced at iteration 200"]


def test_copies_forgeries_and_unreplayed_rows_never_feed_the_rule(tmp_path):
    folder = _replay_dir(tmp_path, {"core_v0.16.1-bf16-a-s1": 0.001})
    rows = json.loads((folder / "replay.json").read_text())
    rows += [{"submission": "copy-01", "status": "reproduced"}, {"submission": "x", "status": "not-replayed"}]
    (folder / "replay.json").write_text(json.dumps(rows))
    assert {p[0] for p in rt.deltas(folder, [ROUND11])} == {"core_v0.16.1-bf16-a-s1"}
