"""A submitted --save folder is hostile input: nothing in it is ever unpickled with code execution (in-process
readers; every command that inspects a submitted checkpoint is in test_untrusted_checkpoints_cli.py)."""

from __future__ import annotations

import pickle

import pytest
import torch

from harness.evidence.checkpoints import inspector as ck
from harness.evidence.checkpoints import safe_pickle
from harness.evidence.checkpoints.pickle_scan import UnsafeContent
from hostile_checkpoints import Payload, tiny_dist_save

# torch.distributed.checkpoint's own note when the tiny checkpoints here are saved without a process group
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def test_payload_alone_runs_when_unpickled_plainly(tmp_path):
    """The payload is real: a plain pickle.load runs it (so the tests below can fail)."""
    marker = tmp_path / "plain.pwned"
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.exists()


def test_safe_unpickler_reads_a_real_dcp_metadata_and_refuses_the_payload(tmp_path):
    """A .metadata torch wrote (fp16 and bf16 tensors) loads; the payload is refused naming posix.system."""
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    tiny_dist_save(tmp_path / "it")
    metadata = safe_pickle.load_dcp_metadata(tmp_path / "it")
    assert isinstance(metadata, Metadata)
    sizes = {k: tuple(m.size) for k, m in metadata.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    assert sizes == {"embedding.word_embeddings.weight": (4, 3), "pooler.dense.bias": (3,)}
    with pytest.raises(UnsafeContent) as refused:
        safe_pickle.loads_dcp_metadata(pickle.dumps(Payload(tmp_path / "m")))
    assert refused.value.name in ("posix.system", "os.system") and not (tmp_path / "m").exists()


@pytest.mark.parametrize("global_name", ["builtins.eval", "torch.load", "torch.distributed.checkpoint.metadata.os",
                                         "torch.distributed.checkpoint.planner.reduce",
                                         "torch.distributed.checkpoint.metadata.Enum", "subprocess.Popen", "torch._C._dynamo"])
def test_safe_unpickler_refuses_other_globals(global_name):
    """Functions, names imported into an allowed module, other modules: all refused with the name."""
    module, _, name = global_name.rpartition(".")
    data = b"\x80\x04c" + module.encode() + b"\n" + name.encode() + b"\n."
    with pytest.raises(UnsafeContent, match="refused: unsafe content"):
        safe_pickle.loads_dcp_metadata(data)


def test_shard_name_outside_the_folder_is_refused(tmp_path):
    """A .metadata whose shard path leaves the iteration folder is refused before any shard is opened."""
    it = tmp_path / "save" / "iter_0000005"
    tiny_dist_save(it)
    (tmp_path / "save" / ck.TRACKER_FILE).write_text("5")
    metadata = safe_pickle.load_dcp_metadata(it)
    for info in metadata.storage_data.values():
        info.relative_path = "../../../../etc/passwd"
    (it / ".metadata").write_bytes(pickle.dumps(metadata))
    report = ck.inspect_save_dir(tmp_path / "save")
    assert any("refused: unsafe content" in p and "etc/passwd" in p for p in report.problems), report.problems
    assert not report.loaded


def test_declared_sizes_are_not_allocated_unless_they_are_the_models(tmp_path):
    """A .metadata declaring a 2^60-byte tensor: reported as a wrong shape, and no load is tried (a load allocates
    what .metadata declares)."""
    it = tmp_path / "save" / "iter_0000005"
    tiny_dist_save(it)
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
    tiny_dist_save(it)
    (tmp_path / "save" / ck.TRACKER_FILE).write_text("5")
    (it / ".metadata").unlink()
    (it / ".metadata").symlink_to(outside)
    report = ck.inspect_save_dir(tmp_path / "save")
    assert len(report.problems) == 1 and "refused: unsafe content: a symlink to" in report.problems[0], report.problems
    assert str(outside) in report.problems[0] and not report.loaded
