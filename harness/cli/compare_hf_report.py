"""compare-hf's reports from compare.json's content: compare.md (every run's numbers and the table of differences
with its evidence), compare.png (the loss curves) and the student page (docs/megatron-vs-hf.md).

Every quoted text (a log line, a line of code, a path, a failure) goes through harness.report.gradebook's escaping
for Markdown; numbers are formatted by harness.cli.compare_hf_rows.fmt.
"""

from __future__ import annotations

import math
from pathlib import Path

from harness.cli.compare_hf_rows import fmt, final, first_loss, get, mib, pct
from harness.report.gradebook import md_cell, visible

RESULTS = "results/compare-hf"            # where the measured run is committed; the page links there
NAMES = {"megatron": "Megatron (reference trainer)", "megatron-eager": "Megatron, eager step",
         "hf": "Hugging Face (NSP)", "hf-sop": "Hugging Face (SOP pairs)"}


def code(value) -> str:
    """A Markdown code span of any text: one line, no backtick to close it early, nothing a renderer would run
    (a code span shows backslashes as they are, so Markdown escapes are not used in it)."""
    text = visible(" ".join(str(value or "").splitlines())).replace("`", "'")
    return "`" + text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") + "`"


def evidence_text(item: dict) -> str:
    """One evidence item for a reader (not yet escaped)."""
    if item.get("kind") == "source":
        if item.get("line") is None:
            return f"{item.get('file')}: not found ({item.get('not_found')})"
        return f"{item.get('file')}:{item.get('line')}: {item.get('text')}"
    value = item.get("value")
    shown = fmt(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if isinstance(shown, list):
        shown = ", ".join(map(str, shown))
    return f"{item.get('what')} = {'n/m' if shown is None else shown}"


# ---- the Markdown report -------------------------------------------------------------------------------
METRICS = (
    ("framework", lambda d, r: get(d, r, "framework")),
    ("binary task", lambda d, r: (get(d, r, "binary_task") or "").upper() or None),
    ("finished", lambda d, r: "yes" if get(d, r, "ok") else f"no: {get(d, r, 'failure')}"),
    ("first logged MLM loss (iteration)", lambda d, r: "{} ({})".format(fmt(first_loss(d, r)[1], 4),
                                                                       fmt(first_loss(d, r)[0]))),
    ("final MLM loss", lambda d, r: fmt(final(d, r, "mlm"), 4)),
    ("final binary-head loss", lambda d, r: fmt(final(d, r, "binary"), 4)),
    ("skipped steps (fp16 overflow)", lambda d, r: fmt(get(d, r, "skipped_steps"))),
    ("ms per iteration (median)", lambda d, r: fmt(get(d, r, "ms_per_iter_median"))),
    ("positions per second", lambda d, r: fmt(get(d, r, "tokens_per_s"))),
    ("real tokens per second", lambda d, r: fmt(get(d, r, "real_tokens_per_s"))),
    ("peak allocated / reserved (MiB)", lambda d, r: "{} / {}".format(
        fmt(get(d, r, "memory", "torch_max_allocated_mib"), 4), fmt(get(d, r, "memory", "torch_max_reserved_mib"), 4))),
    ("NVML peak, CUDA context included (MiB)", lambda d, r: fmt(get(d, r, "memory", "nvml_peak_mib"), 4)),
    ("parameters (vocab rows)", lambda d, r: "{} ({})".format(fmt(get(d, r, "parameters", "count")),
                                                              fmt(get(d, r, "parameters", "vocab_size")))),
    ("checkpoint", lambda d, r: None if not get(d, r, "checkpoint") else "{}: {}".format(
        get(d, r, "checkpoint", "format"), mib(get(d, r, "checkpoint", "bytes")))),
    ("wall time of the run (s)", lambda d, r: fmt(get(d, r, "wall_s"))),
)


def markdown(doc: dict) -> str:
    runs = list(doc.get("runs", {}))
    c = doc.get("config", {})
    out = ["# Megatron-LM and Hugging Face Transformers: the course's BERT side by side", "",
           f"{code(doc.get('command'))} on {md_cell(doc.get('date'))}, commit {md_cell(doc.get('commit'))}, "
           f"device {md_cell(_device(doc))}; {md_cell(_versions(doc))}.", "",
           f"The course's model and schedule on both sides: {c.get('num_layers')} layers, hidden {c.get('hidden_size')}, "
           f"{c.get('num_attention_heads')} heads, sequences of {c.get('seq_length')}, {c.get('global_batch_size')} "
           f"per step in micro-batches of {c.get('micro_batch_size')}, {c.get('train_iters')} iterations, lr "
           f"{c.get('lr')} (warmup {c.get('lr_warmup_fraction')} of {c.get('lr_decay_iters')}, down to "
           f"{c.get('min_lr')}), {'fp16' if c.get('fp16') else 'bf16' if c.get('bf16') else 'fp32'}"
           f"{' (fp32 on the CPU)' if c.get('device') == 'cpu' else ''}; extra flags: "
           f"{md_cell(' '.join(c.get('flags') or [])) or 'none'}. The Hugging Face side is BertForPreTraining in a "
           "plain PyTorch loop (no HF Trainer, so no accelerate), doing what the Trainer does by default.", ""]
    if not runs:
        out += ["**No run finished its setup**: " + md_cell(doc.get("stages")), ""]
    out += ["## The runs", "", "| | " + " | ".join(md_cell(NAMES.get(r, r)) for r in runs) + " |",
            "|---|" + "---|" * len(runs)]
    for label, value in METRICS:
        out.append(f"| {label} | " + " | ".join(md_cell(value(doc, r) if value(doc, r) is not None else "n/m")
                                                for r in runs) + " |")
    out += ["", "![MLM and binary-head losses of every run](compare.png)", "",
            "## What differs, and the evidence", "",
            "| aspect | Megatron side | Hugging Face side | the same? | evidence |", "|---|---|---|---|---|"]
    for r in doc.get("differences", []):
        evidence = "<br>".join(md_cell(evidence_text(e)) for e in r.get("evidence", []))
        out.append(f"| {md_cell(r.get('aspect'))} | {md_cell(r.get('megatron'))} | {md_cell(r.get('hf'))} | "
                   f"{md_cell(r.get('same'))} | {evidence} |")
    out += ["", "## The commands", ""]
    for r in runs:
        out.append(f"- {md_cell(NAMES.get(r, r))}: {code(get(doc, r, 'command'))}")
    return "\n".join(out) + "\n"


def _fp16(doc: dict) -> bool:
    """Both sides trained in fp16 on a GPU (the course's run), not the fp32 smoke mode."""
    return doc.get("device") == "cuda" and bool(doc.get("config", {}).get("fp16"))


def _fp16_and_memory(doc: dict) -> list[str]:
    m, h = "megatron", "hf"
    return [
        f"- **fp16.** Megatron starts its loss scale at 2^32 and skips {fmt(get(doc, m, 'skipped_steps'))} steps "
        f"while it comes down; GradScaler starts at 2^16 and skipped {fmt(get(doc, h, 'skipped_steps'))}.",
        f"- **Memory.** Peak allocated {fmt(get(doc, m, 'memory', 'torch_max_allocated_mib'), 4)} MiB (Megatron: fp16 "
        f"weights plus fp32 copies, its evaluations and CUDA graphs included) against "
        f"{fmt(get(doc, h, 'memory', 'torch_max_allocated_mib'), 4)} MiB (Hugging Face: fp32 weights, fp16 "
        "activations under autocast)."]


def _device(doc: dict) -> str:
    gpus = {get(doc, r, "gpu") for r in doc.get("runs", {})} - {None}
    return ", ".join(sorted(map(str, gpus))) or str(doc.get("device"))


def _versions(doc: dict) -> str:
    m, h = get(doc, "megatron", "versions") or {}, get(doc, "hf", "versions") or {}
    parts = [f"torch {h.get('torch') or m.get('torch')}", f"megatron-core {m.get('megatron_core')}",
             f"transformers {h.get('transformers')}", f"Python {h.get('python') or m.get('python')}"]
    return ", ".join(parts)


# ---- the picture ------------------------------------------------------------------------------------------
def draw(doc: dict, path: Path) -> None:
    """Two panels: every run's MLM loss, and its binary-head loss (SOP or NSP) with chance (ln 2) marked."""
    from harness.report.plot import _pyplot

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in doc.get("runs", {}):
        curve = get(doc, name, "curve") or {}
        short = visible(str(NAMES.get(name, name)))[:60].replace("$", r"\$")   # no mathtext from a name
        task = visible(str(get(doc, name, "binary_task") or "")).upper()[:10].replace("$", r"\$")
        label = f"{short} ({task})"
        for axis, key in ((left, "mlm"), (right, "binary")):
            points = [(i, v) for i, v in zip(curve.get("iteration", []), curve.get(key, []))
                      if isinstance(v, (int, float)) and math.isfinite(v)]
            if points:
                axis.plot(*zip(*points), marker=".", label=label if axis is right else short)
    right.axhline(math.log(2), color="grey", linestyle=":", label="chance (ln 2)")
    left.set(title="masked-LM loss", xlabel="iteration", ylabel="loss (interval mean)")
    right.set(title="binary head: SOP (Megatron) vs NSP (Hugging Face)", xlabel="iteration")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- the student page ---------------------------------------------------------------------------------
def page(doc: dict | None) -> str:
    """docs/megatron-vs-hf.md: short, for students, every number from compare.json (None: not measured yet)."""
    head = ["# Megatron-LM and Hugging Face Transformers, side by side", "",
            "[Back to the README](../README.md). The course's goal is to see how a Megatron-LM training script differs "
            "from a Hugging Face Transformers one. `python -m harness compare-hf --out compare` trains the course's "
            "BERT both ways on one GPU, one run after the other, and writes this comparison "
            "([commands](commands.md)): the Megatron side is the suite's reference trainer (megatron-core's BertModel, "
            "Megatron-LM's fp16 regime and log lines), the Hugging Face side BertForPreTraining in a plain PyTorch loop "
            "(no HF Trainer, so no accelerate), both on the same corpus, vocab and schedule.", ""]
    if doc is None:
        return "\n".join(head + [
            "**Not measured yet.** This page is generated from the measured run's compare.json, committed under "
            f"`{RESULTS}/` by [its GPU script](../{RESULTS}/gpu.sh); until then there are no numbers to show.", ""])
    m, h = "megatron", "hf"
    c = doc.get("config", {})
    it_m, first_m = first_loss(doc, m)
    it_h, first_h = first_loss(doc, h)
    body = [
        f"Measured on {md_cell(_device(doc))} on {md_cell(doc.get('date'))} (commit {md_cell(doc.get('commit'))}; "
        f"{md_cell(_versions(doc))}). The full report: [compare.md](../{RESULTS}/compare.md), every number in "
        f"[compare.json](../{RESULTS}/compare.json). The command: {code(doc.get('command'))}.", "",
        f"![MLM and binary-head losses](../{RESULTS}/compare.png)", "",
        "## What was the same", "",
        f"The model's sizes ({c.get('num_layers')} layers, hidden {c.get('hidden_size')}, "
        f"{c.get('num_attention_heads')} heads), the corpus and its WordPiece ids "
        f"({fmt(get(doc, h, 'tokenization', 'identical_to_megatron_tokenizer'))} of "
        f"{fmt(get(doc, h, 'tokenization', 'sentences'))} sentences identical), "
        f"{fmt(get(doc, h, 'batches', 'positions_per_step'))} token positions per step, the masking rate "
        f"({pct(get(doc, m, 'batches', 'predicted_fraction_of_maskable'))} and "
        f"{pct(get(doc, h, 'batches', 'predicted_fraction_of_maskable'))} of the maskable tokens predicted), AdamW, "
        f"clipping, and the learning-rate schedule (the Hugging Face LambdaLR is off Megatron's formula by at most "
        f"{fmt((doc.get('schedule') or {}).get('lambda_lr_max_rel_error'))}, relative).", "",
        "## What the numbers say", "",
        f"- **Loss.** Masked-LM loss {fmt(first_m, 4)} at iteration {fmt(it_m)} -> {fmt(final(doc, m, 'mlm'), 4)} "
        f"with Megatron, {fmt(first_h, 4)} at iteration {fmt(it_h)} -> {fmt(final(doc, h, 'mlm'), 4)} with Hugging "
        f"Face. Binary head: SOP {fmt(final(doc, m, 'binary'), 3)} (Megatron), NSP {fmt(final(doc, h, 'binary'), 3)} "
        "(Hugging Face)"
        + (f", SOP pairs on the Hugging Face model {fmt(final(doc, 'hf-sop', 'binary'), 3)}"
           if get(doc, 'hf-sop', 'curve') else "") + "; chance is 0.693.",
        *(_fp16_and_memory(doc) if _fp16(doc) else [
            "- **Precision.** fp32 on both sides (a run without a GPU): no loss scaling, no memory measured."]),
        f"- **Speed.** {fmt(get(doc, m, 'ms_per_iter_median'))} ms per iteration for Megatron's step "
        + ("captured as one CUDA graph" if get(doc, m, "cuda_graphs") else "(eager)")
        + (f" ({fmt(get(doc, 'megatron-eager', 'ms_per_iter_median'))} ms eager)"
           if get(doc, 'megatron-eager', 'ms_per_iter_median') else "")
        + f", {fmt(get(doc, h, 'ms_per_iter_median'))} ms for the eager Hugging Face loop, of which "
        f"{fmt(get(doc, h, 'data_ms_per_iter_median'))} ms go to drawing and masking its batches.",
        f"- **Parameters.** {fmt(get(doc, m, 'parameters', 'count'))} in Megatron, whose vocab is padded to "
        f"{fmt(get(doc, m, 'parameters', 'vocab_size'))} rows (a multiple of 128), against "
        f"{fmt(get(doc, h, 'parameters', 'count'))} with the tokenizer's {fmt(get(doc, h, 'parameters', 'vocab_size'))}; "
        f"at Megatron's vocab the Hugging Face model has {fmt(get(doc, h, 'parameters', 'count_at_megatron_vocab'))}.",
        f"- **Checkpoints.** Megatron's torch_dist folder {mib(get(doc, m, 'checkpoint', 'bytes'))} (sharded, with "
        f"fp32 copies and Adam moments); Hugging Face's model.safetensors {mib(get(doc, h, 'checkpoint', 'weights_bytes'))}"
        f", {mib(get(doc, h, 'checkpoint', 'bytes'))} with the optimizer's state.", "",
        "## What differs", "", "| | Megatron-LM | Hugging Face | the same? |", "|---|---|---|---|"]
    for r in doc.get("differences", []):
        brief = r.get("brief") or {}
        body.append(f"| {md_cell(r.get('aspect'))} | {md_cell(brief.get('megatron', r.get('megatron')))} | "
                    f"{md_cell(brief.get('hf', r.get('hf')))} | {md_cell(r.get('same'))} |")
    body += ["", "Each row's evidence (a measured number, or the line of code it comes from) is in "
             f"[compare.md](../{RESULTS}/compare.md).", ""]
    return "\n".join(head + body)
