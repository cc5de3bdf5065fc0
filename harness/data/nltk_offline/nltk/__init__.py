"""Offline stand-in for the few parts of NLTK that Megatron-LM's tools/preprocess_data.py uses (not NLTK).

Why: `--split-sentences` imports nltk, calls `nltk.download("punkt")` and `nltk.load(".../punkt/english.pickle")`;
offline (or without nltk installed) that hangs or exits. bert-acceptance puts this folder's parent
on PYTHONPATH for the checkout's preprocess stage only and records it as an Adaptation; the student's files are
never edited. The splitter is a regex (see nltk.tokenize.punkt), not a trained Punkt model.
"""

from nltk import data, tokenize
from nltk.data import load

__version__ = "0+bert-acceptance-stand-in"
STAND_IN = True  # lets a caller tell this package from the real NLTK


def download(info_or_id=None, download_dir=None, quiet=False, **kwargs) -> bool:
    """Nothing to fetch: the stand-in's punkt splitter is built in (the real call goes online)."""
    return True


__all__ = ["data", "tokenize", "load", "download", "STAND_IN"]
