"""compare-hf's table of differences: each row what the Megatron side and the Hugging Face side do, with their
numbers, whether it is the same, and its evidence (measured numbers from compare.json, lines of code found by their
text when the table is made, so a line number is the file's own; one that is not found says so instead of quoting a
wrong line). Also the schedule check and the small readers of compare.json's content that the reports share.
"""

from __future__ import annotations

import math
from pathlib import Path

from harness.base import paths

SCHEMA = 1


# ---- evidence ---------------------------------------------------------------------------------------------
def cite(rel: str, needle: str, root: Path | None = None) -> dict:
    """A line of code as evidence: the first line of `rel` (under the repo, or `root`) that contains `needle`."""
    base = root or paths.REPO
    path = base / rel
    try:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if needle in line:
                return {"kind": "source", "file": rel, "line": number, "text": line.strip()}
    except OSError:
        pass
    return {"kind": "source", "file": rel, "line": None, "text": None, "not_found": needle}


def cite_package(package: str, rel: str, needle: str) -> dict:
    """A line of an installed package (megatron-core, transformers), found without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        found = cite(rel, needle, Path(root))
        if found["line"] is not None:
            return {**found, "file": f"{package}/{rel}"}
    return {"kind": "source", "file": f"{package}/{rel}", "line": None, "text": None, "not_found": needle}


def measured(what: str, value) -> dict:
    return {"kind": "measured", "what": what, "value": value}


def get(doc: dict, run: str, *keys):
    """doc["runs"][run][k1][k2]..., None where any step is missing."""
    value = doc.get("runs", {}).get(run)
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def fmt(value, digits: int = 3, unit: str = "") -> str:
    """A number for a reader: `digits` significant digits, thousands separated; n/m when not measured."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/m" if value is None else str(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 1000):
        text = f"{int(value):,}"
    else:
        text = f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:,.0f}"
    return text + unit


def mib(n) -> str:
    return fmt(n / 2**20, 3, " MiB") if isinstance(n, (int, float)) else "n/m"


def final(doc: dict, run: str, key: str):
    """The last logged interval mean of a curve (mlm or binary)."""
    values = [v for v in (get(doc, run, "curve", key) or []) if v is not None]
    return values[-1] if values else None


def first_loss(doc: dict, run: str) -> tuple:
    """(iteration, mlm) of the first logged line with an mlm loss."""
    curve = get(doc, run, "curve") or {}
    for it, value in zip(curve.get("iteration", []), curve.get("mlm", [])):
        if value is not None:
            return it, value
    return None, None


# ---- the schedule ---------------------------------------------------------------------------------------
def cumulative_skips(iterations: list, skipped: list, interval: int) -> list:
    """Skipped steps up to each logged line: Megatron's counters are reset at multiples of --log-interval only, so
    the iteration-1 line's skip is counted again in the next line."""
    out, total = [], 0
    for it, s in zip(iterations, skipped):
        if it % interval == 0:
            total += s or 0
            out.append(total)
        else:
            out.append(total + (s or 0))
    return out


def schedule_check(course, runs: dict) -> dict:
    """The two schedules against Megatron's formula (harness.train.schedule.LrSchedule): the Hugging Face LambdaLR at
    every step count of the run, and every logged learning rate at its run's count of steps not skipped."""
    import torch

    from harness.train.hf_bert import lr_scheduler
    from harness.train.schedule import LrSchedule

    schedule = LrSchedule.from_args(course)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=course.lr)
    lambda_lr = lr_scheduler(optimizer, course)
    worst = 0.0
    for steps in range(course.train_iters + 1):
        if steps:
            optimizer.step()
            lambda_lr.step()
        worst = max(worst, _rel(optimizer.param_groups[0]["lr"], schedule.lr_host(steps)))
    out = {"steps_checked": course.train_iters + 1, "lambda_lr_max_rel_error": worst, "logged": {}}
    for name, run in runs.items():
        curve = run.get("curve") or {}
        its, lrs = curve.get("iteration") or [], curve.get("learning_rate") or []
        if not its or any(s is None for s in curve.get("skipped") or [None]):
            continue
        skips = cumulative_skips(its, curve["skipped"], course.log_interval)
        errors = [_rel(lr, schedule.lr_host(it - k)) for it, lr, k in zip(its, lrs, skips) if lr is not None]
        out["logged"][name] = {"lines": len(errors), "max_rel_error": max(errors) if errors else None}
    return out


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a - b)


# ---- the differences ------------------------------------------------------------------------------------
def differences(doc: dict) -> list[dict]:
    """The rows of the table: aspect, what each side does (with its numbers), whether it is the same, evidence."""
    c = doc.get("config", {})
    m, h = "megatron", "hf"
    stats_m, stats_h = get(doc, m, "batches") or {}, get(doc, h, "batches") or {}
    rows = []

    gpu = doc.get("device") == "cuda"
    where = "the GPU" if gpu else "the device"

    def row(aspect, brief, megatron, hf, same, *evidence):
        rows.append({"aspect": aspect, "megatron": megatron, "hf": hf, "same": same, "evidence": list(evidence),
                     "brief": {"megatron": brief[0], "hf": brief[1]}})

    tok = get(doc, h, "tokenization") or {}
    row("tokenization",
        ("WordPiece ids written once to .bin/.idx by a preprocessing step",
         f"BertTokenizerFast in the training process: {fmt(tok.get('identical_to_megatron_tokenizer'))} of "
         f"{fmt(tok.get('sentences'))} sentences get the same ids"),
        f"Megatron's legacy BERT WordPiece (harness.data.tokenizer), lower case, run once by the preprocessing step; "
        f"vocab {fmt(get(doc, m, 'parameters', 'vocab_size_unpadded'))} tokens (the file plus [BOS] and [EOS])",
        f"transformers' BertTokenizerFast on the same vocab.txt ({fmt(get(doc, h, 'parameters', 'vocab_size'))} "
        f"tokens), run in the training process: {fmt(tok.get('identical_to_megatron_tokenizer'))} of "
        f"{fmt(tok.get('sentences'))} sentences get the same ids",
        "yes" if tok and tok.get("identical_to_megatron_tokenizer") == tok.get("sentences") else "no",
        measured("runs.hf.tokenization.identical_to_megatron_tokenizer", tok.get("identical_to_megatron_tokenizer")),
        measured("runs.hf.tokenization.sentences", tok.get("sentences")),
        cite("harness/train/hf_data.py", "BertTokenizerFast.from_pretrained("),
        cite("harness/train/trainer.py", "MegatronBertTokenizer.from_type("))
    pm, ph = get(doc, m, "parameters") or {}, get(doc, h, "parameters") or {}
    pad_rows = (pm.get("vocab_size") or 0) - (ph.get("vocab_size") or 0)
    row("vocabulary and parameters",
        (f"{fmt(pm.get('vocab_size'))} vocab rows (padded to a multiple of 128): {fmt(pm.get('count'))} parameters",
         f"{fmt(ph.get('vocab_size'))} rows: {fmt(ph.get('count'))} parameters "
         f"({fmt(ph.get('count_at_megatron_vocab'))} at {fmt(ph.get('megatron_vocab_size'))} rows)"),
        f"vocab padded to {fmt(pm.get('vocab_size'))} rows (a multiple of {c.get('make_vocab_size_divisible_by')} "
        f"for tensor parallelism): {fmt(pm.get('count'))} parameters",
        f"{fmt(ph.get('vocab_size'))} rows, no padding: {fmt(ph.get('count'))} parameters; the same model at "
        f"Megatron's {fmt(ph.get('megatron_vocab_size'))} rows: {fmt(ph.get('count_at_megatron_vocab'))}",
        "no: the padding rows only" if pm.get("count") and pm.get("count") == ph.get("count_at_megatron_vocab")
        else "no",
        measured("runs.megatron.parameters.count", pm.get("count")),
        measured("runs.hf.parameters.count", ph.get("count")),
        measured("runs.hf.parameters.count_at_megatron_vocab", ph.get("count_at_megatron_vocab")),
        measured("padding rows x (hidden + 1 output bias)", pad_rows * (c.get("hidden_size", 0) + 1)),
        cite("harness/train/trainer.py", "def padded_vocab_size("))
    data_h = get(doc, h, "data") or {}
    row("data pipeline",
        (f"megatron-core's BERTMaskedWordPieceDataset over .bin/.idx; every batch on {where} before the first step",
         f"pairs built once in the training process, a DataLoader and the masking collator in every step "
         f"({fmt(get(doc, h, 'data_ms_per_iter_median'))} ms of it)"),
        f"a separate step writes the corpus's token ids to .bin/.idx ({fmt(get_stage(doc, 'data'))} s with the "
        f"corpus); megatron-core's BERTMaskedWordPieceDataset indexes {fmt(stats_m.get('samples_in_index'))} samples "
        f"of 2 segments each; every training batch is on {where} before the first step",
        f"the JSON corpus read (by the json module: a script would often use the datasets library, which this "
        f"one does not need), tokenized and paired in the training process ({fmt(data_h.get('build_s'))} s): "
        f"{fmt(data_h.get('examples'))} sentence pairs built once, reshuffled by a DataLoader every epoch "
        f"({fmt(get(doc, h, 'epochs_started'))} epochs started); drawing and masking a step's batches: "
        f"{fmt(get(doc, h, 'data_ms_per_iter_median'))} ms of each step",
        "no",
        measured("stages.data.seconds", get_stage(doc, "data")),
        measured("runs.hf.data.build_s", data_h.get("build_s")),
        measured("runs.hf.data_ms_per_iter_median", get(doc, h, "data_ms_per_iter_median")),
        cite("harness/train/data.py", "BERTMaskedWordPieceDataset, [counts.train"),
        cite("harness/train/trainer.py", "self.train.preload(first_batch"),
        cite("harness/train/hf_data.py", "self.loader = DataLoader("))
    row("masking",
        (f"static, whole words in n-grams of up to 3: {fmt(stats_m.get('predicted_per_step'))} predicted per step",
         f"dynamic, token by token: {fmt(stats_h.get('predicted_per_step'))} predicted per step"),
        f"static: each sample's masks are fixed by its index (seed + index), whole words in n-grams of up to 3, "
        f"round(15%) of a sample's tokens: {fmt(stats_m.get('predicted_per_step'))} predicted tokens per step "
        f"({pct(stats_m.get('predicted_fraction_of_maskable'))} of the maskable ones), shown as [MASK] / itself / "
        f"random {pct(stats_m.get('shown_as_mask'))} / {pct(stats_m.get('shown_as_original'))} / "
        f"{pct(stats_m.get('shown_as_random'))}",
        f"dynamic: DataCollatorForLanguageModeling draws every token with p = {c.get('mask_prob')} each time a "
        f"batch is formed: {fmt(stats_h.get('predicted_per_step'))} per step "
        f"({pct(stats_h.get('predicted_fraction_of_maskable'))}), shown {pct(stats_h.get('shown_as_mask'))} / "
        f"{pct(stats_h.get('shown_as_original'))} / {pct(stats_h.get('shown_as_random'))}",
        "rate and 80/10/10: yes; method: no",
        measured("runs.megatron.batches.predicted_per_step", stats_m.get("predicted_per_step")),
        measured("runs.hf.batches.predicted_per_step", stats_h.get("predicted_per_step")),
        cite("harness/train/data.py", "masking_max_ngram=3"),
        cite("harness/train/hf_data.py", "DataCollatorForLanguageModeling(tokenizer=tokenizer"))
    row("tokens per step",
        (f"{fmt(stats_m.get('positions_per_step'))} positions ({fmt(stats_m.get('real_tokens_per_step'))} real)",
         f"{fmt(stats_h.get('positions_per_step'))} positions ({fmt(stats_h.get('real_tokens_per_step'))} real)"),
        f"{c.get('global_batch_size')} sequences x {c.get('seq_length')} = "
        f"{fmt(stats_m.get('positions_per_step'))} positions, {fmt(stats_m.get('real_tokens_per_step'))} of them "
        "real tokens (the rest padding)",
        f"{fmt(stats_h.get('positions_per_step'))} positions ({c.get('micro_batch_size')} per micro-batch, "
        f"gradients accumulated over {c.get('global_batch_size', 0) // max(c.get('micro_batch_size', 1), 1)}), "
        f"{fmt(stats_h.get('real_tokens_per_step'))} real tokens",
        "yes" if stats_m.get("positions_per_step") and stats_m.get("positions_per_step") ==
        stats_h.get("positions_per_step") else "no",
        measured("runs.megatron.batches.positions_per_step", stats_m.get("positions_per_step")),
        measured("runs.hf.batches.positions_per_step", stats_h.get("positions_per_step")),
        cite("harness/train/hf_bert.py", "self.accumulation = args.global_batch_size // args.micro_batch_size"))
    sop = get(doc, "hf-sop", "curve") is not None
    row("binary head",
        (f"sentence order (SOP): final loss {fmt(final(doc, m, 'binary'))}",
         f"next sentence (NSP): final loss {fmt(final(doc, h, 'binary'))}"
         + (f"; on SOP pairs {fmt(final(doc, 'hf-sop', 'binary'))}" if sop else "")),
        f"sentence-order prediction (SOP): A and B are consecutive segments of one document, swapped half the time; "
        f"final loss {fmt(final(doc, m, 'binary'))} ({pct(stats_m.get('binary_label_ones'))} of labels 1)",
        f"next-sentence prediction (NSP), BertForPreTraining's task: B is the real continuation, or half the time "
        f"sentences of another document; final loss {fmt(final(doc, h, 'binary'))} "
        f"({pct(stats_h.get('binary_label_ones'))} of labels 1)"
        + (f"; the same model on SOP pairs: {fmt(final(doc, 'hf-sop', 'binary'))}" if sop else ""),
        "cannot be equal: the task differs, and the pairs are cut by different code (Megatron's sample index, "
        "Google's create_instances_from_document); chance is ln 2 = 0.693",
        measured("runs.megatron.curve.binary[-1]", final(doc, m, "binary")),
        measured("runs.hf.curve.binary[-1]", final(doc, h, "binary")),
        *([measured("runs.hf-sop.curve.binary[-1]", final(doc, "hf-sop", "binary"))] if sop else []),
        cite_package("megatron", "core/datasets/bert_dataset.py", "split_A, split_B = split_B, split_A"),
        cite("harness/train/hf_data.py", "other = rng.randint(0, len(documents) - 1)"))
    model_h = get(doc, h, "model") or {}
    row("layer order and initialisation",
        ("pre-LayerNorm; the layers' output projections initialised smaller",
         "post-LayerNorm; every weight normal(0, 0.02)"),
        "pre-LayerNorm (megatron-core's BERT layer spec: a LayerNorm before attention and before the MLP, one after "
        "the last layer); GELU tanh approximation; LayerNorm eps 1e-5; the two output projections of every layer "
        "initialised with std 0.02 / sqrt(2 x layers)",
        f"post-LayerNorm (BertLayer: a LayerNorm after each residual sum, one after the embeddings: "
        f"{len(model_h.get('layernorm_weights') or [])} LayerNorms); GELU {model_h.get('hidden_act')} and eps "
        f"{model_h.get('layer_norm_eps')} set equal through BertConfig; every weight normal(0, 0.02)",
        "no: BertForPreTraining has no switch for the layer order or the scaled initialisation",
        measured("runs.hf.model.layernorm_weights", model_h.get("layernorm_weights")),
        cite("harness/train/trainer.py", "transformer_layer_spec=bert_layer_local_spec"),
        cite("harness/train/hf_bert.py", 'hidden_act="gelu_new"'),
        cite_package("transformers", "models/bert/modeling_bert.py", "self.LayerNorm(hidden_states + input_tensor)"))
    row("attention kernel",
        ("local (unfused)", f"{model_h.get('attn_implementation')}"),
        "megatron-core's local (unfused) DotProductAttention, softmax in fp16",
        f"transformers' {model_h.get('attn_implementation')} attention",
        "no",
        measured("runs.hf.model.attn_implementation", model_h.get("attn_implementation")),
        cite("harness/train/trainer.py", "attention_backend=AttnBackend.local"))
    row("parallel-state initialisation",
        ("a process group, initialize_model_parallel, model-parallel RNG seeds", "none"),
        f"a torch.distributed process group, megatron-core's initialize_model_parallel (tensor and pipeline size 1) "
        f"and its model-parallel RNG seeding before the model exists: done {fmt(get(doc, m, 'initialized_s'))} s "
        "after start",
        f"none: one process, torch.manual_seed; the model, data and optimizer ready "
        f"{fmt(get(doc, h, 'setup_s'))} s after start",
        "no",
        measured("runs.megatron.initialized_s", get(doc, m, "initialized_s")),
        measured("runs.hf.setup_s", get(doc, h, "setup_s")),
        cite("harness/train/trainer.py", "parallel_state.initialize_model_parallel("),
        cite("harness/train/hf_bert.py", "torch.manual_seed(args.seed)"))
    prec = get(doc, h, "precision") or {}
    it_m, _ = first_loss(doc, m)
    it_h, _ = first_loss(doc, h)
    fp16 = gpu and c.get("fp16")
    row("fp16 and loss scaling",
        (f"fp16 weights, loss scale from 2^32 with hysteresis: {fmt(get(doc, m, 'skipped_steps'))} steps skipped"
         if fp16 else "fp32 (no loss scaling)",
         f"fp32 weights under autocast, GradScaler from 2^16: {fmt(get(doc, h, 'skipped_steps'))} steps skipped"
         if prec.get("grad_scaler") else "fp32 (no loss scaling)"),
        (f"fp16 parameters (Float16Module) with fp32 copies in the optimizer; dynamic loss scale from 2^32, halved "
         f"after 2 overflowing steps (hysteresis), doubled after 1000 clean ones; every overflowing step skipped: "
         f"{fmt(get(doc, m, 'skipped_steps'))} of {c.get('train_iters')} steps, first logged loss at iteration "
         f"{fmt(it_m)}") if fp16 else "fp32 parameters and arithmetic (the CPU smoke mode): no loss scale",
        (f"{prec.get('parameters_dtype')} parameters, torch.autocast({prec.get('autocast')}); GradScaler from "
         f"{fmt(prec.get('init_scale'))}, halved at each overflow, doubled after {fmt(prec.get('growth_interval'))} "
         f"clean steps: {fmt(get(doc, h, 'skipped_steps'))} steps skipped, first logged loss at iteration "
         f"{fmt(it_h)}") if prec.get("grad_scaler") else
        f"{prec.get('parameters_dtype')} parameters, no autocast, GradScaler off",
        "no" if fp16 else "yes: fp32 on both sides",
        measured("runs.megatron.skipped_steps", get(doc, m, "skipped_steps")),
        measured("runs.hf.skipped_steps", get(doc, h, "skipped_steps")),
        cite("harness/train/trainer.py", "model = Float16Module(config, model)"),
        cite("harness/train/hf_bert.py", "self.scaler = torch.amp.GradScaler("))
    row("optimizer and clipping",
        (f"AdamW arithmetic, no decay on biases and 1-D weights, clipping at {c.get('clip_grad')}",
         f"torch.optim.AdamW, the same groups and numbers, clipping at {c.get('clip_grad')}"),
        f"Adam with decoupled weight decay (torch's AdamW arithmetic on one flat fp32 buffer), betas "
        f"({c.get('adam_beta1')}, {c.get('adam_beta2')}), eps {c.get('adam_eps')}, weight decay "
        f"{c.get('weight_decay')}, none on biases and 1-D weights; global-norm clipping at {c.get('clip_grad')} on "
        "the fp32 gradients",
        f"torch.optim.AdamW with the same numbers; two groups, none on biases and LayerNorm weights "
        f"({fmt(get(doc, h, 'parameters', 'without_weight_decay'))} parameters); clip_grad_norm_ at "
        f"{c.get('clip_grad')} after scaler.unscale_",
        "yes",
        measured("runs.hf.parameters.without_weight_decay", get(doc, h, "parameters", "without_weight_decay")),
        cite("harness/train/step.py", 'no_decay = name.endswith(".bias") or p.dim() == 1'),
        cite("harness/train/hf_bert.py", "self.optimizer = torch.optim.AdamW("))
    sched = doc.get("schedule") or {}
    logged = sched.get("logged") or {}
    warmup = (c.get("lr_warmup_fraction") or 0) * (c.get("lr_decay_iters") or 0)
    row("learning-rate schedule",
        ("OptimizerParamScheduler", "LambdaLR with the same formula"),
        f"OptimizerParamScheduler: from 0 up to {c.get('lr')} over {fmt(warmup)} steps, {c.get('lr_decay_style')} "
        f"down to {c.get('min_lr')} at step {c.get('lr_decay_iters')}, then constant; steps only after a step that "
        f"was not skipped (logged rates off the formula by at most {fmt(_logged_error(logged, m))})",
        f"a LambdaLR with the same formula (off Megatron's by at most "
        f"{fmt(sched.get('lambda_lr_max_rel_error'))} over {fmt(sched.get('steps_checked'))} step counts), stepped "
        f"only after a step that was not skipped (logged rates: {fmt(_logged_error(logged, h))}); with fewer "
        "skipped steps it runs that many steps ahead",
        "yes",
        measured("schedule.lambda_lr_max_rel_error", sched.get("lambda_lr_max_rel_error")),
        measured("schedule.logged.megatron.max_rel_error", _logged_error(logged, m)),
        measured("schedule.logged.hf.max_rel_error", _logged_error(logged, h)),
        cite("harness/train/hf_bert.py", "return LambdaLR(optimizer"),
        cite("harness/train/schedule.py", "class LrSchedule"))
    eager = get(doc, "megatron-eager", "ms_per_iter_median")
    graph = bool(get(doc, m, "cuda_graphs"))
    how = ("the whole step (forward, backward, unscale, clip, Adam, loss scale) captured as one CUDA graph" if graph
           else "the step eager (no CUDA graph on this run)")
    row("the step",
        (("one CUDA graph: " if graph else "eager: ") + f"{fmt(get(doc, m, 'ms_per_iter_median'))} ms per iteration"
         + (f" ({fmt(eager)} ms eager)" if eager else ""),
         f"eager: {fmt(get(doc, h, 'ms_per_iter_median'))} ms per iteration"),
        f"{how}: {fmt(get(doc, m, 'ms_per_iter_median'))} ms per iteration, {fmt(get(doc, m, 'tokens_per_s'))} "
        "positions/s" + (f"; the same step eager: {fmt(eager)} ms" if eager else ""),
        f"eager PyTorch, the batch drawn and masked inside the step and a host sync per step for the skip check: "
        f"{fmt(get(doc, h, 'ms_per_iter_median'))} ms per iteration, {fmt(get(doc, h, 'tokens_per_s'))} positions/s",
        "no: one CUDA graph against eager PyTorch" if graph else "no CUDA graph on either side",
        measured("runs.megatron.ms_per_iter_median", get(doc, m, "ms_per_iter_median")),
        *([measured("runs.megatron-eager.ms_per_iter_median", eager)] if eager else []),
        measured("runs.hf.ms_per_iter_median", get(doc, h, "ms_per_iter_median")),
        cite("harness/train/trainer.py", "self.graphs = self.engine.capture("),
        cite("harness/train/hf_bert.py", "skipped = self.scaler.get_scale() < before"))
    mem_m, mem_h = get(doc, m, "memory") or {}, get(doc, h, "memory") or {}
    row("GPU memory",
        (f"{fmt(mem_m.get('torch_max_allocated_mib'), 4)} MiB peak allocated",
         f"{fmt(mem_h.get('torch_max_allocated_mib'), 4)} MiB peak allocated"),
        f"peak allocated {fmt(mem_m.get('torch_max_allocated_mib'), 4)} MiB, reserved "
        f"{fmt(mem_m.get('torch_max_reserved_mib'), 4)} MiB (fp16 weights and gradients, fp32 copies, Adam moments, "
        f"the CUDA graphs' pools, its evaluations included: the Hugging Face loop evaluates nothing); NVML, CUDA context included: {fmt(mem_m.get('nvml_peak_mib'), 4)} MiB",
        f"peak allocated {fmt(mem_h.get('torch_max_allocated_mib'), 4)} MiB, reserved "
        f"{fmt(mem_h.get('torch_max_reserved_mib'), 4)} MiB (fp32 weights and gradients, Adam moments, fp16 "
        f"activations); NVML: {fmt(mem_h.get('nvml_peak_mib'), 4)} MiB",
        "no" if gpu else "not measured: no GPU",
        measured("runs.megatron.memory.torch_max_allocated_mib", mem_m.get("torch_max_allocated_mib")),
        measured("runs.hf.memory.torch_max_allocated_mib", mem_h.get("torch_max_allocated_mib")),
        measured("device", doc.get("device")))
    row("logging",
        ("Megatron-LM's iteration line", "one JSON object per interval (log_history)"),
        f"Megatron-LM's iteration line every {c.get('log_interval')} iterations, the interval's mean losses over "
        f"its steps that were not skipped: {get(doc, m, 'log_line') or 'n/m'}",
        f"one JSON object per interval (the Trainer's log_history), the same means: "
        f"{get(doc, h, 'log_line') or 'n/m'}",
        "no: same numbers, other format",
        measured("runs.megatron.log_line", get(doc, m, "log_line")),
        measured("runs.hf.log_line", get(doc, h, "log_line")))
    ck_m, ck_h = get(doc, m, "checkpoint") or {}, get(doc, h, "checkpoint") or {}
    row("checkpoints",
        (f"{ck_m.get('format') or 'n/m'} folder: {mib(ck_m.get('bytes'))}",
         f"model.safetensors {mib(ck_h.get('weights_bytes'))}, {mib(ck_h.get('bytes'))} with the optimizer's state"),
        f"{ck_m.get('format') or 'n/m'}: iter_{int(ck_m.get('iteration') or 0):07d}/, {fmt(ck_m.get('files'))} "
        f"files, {mib(ck_m.get('bytes'))} (fp16 weights, fp32 main weights, Adam moments, RNG states, sharded "
        f"for any parallel layout), saved in {fmt(ck_m.get('save_s'))} s",
        f"checkpoint-{ck_h.get('iteration') or 'n/m'}/: model.safetensors {mib(ck_h.get('weights_bytes'))} "
        f"(fp32 weights, the tied embedding once) + optimizer.pt, scheduler.pt, scaler.pt, rng_state.pth: "
        f"{fmt(ck_h.get('files'))} files, {mib(ck_h.get('bytes'))}, saved in {fmt(ck_h.get('save_s'))} s",
        "no",
        measured("runs.megatron.checkpoint.bytes", ck_m.get("bytes")),
        measured("runs.hf.checkpoint.bytes", ck_h.get("bytes")),
        measured("runs.hf.checkpoint.weights_bytes", ck_h.get("weights_bytes")),
        cite("harness/train/ckpt.py", "def save("),
        cite("harness/train/hf_bert.py", "self.model.save_pretrained("))
    return rows


def get_stage(doc: dict, name: str):
    return (doc.get("stages", {}).get(name) or {}).get("seconds")


def pct(value) -> str:
    return "n/m" if value is None else f"{100.0 * value:.1f}%"


def _logged_error(logged: dict, run: str):
    return (logged.get(run) or {}).get("max_rel_error")
