"""harness.data.corpus reproduces the course's toy corpus exactly and groups it into multi-sentence documents."""

import hashlib
import random
import subprocess
import sys

import pytest

from harness.data.corpus import course_lines, documents, write_corpus
from harness.base.paths import REPO
from harness.data.preprocess import split_sentences

# sha256 of the default outputs, computed once (regression guard: the corpus must never change silently).
GOLDEN_SHA256 = {
    "grouped": "efc30685002918ca9dbebefa96da80b5c03d037b2ea044822976eddda83ac172",
    "one-per-doc": "8cb97d1b92544312efabc1bc85e952f094ddc162b003f0452af91dcc69ec5919",
}


def course_recipe_literally(lines=2000):
    """The course's own code, global random module and all: the oracle."""
    random.seed(42)
    words = ["the", "model", "train", "data", "gpu", "batch", "layer", "attention"]
    return [" ".join((words * random.randint(3, 8))[:random.randint(10, 30)]) for _ in range(lines)]


def sha256(path):
    """Hex digest of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_course_lines_follow_the_recipe():
    """Same random-call order as the course: list multiplication's randint first, then the slice's."""
    assert course_lines(2000, 42) == course_recipe_literally()


def test_course_lines_are_10_to_30_words():
    """Every line keeps the recipe's bounds (at most 8*n words when 8*n < the slice)."""
    lengths = [len(line.split()) for line in course_lines()]
    assert min(lengths) >= 10 and max(lengths) <= 30


@pytest.mark.parametrize("layout", sorted(GOLDEN_SHA256))
def test_corpus_bytes_are_golden(tmp_path, layout):
    """Same bytes on every run and machine."""
    path = write_corpus(tmp_path / "corpus.json", layout=layout)
    assert sha256(path) == GOLDEN_SHA256[layout], f"corpus {layout} changed: {sha256(path)}"


def test_grouped_documents_split_into_the_course_lines():
    """Each grouped document is 10 sentences, each the course line plus '.' (>= 2 for the SOP head)."""
    lines = course_lines()
    docs = documents(lines, "grouped", 10)
    assert len(docs) == 200
    sentences = [split_sentences(doc) for doc in docs]
    assert all(len(s) == 10 for s in sentences)
    assert [s.rstrip(".") for doc in sentences for s in doc] == lines


def test_one_per_doc_is_the_literal_course_layout():
    """One course line per document, unchanged."""
    lines = course_lines(50)
    assert documents(lines, "one-per-doc") == lines


def test_unknown_layout_is_refused():
    """A typo in the layout fails loudly instead of writing some default."""
    with pytest.raises(ValueError, match="unknown layout 'groupd'"):
        documents(course_lines(5), "groupd")


def test_cli_writes_the_same_bytes_as_the_api(tmp_path):
    """`python -m harness corpus` is the API with flags."""
    cli_out = tmp_path / "cli.json"
    subprocess.run([sys.executable, "-m", "harness.data.corpus", str(cli_out), "--layout", "grouped", "--lines", "30",
                    "--lines-per-doc", "3"], cwd=REPO, check=True, capture_output=True)
    api_out = write_corpus(tmp_path / "api.json", lines=30, lines_per_doc=3)
    assert cli_out.read_bytes() == api_out.read_bytes()
    assert len(cli_out.read_text().splitlines()) == 10
