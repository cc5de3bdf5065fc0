"""`python -m harness compare-hf` on CPU with a tiny model: both sides train, compare.json has every field, both sides
get the same tokens per step, the Hugging Face LambdaLR equals Megatron's schedule at every iteration (several
schedules), the sentence pairs are what NSP and SOP say, every difference is backed by a number or a line of code that
is really there, the reports escape what they quote, and the student page is the JSON's."""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.base.paths import REPO, VOCAB_FILE
from harness.cli import compare_hf, compare_hf_report as report, compare_hf_rows as rows

TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--train-iters", "6",
        "--log-interval", "2", "--eval-interval", "3", "--eval-iters", "1", "--save-interval", "3",
        "--global-batch-size", "4", "--micro-batch-size", "2"]
RUN_FIELDS = ("framework", "binary_task", "ok", "command", "curve", "skipped_steps", "parameters", "ms_per_iter_median",
              "tokens_per_step", "tokens_per_s", "real_tokens_per_s", "memory", "checkpoint", "batches", "log_line")
CURVE_FIELDS = ("iteration", "mlm", "binary", "learning_rate", "loss_scale", "skipped", "grad_norm")
BATCH_FIELDS = ("positions_per_step", "real_tokens_per_step", "predicted_per_step", "predicted_fraction_of_maskable",
                "shown_as_mask", "shown_as_original", "shown_as_random", "binary_label_ones")


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("compare")
    done = subprocess.run([sys.executable, "-m", "harness", "compare-hf", "--out", str(out), "--device", "cpu",
                           "--hf-sop", "--", *TINY], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return {"out": out, "doc": json.loads((out / "compare.json").read_text()), "stdout": done.stdout}


# ---- the run ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_it_runs_and_writes_every_report(compared):
    out = compared["out"]
    for name in ("compare.json", "compare.md", "compare.png", "megatron-vs-hf.md"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(compared["doc"]["runs"]) == {"megatron", "hf", "hf-sop"}


@pytest.mark.slow
def test_the_json_has_every_field_for_every_run(compared):
    doc = compared["doc"]
    assert doc["schema"] == rows.SCHEMA and doc["device"] == "cpu" and doc["config"]["flags"] == TINY
    for name, run in doc["runs"].items():
        assert run["ok"] and run["failure"] is None, (name, run["failure"])
        missing = [f for f in RUN_FIELDS if f not in run]
        assert not missing, (name, missing)
        curve = run["curve"]
        assert [f for f in CURVE_FIELDS if f in curve] == list(CURVE_FIELDS)
        assert curve["iteration"] == [1, 2, 4, 6], (name, curve["iteration"])   # Megatron's lines: 1 and each 2nd
        assert all(isinstance(v, float) and 9 < v < 11.5 for v in curve["mlm"]), (name, curve["mlm"])
        assert all(isinstance(v, float) and 0.3 < v < 1.2 for v in curve["binary"]), (name, curve["binary"])
        assert [f for f in BATCH_FIELDS if run["batches"].get(f) is None] == [], (name, run["batches"])
        assert run["ms_per_iter_median"] > 0 and run["tokens_per_s"] > 0, name
        assert run["checkpoint"]["bytes"] > 0 and run["checkpoint"]["iteration"] == 6, (name, run["checkpoint"])
        # no GPU here: the memory is not measured, and says so instead of a number
        assert run["memory"] == {"torch_max_allocated_mib": None, "torch_max_reserved_mib": None,
                                 "nvml_peak_mib": None}, run["memory"]
    assert doc["runs"]["megatron"]["checkpoint"]["format"] == "torch_dist"
    hf = doc["runs"]["hf"]
    assert hf["checkpoint"]["weights_bytes"] > 0
    assert (compared["out"] / "runs" / "hf" / "checkpoint-6" / "model.safetensors").is_file()
    assert hf["binary_task"] == "nsp" and doc["runs"]["hf-sop"]["binary_task"] == "sop"


@pytest.mark.slow
def test_both_sides_get_the_same_tokens_per_step(compared):
    """4 sequences x 128 positions per optimizer step on both sides, counted from the batches each side trained on."""
    runs = compared["doc"]["runs"]
    assert {n: r["tokens_per_step"] for n, r in runs.items()} == dict.fromkeys(runs, 4 * 128)
    for run in runs.values():   # a seventh to a quarter of the positions are padding on both sides
        assert 0.6 * 512 < run["batches"]["real_tokens_per_step"] < 0.95 * 512, run["batches"]


@pytest.mark.slow
def test_the_same_words_the_same_ids_and_the_same_model_size(compared):
    doc = compared["doc"]
    tok = doc["runs"]["hf"]["tokenization"]
    assert tok["sentences"] == 1960 and tok["identical_to_megatron_tokenizer"] == 1960, tok
    m, h = doc["runs"]["megatron"]["parameters"], doc["runs"]["hf"]["parameters"]
    assert (m["vocab_size"], m["vocab_size_unpadded"], h["vocab_size"]) == (30592, 30524, 30522)
    assert m["count"] == h["count_at_megatron_vocab"] != h["count"]
    assert m["count"] - h["count"] == (30592 - 30522) * (32 + 1)   # the padding rows and their output biases


@pytest.mark.slow
def test_the_runs_logged_schedules_are_megatrons(compared):
    schedule = compared["doc"]["schedule"]
    assert schedule["lambda_lr_max_rel_error"] <= 1e-12 and schedule["steps_checked"] == 7
    assert {n: v["lines"] for n, v in schedule["logged"].items()} == {"megatron": 4, "hf": 4, "hf-sop": 4}
    assert all(v["max_rel_error"] <= 1e-6 for v in schedule["logged"].values()), schedule


@pytest.mark.slow
def test_every_difference_is_backed_by_evidence_that_is_really_there(compared):
    doc = compared["doc"]
    assert len(doc["differences"]) >= 15
    for row in doc["differences"]:
        checked = 0
        for item in row["evidence"]:
            if item["kind"] == "source":
                assert item["line"] is not None, (row["aspect"], item)
                assert _line_of(item["file"], item["line"]) == item["text"], (row["aspect"], item)
                checked += 1
            elif item["value"] is not None:
                resolved = _resolve(doc, item["what"])
                assert resolved is _UNRESOLVABLE or resolved == item["value"], (row["aspect"], item, resolved)
                checked += 1
        assert checked, f"{row['aspect']}: no evidence that holds"
        assert row["megatron"] and row["hf"] and row["same"] and row["brief"]["megatron"] and row["brief"]["hf"]


@pytest.mark.slow
def test_the_page_is_generated_from_the_json(compared, tmp_path):
    """--from-json writes the reports again from the JSON alone, byte for byte what the run wrote."""
    out = compared["out"]
    done = subprocess.run([sys.executable, "-m", "harness", "compare-hf", "--from-json", str(out / "compare.json"),
                           "--out", str(tmp_path), "--page", str(tmp_path / "page.md")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "page.md").read_text() == (out / "megatron-vs-hf.md").read_text() == report.page(
        compared["doc"])
    assert (tmp_path / "compare.md").read_text() == (out / "compare.md").read_text()
    page = (out / "megatron-vs-hf.md").read_text()
    final = rows.final(compared["doc"], "megatron", "mlm")
    assert rows.fmt(final, 4) in page and "(../results/compare-hf/compare.md)" in page


@pytest.mark.slow
def test_a_run_that_fails_is_reported_and_the_others_still_are(tmp_path):
    """The reference trainer crashes at iteration 2 (its own mutant flag; the Hugging Face side ignores it): exit 1,
    every report still written, the failed run named with its stage's failure, the other run's numbers kept."""
    flags = [*TINY, "--train-iters", "3", "--inject-crash-at", "2"]
    done = subprocess.run([sys.executable, "-m", "harness", "compare-hf", "--out", str(tmp_path), "--device", "cpu",
                           "--", *flags], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "not every run finished: megatron" in done.stderr
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert not doc["runs"]["megatron"]["ok"] and "train-megatron" in doc["runs"]["megatron"]["failure"]
    assert doc["runs"]["hf"]["ok"] and rows.final(doc, "hf", "mlm") is not None
    assert "| finished | no: " in (tmp_path / "compare.md").read_text()


def test_the_committed_page_is_the_committed_json():
    """docs/megatron-vs-hf.md is what the page generator makes of results/compare-hf/compare.json (or, before the
    measured run is committed, the page that says it is not measured yet)."""
    committed = REPO / "results" / "compare-hf" / "compare.json"
    doc = json.loads(committed.read_text()) if committed.is_file() else None
    assert (REPO / "docs" / "megatron-vs-hf.md").read_text(encoding="utf-8") == report.page(doc), (
        "regenerate it: python -m harness compare-hf --from-json results/compare-hf/compare.json "
        "--out results/compare-hf --page docs/megatron-vs-hf.md")


_UNRESOLVABLE = object()


def _resolve(doc: dict, what: str):
    """A dotted path into compare.json (runs.hf.parameters.count, runs.hf.curve.binary[-1]); prose: _UNRESOLVABLE."""
    if " " in what or "." not in what:
        return doc.get(what, _UNRESOLVABLE) if " " not in what else _UNRESOLVABLE
    value = doc
    for part in re.findall(r"[^.\[\]]+|\[-?\d+\]", what):
        if part.startswith("["):
            values = [v for v in value if v is not None]
            value = values[int(part[1:-1])]
        else:
            value = value[part]
    return value


def _line_of(rel: str, number: int) -> str:
    if rel.startswith(("megatron/", "transformers/")):
        import importlib.util

        package, _, inner = rel.partition("/")
        root = Path(importlib.util.find_spec(package).submodule_search_locations[0])
        return (root / inner).read_text(encoding="utf-8").splitlines()[number - 1].strip()
    return (REPO / rel).read_text(encoding="utf-8").splitlines()[number - 1].strip()


# ---- the schedule -----------------------------------------------------------------------------------------
SCHEDULES = {
    "the course's": [],
    "no warmup, cosine": ["--lr-warmup-fraction", "0", "--lr-decay-style", "cosine"],
    "no warmup, decay past the end": ["--lr-warmup-fraction", "0", "--lr-decay-iters", "300"],
    "constant after warmup": ["--lr-decay-style", "constant"],
    "min lr 0, short decay": ["--min-lr", "0", "--lr-decay-iters", "40"],
    "other batch": ["--global-batch-size", "32", "--micro-batch-size", "8", "--lr", "3e-4"],
}


@pytest.mark.parametrize("extra", list(SCHEDULES.values()), ids=list(SCHEDULES))
def test_the_lambda_lr_equals_megatrons_schedule_at_every_iteration(extra):
    """The Hugging Face side's LambdaLR, stepped as its loop steps it, against harness.train.schedule.LrSchedule (the
    reference trainer's copy of OptimizerParamScheduler.get_lr): equal to 1e-12 at every step count up to
    --train-iters."""
    import torch

    from harness.train.args import COURSE_FLAGS, parse_args
    from harness.train.hf_bert import lr_scheduler
    from harness.train.schedule import LrSchedule

    args = parse_args([*COURSE_FLAGS, *extra, "--data-path", "x", "--vocab-file", "x"])
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=args.lr)
    scheduler = lr_scheduler(optimizer, args)
    schedule = LrSchedule.from_args(args)
    seen = []
    for steps in range(args.train_iters + 1):
        if steps:
            optimizer.step()
            scheduler.step()
        mine, megatrons = optimizer.param_groups[0]["lr"], schedule.lr_host(steps)
        assert mine == pytest.approx(megatrons, rel=1e-12, abs=1e-18), (steps, mine, megatrons)
        seen.append(mine)
    assert seen[0] == (0.0 if args.lr_warmup_fraction else args.lr) and max(seen) == pytest.approx(args.lr)
    assert len(set(seen)) > 10 or args.lr_decay_style == "constant"


def test_a_skipped_line_counts_once_as_megatron_logs_it():
    """Megatron resets its counters at multiples of --log-interval only: the iteration-1 line's skip is in the
    iteration-10 line again."""
    assert rows.cumulative_skips([1, 10, 20, 30], [1, 9, 8, 0], 10) == [1, 9, 17, 17]
    assert rows.cumulative_skips([1, 10, 20], [0, 0, 2], 10) == [0, 0, 2]


# ---- the pairs ----------------------------------------------------------------------------------------------
def _documents(n: int = 12, seed: int = 0) -> list:
    """Documents whose token ids name their document and sentence: 1000 * (doc + 1) + 10 * sentence + position."""
    rng = random.Random(seed)
    return [[[1000 * (d + 1) + 10 * s + k for k in range(rng.randint(3, 9))] for s in range(rng.randint(1, 8))]
            for d in range(n)]


def _doc(token: int) -> int:
    return token // 1000 - 1


def _contiguous(tokens: list, documents: list) -> bool:
    """`tokens` are whole consecutive sentences of one document, in order."""
    doc = documents[_doc(tokens[0])]
    flat = [t for s in doc for t in s]
    start = flat.index(tokens[0])
    return flat[start:start + len(tokens)] == tokens and {_doc(t) for t in tokens} == {_doc(tokens[0])}


@pytest.mark.parametrize("seed", range(8))
def test_nsp_and_sop_pairs_are_what_their_tasks_say(seed):
    """No truncation here (room for every chunk): NSP label 0 and SOP label 0 are a document's sentences in order;
    NSP label 1 takes B from another document; SOP label 1 is the same sentences with A and B swapped."""
    from harness.train.hf_data import document_pairs

    documents = _documents(seed=seed)
    labels = {"nsp": set(), "sop": set()}
    for task in ("nsp", "sop"):
        rng = random.Random(seed)
        for index in range(len(documents)):
            for a, b, label in document_pairs(documents, index, 1000, 0.0, task, rng):
                labels[task].add(label)
                assert a and b
                if label == 0:
                    assert _contiguous(a + b, documents), (task, a, b)
                elif task == "nsp":
                    assert {_doc(t) for t in a} == {index} and {_doc(t) for t in b} != {index}, (a, b)
                    assert _contiguous(a, documents) and _contiguous(b, documents), (a, b)
                else:
                    assert _contiguous(b + a, documents) and {_doc(t) for t in a + b} == {index}, (a, b)
    assert labels == {"nsp": {0, 1}, "sop": {0, 1}}


def test_a_pair_fits_the_sequence_and_marks_its_special_tokens():
    from harness.train.hf_data import Specials, build_examples

    sp = Specials(cls=101, sep=102, pad=0, mask=103)
    examples = build_examples(_documents(30), 32, 0.1, "sop", 1, sp)
    for e in examples:
        ids, special = e["input_ids"].tolist(), e["special_tokens_mask"].tolist()
        assert len(ids) == 32 and ids[0] == 101 and ids.count(102) == 2
        assert [i for i, s in zip(ids, special) if s] == [i for i in ids if i in (101, 102, 0)]
        assert e["attention_mask"].tolist() == [int(i != 0) for i in ids]
        real = sum(e["attention_mask"].tolist())
        assert e["token_type_ids"].tolist()[:real].count(1) == real - 1 - ids.index(102)   # B and its [SEP]


def test_the_document_split_is_megatrons():
    """harness.train.hf_data.split_ranges against megatron-core's own split functions (a split Megatron builds no
    dataset for, None in its matrix, is not compared)."""
    from megatron.core.datasets.blended_megatron_dataset_config import (convert_split_vector_to_split_matrix,
                                                                        parse_and_normalize_split)

    from harness.train.hf_data import split_ranges

    compared = 0
    for split in ("980,10,10", "969,30,1", "1,1,1", "100,0,0", "7,2,1"):
        matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
        for n in (1, 7, 30, 99, 100, 200, 1001):
            mine = split_ranges(split, n)
            for k, pair in enumerate(matrix):
                if pair is not None:
                    assert mine[k] == (int(round(pair[0] * float(n))), int(round(pair[1] * float(n)))), (split, n, k)
                    compared += 1
    assert compared > 80


def test_the_hf_tokenizer_gives_megatrons_ids_and_the_count_sees_a_difference(tmp_path):
    """On the course corpus (and accents, capitals, punctuation) every sentence gets Megatron's ids; a word of 150
    characters is where they part (Megatron's WordPiece splits words up to 200 characters, transformers' up to 100),
    and the count says so, naming the sentence."""
    from harness.data.corpus import course_lines, documents
    from harness.data.tokenizer import MegatronBertTokenizer
    from harness.train.hf_data import hf_tokenizer, tokenize_documents

    tokenizer, megatron = hf_tokenizer(VOCAB_FILE, tmp_path), MegatronBertTokenizer(VOCAB_FILE)
    texts = documents(course_lines()) + ["Ünïcode, CAPITALS and punctuation: don't (stop)!"]
    same = tokenize_documents(texts, tokenizer, megatron)
    assert same.identical == same.sentences == 2001 and same.first_difference is None, same.first_difference
    parted = tokenize_documents(["the model. " + "ab" * 75 + " train."], tokenizer, megatron)
    assert (parted.sentences, parted.identical) == (2, 1) and "abab" in parted.first_difference


# ---- the reports escape what they quote -----------------------------------------------------------------------
HOSTILE = "a|b <script>x</script> `tick` *star* [link](http://x)\n# heading\x1b[31m red\u202e"


def _hostile_doc() -> dict:
    run = {"framework": HOSTILE, "binary_task": "sop", "ok": False, "failure": HOSTILE, "command": HOSTILE,
           "log_line": HOSTILE, "curve": {"iteration": [1, 10], "mlm": [10.3, float("nan")], "binary": [0.7, None]},
           "parameters": {"count": 5, "vocab_size": 3}, "checkpoint": {"format": HOSTILE, "bytes": 1},
           "memory": {}, "gpu": HOSTILE, "versions": {"torch": HOSTILE}}
    doc = {"schema": 1, "command": HOSTILE, "date": HOSTILE, "commit": HOSTILE, "device": "cuda",
           "config": {"flags": [HOSTILE], "log_interval": 10}, "runs": {"megatron": run, "hf": dict(run)}}
    doc["differences"] = rows.differences(doc)
    doc["differences"][0]["evidence"].append({"kind": "source", "file": HOSTILE, "line": 3, "text": HOSTILE})
    return doc


def _cells(line: str) -> int:
    """Columns of a Markdown table row: its pipes that are not escaped, less one."""
    return len(re.findall(r"(?<!\\)\|", line)) - 1


@pytest.mark.parametrize("render", [report.markdown, report.page], ids=["compare.md", "page"])
def test_the_reports_escape_what_they_quote(render):
    """Every quoted field holds a pipe, HTML, Markdown, a line break, a terminal escape and a bidi override: none
    survives raw, and every table row keeps its header's columns."""
    text = render(_hostile_doc())
    # an HTML tag is escaped the Markdown way (`\<script>` is a literal '<' in CommonMark): none may open raw
    assert not re.search(r"(?<!\\)<script>", text) and "\x1b" not in text and "\u202e" not in text
    prose = re.sub(r"`[^`\n]*`", "", text)    # code spans show their text as it is: a link there is only text
    assert "\n# heading" not in text and "[link](http" not in prose and "`tick`" not in text
    blocks, block = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
        elif block:
            blocks.append(block)
            block = []
    assert blocks
    for table in blocks:
        assert {_cells(line) for line in table} == {_cells(table[0])}, table


def test_the_picture_draws_hostile_and_missing_values(tmp_path):
    """NaN, None and text among the losses, a run whose name and task are mathtext that does not parse."""
    doc = _hostile_doc()
    doc["runs"]["$\\frac{x$ " + HOSTILE] = {"binary_task": "$^{", "curve": {"iteration": [1, "2", 3],
                                                                          "mlm": [10.0, 9.0, "x"]}}
    report.draw(doc, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


# ---- usage errors ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [["--data-path", "elsewhere"], ["--save=/tmp/x"], ["--bert-no-binary-head"],
                                   ["--num-layerz", "2"], ["--device", "cuda"]])
def test_flags_that_would_split_the_two_sides_are_refused(flags):
    problem = compare_hf.check_flags(flags)
    assert problem and flags[0].split("=")[0] in problem


def test_the_course_flags_pass():
    assert compare_hf.check_flags(TINY) is None and compare_hf.check_flags([]) is None


def test_a_missing_transformers_names_the_install(monkeypatch, capsys, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a))
    args = argparse.Namespace(flags=[], from_json=None, out=tmp_path, page=None)
    assert compare_hf.main(args) == 2
    err = capsys.readouterr().err
    assert "transformers is not installed" in err and ".[compare]" in err
    assert not list(tmp_path.iterdir())   # nothing trained, nothing written


def test_an_unreadable_json_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{not json")
    args = argparse.Namespace(flags=[], from_json=tmp_path / "bad.json", out=tmp_path / "o", page=None)
    assert compare_hf.main(args) == 2
    assert "not a readable compare.json" in capsys.readouterr().err
