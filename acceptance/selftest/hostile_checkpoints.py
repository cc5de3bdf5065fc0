"""Hostile checkpoints for the self-tests: a pickle payload planted in each file a --save folder holds.

Each case plants a payload (its __reduce__ runs `touch MARKER`) in one file: .metadata, common.pt, a *.distcp
shard, mp_rank_00/model_optim_rng.pt, the tracker. test_untrusted_checkpoints.py reads them in-process;
test_untrusted_checkpoints_cli.py runs every command that inspects a submitted checkpoint on them.
"""

from __future__ import annotations

import os
import pickle
import shlex
import shutil
import subprocess
from pathlib import Path

import torch

from harness.evidence.checkpoints import inspector as ck
from harness.base.paths import RECORDED_LOGS, REPO

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


def tiny_dist_save(iter_dir: Path) -> None:
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
    tiny_dist_save(it)
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


def make_planted(root: Path, markers: Path) -> dict:
    """One submission per planted file (the recorded good log beside its --save folder) and one marker each."""
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


def run_here(argv: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """A subprocess importing this checkout's harness (not an installed copy), wherever it starts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def no_marker(planted: dict, how: str) -> None:
    made = sorted(p.name for p in planted["markers"].iterdir())
    assert not made, (f"{how} executed a planted pickle payload ({made} created): a submitted file was unpickled "
                      "without an allowlist; read it through harness.evidence.checkpoints.safe_pickle or torch.load(weights_only=True)")


