"""A submitted --save folder is hostile input: nothing in it is ever unpickled with code execution.

Each case plants a pickle payload (its __reduce__ runs `touch MARKER`) in one file a checkpoint holds: .metadata,
common.pt, a *.distcp shard, mp_rank_00/model_optim_rng.pt, the tracker. Every path that inspects a submitted
checkpoint runs on it (`python -m harness grade`, `python -m harness.judge.checkpoints`, `pytest -m gpu --from-log L
--checkpoint-dir C`), and the marker must never appear; the grade names the refused class.
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.judge import checkpoints as ck
from harness.judge import safe_pickle
from harness.paths import RECORDED_LOGS, REPO

# torch.distributed.checkpoint's own note when the tiny checkpoints here are saved without a process group
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
GOOD_LOG = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
PLANTED = (".metadata", "common.pt", "distcp", "model_optim_rng.pt", "tracker")
# the files that are unpickled at all: a payload there must be refused by name, not just fail to parse
REFUSED_BY_NAME = {".metadata", "common.pt", "model_optim_rng.pt"}


class Payload:
    """Unpickling it runs a shell command that creates `marker` (what an attacker's os.system call would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def _tiny_dist_save(iter_dir: Path) -> None:
    """A torch_dist iteration folder (metadata.json, .metadata, a .distcp, common.pt) of a two-tensor state."""
    import torch.distributed.checkpoint as dcp

    iter_dir.mkdir(parents=True)
    dcp.save({"embedding.word_embeddings.weight": torch.zeros(4, 3, dtype=torch.float16),
              "pooler.dense.bias": torch.ones(3, dtype=torch.bfloat16)},
             storage_writer=dcp.FileSystemWriter(str(iter_dir)), no_dist=True)
    (iter_dir / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    torch.save({"iteration": 5}, iter_dir / "common.pt")


def plant(save: Path, where: str, marker: Path) -> Path:
    """A --save folder at iteration 5 with the payload in `where`; returns the folder."""
    it = save / "iter_0000005"
    (save / ck.TRACKER_FILE).parent.mkdir(parents=True, exist_ok=True)
    (save / ck.TRACKER_FILE).write_text("5")
    payload = pickle.dumps(Payload(marker))
    if where == "model_optim_rng.pt":
        (it / "mp_rank_00").mkdir(parents=True)
        torch.save({"model": {"w": torch.zeros(2)}, "args": Payload(marker)}, it / "mp_rank_00" / ck.TORCH_FILE)
        return save
    _tiny_dist_save(it)
    if where == ".metadata":
        (it / ".metadata").write_bytes(payload)
    elif where == "common.pt":
        torch.save({"iteration": 5, "extra": Payload(marker)}, it / "common.pt")
    elif where == "distcp":
        for shard in it.glob("*.distcp"):
            size = shard.stat().st_size
            shard.write_bytes(payload.ljust(size, b"\0"))
    elif where == "tracker":
        (save / ck.TRACKER_FILE).write_bytes(payload)
    return save


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict:
    """One submission per planted file (the recorded good log beside its --save folder) and one marker each."""
    root = tmp_path_factory.mktemp("hostile")
    markers = tmp_path_factory.mktemp("markers")
    subs = root / "submissions"
    cases = {}
    for where in PLANTED:
        name = where.lstrip(".").replace(".", "-")
        folder = subs / name
        folder.mkdir(parents=True)
        shutil.copy(GOOD_LOG, folder / "train.log")
        marker = markers / f"{name}.pwned"
        cases[where] = (folder, plant(folder / "checkpoints", where, marker), marker)
    return {"dir": subs, "cases": cases, "markers": markers}


def _run(argv: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """A subprocess importing this checkout's harness (not an installed copy), wherever it starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _no_marker(planted: dict, how: str) -> None:
    made = sorted(p.name for p in planted["markers"].iterdir())
    assert not made, (f"{how} executed a planted pickle payload ({made} created): a submitted file was unpickled "
                      "without an allowlist; read it through harness.judge.safe_pickle or torch.load(weights_only=True)")


def test_payload_alone_runs_when_unpickled_plainly(tmp_path):
    """The payload is real: a plain pickle.load runs it (so the tests below can fail)."""
    marker = tmp_path / "plain.pwned"
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.exists()


def test_safe_unpickler_reads_a_real_dcp_metadata_and_refuses_the_payload(tmp_path):
    """A .metadata torch wrote (fp16 and bf16 tensors) loads; the payload is refused naming posix.system."""
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    _tiny_dist_save(tmp_path / "it")
    metadata = safe_pickle.load_dcp_metadata(tmp_path / "it")
    assert isinstance(metadata, Metadata)
    sizes = {k: tuple(m.size) for k, m in metadata.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    assert sizes == {"embedding.word_embeddings.weight": (4, 3), "pooler.dense.bias": (3,)}
    with pytest.raises(safe_pickle.UnsafeContent) as refused:
        safe_pickle.loads_dcp_metadata(pickle.dumps(Payload(tmp_path / "m")))
    assert refused.value.name in ("posix.system", "os.system") and not (tmp_path / "m").exists()


@pytest.mark.parametrize("global_name", ["builtins.eval", "torch.load", "torch.distributed.checkpoint.metadata.os",
                                         "torch.distributed.checkpoint.planner.reduce",
                                         "torch.distributed.checkpoint.metadata.Enum", "subprocess.Popen", "torch._C._dynamo"])
def test_safe_unpickler_refuses_other_globals(global_name):
    """Functions, names imported into an allowed module, other modules: all refused with the name."""
    module, _, name = global_name.rpartition(".")
    data = b"\x80\x04c" + module.encode() + b"\n" + name.encode() + b"\n."
    with pytest.raises(safe_pickle.UnsafeContent, match="refused: unsafe content"):
        safe_pickle.loads_dcp_metadata(data)


def test_shard_name_outside_the_folder_is_refused(tmp_path):
    """A .metadata whose shard path leaves the iteration folder is refused before any shard is opened."""
    it = tmp_path / "save" / "iter_0000005"
    _tiny_dist_save(it)
    (tmp_path / "save" / ck.TRACKER_FILE).write_text("5")
    metadata = safe_pickle.load_dcp_metadata(it)
    for info in metadata.storage_data.values():
        info.relative_path = "../../../../etc/passwd"
    (it / ".metadata").write_bytes(pickle.dumps(metadata))
    report = ck.inspect_save_dir(tmp_path / "save")
    assert any("refused: unsafe content" in p and "etc/passwd" in p for p in report.problems), report.problems
    assert not report.loaded


@pytest.mark.slow
def test_grade_never_runs_a_payload(planted, tmp_path):
    """`python -m harness grade`: every planted submission graded, unsafe ones refused by class, no marker."""
    out = tmp_path / "grades"
    done = _run([sys.executable, "-m", "harness", "grade", str(planted["dir"]), "--out", str(out), "--no-progress",
                 "--jobs", "2"], cwd=tmp_path)
    _no_marker(planted, "python -m harness grade")
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-3000:])
    grades = {g["submission"]: g for g in json.loads((out / "grades.json").read_text())}
    for where, (folder, _, _) in planted["cases"].items():
        g = grades[folder.name]
        assert g["verdict"] == "fail", g
        checkpoint = next(c for c in g["criteria"] if c["id"] == "checkpoint-loads")
        if where in REFUSED_BY_NAME:
            assert "refused: unsafe content" in checkpoint["message"] and "system" in checkpoint["message"], checkpoint


@pytest.mark.slow
def test_checkpoint_inspector_cli_never_runs_a_payload(planted, tmp_path):
    """`python -m harness.judge.checkpoints C --no-load` on the .metadata payload, then every planted folder with
    and without --no-load through the same main() in one process."""
    save = planted["cases"][".metadata"][1]
    done = _run([sys.executable, "-m", "harness.judge.checkpoints", str(save), "--no-load"], cwd=tmp_path)
    _no_marker(planted, "python -m harness.judge.checkpoints --no-load")
    assert done.returncode == 1 and "refused: unsafe content" in done.stdout, (done.stdout[-2000:], done.stderr[-2000:])
    saves = [str(c[1]) for c in planted["cases"].values()]
    code = ("import sys, contextlib, io\nfrom harness.judge.checkpoints import main\n"
            "for d in sys.argv[1:]:\n    for extra in ([], ['--no-load']):\n"
            "        with contextlib.redirect_stdout(io.StringIO()):\n            main([d, *extra])\n")
    done = _run([sys.executable, "-c", code, *saves], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    _no_marker(planted, "harness.judge.checkpoints.main (with and without --no-load)")


@pytest.mark.slow
@pytest.mark.parametrize("where", PLANTED)
def test_pytest_from_log_never_runs_a_payload(where, planted, tmp_path):
    """`pytest -m gpu --from-log L --checkpoint-dir C`: the checkpoint criterion fails, the payload never runs."""
    folder, save, _ = planted["cases"][where]
    done = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-q", "-k", "checkpoint",
                 "--from-log", str(folder / "train.log"), "--checkpoint-dir", str(save)], cwd=REPO)
    _no_marker(planted, f"pytest --from-log --checkpoint-dir (payload in {where})")
    assert done.returncode == 1, (done.stdout[-3000:], done.stderr[-2000:])
    if where in REFUSED_BY_NAME:
        assert "refused: unsafe content" in done.stdout, done.stdout[-3000:]


def test_declared_sizes_are_not_allocated_unless_they_are_the_models(tmp_path):
    """A .metadata declaring a 2^60-byte tensor: reported as a wrong shape, and no load is tried (a load allocates
    what .metadata declares)."""
    it = tmp_path / "save" / "iter_0000005"
    _tiny_dist_save(it)
    (tmp_path / "save" / ck.TRACKER_FILE).write_text("5")
    metadata = safe_pickle.load_dcp_metadata(it)
    metadata.state_dict_metadata["embedding.word_embeddings.weight"].size = torch.Size([2 ** 40, 2 ** 19])
    (it / ".metadata").write_bytes(pickle.dumps(metadata))
    report = ck.inspect_save_dir(tmp_path / "save")
    assert any("(1099511627776, 524288)" in p for p in report.problems), report.problems
    assert not report.loaded and not [p for p in report.problems if "loading the model tensors failed" in p]


def test_a_symlink_leaving_the_save_folder_is_refused(tmp_path):
    """--checkpoint-dir / the inspector CLI: a .metadata linked to a file outside the folder is never opened."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\x80\x04secret")
    it = tmp_path / "save" / "iter_0000005"
    _tiny_dist_save(it)
    (tmp_path / "save" / ck.TRACKER_FILE).write_text("5")
    (it / ".metadata").unlink()
    (it / ".metadata").symlink_to(outside)
    report = ck.inspect_save_dir(tmp_path / "save")
    assert len(report.problems) == 1 and "refused: unsafe content: a symlink to" in report.problems[0], report.problems
    assert str(outside) in report.problems[0] and not report.loaded
