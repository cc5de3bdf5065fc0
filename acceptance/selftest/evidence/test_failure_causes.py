"""fixtures/failures/causes.toml: every entry is reached by a real failure (or a sample of its class), every template
fills, and what a class of error means is said for the texts that show it."""

from __future__ import annotations

import pytest

from harness.evidence import diagnose as dg, failure_events as fe
from harness.tools import failure_catalogue as fc

TABLE = dg.load_causes()
ENTRIES = [("cause", i, c) for i, c in enumerate(TABLE.before)] + [("class", i, c) for i, c in enumerate(TABLE.after)]
FIELDS = {"program", "who", "type", "short_type", "message", "first", "where", "module", "rank", "exit_code", "signal",
          "meaning", "chain", "evidence", "flag", "top"}

# Classes the catalogue's real failures do not (yet) show; each sample is the class's error text as its library
# prints it (torch.utils.cpp_extension, torch.distributed.checkpoint, argparse, CUDA's indexSelect assert).
SAMPLES = {
    "cpp-extension-ninja": ('Traceback (most recent call last):\n  File "/u/torch/utils/cpp_extension.py", line 1900, '
                            "in _run_ninja_build\n    subprocess.run(\nsubprocess.CalledProcessError: Command "
                            "'['ninja', '-v']' returned non-zero exit status 1.\n", "fused-kernel-build-failed"),
    "cuda-home": ('Traceback (most recent call last):\n  File "/m/megatron/fused_kernels/__init__.py", line 9, in load\n'
                  "    x()\nOSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.\n",
                  "cuda-toolkit-missing"),
    "dcp-missing-key": ('Traceback (most recent call last):\n  File "/m/megatron/training/checkpointing.py", line 1, in '
                        "load_checkpoint\n    f()\nRuntimeError: Missing key in checkpoint state_dict: "
                        "model.decoder.layers.self_attention.linear_qkv._extra_state/shard_0_1.\n",
                        "checkpoint-keys-mismatch"),
    "invalid-choice": ("usage: pretrain_bert.py [-h]\npretrain_bert.py: error: argument --data-impl: invalid choice: "
                       "'infer' (choose from 'mmap')\n", "invalid-argument-value"),
    "argparse-other": ("usage: pretrain_bert.py [-h]\npretrain_bert.py: error: one of the arguments --fp16 --bf16 is "
                       "required\n", "argparse-error"),
    "token-id": ("../aten/src/ATen/native/cuda/Indexing.cu:1231: indexSelectSmallIndex: block: [31,0,0], thread: "
                 "[116,0,0] Assertion `srcIndex < srcSelectDimSize` failed.\n"
                 "RuntimeError: CUDA error: device-side assert triggered\n", "token-id-out-of-vocab"),
    "shm-file": ("RuntimeError: unable to write to file </torch_1234_567_8>: No space left on device (28)\n",
                 "shm-full"),
    "tokenizer-frame": ('Traceback (most recent call last):\n  File "/m/megatron/training/tokenizer/tokenizer.py", '
                        "line 612, in __init__\n    self.t = load(p)\nValueError: Unrecognized model in /data/tok\n",
                        "tokenizer-load-failed"),
    "sigterm": ("Received Signals.SIGTERM death signal, shutting down workers\n", "launcher-signal"),
    "killed": ("failed (exitcode: -9) local_rank: 0 (pid: 12) of binary: /usr/bin/python\n", "killed-by-signal"),
    "file-not-found": ('Traceback (most recent call last):\n  File "/m/megatron/training/training.py", line 3, in '
                       "save\n    open(p)\nFileNotFoundError: [Errno 2] No such file or directory: "
                       "'/results/run1/tb/events.out'\n", "file-not-found"),
    "arguments-check": ('Traceback (most recent call last):\n  File "/m/megatron/training/arguments.py", line 444, '
                        "in validate_args\n    assert args.world_size % total_model_size == 0, (\nAssertionError: world "
                        "size (1) is not divisible by total_model_size (total_model_size=2)\n", "invalid-arguments"),
    "batch-check": ('Traceback (most recent call last):\n  File "/m/megatron/core/num_microbatches_calculator.py", '
                    "line 340, in __init__\n    assert global_batch_size % micro_batch_times_data_parallel_size == 0, "
                    "(\nAssertionError: global batch size (16) is not divisible by micro batch size (32) times data "
                    "parallel size (1)\n", "invalid-arguments"),
    "watchdog-sigterm": ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 4082 got signal: 15\n",
                         "launcher-signal"),
    "peer-lost": ("torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:268, remote process exited or "
                  "there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a "
                  "network error or a remote process exiting prematurely.\n", "nccl-peer-lost"),
    "nccl-oom": ("torch.distributed.DistBackendError: NCCL error in: x.cpp:1, unhandled cuda error\n"
                 "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'\n",
                 "cuda-oom"),
}


def _events() -> list:
    found = []
    for f in fc.load():
        ev = fe.first_error(f.log_path.read_text(encoding="utf-8"))
        if ev is not None:
            found.append(ev)
    return found + [fe.first_error(text) for text, _ in SAMPLES.values()]


EVENTS = _events()


@pytest.mark.parametrize("tier, index, cause", ENTRIES, ids=[f"{t}{i}-{c.id}" for t, i, c in ENTRIES])
def test_every_entry_is_reached_by_a_real_failure_or_a_sample_of_its_class(tier, index, cause):
    assert any(dg.match_cause(cause, ev) for ev in EVENTS), f"{tier} {cause.id}: no text shows it (dead data)"


@pytest.mark.parametrize("tier, index, cause", ENTRIES, ids=[f"{t}{i}-{c.id}" for t, i, c in ENTRIES])
def test_every_template_names_only_fields_it_is_given(tier, index, cause):
    groups = set()
    for pattern in (cause.type, cause.message, cause.anywhere, cause.frames, cause.signal):
        if pattern is not None:
            groups |= set(pattern.groupindex)
    for template in (cause.cause, cause.remedy):
        for name in __import__("re").findall(r"\{(\w+)\}", template):
            assert name in FIELDS | groups, (cause.id, name)


@pytest.mark.parametrize("name", SAMPLES)
def test_a_sample_of_each_class_gets_its_cause(name):
    text, expect = SAMPLES[name]
    found = dg.diagnose("train", 1, text)
    assert found is not None and found.cause_id == expect, (name, found)
    assert "{" not in found.cause and "?" not in found.cause.split(":")[0], found.cause


def test_the_table_can_be_switched_off():
    """NO_CAUSES: the rule table alone, as before causes.toml (what the rules' own tests check)."""
    text = SAMPLES["cuda-home"][0]
    assert dg.diagnose("train", 1, text, causes=dg.NO_CAUSES) is None
    assert dg.diagnose("train", 1, text).cause_id == "cuda-toolkit-missing"


def test_an_entry_with_an_unknown_field_is_refused():
    with pytest.raises(ValueError, match="unknown fields"):
        dg._cause({"id": "x", "cause": "c", "remedy": "r", "mesage": "typo"})


@pytest.mark.parametrize("tier, index, cause", ENTRIES, ids=[f"{t}{i}-{c.id}" for t, i, c in ENTRIES])
def test_every_entry_carries_the_public_threads_it_came_from(tier, index, cause):
    assert cause.sources and all(s.startswith("https://github.com/") for s in cause.sources), cause.id
