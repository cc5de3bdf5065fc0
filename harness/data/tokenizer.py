"""BERT WordPiece through HF `tokenizers`, id-for-id equal to Megatron-LM's legacy `_BertWordPieceTokenizer`.

Megatron's legacy tokenizer (megatron/training/tokenizer/tokenizer.py + bert_tokenization.py, core_v0.16.1) is
Google's original BERT code. Three details differ from HF's BERT defaults and are handled here on purpose:
- words longer than 200 characters become [UNK] (Google/Megatron `max_input_chars_per_word=200`; HF default 100);
- the vocab is read the Megatron way (one token per line, `str.strip()`, id = line number, later duplicates win);
- character classes: HF's `BertNormalizer` deletes private-use (Co) and unassigned code points and uses its own
  Unicode tables (its CJK ranges differ too); Google's code keeps Co and asks Python's `unicodedata`, whose version
  follows the Python release. So Google's BasicTokenizer runs here as string operations built from `unicodedata`
  (`basic_tokenize`: translate tables + one regex, ~4x faster than BertNormalizer on ASCII), and HF does the
  whitespace split and WordPiece in Rust.
The adapter appends [BOS] and [EOS] like Megatron does, so `vocab_size` is 30524 and `eod` is [EOS].
"""

from __future__ import annotations

import hashlib
import re
import sys
import unicodedata
from functools import cache, cached_property
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.models import WordPiece
from tokenizers.pre_tokenizers import WhitespaceSplit

from harness.base.errors import InputError
from harness.base.paths import VOCAB_FILE

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
ADDED_TOKENS = ("[BOS]", "[EOS]")  # appended by Megatron's _BertWordPieceTokenizer.__init__
KNOWN_VOCAB_SIZES = {30522: "bert-*-uncased", 28996: "bert-*-cased"}
MAX_INPUT_CHARS_PER_WORD = 200  # megatron/training/tokenizer/bert_tokenization.py WordpieceTokenizer
OPAQUE_CHAR = "\ue000"  # private use: in no BERT vocab token, so WordPiece treats it like any unknown char
CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
              (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # Google's; HF has 0x2B920 for 0x2B820
ASCII_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # Google's ASCII rule; 20x faster than the full class
TOKENIZER_TYPES = {"BertWordPieceLowerCase": True, "BertWordPieceCase": False}  # name -> lower_case
VOCAB_FIX = f"pass --vocab-file {VOCAB_FILE} (the standard 30522-line BERT uncased WordPiece vocab)"


class VocabError(InputError):
    """The --vocab-file is missing, unreadable or not a BERT WordPiece vocabulary."""


def load_vocab(path: str | Path) -> dict[str, int]:
    """Read a vocab exactly like Megatron's `bert_tokenization.load_vocab`; raise VocabError if unreadable."""
    vocab: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            for index, line in enumerate(handle):
                vocab[line.strip()] = index
    except FileNotFoundError:
        raise VocabError("vocab file not found", path=path, fix=VOCAB_FIX) from None
    except (IsADirectoryError, PermissionError) as exc:
        raise VocabError(f"vocab file is not readable ({exc.strerror})", path=path, fix=VOCAB_FIX) from None
    except UnicodeDecodeError as exc:
        raise VocabError(f"vocab file is not UTF-8 text (byte {exc.start}): not a WordPiece vocab",
                         path=path, fix=VOCAB_FIX) from None
    return vocab


def validate_vocab(path: str | Path, sizes: dict[int, str] | None = None) -> dict[str, int]:
    """Load a vocab and check it is a BERT WordPiece vocab: special tokens present, a known size."""
    sizes = KNOWN_VOCAB_SIZES if sizes is None else sizes
    vocab = load_vocab(path)
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise VocabError(f"not a BERT WordPiece vocab: {len(vocab)} entries, missing {' '.join(missing)}",
                         path=path, fix=VOCAB_FIX)
    if sizes and len(vocab) not in sizes:
        expected = " or ".join(f"{size} ({name})" for size, name in sizes.items())
        raise VocabError(f"wrong vocab size: expected {expected} entries, found {len(vocab)}",
                         path=path, fix=VOCAB_FIX)
    return vocab


def wordpiece(vocab: dict[str, int]) -> Tokenizer:
    """HF WordPiece with Megatron's [UNK] and word-length limit, over text already split by `basic_tokenize`."""
    model = WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return tokenizer


def _is_punctuation(cp: int, category: str) -> bool:
    """Google's rule: ASCII non-alphanumerics plus every Unicode P* category."""
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or category[0] == "P"


@cache
def _char_tables() -> tuple[dict[int, str | None], dict[int, None], re.Pattern]:
    """Google's clean-text (+CJK spacing) table, the accent (Mn) table and the punctuation pattern."""
    clean: dict[int, str | None] = {}
    marks: dict[int, None] = {}
    punctuation: list[list[int]] = []  # ranges of code points: a big class of single chars is 2x slower
    for cp in range(sys.maxunicode + 1):
        char = chr(cp)
        category = unicodedata.category(char)
        if cp in (0, 0xFFFD) or (category in ("Cc", "Cf") and char not in "\t\n\r"):
            clean[cp] = None
        elif char.isspace() or category == "Zs":
            clean[cp] = " "  # Google maps Zs to ' ' and str.split() also breaks on the rest (Zl, Zp)
        elif category == "Cs":
            clean[cp] = OPAQUE_CHAR  # a lone surrogate (valid JSON: "\\ud800") cannot cross into Rust
        if category == "Mn":
            marks[cp] = None
        if _is_punctuation(cp, category):
            if punctuation and punctuation[-1][1] == cp - 1:
                punctuation[-1][1] = cp
            else:
                punctuation.append([cp, cp])
    for low, high in CJK_RANGES:
        clean.update({cp: f" {chr(cp)} " for cp in range(low, high + 1)})
    ranges = "".join(f"{re.escape(chr(low))}-{re.escape(chr(high))}" for low, high in punctuation)
    return clean, marks, re.compile(f"([{ranges}])")


def basic_tokenize(text: str, lower_case: bool) -> str:
    """Google's BasicTokenizer as a string: its output tokens joined by spaces (Python `unicodedata` rules)."""
    clean, marks, punctuation = _char_tables()
    text = text.translate(clean)
    if lower_case:
        text = text.lower()
        if not text.isascii():
            text = unicodedata.normalize("NFD", text).translate(marks)
    return (ASCII_PUNCTUATION if text.isascii() else punctuation).sub(r" \1 ", text)


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file (vocab provenance)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class MegatronBertTokenizer:
    """What megatron-core's BERT datasets and tools/preprocess_data.py need from a tokenizer."""

    def __init__(self, vocab_file: str | Path = VOCAB_FILE, lower_case: bool = True,
                 vocab_sizes: dict[int, str] | None = None) -> None:
        self.vocab_file = str(vocab_file)
        self.lower_case = lower_case
        vocab = validate_vocab(vocab_file, vocab_sizes)
        self._wordpiece = wordpiece(vocab)
        self.vocab = dict(vocab)
        for token in ADDED_TOKENS:
            self.vocab.setdefault(token, len(self.vocab))
        # Read by megatron-core to hash dataset caches (MegatronDataset.unique_description).
        self.unique_identifiers = {"class": "_BertWordPieceTokenizer", "tokenizer_path": [self.vocab_file],
                                   "lower_case": str(lower_case), "vocab_extra_ids": "0"}

    @classmethod
    def from_type(cls, tokenizer_type: str, vocab_file: str | Path = VOCAB_FILE) -> "MegatronBertTokenizer":
        """Build from Megatron's --tokenizer-type name (BertWordPieceLowerCase | BertWordPieceCase)."""
        return cls(vocab_file, lower_case=TOKENIZER_TYPES[tokenizer_type])

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one text, without [CLS]/[SEP], like Megatron's `tokenize`."""
        return self.tokenize_batch([text])[0]

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of many texts (WordPiece runs in Rust threads)."""
        words = [basic_tokenize(text, self.lower_case) for text in texts]
        return [e.ids for e in self._wordpiece.encode_batch_fast(words, add_special_tokens=False)]

    def detokenize(self, ids: list[int]) -> str:
        """Tokens joined with '##' pieces glued back (no clean-up of spaces)."""
        return " ".join(self.inv_vocab[i] for i in ids).replace(" ##", "")

    @cached_property
    def inv_vocab(self) -> dict[int, str]:
        """id -> token, [BOS]/[EOS] included (BERTMaskedWordPieceDataset reads its keys and '##' prefixes)."""
        return {index: token for token, index in self.vocab.items()}

    @property
    def vocab_size(self) -> int:
        """Entries including [BOS]/[EOS]: 30524 for the BERT uncased vocab, as Megatron reports."""
        return len(self.vocab)

    @property
    def cls(self) -> int:
        return self.vocab["[CLS]"]

    @property
    def sep(self) -> int:
        return self.vocab["[SEP]"]

    @property
    def pad(self) -> int:
        return self.vocab["[PAD]"]

    @property
    def mask(self) -> int:
        return self.vocab["[MASK]"]

    @property
    def unk(self) -> int:
        return self.vocab["[UNK]"]

    @property
    def bos(self) -> int:
        return self.vocab["[BOS]"]

    @property
    def eos(self) -> int:
        return self.vocab["[EOS]"]

    @property
    def eod(self) -> int:
        """What `--append-eod` appends: Megatron's legacy BERT tokenizer returns [EOS]."""
        return self.eos
