"""Boundary test of the checkpoint inspector's truncated-shard check (harness.evidence.checkpoints.inspector), against behaviour.

A torch_dist shard must be at least as long as the end (offset + length) of the last item .metadata places in it.
Checked at the value (the file exactly that long: fine), one byte under (truncated: the problem names the file, its
size and the size needed), one byte over (fine), and cut inside an earlier item. The items are laid out so that the
end of the last one is NOT the longest item's length: a check that ignores offsets would pass a shard missing only
its last bytes. The checkpoints are written here by torch.distributed.checkpoint (the format Megatron's torch_dist
backend writes, core_v0.16.1), one process, no model: fast.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from harness.evidence.checkpoints import inspector as ck
from harness.evidence.checkpoints.safe_pickle import load_dcp_metadata

# (name, numel) in save order: a long item first, shorter ones after it, so max(length) < end of the last item
LAYOUTS = {
    "long-then-short": [("w", 2000), ("v", 300)],
    "three-mixed": [("a", 900), ("b", 50), ("c", 700)],
    "many-small": [(f"t{i}", 40 + 7 * i) for i in range(6)],
}


def truncation_problems(report) -> list[str]:
    """The report's truncated-shard problems (by the module's template; by its words if the template moved)."""
    template = getattr(ck, "MSG_TRUNCATED", None)
    if template:
        literal = [re.escape(part) for part in re.split(r"\{[^}]*\}", template)]
        pattern = re.compile(".*?".join(literal), re.S)
        return [p for p in report.problems if pattern.search(p)]
    return [p for p in report.problems if "truncated" in p]


@pytest.fixture(scope="module")
def saves(tmp_path_factory) -> dict:
    """layout -> (save dir, shard path, ends of every item in the shard, sorted)."""
    import torch.distributed.checkpoint as dcp

    made = {}
    for name, items in LAYOUTS.items():
        root = tmp_path_factory.mktemp(name)
        it = root / "iter_0000001"
        it.mkdir()
        state = {"model": {key: torch.arange(n, dtype=torch.float32) for key, n in items}}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")        # "assuming the intent is to save in a single process"
            dcp.save(state, checkpoint_id=str(it), no_dist=True)
        (it / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                      "common_backend": "torch", "common_backend_version": 1}))
        (root / ck.TRACKER_FILE).write_text("1")
        metadata = load_dcp_metadata(it)
        infos = list(metadata.storage_data.values())
        shards = {i.relative_path for i in infos}
        assert len(shards) == 1, shards
        shard = it / shards.pop()
        ends = sorted(i.offset + i.length for i in infos)
        longest = max(i.length for i in infos)
        assert ends[-1] > longest, (name, ends, longest)   # the layout really tells offsets from lengths apart
        made[name] = (root, shard, ends)
    return made


def cut_to(root: Path, shard: Path, size: int, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the save with its shard cut (or padded) to `size` bytes."""
    import shutil

    copy = Path(shutil.copytree(root, tmp_path / "save"))
    target = copy / shard.relative_to(root)
    data = target.read_bytes()
    target.write_bytes(data[:size] if size <= len(data) else data + b"\0" * (size - len(data)))
    return copy, target


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_intact_save_has_no_truncation_problem(saves, layout):
    root, shard, ends = saves[layout]
    assert shard.stat().st_size >= ends[-1]
    assert truncation_problems(ck.inspect_save_dir(root, load=False)) == []


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_shard_length_at_under_and_over_the_end_of_its_last_item(saves, layout, delta, tmp_path):
    root, shard, ends = saves[layout]
    needed = ends[-1]
    copy, target = cut_to(root, shard, needed + delta, tmp_path)
    found = truncation_problems(ck.inspect_save_dir(copy, load=False))
    if delta < 0:
        assert len(found) == 1, found
        assert target.name in found[0] and str(needed + delta) in found[0] and str(needed) in found[0]
    else:
        assert found == [], found


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_shard_cut_inside_any_item_is_truncated(saves, layout, tmp_path):
    """Cut one byte before the end of each item in turn (and to nothing but one byte): always reported."""
    root, shard, ends = saves[layout]
    for i, end in enumerate(ends):
        sub = tmp_path / f"cut{i}"
        sub.mkdir()
        copy, target = cut_to(root, shard, end - 1, sub)
        assert truncation_problems(ck.inspect_save_dir(copy, load=False)), (layout, end - 1)
    sub = tmp_path / "tiny"
    sub.mkdir()
    copy, _ = cut_to(root, shard, 1, sub)
    assert truncation_problems(ck.inspect_save_dir(copy, load=False))
