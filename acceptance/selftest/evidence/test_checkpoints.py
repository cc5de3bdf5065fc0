"""Self-tests of harness.evidence.checkpoints.inspector on checkpoints really written here by megatron-core on CPU."""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.evidence.checkpoints import inspector as ck
from harness.evidence.checkpoints.model_shapes import (build_bert_model, COURSE_MODEL, course_model, expected_model_shapes, expected_sharded_shapes, ModelShape, single_process_model_parallel)
from harness.evidence.checkpoints.inspector import inspect_save_dir, inspect_with_notes
from harness.train.cpu_shims import cpu_shims
from harness.evidence.checkpoints.texts import (MSG_BAD_TRACKER, MSG_EMPTY_DIR, MSG_NO_ITERATIONS, MSG_NO_SAVE_DIR, MSG_NO_SUCH_ITERATION, MSG_NO_TRACKER, MSG_TRACKER_BEHIND, MSG_TRACKER_DANGLING, MSG_TRACKER_NOT_A_FILE, MSG_TRUNCATED, MSG_UNREADABLE, MSG_UNSAFE_PICKLE, MSG_WRONG_SHAPE)

NARROW_MODEL = ModelShape(num_layers=4, hidden_size=64, num_attention_heads=8, ffn_hidden_size=256,
                          seq_length=128, max_position_embeddings=512, vocab_size=30524)


def matches(template: str, text: str) -> bool:
    """True when text is an instance of a message template (placeholders match anything)."""
    literal = [re.escape(part) for part in re.split(r"\{[^}]*\}", template)]
    return re.search(".*?".join(literal), text) is not None


def problems_like(report, template: str) -> list[str]:
    """The report's problems produced by one template."""
    return [p for p in report.problems if matches(template, p)]


# ---------------------------------------------------------------- fixtures: real saves, once per module

@pytest.fixture(scope="module")
def model_parallel():
    """A single-process gloo world with TP=1/PP=1 for the whole module, torn down afterwards."""
    with single_process_model_parallel():
        yield


@pytest.fixture(scope="module")
def bert(model_parallel):
    """The course's BertModel on CPU, with initialised weights."""
    return build_bert_model(COURSE_MODEL, init_weights=True)


def dist_save(model, iter_dir: Path, iteration: int, with_optimizer: bool = True) -> Path:
    """Save like the suite's trainer: {"model": sharded_state_dict, "optimizer": ..., "iteration": N}."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    state = {"model": model.sharded_state_dict(), "iteration": iteration}
    if with_optimizer:  # one Adam moment keyed the way Megatron's optimizer.sharded_state_dict keys it
        weight = model.pooler.dense.weight
        state["optimizer"] = {"exp_avg": ShardedTensor.from_rank_offsets(
            "optimizer.state.exp_avg.pooler.dense.weight", torch.zeros_like(weight.detach()))}
    iter_dir.mkdir(parents=True)
    with cpu_shims():
        dist_checkpointing.save(state, str(iter_dir))
    return iter_dir


@pytest.fixture(scope="module")
def dist_template(bert, tmp_path_factory) -> Path:
    """A torch_dist --save directory (core_v0.16.1 layout, with common.pt) at iteration 5."""
    root = tmp_path_factory.mktemp("dist_template")
    dist_save(bert, root / "iter_0000005", 5)
    (root / ck.TRACKER_FILE).write_text("5")
    return root


@pytest.fixture
def dist_dir(dist_template, tmp_path) -> Path:
    """A private copy of the torch_dist template that a test may corrupt."""
    return Path(shutil.copytree(dist_template, tmp_path / "save"))


@pytest.fixture(scope="module")
def torch_template(bert, tmp_path_factory) -> Path:
    """A --ckpt-format torch directory at iteration 7, pickled args and numpy RNG state included."""
    from megatron.core.transformer.enums import AttnBackend

    root = tmp_path_factory.mktemp("torch_template")
    rank_dir = root / "iter_0000007" / "mp_rank_00"
    rank_dir.mkdir(parents=True)
    args = argparse.Namespace(hidden_size=128, params_dtype=torch.float16, attention_backend=AttnBackend.local)
    rng = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
           "torch_rng_state": torch.get_rng_state()}
    state = {"args": args, "checkpoint_version": 3.0, "iteration": 7, "rng_state": [rng],
             "model": bert.state_dict_for_save_checkpoint(), "optimizer": {"state": {}, "param_groups": []}}
    torch.save(state, rank_dir / ck.TORCH_FILE)
    (root / ck.TRACKER_FILE).write_text("7")
    return root


# ---------------------------------------------------------------- expected shapes

def test_expected_shapes_match_the_course_model(model_parallel):
    """The table derived from megatron-core has the padded vocab and the tied model's 4,839,042 weights."""
    plain = expected_model_shapes(COURSE_MODEL)
    sharded = expected_sharded_shapes(COURSE_MODEL)
    assert COURSE_MODEL.padded_vocab_size == 30592
    assert plain["embedding.word_embeddings.weight"] == (30592, 128)
    assert "output_layer.weight" not in plain  # tied to the word embeddings
    assert sharded["encoder.layers.self_attention.linear_qkv.weight"] == (4, 384, 128)
    assert sum(np.prod(s) for s in plain.values()) == sum(np.prod(s) for s in sharded.values()) == 4_839_042


# ---------------------------------------------------------------- valid checkpoints

def test_torch_dist_checkpoint_loads(dist_dir):
    """A megatron-core torch_dist save validates, loads, and counts the model's weights."""
    report, notes = inspect_with_notes(dist_dir)
    assert report.problems == ()
    assert (report.format, report.loaded, report.shapes_ok) == ("torch_dist", True, True)
    assert (report.iterations, report.tracker, report.num_parameters) == ((5,), 5, 4_839_042)
    assert any("optimizer state present (1 entries)" in n for n in notes)


def test_torch_dist_without_common_pt_like_megatron_main(dist_dir):
    """Megatron-LM main writes no common.pt: still valid, noted."""
    (dist_dir / "iter_0000005" / "common.pt").unlink()
    report, notes = inspect_with_notes(dist_dir)
    assert report.problems == () and report.loaded and report.shapes_ok
    assert any("no common.pt" in n for n in notes)


def test_torch_dist_shapes_without_loading(dist_dir):
    """load=False judges names and shapes from .metadata alone."""
    report = inspect_save_dir(dist_dir, load=False)
    assert report.problems == () and report.shapes_ok and not report.loaded
    assert report.num_parameters == 4_839_042


def test_torch_format_checkpoint_loads(torch_template):
    """mp_rank_00/model_optim_rng.pt with pickled Namespace/enum/numpy RNG loads under weights_only=True."""
    report = inspect_save_dir(torch_template)
    assert report.problems == ()
    assert (report.format, report.loaded, report.shapes_ok, report.tracker) == ("torch", True, True, 7)
    assert report.num_parameters == 4_839_042


def test_tracker_picks_iteration_and_explicit_choice(dist_template, tmp_path):
    """Two saves: the tracker's is loaded by default, another on request."""
    root = tmp_path / "save"
    for name in ("iter_0000100", "iter_0000200"):
        shutil.copytree(dist_template / "iter_0000005", root / name)
    (root / ck.TRACKER_FILE).write_text("200\n")
    assert inspect_save_dir(root, load=False).iterations == (100, 200)
    _, notes = inspect_with_notes(root, iteration=100, load=False)
    assert any("iter_0000100" in n for n in notes)
    missing = inspect_save_dir(root, iteration=300, load=False)
    assert problems_like(missing, MSG_NO_SUCH_ITERATION)


def test_cli_prints_json_and_exit_code(dist_dir, capsys):
    """The CLI prints the report as JSON; 0 when clean, 1 with problems."""
    assert ck.main([str(dist_dir), "--no-load"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "torch_dist"
    (dist_dir / ck.TRACKER_FILE).unlink()
    assert ck.main([str(dist_dir), "--no-load"]) == 1
    assert json.loads(capsys.readouterr().out)["problems"]


def test_json_out_gives_back_the_same_report(dist_dir, tmp_path, capsys):
    """What a session's inspection stage writes (--json-out) reads back as the report inspecting here gives, for a
    clean checkpoint and for a broken one; --no-binary-head checks recipe (b)'s model."""
    out = tmp_path / "report.json"
    for broken in (False, True):
        if broken:
            (dist_dir / ck.TRACKER_FILE).unlink()
        code = ck.main([str(dist_dir), "--json-out", str(out)])
        capsys.readouterr()
        assert code == int(broken)
        assert ck.report_from_json(out) == inspect_save_dir(dist_dir)
    ck.main([str(dist_dir), "--json-out", str(out), "--no-binary-head"])
    capsys.readouterr()
    assert ck.report_from_json(out) == inspect_save_dir(dist_dir, course_model(binary_head=False))
    assert not ck.report_from_json(out).shapes_ok  # the fixture's model has the binary head


# ---------------------------------------------------------------- corruption: one problem each, never a crash

def test_truncated_distcp(dist_dir):
    """A half-written shard names the file and fails the load."""
    shard = max((dist_dir / "iter_0000005").glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    report = inspect_save_dir(dist_dir)
    found = problems_like(report, MSG_TRUNCATED)
    assert found and shard.name in found[0] and "re-run training" in found[0]
    assert not report.loaded


def test_garbage_metadata(dist_dir):
    """An unparsable .metadata is reported by path; nothing loads."""
    (dist_dir / "iter_0000005" / ".metadata").write_bytes(b"not a pickle at all")
    report = inspect_save_dir(dist_dir)
    assert any(".metadata" in p for p in problems_like(report, MSG_UNREADABLE))
    assert not report.loaded and not report.shapes_ok


def test_empty_common_pt(dist_dir):
    """An empty common.pt is corrupt, even though common.pt itself is optional."""
    (dist_dir / "iter_0000005" / "common.pt").write_bytes(b"")
    report = inspect_save_dir(dist_dir)
    assert any("common.pt" in p for p in problems_like(report, MSG_UNREADABLE))


def test_missing_tracker(dist_dir):
    """No latest_checkpointed_iteration.txt: the save did not finish; the newest dir is still inspected."""
    (dist_dir / ck.TRACKER_FILE).unlink()
    report = inspect_save_dir(dist_dir, load=False)
    assert problems_like(report, MSG_NO_TRACKER) and report.tracker is None
    assert report.shapes_ok


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_tracker_that_is_not_a_file_is_named_so_and_never_read(dist_dir, kind):
    """A pipe in the tracker's place is not opened (reading it would block for ever); it is not called missing."""
    import os

    tracker = dist_dir / ck.TRACKER_FILE
    tracker.unlink()
    os.mkfifo(tracker) if kind == "fifo" else tracker.mkdir()
    report = inspect_save_dir(dist_dir, load=False)
    assert problems_like(report, MSG_TRACKER_NOT_A_FILE) and not problems_like(report, MSG_NO_TRACKER)
    assert report.tracker is None and report.shapes_ok


def test_tracker_points_to_missing_dir(dist_dir):
    """A tracker naming an iteration with no directory names the missing directory."""
    (dist_dir / ck.TRACKER_FILE).write_text("200")
    found = problems_like(inspect_save_dir(dist_dir, load=False), MSG_TRACKER_DANGLING)
    assert found and "iter_0000200" in found[0]


def test_tracker_garbage(dist_dir):
    """A tracker that is neither a number nor 'release' is reported with its content."""
    (dist_dir / ck.TRACKER_FILE).write_text("two hundred")
    found = problems_like(inspect_save_dir(dist_dir, load=False), MSG_BAD_TRACKER)
    assert found and "two hundred" in found[0]


def test_tracker_behind_newest_dir(dist_dir):
    """A newer iteration than the tracker's means an unfinished save."""
    shutil.copytree(dist_dir / "iter_0000005", dist_dir / "iter_0000010")
    found = problems_like(inspect_save_dir(dist_dir, load=False), MSG_TRACKER_BEHIND)
    assert found and "iter_0000010" in found[0]


def test_empty_iteration_dir(dist_dir):
    """An iteration directory without files is an interrupted save."""
    (dist_dir / "iter_0000010").mkdir()
    (dist_dir / ck.TRACKER_FILE).write_text("10")
    report = inspect_save_dir(dist_dir)
    found = problems_like(report, MSG_EMPTY_DIR)
    assert found and "iter_0000010" in found[0] and not report.loaded


def test_no_save_dir_and_no_iterations(tmp_path):
    """A missing directory and an empty one are problems, not exceptions."""
    assert problems_like(inspect_save_dir(tmp_path / "nope"), MSG_NO_SAVE_DIR)
    assert problems_like(inspect_save_dir(tmp_path), MSG_NO_ITERATIONS)


def test_empty_torch_file(torch_template, tmp_path):
    """An empty model_optim_rng.pt names the file; nothing loads."""
    root = Path(shutil.copytree(torch_template, tmp_path / "save"))
    (root / "iter_0000007" / "mp_rank_00" / ck.TORCH_FILE).write_bytes(b"")
    report = inspect_save_dir(root)
    assert any(ck.TORCH_FILE in p for p in problems_like(report, MSG_UNREADABLE)) and not report.loaded


class Payload:
    """A class no allowlist admits: loading it would run arbitrary code."""


def test_unsafe_pickle_refused(tmp_path):
    """A torch-format file needing an arbitrary class is refused, not unpickled."""
    target = tmp_path / "save" / "iter_0000001" / "mp_rank_00" / ck.TORCH_FILE
    target.parent.mkdir(parents=True)
    torch.save({"model": {}, "payload": Payload()}, target)
    (tmp_path / "save" / ck.TRACKER_FILE).write_text("1")
    found = problems_like(inspect_save_dir(tmp_path / "save"), MSG_UNSAFE_PICKLE)
    assert found and "Payload" in found[0]


def test_wrong_hidden_size_names_a_tensor(model_parallel, tmp_path):
    """A hidden-size-64 model's checkpoint fails shapes_ok, naming tensors and both shapes."""
    narrow = build_bert_model(NARROW_MODEL)
    dist_save(narrow, tmp_path / "save" / "iter_0000005", 5, with_optimizer=False)
    (tmp_path / "save" / ck.TRACKER_FILE).write_text("5")
    report = inspect_save_dir(tmp_path / "save", load=False)
    assert not report.shapes_ok
    wrong = problems_like(report, MSG_WRONG_SHAPE)
    assert any("embedding.word_embeddings.weight" in p and "(30592, 64)" in p and "(30592, 128)" in p
               for p in wrong)


def test_cpu_shims_are_reversible():
    """cpu_shims patches torch.cuda only inside the block and only without CUDA."""
    original = torch.cuda.synchronize
    with cpu_shims() as active:
        assert active == (not torch.cuda.is_available())
        torch.cuda.synchronize()
    assert torch.cuda.synchronize is original
