"""`python -m harness bench preprocess` against a fake Megatron-LM checkout: timing of both runs, the identity check
(a changed document fails with exit 1 and is named) and the JSON; the corpus and the comparison on their own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy
import pytest

from harness.tools import bench
import harness.data
from harness.tools import bench_preprocess
from harness.data.preprocess import split_sentences

DOCS = 300
FIRST_RUN_SLEEP_S = 1.0
FAKE_TOOL = '''"""Fake tools/preprocess_data.py (bert-acceptance self-test): Megatron's CLI
('--legacy-tokenizer' accepted), issue #1052's two runs, and harness.data.preprocess as the encoder. The first run
sleeps, writes INPUT_ss.EXT and exits 0 without .bin/.idx; the second encodes it. With a CHANGE_DOC file next to this
one, document N's text starts with "Zebra" in the split file, so its ids differ from the input's."""
import json, os, sys, time
from pathlib import Path

from harness.data.preprocess import main


def run(args):
    at = args.index("--input") + 1
    stem, ext = os.path.splitext(args[at])
    split = stem + "_ss" + ext
    if not os.path.exists(split):
        time.sleep(SLEEP)
        lines = Path(args[at]).read_text().splitlines(keepends=True)
        change = Path(__file__).with_name("CHANGE_DOC")
        if change.exists():
            n = int(change.read_text())
            lines[n] = json.dumps({"text": "Zebra " + json.loads(lines[n])["text"]}) + "\\n"
        Path(split).write_text("".join(lines))
        return 0
    args[at] = split
    return main(args)


if __name__ == "__main__":  # our --workers pool spawns: its workers import this file as __mp_main__
    sys.exit(run(sys.argv[1:]))
'''


def fake_checkout(root: Path, change_doc: int | None = None) -> Path:
    """A checkout detect() accepts (0.16.1, legacy tokenizer) whose tools/preprocess_data.py is FAKE_TOOL.

    No __init__.py under megatron/: the installed megatron-core still supplies megatron.core to the fake tool."""
    (root / "megatron" / "core").mkdir(parents=True)
    (root / "megatron" / "core" / "package_info.py").write_text("MAJOR = 0\nMINOR = 16\nPATCH = 1\nPRE_RELEASE = ''\n")
    (root / "megatron" / "training" / "tokenizer").mkdir(parents=True)
    (root / "megatron" / "training" / "tokenizer" / "bert_tokenization.py").write_text("")
    (root / "tools").mkdir()
    (root / "tools" / "preprocess_data.py").write_text(FAKE_TOOL.replace("SLEEP", str(FIRST_RUN_SLEEP_S)))
    if change_doc is not None:
        (root / "tools" / "CHANGE_DOC").write_text(str(change_doc))
    return root


def _bench(tmp: Path, change_doc: int | None, workers: int, capsys) -> tuple[int, dict, str]:
    """Run the command as a user would; its exit code, JSON and printed line."""
    checkout = fake_checkout(tmp / "checkout", change_doc)
    out = tmp / "result.json"
    code = bench.main(["preprocess", "--megatron-lm", str(checkout), "--docs", str(DOCS), "--workers", str(workers),
                       "--run-dir", str(tmp / "run"), "--out", str(out)])
    return code, json.loads(out.read_text()), capsys.readouterr().out


@pytest.mark.slow
def test_identical_ids_pass_and_both_megatron_runs_count(tmp_path, capsys):
    code, result, printed = _bench(tmp_path, None, 2, capsys)
    assert code == 0, printed
    assert result["identical"] and result["check"]["bin_bytes_identical"], result["check"]
    first, rerun = result["megatron_lm"]["runs"]
    assert (first["stage"], rerun["stage"]) == ("preprocess", "preprocess-rerun")
    assert first["wall_s"] >= FIRST_RUN_SLEEP_S  # the split-only run is timed, not skipped
    assert result["megatron_lm"]["wall_s"] == pytest.approx(first["wall_s"] + rerun["wall_s"], abs=0.002)
    assert result["ratio"] == pytest.approx(result["megatron_lm"]["wall_s"] / result["ours"]["wall_s"], abs=0.01)
    assert result["ours"]["cpu_s"] > 0 and result["megatron_lm"]["cpu_s"] > 0
    for tool in ("ours", "megatron_lm"):
        assert "--workers 2" in result[tool]["command"] and "--split-sentences" in result[tool]["command"]
        assert result[tool]["docs_per_s"] == pytest.approx(DOCS / result[tool]["wall_s"], rel=0.01)
        assert result[tool]["mb_per_s"] == pytest.approx(result["mb"] / result[tool]["wall_s"], rel=0.01)
    corpus = Path(result["corpus"]["path"])
    assert result["docs"] == result["check"]["documents"] == len(corpus.read_text().splitlines()) == DOCS
    assert result["mb"] == pytest.approx(corpus.stat().st_size / 1e6, abs=0.001)
    assert result["tokens"] == Path(tmp_path / "run" / "ours" / "corpus_text_sentence.bin").stat().st_size // 2
    assert result["host"]["cpu_count"] >= 1 and result["versions"]["megatron_lm"] == "0.16.1"
    assert printed.startswith(f"preprocess {DOCS} docs") and "ids identical" in printed and "ratio" in printed


@pytest.mark.slow
def test_a_changed_document_fails_with_exit_1_naming_it(tmp_path, capsys):
    code, result, printed = _bench(tmp_path, 137, 1, capsys)
    assert code == 1
    assert not result["identical"] and result["check"]["first_differing_document"] == 137
    assert "first differing document 137 (0-based; line 138 of" in printed, printed


# ---- the comparison on hand-built datasets ---------------------------------------------------------------------
def _dataset(prefix: Path, docs: list[list[list[int]]], dtype=numpy.uint16) -> Path:
    """Write documents (lists of sentences of ids) with megatron-core's builder, as both tools do."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        builder.add_document(numpy.array([t for s in doc for t in s]), [len(s) for s in doc])
    builder.finalize(f"{prefix}.idx")
    return prefix


BASE = [[[1, 2, 3], [4, 5]], [[6, 7], [8]], [[9, 10, 11]], [[12], [13, 14]]]


@pytest.mark.parametrize("other, doc, what", [
    ([BASE[0], [[6, 7], [9]], *BASE[2:]], 1, "token 2 is 8 against 9"),            # same lengths, one id
    ([*BASE[:2], [[9, 10], [11]], BASE[3]], 2, "1 sentences against 2"),           # same ids, split elsewhere
    ([*BASE[:2], [[9, 10, 11, 0]], BASE[3]], 2, "sentence 0 has 3 tokens against 4"),
    (BASE[:3], 3, "4 documents against 3"),                                          # a document missing
])
def test_first_difference_names_the_first_differing_document(tmp_path, other, doc, what):
    ours, theirs = _dataset(tmp_path / "ours", BASE), _dataset(tmp_path / "theirs", other)
    found = bench_preprocess.first_difference(ours, theirs)
    assert found is not None and found[0] == doc and what in found[1], found


def test_first_difference_is_none_for_the_same_documents_and_names_a_dtype_change(tmp_path):
    ours = _dataset(tmp_path / "ours", BASE)
    assert bench_preprocess.first_difference(ours, _dataset(tmp_path / "same", BASE)) is None
    found = bench_preprocess.first_difference(ours, _dataset(tmp_path / "wide", BASE, numpy.int32))
    assert found is not None and found[0] == 0 and "dtype" in found[1]


def test_an_unreadable_output_is_a_difference_naming_the_file(tmp_path):
    ours = _dataset(tmp_path / "ours", BASE)
    for ext in (".bin", ".idx"):
        (tmp_path / f"bad{ext}").write_text("3 documents\n")
    corpus = tmp_path / "corpus.json"
    corpus.write_text("")
    check = bench_preprocess.compare(ours, tmp_path / "bad", corpus)
    assert not check["identical"] and "not a readable .bin/.idx pair" in check["message"]
    assert str(tmp_path / "bad") in check["message"]


# ---- the corpus --------------------------------------------------------------------------------------------------
def _stand_in_punkt():
    """The offline NLTK stand-in's splitter (what Megatron's tool uses here), loaded without putting it on sys.path."""
    path = Path(harness.data.__file__).with_name("nltk_offline") / "nltk" / "tokenize" / "punkt.py"
    spec = importlib.util.spec_from_file_location("stand_in_punkt", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PunktSentenceTokenizer()


def test_corpus_is_deterministic_and_both_splitters_cut_it_alike(tmp_path):
    a = bench_preprocess.write_corpus(tmp_path / "a.json", 400)
    bench_preprocess.write_corpus(tmp_path / "b.json", 400)
    bench_preprocess.write_corpus(tmp_path / "c.json", 400, seed=7)
    text = (tmp_path / "a.json").read_bytes()
    assert text == (tmp_path / "b.json").read_bytes() and a["bytes"] == len(text)
    assert text != (tmp_path / "c.json").read_bytes()
    punkt = _stand_in_punkt()
    low, high = bench_preprocess.SENTENCES_PER_DOC
    docs = [json.loads(line)["text"] for line in text.decode().splitlines()]
    assert len(docs) == 400
    for doc in docs:
        ours = split_sentences(doc)
        assert low <= len(ours) <= high and ours == punkt.tokenize(doc), doc


def test_corpus_words_need_wordpiece_splits(tmp_path):
    from harness.data.tokenizer import MegatronBertTokenizer
    from harness.base.paths import VOCAB_FILE

    bench_preprocess.write_corpus(tmp_path / "a.json", 50)
    docs = [json.loads(line)["text"] for line in (tmp_path / "a.json").read_text().splitlines()]
    words = sum(len(d.split()) for d in docs) + sum(d.count(".") for d in docs)  # each "." is a token too
    ids = MegatronBertTokenizer.from_type("BertWordPieceLowerCase", VOCAB_FILE).tokenize_batch(docs)
    assert sum(map(len, ids)) > words  # glued words become 2+ pieces
