"""`nltk.tokenize` of the stand-in: the punkt module and `sent_tokenize`."""

from nltk.tokenize import punkt
from nltk.tokenize.punkt import PunktLanguageVars, PunktSentenceTokenizer


def sent_tokenize(text: str, language: str = "english") -> list[str]:
    """Sentences of `text`, as nltk.sent_tokenize returns them."""
    return PunktSentenceTokenizer().tokenize(text)


__all__ = ["punkt", "PunktLanguageVars", "PunktSentenceTokenizer", "sent_tokenize"]
