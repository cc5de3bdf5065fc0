"""The drift matrix (harness.cli.matrix) on CPU, from recorded checkout-mode reports: the table builder, the first
iteration where a release's curve leaves the previous release's, the comparison with an earlier matrix, and the
command rebuilding a matrix from a run folder (--from-runs) with its exit codes.

Recorded inputs: results/checkout/report-<ref>-h200.json and train-<ref>-h200.log.gz (real H200 runs).
"""

from __future__ import annotations

import copy
import gzip
import json
import shutil
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli import matrix
from harness.__main__ import build_parser
from harness.base.paths import REPO

RECORDED = REPO / "results" / "checkout"
REFS = {"core_v0.16.1": "core_v0.16.1", "main": "main"}


def recorded(ref: str) -> tuple[dict, dict]:
    report = json.loads((RECORDED / f"report-{ref}-h200.json").read_text())
    return report, matrix.curve_from_log(RECORDED / f"train-{ref}-h200.log.gz")


def rows(drift_from: int | None = None) -> list[dict]:
    """0.16.1 and main as recorded, and a 0.17.1 made of 0.16.1 whose curve moves from `drift_from` on."""
    out = []
    for release, ref in REFS.items():
        report, curve = recorded(ref)
        out.append(matrix.row_from_report(release, report, curve, 160.0))
    report, curve = recorded("core_v0.16.1")
    if drift_from is not None:
        curve = {i: (v - 0.00022 if i >= drift_from else v) for i, v in curve.items()}
    report = copy.deepcopy(report)
    report["checkout"]["version"] = "0.17.1"
    out.append(matrix.row_from_report("core_v0.17.1", report, curve, 157.0))
    return out


def test_recorded_releases_make_one_table_in_release_order():
    built = matrix.build(rows(drift_from=None))
    assert [r["release"] for r in built["rows"]] == ["core_v0.16.1", "core_v0.17.1", "main"]
    first = built["rows"][0]
    assert first["stages"] == {"preprocess": "pass", "train": "pass", "checkpoint-save": "pass",
                               "checkpoint-read": "pass", "resume": "not-run"}   # checkout mode trains no resume run
    assert first["final_loss"] == 8.159132 and first["final_iteration"] == 200
    assert "legacy-tokenizer" in first["adaptations"] and "hf-local-tokenizer" in built["rows"][2]["adaptations"]
    assert [r["differs_at"] for r in built["rows"]] == [None, None, None]       # the recorded curves are identical
    text = matrix.markdown(built)
    assert text.splitlines()[0].startswith("| release | Megatron-LM | preprocess | train | checkpoint-save |")
    assert "| core_v0.16.1 | 0.16.1 @ 55ac7082517c | pass | pass | pass | pass | not-run |" in text
    assert "Details" not in text
    assert "8.159132 at 200" in text and "identical to core_v0.17.1" in text


def test_a_drifting_release_is_named_at_its_first_differing_iteration():
    built = matrix.build(rows(drift_from=120))
    by = {r["release"]: r for r in built["rows"]}
    assert by["core_v0.17.1"]["differs_at"] == 120 and by["core_v0.17.1"]["differs_from"] == "core_v0.16.1"
    assert by["main"]["differs_at"] == 120 and by["main"]["differs_from"] == "core_v0.17.1"
    assert abs(by["core_v0.17.1"]["final_loss"] - 8.158912) < 1e-9
    assert "iteration 120 (vs core_v0.16.1)" in matrix.markdown(built)


def test_compare_names_every_change_and_nothing_else():
    before = matrix.build(rows(drift_from=None))
    assert matrix.compare(before, copy.deepcopy(before)) == []
    after = copy.deepcopy(before)
    by = {r["release"]: r for r in after["rows"]}
    by["core_v0.17.1"]["final_loss"] = 8.158912
    by["main"]["stages"]["checkpoint-read"] = "fail"
    by["main"]["adaptations"].append("hf-offline")
    after["rows"].append({**copy.deepcopy(by["main"]), "release": "core_v0.20.0"})
    after["rows"] = [r for r in after["rows"] if r["release"] != "core_v0.16.1"]
    changes = matrix.compare(before, after)
    assert sorted(changes) == sorted([
        "core_v0.20.0: new in this matrix", "core_v0.16.1: missing from this matrix",
        "core_v0.17.1: final lm loss 8.159132 -> 8.158912", "main: checkpoint-read pass -> fail",
        "main: adaptations +hf-offline"])


CURVES = st.dictionaries(st.integers(1, 40).map(lambda i: i * 10), st.floats(5, 11, allow_nan=False), min_size=1)


@settings(max_examples=200, deadline=None)
@given(a=CURVES, b=CURVES)
def test_first_difference_is_the_first_common_iteration_that_differs(a, b):
    sa, sb = ({str(k): v for k, v in c.items()} for c in (a, b))
    found = matrix.first_difference(sa, sb)
    differing = sorted(i for i in set(a) & set(b) if a[i] != b[i])
    assert found == (differing[0] if differing else None)
    assert matrix.first_difference(sa, sa) is None


def test_default_releases_from_0_16_1_to_main_plus_named():
    names = ["core_v0.14.0", "core_v0.15.3", "core_v0.16.1", "core_v0.19.0", "core_v0.17.1", "main", "core_v0.18.2"]
    assert matrix.default_releases(names, ["d98e8a64"]) == ["core_v0.16.1", "core_v0.17.1", "core_v0.18.2",
                                                           "core_v0.19.0", "main", "d98e8a64"]


def _runs(out: Path, releases: dict) -> None:
    for release, ref in releases.items():
        run = out / "runs" / release / "megatron-lm"
        run.mkdir(parents=True)
        shutil.copyfile(RECORDED / f"report-{ref}-h200.json", run / "report.json")
        with gzip.open(RECORDED / f"train-{ref}-h200.log.gz", "rb") as src, (run / "train-checkout.log").open("wb") as dst:
            shutil.copyfileobj(src, dst)
        (out / "runs" / release / "wall_s.txt").write_text("150.5\n")


def _matrix(*argv: str) -> int:
    args = build_parser().parse_args(["matrix", *argv])
    return matrix.main(args)


def test_the_command_rebuilds_the_matrix_and_compares_it(tmp_path, capsys):
    _runs(tmp_path / "m", REFS)
    assert _matrix("--from-runs", str(tmp_path / "m"), "--out", str(tmp_path / "m")) == 0
    built = json.loads((tmp_path / "m" / "matrix.json").read_text())
    assert [r["release"] for r in built["rows"]] == ["core_v0.16.1", "main"] and built["rows"][0]["wall_s"] == 150.5
    assert "| main | 0.20.0 @ d98e8a64ddf3 |" in (tmp_path / "m" / "matrix.md").read_text()

    previous = copy.deepcopy(built)
    previous["rows"][1]["final_loss"] = 8.158912
    (tmp_path / "previous.json").write_text(json.dumps(previous))
    capsys.readouterr()
    assert _matrix("--from-runs", str(tmp_path / "m"), "--out", str(tmp_path / "m"), "--compare",
                   str(tmp_path / "previous.json")) == 1
    assert "- main: final lm loss 8.158912 -> 8.159132" in capsys.readouterr().out
    assert _matrix("--from-runs", str(tmp_path / "m"), "--out", str(tmp_path / "m"), "--compare",
                   str(tmp_path / "m" / "matrix.json")) == 0


def test_a_release_without_a_report_is_not_judged_exit_3(tmp_path):
    _runs(tmp_path / "m", {"core_v0.16.1": "core_v0.16.1"})
    (tmp_path / "m" / "runs" / "core_v0.18.2").mkdir()
    assert _matrix("--from-runs", str(tmp_path / "m"), "--out", str(tmp_path / "m")) == 3
    text = (tmp_path / "m" / "matrix.md").read_text()
    (tmp_path / "m" / "runs" / "core_v0.18.2" / "pytest.log").write_text(
        "SKIPPED [16] acceptance/test_checkout.py:219: needs 1 CUDA GPU(s), found 0\n23 skipped in 10.10s\n")
    assert _matrix("--from-runs", str(tmp_path / "m"), "--out", str(tmp_path / "m")) == 3
    text = (tmp_path / "m" / "matrix.md").read_text()
    assert "| core_v0.18.2 | ? | not-run |" in text and "report.json: not judged" in text
    assert "needs 1 CUDA GPU(s), found 0; 23 skipped in 10.10s" in text


def test_a_missing_release_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "co" / "core_v0.16.1" / "megatron" / "core").mkdir(parents=True)
    assert _matrix("--checkouts", str(tmp_path / "co"), "--only", "core_v0.17.1", "--out", str(tmp_path / "o")) == 4
    assert "no release core_v0.17.1" in capsys.readouterr().err


def test_keep_artifacts_takes_the_small_checkpoint_files_not_the_weights(tmp_path):
    save = tmp_path / "ck"
    (save / "iter_0000200").mkdir(parents=True)
    (save / matrix.TRACKER).write_text("200\n")
    for name in (*matrix.SMALL_CHECKPOINT_FILES, "__0_0.distcp"):
        (save / "iter_0000200" / name).write_bytes(b"x")
    run = tmp_path / "run"
    (run / "megatron-lm").mkdir(parents=True)
    (run / matrix.TRAIN_LOG).write_text("iteration 200\n")
    report = {"matrix": [{"stage": "train", "adaptations": [f"--save {save}"]}]}
    matrix.keep_artifacts("r", run, tmp_path / "a", report)
    kept = sorted(str(p.relative_to(tmp_path / "a")) for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert kept == ["iter_0000200/.metadata", "iter_0000200/common.pt", "iter_0000200/metadata.json",
                    "latest_checkpointed_iteration.txt", "train.log.gz"]
