"""The chapter's learning goal, measured on a GPU: `python -m harness compare-hf` with the course's full configuration
trains the course's BERT with the reference trainer (Megatron) and with Hugging Face Transformers, one after the
other on the same GPU, and its report holds what it promises. Opt-in (`pytest -m compare`, a few minutes on an
H200): `pytest -m gpu` does not select it, and a plain `pytest` deselects it with one summary line (root conftest).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.base.paths import REPO

pytestmark = pytest.mark.compare

COURSE_TOKENS_PER_STEP = 16 * 128


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("compare-hf")
    done = subprocess.run([sys.executable, "-m", "harness", "compare-hf", "--out", str(out), "--device", "cuda",
                           "--hf-sop", "--megatron-eager"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"compare-hf exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    doc = json.loads((out / "compare.json").read_text())
    return {"out": out, "doc": doc}


def test_every_run_finished_and_every_report_is_written(compared):
    doc, out = compared["doc"], compared["out"]
    assert set(doc["runs"]) == {"megatron", "megatron-eager", "hf", "hf-sop"}
    assert all(run["ok"] for run in doc["runs"].values()), {n: r["failure"] for n, r in doc["runs"].items()}
    for name in ("compare.md", "compare.png", "megatron-vs-hf.md"):
        assert (out / name).stat().st_size > 0, name


def test_both_sides_train_on_the_same_tokens_per_step(compared):
    runs = compared["doc"]["runs"]
    assert {n: r["tokens_per_step"] for n, r in runs.items()} == dict.fromkeys(runs, COURSE_TOKENS_PER_STEP)


def test_both_losses_go_down_over_the_course_schedule(compared):
    """From the first logged masked-LM loss (about ln 30522 = 10.3) down by at least 0.5 on both sides, as the
    loss-decreases criterion asks of a Megatron run."""
    from harness.cli.compare_hf_report import final, first_loss

    doc = compared["doc"]
    for name in ("megatron", "hf"):
        _, first = first_loss(doc, name)
        assert first is not None and 9.5 < first < 11.0, (name, first)
        assert final(doc, name, "mlm") < first - 0.5, (name, first, final(doc, name, "mlm"))


def test_fp16_skips_are_counted_on_both_sides(compared):
    runs = compared["doc"]["runs"]
    assert runs["megatron"]["skipped_steps"] >= 1   # the loss-scale search from 2^32 (17-18 steps in real runs)
    assert isinstance(runs["hf"]["skipped_steps"], int)
    assert runs["hf"]["precision"]["grad_scaler"] and runs["hf"]["precision"]["autocast"] == "float16"


def test_memory_and_speed_are_measured(compared):
    for name, run in compared["doc"]["runs"].items():
        assert run["memory"]["torch_max_allocated_mib"] > 0 and run["memory"]["nvml_peak_mib"], (name, run["memory"])
        assert run["ms_per_iter_median"] > 0 and run["tokens_per_s"] > 0, name
    assert compared["doc"]["runs"]["megatron"]["cuda_graphs"] is True


def test_the_schedules_are_megatrons(compared):
    schedule = compared["doc"]["schedule"]
    assert schedule["lambda_lr_max_rel_error"] <= 1e-12
    for name, logged in schedule["logged"].items():
        assert logged["lines"] > 10 and logged["max_rel_error"] <= 1e-6, (name, logged)  # the log prints 7 digits


def test_parameters_differ_by_the_vocab_padding_only(compared):
    runs = compared["doc"]["runs"]
    assert runs["megatron"]["parameters"]["vocab_size"] == 30592 and runs["hf"]["parameters"]["vocab_size"] == 30522
    assert runs["megatron"]["parameters"]["count"] == runs["hf"]["parameters"]["count_at_megatron_vocab"]


def test_checkpoints_are_written_in_each_format(compared):
    runs, out = compared["doc"]["runs"], compared["out"]
    assert runs["megatron"]["checkpoint"]["format"] == "torch_dist" and runs["megatron"]["checkpoint"]["bytes"] > 0
    hf = runs["hf"]["checkpoint"]
    assert hf["iteration"] == 200 and hf["weights_bytes"] > 0
    assert (out / "runs" / "hf" / "checkpoint-200" / "model.safetensors").is_file()


def test_every_difference_is_backed_and_the_page_is_the_json(compared):
    from harness.cli import compare_hf_report as report

    doc, out = compared["doc"], compared["out"]
    for row in doc["differences"]:
        found = [e for e in row["evidence"] if (e["kind"] == "source" and e["line"]) or
                 (e["kind"] == "measured" and e["value"] is not None)]
        assert found, row["aspect"]
        assert not [e for e in row["evidence"] if e["kind"] == "source" and not e["line"]], row
    assert (out / "megatron-vs-hf.md").read_text() == report.page(doc)
