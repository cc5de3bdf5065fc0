"""The documented failure modes as data: how to provoke each one for real on a CPU, and the diagnosis it must get.

docs/MEASURED.md "Failure modes, as they really behave" lists what a student runs into. Each `Failure` here
builds the inputs and the command that reproduce one of them (`provoke`), names its stage (diagnose rules match
stages by prefix: "preprocess...", "train..."), and says which `harness.evidence.diagnose` rule must name it and which
words of the cause and remedy the failure message must carry. `acceptance/selftest/run/test_failures_cpu.py` runs
every entry through `harness.run.launch.run_stage`. The helpers that build tiny CPU runs are shared by the CPU
self-tests of the trainer.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.base import paths
from harness.run.launch import DATASET_MARKER, StageSpec
from harness.train.args import COURSE_FLAGS

# The course's command shrunk to a CPU smoke run: model dims untouched, only iterations and batches cut.
CPU_SMOKE_FLAGS = ("--device", "cpu", "--train-iters", "4", "--global-batch-size", "4", "--micro-batch-size", "2",
                   "--log-interval", "2", "--eval-interval", "2", "--eval-iters", "1", "--save-interval", "2")

FAST_FAIL_TIMEOUT_S = 90.0     # an import error or a bad argument: seconds, even on a loaded 2-core machine
PROVOKED_STALL_S = 20.0        # a provoked failure on the CPU: silence after the dataset marker that counts as the
                               # sample-index hang (a live run waits DATASET_STALL_S, harness.run.session)
HANG_TIMEOUT_S = 3.0           # the generic hang: a stage that outlives this is killed
HEALTHY_DOCUMENTS = 100        # > ~76 documents: split 980,10,10 leaves validation and test non-empty
FEW_DOCUMENTS = 30             # < ~76: one split is empty (docs/MEASURED.md)

# The course's seed script `pretrain_bert_single_gpu.py` as printed: the pre-2023 Megatron-LM API.
COURSE_SEED_SCRIPT = '''\
import torch
from megatron.initialize import initialize_megatron
from megatron.model import BertModel
from megatron.training import pretrain

if __name__ == "__main__":
    initialize_megatron()
'''

# Imported from sitecustomize: every `import megatron...` fails the way it does when megatron-core is not installed.
HIDE_MEGATRON = '''\
import sys


class _HideMegatron:
    """A meta-path finder that makes megatron (and megatron-core) unimportable."""

    def find_spec(self, name, path=None, target=None):
        if name == "megatron" or name.startswith("megatron."):
            raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}", name=name.split(".")[0])
        return None


sys.meta_path.insert(0, _HideMegatron())
'''


@dataclass(frozen=True)
class Inputs:
    """What a provocation may use: its own empty directory, the real vocab and a healthy dataset prefix."""

    root: Path
    vocab_file: Path
    data_prefix: Path


@dataclass(frozen=True)
class Failure:
    """One documented failure: how to provoke it, and the diagnosis its failure message must carry."""

    name: str
    description: str
    stage: str                                  # StageSpec name; diagnose rules match stages by prefix
    provoke: Callable[[Inputs], StageSpec]      # writes the inputs under Inputs.root, returns the command
    expected_cause_id: str
    expected_text: tuple[str, ...]              # substrings of the failure message: the cause and the remedy


# ---- building blocks -------------------------------------------------------------------------------------------

def stage(name: str, argv: list[str], timeout_s: float = FAST_FAIL_TIMEOUT_S, env: dict | None = None,
          **limits) -> StageSpec:
    """A stage in this checkout's Python environment, run from the repository root."""
    from harness.run.session import python_env  # late: session pulls in the NVML sampler

    return StageSpec(name, tuple(argv), timeout_s, env=python_env(env), cwd=str(paths.REPO), **limits)


def train_argv(data_prefix: Path, vocab_file: Path, cache_dir: Path, *extra: str) -> list[str]:
    """The course's training command as a CPU smoke run; `extra` comes last and wins."""
    return [sys.executable, "-m", "harness.train", *COURSE_FLAGS, *CPU_SMOKE_FLAGS, "--data-path", str(data_prefix),
            "--vocab-file", str(vocab_file), "--data-cache-path", str(cache_dir), *extra]


def preprocess_argv(corpus: Path, prefix: Path, vocab_file: Path, *extra: str) -> list[str]:
    """The course's preprocessing command (through the suite's drop-in for tools/preprocess_data.py)."""
    return [sys.executable, "-m", "harness.data.preprocess", "--input", str(corpus), "--output-prefix", str(prefix),
            "--vocab-file", str(vocab_file), "--tokenizer-type", "BertWordPieceLowerCase", "--split-sentences",
            "--json-keys", "text", "--workers", "1", *extra]


def write_dataset(root: Path, layout: str = "grouped", documents: int = HEALTHY_DOCUMENTS,
                  vocab_file: Path = paths.VOCAB_FILE) -> Path:
    """The course corpus with `documents` documents, preprocessed in this process; returns the data prefix."""
    from harness.data.corpus import write_corpus
    from harness.data.preprocess import preprocess

    root.mkdir(parents=True, exist_ok=True)
    lines_per_doc = 1 if layout == "one-per-doc" else 10
    corpus = write_corpus(root / f"corpus-{layout}-{documents}.json", layout, documents * lines_per_doc)
    prefix = root / f"{layout}-{documents}"
    preprocess(corpus, prefix, vocab_file, "BertWordPieceLowerCase", ("text",), split_sentences=True)
    return Path(f"{prefix}_text_sentence")


def healthy_dataset(root: Path) -> Path:
    """The healthy dataset under `root`, preprocessed once and reused (CPU self-tests of one session share it)."""
    prefix = root / f"grouped-{HEALTHY_DOCUMENTS}_text_sentence"
    if not Path(f"{prefix}.idx").is_file():
        write_dataset(root)
    return prefix


def truncated_vocab(path: Path, lines: int = 100) -> Path:
    """A vocab file that exists but is not BERT's: its first `lines` lines ([PAD] and [unusedN] only)."""
    with open(paths.VOCAB_FILE, encoding="utf-8") as source:
        path.write_text("".join(next(source) for _ in range(lines)), encoding="utf-8")
    return path


# ---- provocations ----------------------------------------------------------------------------------------------

def _plain_text(i: Inputs) -> StageSpec:
    """Preprocess the course's plain sample.txt (fixtures/broken/sample.txt)."""
    sample = paths.BROKEN_INPUTS / "sample.txt"
    return stage("preprocess-plain-text", preprocess_argv(sample, i.root / "sample", i.vocab_file))


def _no_text_key(i: Inputs) -> StageSpec:
    """Preprocess JSON lines whose document is under 'content' (fixtures/broken/no_text_key.json), --json-keys text."""
    corpus = paths.BROKEN_INPUTS / "no_text_key.json"
    return stage("preprocess-no-text-key", preprocess_argv(corpus, i.root / "content", i.vocab_file))


def _preprocess_vocab_missing(i: Inputs) -> StageSpec:
    """Preprocess with a --vocab-file that does not exist."""
    from harness.data.corpus import write_corpus

    corpus = write_corpus(i.root / "corpus.json", lines=50)
    return stage("preprocess-vocab-missing", preprocess_argv(corpus, i.root / "out", i.root / "no-such-vocab.txt"))


def _preprocess_vocab_wrong(i: Inputs) -> StageSpec:
    """Preprocess with a 100-line vocab file."""
    from harness.data.corpus import write_corpus

    corpus = write_corpus(i.root / "corpus.json", lines=50)
    vocab = truncated_vocab(i.root / "vocab-100.txt")
    return stage("preprocess-vocab-wrong", preprocess_argv(corpus, i.root / "out", vocab))


def _train_vocab_missing(i: Inputs) -> StageSpec:
    """Train on a good dataset with a --vocab-file that does not exist."""
    argv = train_argv(i.data_prefix, i.root / "no-such-vocab.txt", i.root / "cache")
    return stage("train-vocab-missing", argv)


def _train_vocab_wrong(i: Inputs) -> StageSpec:
    """Train on a good dataset with a 100-line vocab file."""
    argv = train_argv(i.data_prefix, truncated_vocab(i.root / "vocab-100.txt"), i.root / "cache")
    return stage("train-vocab-wrong", argv)


def _data_missing(i: Inputs) -> StageSpec:
    """Train with a --data-path that names no .bin/.idx (a typo, or preprocessing never ran)."""
    argv = train_argv(i.root / "no-such-data" / "corpus_text_sentence", i.vocab_file, i.root / "cache")
    return stage("train-data-missing", argv)


def _few_documents(i: Inputs) -> StageSpec:
    """Train on 30 documents with --split 980,10,10."""
    prefix = write_dataset(i.root / "data", "grouped", FEW_DOCUMENTS, i.vocab_file)
    return stage("train-few-documents", train_argv(prefix, i.vocab_file, i.root / "cache"))


def _one_sentence_docs(i: Inputs) -> StageSpec:
    """Train the course's one-line documents with the binary head: bounded by the stall watchdog."""
    prefix = write_dataset(i.root / "data", "one-per-doc", 300, i.vocab_file)
    return stage("train-one-sentence-docs", train_argv(prefix, i.vocab_file, i.root / "cache"), timeout_s=120.0,
                 stall_timeout_s=PROVOKED_STALL_S, stall_after_marker=DATASET_MARKER)


def _no_gpu(i: Inputs) -> StageSpec:
    """Train with --device cuda (and the course's nccl) where torch sees no GPU."""
    argv = train_argv(i.data_prefix, i.vocab_file, i.root / "cache", "--device", "cuda",
                      "--distributed-backend", "nccl")
    return stage("train-no-gpu", argv, env={"CUDA_VISIBLE_DEVICES": ""})


def _megatron_missing(i: Inputs) -> StageSpec:
    """Train where megatron cannot be imported (a sitecustomize hides it, as if megatron-core were not installed)."""
    hide = i.root / "hide-megatron"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_MEGATRON, encoding="utf-8")
    from harness.run.session import python_env

    pythonpath = os.pathsep.join([str(hide), python_env()["PYTHONPATH"]])
    return stage("train-megatron-missing", train_argv(i.data_prefix, i.vocab_file, i.root / "cache"),
                 env={"PYTHONPATH": pythonpath})


def _old_api(i: Inputs) -> StageSpec:
    """Run the course's seed script as printed."""
    script = i.root / "pretrain_bert_single_gpu.py"
    script.write_text(COURSE_SEED_SCRIPT, encoding="utf-8")
    return stage("train-seed-script", [sys.executable, str(script)])


def _hang(i: Inputs) -> StageSpec:
    """A stage that prints one line and then sleeps far past its timeout."""
    code = "import time; print('waiting for a rendezvous that never comes', flush=True); time.sleep(600)"
    return stage("rendezvous", [sys.executable, "-c", code], timeout_s=HANG_TIMEOUT_S)


# ---- the table -------------------------------------------------------------------------------------------------

FAILURES: tuple[Failure, ...] = (
    Failure("plain-text-input", "the course's plain sample.txt fed to preprocessing", "preprocess-plain-text",
            _plain_text, "not-json", ("input must be JSON lines with a 'text' key", "harness.data.corpus")),
    Failure("no-text-key", "JSON lines without a 'text' key (--json-keys text)", "preprocess-no-text-key",
            _no_text_key, "missing-text-key", ("'text' key", "--json-keys")),
    Failure("preprocess-vocab-missing", "preprocessing with a --vocab-file path that does not exist",
            "preprocess-vocab-missing", _preprocess_vocab_missing, "vocab-missing",
            ("vocab file not found", "no-such-vocab.txt", "bert-base-uncased-vocab.txt")),
    Failure("preprocess-vocab-wrong", "preprocessing with a 100-line vocab file", "preprocess-vocab-wrong",
            _preprocess_vocab_wrong, "vocab-wrong", ("30522", "bert-base-uncased-vocab.txt")),
    Failure("train-vocab-missing", "training with a --vocab-file path that does not exist", "train-vocab-missing",
            _train_vocab_missing, "vocab-missing",
            ("vocab file not found", "no-such-vocab.txt", "bert-base-uncased-vocab.txt")),
    Failure("train-vocab-wrong", "training with a 100-line vocab file", "train-vocab-wrong",
            _train_vocab_wrong, "vocab-wrong", ("30522", "bert-base-uncased-vocab.txt")),
    Failure("data-missing", "training with a --data-path that names no preprocessed .bin/.idx",
            "train-data-missing", _data_missing, "data-missing",
            ("training data was not found", "no-such-data/corpus_text_sentence", "--data-path PREFIX")),
    Failure("few-documents", f"{FEW_DOCUMENTS} documents with --split 980,10,10: an empty split",
            "train-few-documents", _few_documents, "empty-split",
            ("split is empty", "--split 980,10,10", "more documents")),
    Failure("one-sentence-docs", "one sentence per document with the binary head (the course's corpus layout)",
            "train-one-sentence-docs", _one_sentence_docs, "one-sentence-docs",
            (">= 2 sentences", "--bert-no-binary-head")),
    Failure("no-gpu", "--device cuda on a machine where torch sees no GPU", "train-no-gpu", _no_gpu, "no-gpu",
            ("no usable CUDA GPU", "harness doctor")),
    Failure("megatron-core-missing", "training without megatron-core installed", "train-megatron-missing",
            _megatron_missing, "megatron-core-missing",
            ("megatron-core is missing", "pip install 'megatron-core>=0.16.1,<0.20'")),
    Failure("old-api", "the course's seed script as written (megatron.initialize, megatron.model)",
            "train-seed-script", _old_api, "old-api",
            ("megatron.initialize", "from megatron.training import initialize_megatron")),
    Failure("hang", "a stage that stops printing and never exits", "rendezvous", _hang, "timeout",
            ("stage 'rendezvous' hung", "waiting for a rendezvous that never comes")),
)


def by_name(name: str) -> Failure:
    """The table entry called `name`."""
    for failure in FAILURES:
        if failure.name == name:
            return failure
    raise KeyError(f"no failure {name!r}; known: {', '.join(f.name for f in FAILURES)}")
