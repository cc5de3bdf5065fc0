"""The checkpoint inspector on every release's real small files (fixtures/checkpoints/<release>/, globbed: a release
added there is tested too): each common.pt and .metadata reads through the vetted reader without importing
Megatron-LM, shapes follow the run's model (the FAQ's --hidden-size 64 passes, a wrong width fails), a shard one
byte short fails, and a class no known release pickles is the suite's limitation (not judged), never the student's."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.evidence.checkpoints import inspector as ck
from harness.judge import kinds
from harness.evidence.checkpoints import safe_pickle
from harness.evidence.records import CheckpointReport, RunEvidence
from harness.judge.profiles import FAIL, NOT_MEASURABLE, PASS, Criterion
from harness.evidence.checkpoints.release_classes import classes_in_source, load_table
from harness.base.paths import FIXTURES, REPO
from harness.evidence.checkpoints.model_shapes import COURSE_MODEL, model_for_flags

RELEASES = FIXTURES / "checkpoints"
COMMON = sorted(RELEASES.glob("*/iter_*/common.pt"))
METADATA = sorted(RELEASES.glob("*/iter_*/.metadata"))
SAVE_DIRS = sorted(p for p in RELEASES.iterdir() if (p / ck.TRACKER_FILE).exists())
H64 = model_for_flags({"bert_binary_head": True, "hidden_size": 64, "ffn_hidden_size": 256})


def _id(path: Path) -> str:
    return str(path.relative_to(RELEASES))


def test_the_fixtures_cover_every_release_of_the_matrix():
    """The globs below test something: five releases and the hidden-64 save, each with a .metadata."""
    names = {p.name for p in SAVE_DIRS}
    assert {"core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "core_v0.19.0", "main", "core_v0.16.1-hidden-64"} <= names
    assert len(COMMON) >= 8 and len(METADATA) >= 10


@pytest.mark.parametrize("path", COMMON, ids=_id)
def test_every_real_common_pt_reads_with_its_arguments_rebuilt(path):
    """Namespace args, Megatron's enums (by value, from stand-ins), tensors on the meta device."""
    state = safe_pickle.safe_torch_load(path)
    args = state["args"]
    assert isinstance(state["iteration"], int) and state["iteration"] in (100, 200)
    assert args.hidden_size == (64 if "hidden-64" in str(path) else 128)
    assert type(args.attention_backend).__module__ == "megatron.core.transformer.enums"
    assert args.attention_backend.name == "local"


def test_core_v0_18_2_pickles_inference_cuda_graph_scope_and_it_is_read():
    """The class that made core_v0.18.2 a FAIL with "Add --save DIR" (issue #32): rebuilt by value."""
    state = safe_pickle.safe_torch_load(RELEASES / "core_v0.18.2" / "iter_0000200" / "common.pt")
    scope = state["args"].inference_cuda_graph_scope
    assert type(scope).__qualname__ == "InferenceCudaGraphScope" and scope.name == "none"
    assert type(state["rerun_state_machine"]) is dict


@pytest.mark.parametrize("path", METADATA, ids=_id)
def test_every_real_metadata_reads(path):
    from torch.distributed.checkpoint.metadata import Metadata

    metadata = safe_pickle.load_dcp_metadata(path)
    assert isinstance(metadata, Metadata) and len(metadata.state_dict_metadata) > 100
    assert not safe_pickle.bad_shard_names(metadata)


def test_nothing_from_megatron_is_imported_to_read_them():
    """A fresh interpreter reads every fixture; afterwards no megatron module is loaded (stand-ins only)."""
    code = ("import sys, glob\nfrom harness.evidence.checkpoints import safe_pickle as s\n"
            f"for f in sorted(glob.glob({str(RELEASES)!r} + '/*/iter_*/common.pt')): s.safe_torch_load(f)\n"
            f"for f in sorted(glob.glob({str(RELEASES)!r} + '/*/iter_*/.metadata')): s.load_dcp_metadata(f)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('megatron', 'numpy')))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().replace("'", '"'))
    assert not [m for m in loaded if m.startswith("megatron")], loaded


def test_shapes_follow_the_runs_model():
    """The hidden-64 save fails against the 128-wide model (its tensors named with both widths) and passes against
    its variant's and against what its own saved arguments say; a 128-wide save fails against the variant's."""
    save = RELEASES / "core_v0.16.1-hidden-64"
    assert ck.inspect_save_dir(save, H64, load=False).shapes_ok
    assert ck.inspect_save_dir(save, None, load=False).shapes_ok
    wrong = ck.inspect_save_dir(save, COURSE_MODEL, load=False)
    assert not wrong.shapes_ok
    assert any("(30592, 64)" in p and "expected (30592, 128)" in p for p in wrong.problems), wrong.problems
    assert not ck.inspect_save_dir(RELEASES / "core_v0.16.1", H64, load=False).shapes_ok


def _with_shards(save: Path, tmp_path: Path, short_by: int = 0) -> Path:
    """A copy of a real save whose *.distcp shards are as long as its .metadata says (zeros), the first one
    `short_by` bytes shorter."""
    copy = tmp_path / save.name
    shutil.copytree(save, copy)
    for it in copy.glob("iter_*"):
        if not (it / ".metadata").exists():
            continue
        needed: dict = {}
        for info in safe_pickle.load_dcp_metadata(it).storage_data.values():
            needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
        for i, (name, size) in enumerate(sorted(needed.items())):
            (it / name).write_bytes(b"\0" * (size - (short_by if i == 0 else 0)))
    return copy


def test_a_shard_missing_only_its_last_byte_fails(tmp_path):
    whole = _with_shards(RELEASES / "core_v0.18.2", tmp_path / "whole")
    assert not [p for p in ck.inspect_save_dir(whole, load=False).problems if "distcp" in p]
    short = _with_shards(RELEASES / "core_v0.18.2", tmp_path / "short", short_by=1)
    truncated = [p for p in ck.inspect_save_dir(short, load=False).problems if "is truncated" in p]
    assert len(truncated) == 2 and all("__0_0.distcp" in p for p in truncated), truncated


@pytest.mark.parametrize("save", [s for s in SAVE_DIRS if "killed" not in s.name], ids=lambda p: p.name)
def test_a_whole_real_save_has_no_problem_but_its_missing_weights(save, tmp_path):
    """With shards of the declared sizes, every release's save has no problem at all and its shapes are its run's
    model's (no load: zeros are not weights); checkpoints-saved passes on it."""
    copy = _with_shards(save, tmp_path)
    own = H64 if "hidden-64" in save.name else COURSE_MODEL
    report = ck.inspect_save_dir(copy, own, load=False)
    assert report.problems == () and report.shapes_ok and report.tracker == 200 and not report.unreadable
    ev = RunEvidence(run_dir=str(copy), checkpoints=report)
    crit = Criterion(id="checkpoints-saved", label="", kind="checkpoint_iterations", params={"iterations": [100, 200]},
                     remedy="", rationale="", source="test")
    assert kinds._check_checkpoint_iterations(crit, ev, None).status == PASS


def test_a_class_no_known_release_pickles_is_the_suites_limitation(tmp_path, monkeypatch):
    """Take InferenceCudaGraphScope out of the table (a suite that predates core_v0.18.2): the report says the
    suite cannot read the checkpoint, naming the class; checkpoint-loads and checkpoints-saved are not judged
    (never FAIL with a student remedy)."""
    table = dict(safe_pickle._table())
    table.pop(("megatron.core.transformer.enums", "InferenceCudaGraphScope"))
    monkeypatch.setattr(safe_pickle, "_table", lambda: table)
    save = _with_shards(RELEASES / "core_v0.18.2", tmp_path)
    report = ck.inspect_save_dir(save, load=False)
    assert "InferenceCudaGraphScope" in report.unreadable and "cannot read" in report.unreadable
    assert not [p for p in report.problems if "InferenceCudaGraphScope" in p], report.problems
    ev = RunEvidence(run_dir=str(save), checkpoints=report)
    loads = Criterion(id="checkpoint-loads", label="", kind="checkpoint_loads", params={}, remedy="", rationale="",
                      source="test")
    outcome = kinds._check_checkpoint_loads(loads, ev, None)
    assert outcome.status == NOT_MEASURABLE and "InferenceCudaGraphScope" in outcome.measured
    assert outcome.status != FAIL
    back = CheckpointReport(**{**dataclasses.asdict(report), "iterations": tuple(report.iterations),
                                  "problems": tuple(report.problems)})
    assert back.unreadable == report.unreadable


def test_the_table_is_derived_from_the_sources():
    """megatron_classes.json lists every enum the fixtures pickle, for the releases that define it; the AST reader
    finds enums (auto() too) and dataclasses, and no function."""
    table = load_table()
    assert set(table["derived_from"]) >= {"core_v0.16.1", "core_v0.18.2", "d98e8a64"}
    scope = table["enums"]["megatron.core.transformer.enums.InferenceCudaGraphScope"]
    assert "core_v0.18.2" in scope["releases"] and "core_v0.16.1" not in scope["releases"]
    enums, dcs = classes_in_source("m", "import enum\nfrom dataclasses import dataclass\n"
                                        "class A(enum.Enum):\n    x = enum.auto()\n    y = enum.auto()\n"
                                        "class B(str, enum.Enum):\n    p = 'q'\n"
                                        "@dataclass\nclass C:\n    f: int = 0\n    g: str = ''\n"
                                        "def h():\n    pass\n")
    assert enums == {"m.A": {"kind": "Enum", "members": {"x": 1, "y": 2}},
                     "m.B": {"kind": "StrEnum", "members": {"p": "q"}}}
    assert dcs == {"m.C": ["f", "g"]}


def test_a_hidden_64_submission_is_inspected_against_its_variant(tmp_path):
    """The FAQ's --hidden-size 64 run (its real log and its real save's small files, shards padded to their
    declared sizes): the grader detects recipe a-h64 from the log and the checkpoint's 64-wide tensors pass; the
    128-wide save beside the same log fails on shape."""
    from harness.judge import submission

    log = FIXTURES / "logs" / "runs-h200" / "core_v0.16.1-h64-s1234.log.gz"
    h64 = submission.evidence(log, _with_shards(RELEASES / "core_v0.16.1-hidden-64", tmp_path / "h64"))
    assert h64.checkpoints.shapes_ok and not [p for p in h64.checkpoints.problems if "shape" in p]
    wide = submission.evidence(log, _with_shards(RELEASES / "core_v0.16.1", tmp_path / "wide"))
    assert not wide.checkpoints.shapes_ok
    assert any("(30592, 128)" in p and "expected (30592, 64)" in p for p in wide.checkpoints.problems)
