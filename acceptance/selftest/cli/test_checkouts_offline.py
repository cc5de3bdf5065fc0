"""Checkout mode offline for every release: which releases go to the Hugging Face hub is read from their source
before anything runs, the local-tokenizer adaptation follows from it, and a hub lookup is named within seconds.

The real sources come from a Megatron-LM mirror (MEGATRON_MIRROR, a bare git directory with every tag) or from the
extracted release snapshots in .megatron/<tag>/; only the files detection reads are taken out of the mirror
(git archive), nothing of Megatron-LM is imported or run. Without either, those tests skip; the stub-checkout tests
run everywhere.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from harness.evidence.diagnose import diagnose
from harness.base.paths import FIXTURES, REPO, VOCAB_FILE
from harness.run import checkout as co
from harness.run import megatron_lm as mlm
from harness.run.checkout import _check_flags, detect, select_adapters

FAKE_016 = FIXTURES / "checkouts" / "core_v0.16.1-like"
MIRROR = Path(os.environ.get("MEGATRON_MIRROR", "/work/.mirror/NVIDIA+Megatron-LM/repo"))
SNAPSHOTS = REPO / ".megatron"
# what detect(), the adapters' conditions and flag_defined() read
DETECTED = (co.VERSION_FILE, "megatron/core/tokenizers", "megatron/training/tokenizer", co.PREPROCESS_TOOL,
            "megatron/training/arguments.py", "megatron/training/config", co.SPEC_FILE, "pyproject.toml",
            "megatron/core/transformer/transformer_config.py", "megatron/core/model_parallel_config.py",
            *co.TRAIN_SCRIPTS)
HUB_RELEASES = ("core_v0.15.0", "core_v0.15.3", "core_v0.16.1", "core_v0.17.1", "core_v0.18.2", "core_v0.19.0")


def release_sources(tag: str, dest: Path) -> Path:
    """The files detection reads of release `tag`: its extracted snapshot, or those paths out of the mirror."""
    snapshot = SNAPSHOTS / tag
    if (snapshot / co.VERSION_FILE).is_file():
        return snapshot
    if not (MIRROR / "HEAD").is_file():
        pytest.skip(f"no Megatron-LM mirror at {MIRROR} and no snapshot at {snapshot}")
    git = ["git", f"--git-dir={MIRROR}"]
    listed = subprocess.run([*git, "ls-tree", "--name-only", tag, "--", *DETECTED], capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"{tag} is not in the mirror at {MIRROR}")
    archive = subprocess.run([*git, "archive", "--format=tar", tag, *listed.stdout.split()], capture_output=True,
                             check=True).stdout
    root = dest / tag
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return root


@pytest.mark.parametrize("tag", HUB_RELEASES)
def test_a_release_whose_tokenizer_goes_to_the_hub_is_found_from_its_source(tag, tmp_path):
    checkout = detect(release_sources(tag, tmp_path))
    assert co.hub_tokenizer_name(checkout.root) == "bert-large-uncased"
    for stage in ("preprocess", "train"):
        ids = [a.id for a in select_adapters(checkout, stage)]
        assert "hf-offline" in ids
        # a release keeps its legacy tokenizer (read --vocab-file) or gets the local tokenizer folder: never neither
        assert ("legacy-tokenizer" in ids) != ("hf-local-tokenizer" in ids), (tag, stage, ids)
        _check_flags(checkout, select_adapters(checkout, stage))   # every added flag exists in the release


def test_core_v0_15_3_is_adapted_like_0_16_and_runnable_without_te(tmp_path):
    checkout = detect(release_sources("core_v0.15.3", tmp_path))
    assert str(checkout.version) == "0.15.3" and checkout.has_legacy_tokenizer
    assert [a.id for a in select_adapters(checkout, "preprocess")] == ["hf-offline", "legacy-tokenizer",
                                                                         "nltk-stand-in"]
    assert [a.id for a in select_adapters(checkout, "train")] == [
        "hf-offline", "local-spec", "no-te-launcher", "no-fused-kernels", "legacy-tokenizer"]
    assert mlm.cannot_run_reason(checkout, python_version=(3, 12)) is None


def test_core_v0_14_0_reads_its_vocab_and_stays_named_as_needing_te(tmp_path):
    checkout = detect(release_sources("core_v0.14.0", tmp_path))
    assert co.hub_tokenizer_name(checkout.root) is None
    assert "legacy-tokenizer" not in [a.id for a in select_adapters(checkout, "preprocess")]
    reason = mlm.cannot_run_reason(checkout, python_version=(3, 12))
    assert reason and "Transformer Engine is not importable" in reason


def _stub(tmp_path: Path, hub_code: bool = True) -> Path:
    root = Path(shutil.copytree(FAKE_016, tmp_path / "stub"))
    if not hub_code:
        shutil.rmtree(root / "megatron" / "core" / "tokenizers")
    return root


@pytest.mark.parametrize("hub_code", [True, False])
def test_the_tokenizer_adapters_follow_the_source_not_the_version(tmp_path, hub_code):
    root = _stub(tmp_path, hub_code)
    for minor in (14, 16, 19):
        info = root / co.VERSION_FILE
        info.write_text(f"MAJOR = 0\nMINOR = {minor}\nPATCH = 0\nPRE_RELEASE = ''\n")
        ids = [a.id for a in select_adapters(detect(root), "preprocess")]
        assert ("legacy-tokenizer" in ids) is hub_code, (minor, ids)


def test_every_stage_runs_with_the_hub_offline(tmp_path):
    checkout = detect(FAKE_016)
    pre = mlm.plan_preprocess(checkout, tmp_path / "c.json", tmp_path / "data" / "c", VOCAB_FILE, tmp_path / "w")
    train = mlm.plan_train(checkout, tmp_path / "data" / "c", VOCAB_FILE, tmp_path / "ckpt")
    for stage in (*pre.stages, *train.stages):
        assert stage.env["HF_HUB_OFFLINE"] == "1" and stage.env["TRANSFORMERS_OFFLINE"] == "1", stage.name
    assert any("HF_HUB_OFFLINE=1" in a.what for a in pre.adaptations + train.adaptations)


HUB_TOOL = '''"""Stub tools/preprocess_data.py: looks a tokenizer up on the hub by name, as 0.15.3's default path does."""
import os, sys, time
print("> building BertWordPieceLowerCase tokenizer ...", flush=True)
if os.environ.get("HF_HUB_OFFLINE") == "1":
    print("OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in "
          "the cached files. Cannot find the requested files in the disk cache and outgoing traffic has been "
          "disabled.", flush=True)
    sys.exit(1)
while True:
    print("Temporary failure in name resolution: huggingface.co, retrying", flush=True)
    time.sleep(1)
'''


def test_a_hub_lookup_is_named_within_seconds_never_a_stage_timeout(tmp_path):
    root = _stub(tmp_path)
    (root / co.PREPROCESS_TOOL).write_text(HUB_TOOL)
    plan = mlm.plan_preprocess(detect(root), tmp_path / "c.json", tmp_path / "data" / "c", VOCAB_FILE,
                               tmp_path / "w", timeout_s=120.0)
    started = time.monotonic()
    done = mlm.run_preprocess(plan, tmp_path / "run")
    assert time.monotonic() - started < 30 and not done.ok and not done.results[-1].timed_out
    row = mlm.row_from_result(detect(root), done, "preprocess", plan.adaptations)
    assert row["outcome"] == "fail" and row["detail"].startswith("[hf-hub-offline]")
    assert "needs the Hugging Face hub, and this machine is offline" in row["detail"]


@pytest.mark.parametrize("line", [
    "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): Max retries "
    "exceeded (Caused by NameResolutionError(\"Failed to resolve 'huggingface.co' ([Errno -3] Temporary failure in "
    "name resolution)\"))",
    "socket.gaierror: [Errno -3] Temporary failure in name resolution (huggingface.co)",
    "huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://huggingface.co/api/models/bert-large-uncased",
    "OSError: Can't load tokenizer for 'bert-large-uncased'. If you were trying to load it from "
    "'https://huggingface.co/models', make sure you don't have a local directory with the same name.",
])
def test_a_stage_that_timed_out_on_the_hub_is_named_by_its_log(line):
    found = diagnose("preprocess", None, f"> building tokenizer\n{line}\n", timed_out=True, duration_s=300.0)
    assert found is not None and found.cause_id == "hf-hub-offline" and "this machine is offline" in found.cause
