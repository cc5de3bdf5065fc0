"""Preprocessing throughput: harness.data.preprocess against a Megatron-LM checkout's tools/preprocess_data.py.

    python -m harness bench preprocess --megatron-lm CHECKOUT [--docs 1000000] [--workers N] [--out JSON]

Both tools get the same corpus and the course's flags (BertWordPieceLowerCase, --split-sentences, --json-keys text,
--workers N). Megatron's tool runs through harness.run.megatron_lm's plan (offline NLTK stand-in, legacy tokenizer,
and the second identical run that Megatron-LM issue #1052 needs): both of its runs count in its time. The outputs
must be the same token ids: .bin bytes, and the .idx's dtype, sentence lengths and document indices read back with
megatron-core's IndexedDataset. A difference exits 1 and names the first differing document. The tools run one
after the other; each one's wall time starts at its process start (imports included) and ends at its exit.

The corpus is not the course's (8 words, 10 long sentences per document: 1 GB for 1M documents, every word one
token): each document is 3-5 sentences drawn from a seeded pool of sentences of 4-10 words from the BERT vocab,
one word in ten glued to a `##` piece (so WordPiece really splits), capitalised, each sentence ending in a word of
7+ letters and "." so that no splitter (punkt's abbreviation list, NLTK stand-in, ours) reads an abbreviation.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.metadata
import itertools
import json
import os
import platform
import random
import resource
import sys
import time
import warnings
from pathlib import Path

from harness.base import paths
from harness.data import preprocess_argv
from harness.base.errors import InputError
from harness.run.launch import StageSpec, run_stage

DEFAULT_DOCS = 1_000_000
SEED = 20261201
POOL_SENTENCES = 8192
SENTENCES_PER_DOC = (3, 5)
WORDS_PER_SENTENCE = (4, 10)
GLUE_PROBABILITY = 0.1
FINAL_WORD_LETTERS = 7
TOOL_TIMEOUT_S = 1800.0
TOOL_STALL_S = 300.0
MISMATCH = "token ids differ: first differing document {doc} (0-based; line {line} of {corpus}): {what}"


# ---- the corpus --------------------------------------------------------------------------------------------------
def vocab_words(vocab_file: Path = paths.VOCAB_FILE) -> tuple[list[str], list[str]]:
    """Whole lowercase words (2+ letters) and `##` continuation pieces (without ##) of a WordPiece vocab."""
    words, pieces = [], []
    for line in Path(vocab_file).read_text(encoding="utf-8").splitlines():
        token = line.strip()
        bare = token[2:] if token.startswith("##") else token
        if len(bare) >= 2 and bare.isascii() and bare.isalpha() and bare.islower():
            (pieces if token.startswith("##") else words).append(bare)
    if not words or not pieces:
        raise InputError("no lowercase words or ## pieces in the vocab", path=vocab_file,
                         fix=f"pass --vocab-file {paths.VOCAB_FILE}")
    return words, pieces


def sentence_pool(vocab_file: Path = paths.VOCAB_FILE, seed: int = SEED, size: int = POOL_SENTENCES) -> list[str]:
    """`size` seeded sentences from the vocab's words (see the module docstring)."""
    words, pieces = vocab_words(vocab_file)
    finals = [w for w in words if len(w) >= FINAL_WORD_LETTERS]
    rng = random.Random(seed)
    glue = lambda w: w + rng.choice(pieces) if rng.random() < GLUE_PROBABILITY else w  # noqa: E731
    pool = []
    for _ in range(size):
        body = [glue(rng.choice(words)) for _ in range(rng.randint(*WORDS_PER_SENTENCE) - 1)]
        pool.append(" ".join(body + [rng.choice(finals)]).capitalize() + ".")
    return pool


def write_corpus(path: Path, docs: int, vocab_file: Path = paths.VOCAB_FILE, seed: int = SEED) -> dict:
    """Write `docs` JSON lines {"text": ...}, byte-for-byte the same for the same arguments; return its size."""
    pool, rng = sentence_pool(vocab_file, seed), random.Random(seed + 1)
    low, high = SENTENCES_PER_DOC
    with open(path, "w", encoding="ascii", newline="\n") as handle:
        for start in range(0, docs, 10_000):  # the pool is plain ASCII letters and ". ": no JSON escaping needed
            handle.write("".join('{"text": "' + " ".join(rng.choices(pool, k=rng.randint(low, high))) + '"}\n'
                                 for _ in range(min(10_000, docs - start))))
    size = path.stat().st_size
    return {"path": str(path), "docs": docs, "bytes": size, "mb": round(size / 1e6, 3), "seed": seed}


# ---- the two tools -----------------------------------------------------------------------------------------------
def _children_cpu_s() -> float:
    """User + sys CPU seconds of every child process reaped so far (grandchildren their parents reaped included)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run_ours(corpus: Path, prefix: Path, vocab_file: Path, workers: int, run_dir: Path,
             timeout_s: float = TOOL_TIMEOUT_S, on_line=None) -> dict:
    """Our preprocessor as a fresh process (its imports count, as Megatron's do)."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(paths.REPO), os.environ.get("PYTHONPATH")]))}
    spec = StageSpec("preprocess-ours", preprocess_argv(corpus, prefix, vocab_file, workers), timeout_s, env=env)
    cpu = _children_cpu_s()
    result = run_stage(spec, run_dir, on_line=on_line)
    cpu = _children_cpu_s() - cpu
    if not result.ok:
        raise SystemExit("harness.data.preprocess failed\n" + result.failure_message())
    return {"wall_s": round(result.duration_s, 3), "cpu_s": round(cpu, 3), "command": " ".join(spec.argv),
            "log": str(result.log_path)}


def run_megatron(checkout, corpus: Path, prefix: Path, vocab_file: Path, workers: int, run_dir: Path,
                 timeout_s: float = TOOL_TIMEOUT_S, on_line=None) -> dict:
    """The checkout's tools/preprocess_data.py through plan_preprocess: first run, and the #1052 rerun if needed."""
    from harness.run.megatron_lm import plan_preprocess, run_preprocess

    plan = plan_preprocess(checkout, corpus, prefix, vocab_file, run_dir / "megatron-work", timeout_s=timeout_s,
                           stall_s=TOOL_STALL_S, workers=workers)
    cpu = _children_cpu_s()
    done = run_preprocess(plan, run_dir, on_line=on_line)
    cpu = _children_cpu_s() - cpu
    if not done.ok:
        raise SystemExit("Megatron-LM's tools/preprocess_data.py failed\n" + done.failure_message())
    runs = [{"stage": r.name, "wall_s": round(r.duration_s, 3), "log": str(r.log_path)} for r in done.results]
    return {"runs": runs, "wall_s": round(sum(r.duration_s for r in done.results), 3),
            "cpu_s": round(cpu, 3),
            "command": " ".join(plan.stages[0].argv), "adaptations": [a.what for a in done.adaptations]}


# ---- the identity check ------------------------------------------------------------------------------------------
def _read(prefix: Path):
    """(IndexedDataset, its tokens as a memory map); InputError when the pair is not a readable dataset."""
    import numpy

    with warnings.catch_warnings():  # megatron-core's "Apex/TE not installed" noise, irrelevant here
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import _INDEX_HEADER, IndexedDataset
    with open(f"{prefix}.idx", "rb") as handle:  # checked first: a failed IndexedDataset() complains in __del__
        header = handle.read(len(_INDEX_HEADER))
    if header != _INDEX_HEADER:
        raise InputError(f"not a readable .bin/.idx pair (the .idx starts with {header!r}, not {_INDEX_HEADER!r})",
                         path=prefix, fix="see the tool's log next to it")
    try:
        dataset = IndexedDataset(str(prefix))
        tokens = numpy.memmap(f"{prefix}.bin", dtype=dataset.index.dtype, mode="r")
    except Exception as exc:  # megatron-core asserts on a bad header; numpy raises on a bad size
        raise InputError(f"not a readable .bin/.idx pair ({type(exc).__name__}: {exc})", path=prefix,
                         fix="see the tool's log next to it") from None
    return dataset, tokens


def first_difference(ours_prefix: Path, theirs_prefix: Path) -> tuple[int, str] | None:
    """(first differing document, what differs), or None when tokens, sentences and documents are all the same."""
    import numpy

    (a, ta), (b, tb) = _read(ours_prefix), _read(theirs_prefix)
    if a.index.dtype != b.index.dtype:
        return 0, f"token dtype {a.index.dtype.__name__} against {b.index.dtype.__name__}"
    da, db = a.document_indices, b.document_indices
    la, lb = a.sequence_lengths.astype(numpy.int64), b.sequence_lengths.astype(numpy.int64)
    ea = numpy.concatenate([[0], numpy.cumsum(la)])[da]  # token offset of each document boundary
    found = {}
    docs = min(len(da), len(db)) - 1
    if len(da) != len(db):
        found[docs] = f"{len(da) - 1} documents against {len(db) - 1}"
    counts = numpy.flatnonzero(numpy.diff(da)[:docs] != numpy.diff(db)[:docs])
    if len(counts):
        d = int(counts[0])
        found.setdefault(d, f"{da[d + 1] - da[d]} sentences against {db[d + 1] - db[d]}")
    lengths = numpy.flatnonzero(la[:min(len(la), len(lb))] != lb[:min(len(la), len(lb))])
    if len(lengths):
        s = int(lengths[0])
        d = int(numpy.searchsorted(da, s, side="right") - 1)
        found.setdefault(d, f"sentence {s - da[d]} has {la[s]} tokens against {lb[s]}")
    ids = numpy.flatnonzero(ta[:min(len(ta), len(tb))] != tb[:min(len(ta), len(tb))])
    if len(ids):
        p = int(ids[0])
        d = int(numpy.searchsorted(ea, p, side="right") - 1)
        found.setdefault(d, f"token {p - ea[d]} is {ta[p]} against {tb[p]} (ids {ta[p:p + 5].tolist()} "
                            f"against {tb[p:p + 5].tolist()})")
    if not found and len(ta) != len(tb):
        found[docs] = f"{len(ta)} tokens against {len(tb)}"
    return min(found.items()) if found else None


def compare(ours_prefix: Path, theirs_prefix: Path, corpus: Path) -> dict:
    """Byte and index comparison; on a difference, the first differing document and its input line."""
    bins = [Path(f"{p}.bin") for p in (ours_prefix, theirs_prefix)]
    idxs = [Path(f"{p}.idx") for p in (ours_prefix, theirs_prefix)]
    out = {"bin_bytes_identical": filecmp.cmp(*bins, shallow=False),
           "idx_bytes_identical": filecmp.cmp(*idxs, shallow=False),
           "bin_bytes": [p.stat().st_size for p in bins], "idx_bytes": [p.stat().st_size for p in idxs]}
    try:
        diff = first_difference(ours_prefix, theirs_prefix)
    except InputError as exc:
        return {**out, "identical": False, "first_differing_document": None, "message": str(exc)}
    dataset, _ = _read(ours_prefix)
    out.update(documents=len(dataset.document_indices) - 1, sentences=len(dataset.sequence_lengths),
               tokens=int(dataset.sequence_lengths.sum(dtype="int64")))
    if diff is None and out["bin_bytes_identical"]:
        return {**out, "identical": True, "first_differing_document": None, "message": "identical token ids"}
    doc, what = diff if diff is not None else (0, "the .bin bytes differ")
    text = next(itertools.islice(open(corpus, encoding="utf-8", errors="replace"), doc, None), "").strip()
    message = MISMATCH.format(doc=doc, line=doc + 1, corpus=corpus, what=what) + f"; its text: {text[:160]}"
    return {**out, "identical": False, "first_differing_document": doc, "message": message}


# ---- the command -------------------------------------------------------------------------------------------------
def versions(checkout) -> dict:
    """Python, the packages our tool uses, and the checkout."""
    found = {"python": platform.python_version(), "megatron_lm": str(checkout.version),
             "megatron_lm_commit": checkout.git_commit, "megatron_lm_root": str(checkout.root)}
    for name in ("megatron-core", "tokenizers", "numpy", "torch"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def host() -> dict:
    """CPU count (and the cores this process may use) and CPU model."""
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), None)
    return {"cpu_count": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)), "cpu_model": model,
            "platform": platform.platform()}


def _cpuinfo() -> list[str]:
    """/proc/cpuinfo's lines, or none."""
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return []


def _rates(wall_s: float, docs: int, mb: float) -> dict:
    """docs/s and MB/s of one tool."""
    return {"docs_per_s": float(f"{docs / wall_s:.4g}"), "mb_per_s": float(f"{mb / wall_s:.4g}")}


def bench_preprocess(checkout_path, docs: int = DEFAULT_DOCS, workers: int = 1, run_dir: Path | None = None,
                     vocab_file: Path = paths.VOCAB_FILE, seed: int = SEED, timeout_s: float = TOOL_TIMEOUT_S,
                     on_line=None) -> dict:
    """Build the corpus, run both tools on it one after the other, compare their outputs; the JSON result."""
    from harness.run.checkout import detect

    if docs < 1 or workers < 1:
        raise InputError(f"--docs and --workers must be >= 1, got {docs} and {workers}", fix="pass positive counts")
    checkout = detect(checkout_path)
    run_dir = Path(run_dir or paths.REPO / "runs" / time.strftime("bench-preprocess-%Y%m%d-%H%M%S"))
    (run_dir / "ours").mkdir(parents=True, exist_ok=True)
    (run_dir / "megatron").mkdir(exist_ok=True)
    corpus = run_dir / "corpus.json"
    for stale in [corpus.with_name("corpus_ss.json"), *run_dir.glob("*/corpus_text_sentence.*")]:
        stale.unlink(missing_ok=True)  # a stale split file or output would skip a Megatron run
    started = time.monotonic()
    info = write_corpus(corpus, docs, vocab_file, seed)
    info["write_s"] = round(time.monotonic() - started, 3)
    megatron = run_megatron(checkout, corpus, run_dir / "megatron" / "corpus", vocab_file, workers, run_dir,
                            timeout_s, on_line)
    ours = run_ours(corpus, run_dir / "ours" / "corpus", vocab_file, workers, run_dir, timeout_s, on_line)
    started = time.monotonic()
    check = compare(run_dir / "ours" / "corpus_text_sentence", run_dir / "megatron" / "corpus_text_sentence", corpus)
    check["check_s"] = round(time.monotonic() - started, 3)
    info["tokens"], info["sentences"] = check.get("tokens"), check.get("sentences")
    for tool in (ours, megatron):
        tool.update(_rates(tool["wall_s"], docs, info["mb"]))
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": "python -m harness bench preprocess",
            "docs": docs, "mb": info["mb"], "tokens": info["tokens"], "workers": workers, "corpus": info,
            "ours": ours, "megatron_lm": megatron,
            "ratio": round(megatron["wall_s"] / ours["wall_s"], 2),
            "ratio_means": "Megatron-LM's total wall (both runs) / ours: above 1, ours is faster",
            "cpu_ratio": round(megatron["cpu_s"] / ours["cpu_s"], 2) if ours["cpu_s"] else None,
            "cpu_ratio_means": "the same for user+sys CPU seconds of each tool's processes: steadier on a busy host",
            "identical": check["identical"], "check": check, "versions": versions(checkout), "host": host(),
            "run_dir": str(run_dir)}


def summary(result: dict) -> str:
    """One line: size, both tools' wall and rates, the ratio, the identity verdict."""
    m, o = result["megatron_lm"], result["ours"]
    runs = " + ".join(f"{r['wall_s']:.1f}" for r in m["runs"])
    tokens = f"{result['tokens']:,} tokens" if result["tokens"] else "tokens unknown"
    verdict = "ids identical" if result["identical"] else "IDS DIFFER: " + result["check"]["message"]
    return (f"preprocess {result['docs']} docs ({result['mb']:.1f} MB, {tokens}), {result['workers']} workers: "
            f"ours {o['wall_s']:.1f} s ({o['docs_per_s']:,.0f} docs/s, {o['mb_per_s']:.3g} MB/s); "
            f"Megatron-LM {result['versions']['megatron_lm']} {m['wall_s']:.1f} s ({runs}; {m['docs_per_s']:,.0f} "
            f"docs/s, {m['mb_per_s']:.3g} MB/s); ratio {result['ratio']}x; {verdict}")


def main(argv=None) -> int:
    """CLI: exit 0 when the ids are identical, 1 when they differ or a tool fails, 2 on bad input."""
    p = argparse.ArgumentParser(prog="python -m harness bench preprocess", description=__doc__.splitlines()[0])
    p.add_argument("--megatron-lm", required=True, metavar="CHECKOUT", help="root of a Megatron-LM checkout")
    p.add_argument("--docs", type=int, default=DEFAULT_DOCS, help=f"documents in the corpus (default {DEFAULT_DOCS})")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="--workers of both tools (default: this host's CPU count)")
    p.add_argument("--out", type=Path, default=paths.RESULTS_DIR / "bench-preprocess.json")
    p.add_argument("--run-dir", type=Path, default=None, help="default: runs/bench-preprocess-<time>")
    p.add_argument("--vocab-file", type=Path, default=paths.VOCAB_FILE)
    p.add_argument("--timeout-s", type=float, default=TOOL_TIMEOUT_S, help="limit for each tool run")
    args = p.parse_args(argv)
    try:
        result = bench_preprocess(args.megatron_lm, args.docs, args.workers, args.run_dir, args.vocab_file,
                                  timeout_s=args.timeout_s)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(summary(result))
    print(f"written: {args.out}")
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
