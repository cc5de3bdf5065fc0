"""`nltk.data.load` for punkt resources only: `nltk:tokenizers/punkt/english.pickle` or a `file:` path to one."""

from __future__ import annotations

import re

from nltk.tokenize.punkt import PunktSentenceTokenizer

PUNKT_RESOURCE = re.compile(r"(?:^|/)tokenizers/punkt(?:_tab)?/(?P<lang>[A-Za-z_]+)(?:\.pickle)?/?$")
NOT_FOUND = ("Resource {url!r} not found: this is bert-acceptance's offline NLTK stand-in, which provides only "
             "tokenizers/punkt/<language>.pickle")


def _path_of(resource_url: str) -> str:
    """The resource path without its `nltk:` / `file:` scheme."""
    for scheme in ("nltk:", "file:"):
        if resource_url.startswith(scheme):
            return resource_url[len(scheme):]
    return resource_url


def load(resource_url: str, format: str = "auto", cache: bool = True, verbose: bool = False, **kwargs):
    """A punkt sentence splitter for any punkt resource URL; LookupError (as NLTK raises) for anything else."""
    if not PUNKT_RESOURCE.search(_path_of(str(resource_url))):
        raise LookupError(NOT_FOUND.format(url=resource_url))
    return PunktSentenceTokenizer()
