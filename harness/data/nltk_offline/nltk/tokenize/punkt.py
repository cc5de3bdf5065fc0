"""A regex sentence splitter with punkt's interface (`PunktSentenceTokenizer(...).tokenize(text)`).

Rule: a sentence ends at . ! or ? (optionally closed by quotes or brackets) followed by whitespace, unless the
word before the period is a common English abbreviation or a single letter ("Dr. Smith", "J. Smith", "e.g. this").
Newlines inside a sentence are kept, as punkt keeps them. Megatron's `--keep-newlines` passes a PunktLanguageVars
subclass with its own `_period_context_fmt`; then the whitespace after each sentence stays attached to it.
"""

from __future__ import annotations

import re

ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e u.s u.k inc ltd co corp no fig al approx dept est jan feb mar apr "
    "jun jul aug sep sept oct nov dec mt ft".split())
_CLOSERS = "\"'\u201d\u2019)]}"
_BREAK = re.compile(r"[.!?]+[" + re.escape(_CLOSERS) + r"]*(?P<ws>\s+)(?=\S)")
_WORD_BEFORE = re.compile(r"(?:^|\s)(?P<word>[\w.]+)\.$")


class PunktLanguageVars:
    """Language settings; Megatron subclasses it and overrides `_period_context_fmt`."""

    sent_end_chars = (".", "?", "!")
    _period_context_fmt = r"""
        \S*                          # some word material
        %(SentEndChars)s             # a potential sentence ending
        (?=(?P<after_tok>
            %(NonWord)s              # either other punctuation
            |
            \s+(?P<next_tok>\S+)     # or whitespace and some other token
        ))"""


class PunktParameters:
    """Stand-in for punkt's trained parameters (only the abbreviation set is used)."""

    def __init__(self, abbrev_types=ABBREVIATIONS):
        self.abbrev_types = set(abbrev_types)


class PunktSentenceTokenizer:
    """Split text into sentences with the rule in the module docstring."""

    def __init__(self, train_text=None, verbose=False, lang_vars=None, token_cls=None):
        self._lang_vars = lang_vars if lang_vars is not None else PunktLanguageVars()
        self._params = train_text if isinstance(train_text, PunktParameters) else PunktParameters()
        custom = getattr(type(self._lang_vars), "_period_context_fmt", PunktLanguageVars._period_context_fmt)
        self._keep_whitespace = custom != PunktLanguageVars._period_context_fmt

    def _is_abbreviation(self, head: str) -> bool:
        """The text up to a period ends with an abbreviation or a single letter."""
        found = _WORD_BEFORE.search(head)
        if not found:
            return False
        word = found["word"].lower()
        return word in self._params.abbrev_types or (len(word) == 1 and word.isalpha())

    def span_tokenize(self, text: str, realign_boundaries: bool = True):
        """(start, end) of each sentence in `text`, as punkt yields them."""
        start = len(text) - len(text.lstrip())
        for match in _BREAK.finditer(text, start):
            if text[match.start()] == "." and self._is_abbreviation(text[start:match.start() + 1]):
                continue
            yield start, match.end("ws") if self._keep_whitespace else match.start("ws")
            start = match.end("ws")
        if text[start:].strip():
            yield start, len(text) if self._keep_whitespace else len(text.rstrip())

    def tokenize(self, text: str, realign_boundaries: bool = True) -> list[str]:
        """The sentences of `text`."""
        return [text[a:b] for a, b in self.span_tokenize(text)]

    def sentences_from_text(self, text: str, realign_boundaries: bool = True) -> list[str]:
        """Alias punkt provides."""
        return self.tokenize(text, realign_boundaries)
