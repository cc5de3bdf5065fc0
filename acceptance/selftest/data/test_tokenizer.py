"""harness.data.tokenizer gives the token ids of Megatron-LM's legacy BERT tokenizer and refuses bad vocabularies."""

import contextlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.base.paths import FIXTURES, REPO, VOCAB_FILE
from harness.data.tokenizer import MegatronBertTokenizer, VocabError, file_sha256, validate_vocab

GOLDEN = json.loads((FIXTURES / "tokenizer" / "megatron_legacy_golden.json").read_text(encoding="utf-8"))
TYPES = sorted(GOLDEN["tokenizers"])
# Megatron's own bert_tokenization.py: the .megatron/ snapshot when present, else the copy recorded from the same ref
# (fixtures/megatron/core_v0.16.1/, Apache-2.0, its origin in fixtures/megatron/NOTICE.md): the live comparison
# runs on every machine.
_TOKENIZATION = Path("megatron") / "training" / "tokenizer" / "bert_tokenization.py"
SNAPSHOT_TOKENIZATION = next(p for p in (REPO / ".megatron" / "core_v0.16.1" / _TOKENIZATION,
                                         FIXTURES / "megatron" / "core_v0.16.1" / _TOKENIZATION) if p.is_file())


@pytest.fixture(scope="module")
def tokenizers():
    """Ours, one per --tokenizer-type."""
    return {name: MegatronBertTokenizer.from_type(name) for name in TYPES}


@pytest.fixture(scope="module")
def megatron_tokenizers():
    """Megatron's own FullTokenizer from the snapshot (bert_tokenization.py only needs `six.PY3`)."""
    spec = importlib.util.spec_from_file_location("megatron_bert_tokenization", SNAPSHOT_TOKENIZATION)
    module = importlib.util.module_from_spec(spec)
    with monkeypatch_six():
        spec.loader.exec_module(module)
    return {name: module.FullTokenizer(str(VOCAB_FILE), do_lower_case=name == "BertWordPieceLowerCase")
            for name in TYPES}


@contextlib.contextmanager
def monkeypatch_six():
    """A stand-in `six` only while bert_tokenization imports (a lasting one would break dateutil in megatron-core)."""
    real = sys.modules.get("six")
    sys.modules["six"] = real or types.SimpleNamespace(PY2=False, PY3=True)
    try:
        yield
    finally:
        if real is None:
            del sys.modules["six"]


def megatron_ids(full_tokenizer, text):
    """What `_BertWordPieceTokenizer.tokenize` returns."""
    return full_tokenizer.convert_tokens_to_ids(full_tokenizer.tokenize(text))


def test_golden_was_made_with_our_vocab():
    """The golden ids are only meaningful for the committed vocab."""
    assert GOLDEN["provenance"]["vocab_sha256"] == file_sha256(VOCAB_FILE)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[case["name"] for case in GOLDEN["cases"]])
@pytest.mark.parametrize("tokenizer_type", TYPES)
def test_ids_equal_megatron_golden(tokenizers, case, tokenizer_type):
    """Every golden text (punctuation, accents, CJK, emoji, >200-char words, controls...) gives Megatron's ids."""
    assert tokenizers[tokenizer_type].tokenize(case["text"]) == case["ids"][tokenizer_type]


@pytest.mark.parametrize("tokenizer_type", TYPES)
def test_special_ids_equal_megatron(tokenizers, tokenizer_type):
    """cls/sep/pad/mask/unk/bos/eos/eod and vocab_size 30524 (vocab + [BOS] [EOS]) as Megatron reports them."""
    ours = tokenizers[tokenizer_type]
    expected = GOLDEN["tokenizers"][tokenizer_type]
    assert {name: getattr(ours, name) for name in expected} == expected


def test_adapter_has_what_megatron_core_bert_datasets_read(tokenizers):
    """BERTMaskedWordPieceDataset reads .cls .sep .mask .pad .inv_vocab (keys, '##' prefixes) and hashes the tokenizer."""
    ours = tokenizers["BertWordPieceLowerCase"]
    assert ours.inv_vocab[ours.mask] == "[MASK]" and ours.inv_vocab[ours.eod] == "[EOS]"
    assert sorted(ours.inv_vocab) == list(range(ours.vocab_size))
    assert ours.inv_vocab[ours.tokenize("unaffable")[1]].startswith("##")
    assert ours.detokenize(ours.tokenize("Unaffable GPUs")) == "unaffable gpus"

@pytest.mark.parametrize("tokenizer_type", TYPES)
def test_unique_identifiers_are_megatrons(tokenizers, tokenizer_type):
    """What MegatronTokenizer.__init__ (core_v0.16.1, megatron/core/datasets/megatron_tokenizer.py) records for
    _BertWordPieceTokenizer(vocab_file, lower_case, vocab_extra_ids=0): class name, [vocab path], then each option
    as str(); megatron-core hashes its JSON into the dataset cache names, so a difference rebuilds or mixes caches."""
    ours = tokenizers[tokenizer_type]
    expected = {"class": "_BertWordPieceTokenizer", "tokenizer_path": [str(ours.vocab_file)],
                "lower_case": str(tokenizer_type == "BertWordPieceLowerCase"), "vocab_extra_ids": str(0)}
    assert json.loads(json.dumps(ours.unique_identifiers)) == expected
    assert list(ours.unique_identifiers) == list(expected)   # the JSON (and so the hash) depends on the order


@pytest.mark.parametrize("tokenizer_type", TYPES)
def test_ids_equal_live_megatron(tokenizers, megatron_tokenizers, tokenizer_type):
    """The golden texts, tokenized by the snapshot right now, still agree (catches a stale golden file)."""
    for case in GOLDEN["cases"]:
        assert tokenizers[tokenizer_type].tokenize(case["text"]) == megatron_ids(
            megatron_tokenizers[tokenizer_type], case["text"]), case["name"]


CHARS = st.one_of(st.characters(codec=None), st.sampled_from("ΣσςİIıAaÉé \t\n\r.,!?'\"ﬁ中\u0301\u200b\u00a0\u2028\x00\ufffd\ue000"))
TEXTS = st.lists(st.one_of(st.text(CHARS, max_size=12), st.just("x" * 199)), max_size=6).map("".join)


@settings(max_examples=200, deadline=None)
@given(text=TEXTS)
def test_ids_equal_live_megatron_on_random_unicode(tokenizers, megatron_tokenizers, text):
    """Any Unicode text (surrogates, private use, marks, CJK, words near 200 chars) gives Megatron's ids."""
    for name in TYPES:
        assert tokenizers[name].tokenize(text) == megatron_ids(megatron_tokenizers[name], text)


def test_batch_equals_one_by_one(tokenizers):
    """tokenize_batch keeps order and content."""
    ours = tokenizers["BertWordPieceLowerCase"]
    texts = [case["text"] for case in GOLDEN["cases"]]
    assert ours.tokenize_batch(texts) == [ours.tokenize(text) for text in texts]


def test_validate_vocab_accepts_the_bert_vocab():
    """The committed vocab is the 30522-entry uncased BERT vocab."""
    assert len(validate_vocab(VOCAB_FILE)) == 30522


@pytest.mark.parametrize("name, message", [
    ("missing.txt", "vocab file not found"),
    ("a_directory", "vocab file is not readable"),
    ("binary.bin", "vocab file is not UTF-8 text (byte 1)"),
    ("vocab_wrong_size.txt", "wrong vocab size: expected 30522 (bert-*-uncased) or 28996 (bert-*-cased) entries, found 5"),
    ("vocab_not_wordpiece.txt", "not a BERT WordPiece vocab: 6 entries, missing [PAD] [UNK] [CLS] [SEP] [MASK]"),
])
def test_bad_vocab_is_refused_with_path_and_fix(tmp_path, name, message):
    """Each bad --vocab-file names itself, what is wrong and the fix, instead of Megatron's silent 5-token vocab."""
    (tmp_path / "a_directory").mkdir()
    (tmp_path / "binary.bin").write_bytes(b"\x00\xff\xfe[PAD]\n")
    path = FIXTURES / "broken" / name if name.startswith("vocab_") else tmp_path / name
    with pytest.raises(VocabError) as info:
        validate_vocab(path)
    assert str(info.value).startswith(f"{path}: {message}")
    assert "Fix: pass --vocab-file" in str(info.value)
