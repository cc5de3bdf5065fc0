"""The reference trainer's loop: the course's BERT recipe on pip megatron-core, with Megatron-LM's log lines.

Entry point: `python -m harness train` (harness/train/__main__.py keeps the main module light).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from harness.base.imports import import_megatron_core
from harness.train import ckpt as train_ckpt
from harness.evidence.logformat import format_arguments, format_datetime_marker
from harness.base.proc import LOAD_READY_MARKER, LOAD_WAIT_MARKER, free_port
from harness.train.args import parse_args
from harness.train.data import BatchSource, SampleCounts, build_datasets
from harness.train.fusions import use_eager_bias_gelu
from harness.train.step import BATCH_KEYS, StepEngine
from harness.evidence.checkpoints.inspector import TRACKER_FILE, failed_marker


# ---- output: Megatron prints most lines on rank 0 and the iteration line on the last rank ----------
def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _world() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def parallel_sizes() -> dict:
    """The run's layout as Megatron names it: tensor-, pipeline-, data-parallel size and world size."""
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return {"world_size": _world()}
    return {"tensor_model_parallel_size": ps.get_tensor_model_parallel_world_size(),
            "pipeline_model_parallel_size": ps.get_pipeline_model_parallel_world_size(),
            "data_parallel_size": ps.get_data_parallel_world_size(), "world_size": _world()}


def _write_line(line: str) -> None:
    """One line in one write() call: ranks sharing torchrun's stdout pipe cannot interleave inside it."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def log(line: str) -> None:
    if _rank() == 0:
        _write_line(line)


def log_last(line: str) -> None:
    if _rank() == _world() - 1:
        _write_line(line)


# ---- setup -------------------------------------------------------------------------------------------
def init_distributed(args) -> torch.device:
    """torch.distributed + megatron-core parallel state; works alone or under torchrun."""
    from megatron.core import parallel_state

    # One process, not under torchrun: an in-process store, so no TCP port is picked that another run starting
    # at the same moment could take first (EADDRINUSE at start-up).
    alone = "MASTER_PORT" not in os.environ and os.environ.get("WORLD_SIZE", "1") == "1"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if not alone:
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("CUDA is not available: no GPU visible to torch "
                             f"(torch {torch.__version__}, CUDA build {torch.version.cuda}). "
                             "Run on a GPU machine, or use --device cpu for the smoke mode.")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        if args.memory_cap_gb:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap_gb * 2**30 / total), device)
    else:
        from harness.train.cpu_shims import apply_cpu_shims

        apply_cpu_shims()
        device = torch.device("cpu")
    if alone:
        torch.distributed.init_process_group(backend=args.distributed_backend, store=torch.distributed.HashStore(),
                                             rank=0, world_size=1)
    else:
        torch.distributed.init_process_group(backend=args.distributed_backend)
    parallel_state.initialize_model_parallel(args.tensor_model_parallel_size, args.pipeline_model_parallel_size)
    return device


def seed_everything(args, device) -> list:
    """Megatron's model_parallel_cuda_manual_seed; returns the RNG generators a CUDA graph must register."""
    import random

    import numpy as np
    from megatron.core import tensor_parallel

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if device.type != "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(args.seed, inference_rng_tracker=True, force_reset_rng=True)
        return []
    graphable = args.cuda_graph != "off"
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed, use_cudagraphable_rng=graphable)
    return list(tensor_parallel.get_cuda_rng_tracker().get_states().values()) if graphable else []


def padded_vocab_size(orig: int, args) -> int:
    multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    return ((orig + multiple - 1) // multiple) * multiple


def build_model(args, vocab_size: int, device):
    from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
    from megatron.core.models.bert.bert_model import BertModel
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    log("building BERT model ...")
    fp16 = args.fp16 and device.type == "cuda"  # the CPU smoke mode stays fp32
    use_eager_bias_gelu()
    config = TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads, hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout, init_method_std=args.init_method_std,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        use_cpu_initialization=device.type != "cuda", fp16=fp16, params_dtype=torch.half if fp16 else torch.float32,
        attention_backend=AttnBackend.local, persist_layer_norm=False, masked_softmax_fusion=False,
        bias_dropout_fusion=False, gradient_accumulation_fusion=False, layernorm_epsilon=1e-5,
        # Megatron-LM's defaults for these flags (its arguments, not TransformerConfig's)
        attention_softmax_in_fp32=False, bias_activation_fusion=True,
        cuda_graph_scope=[],  # megatron-core's default "full" is deprecated (a warning in every log); [] means the same
    )
    model = BertModel(
        config=config, transformer_layer_spec=bert_layer_local_spec, vocab_size=vocab_size,
        max_sequence_length=args.max_position_embeddings, num_tokentypes=2 if args.bert_binary_head else 0,
        add_binary_head=args.bert_binary_head, share_embeddings_and_output_weights=True, parallel_output=True,
    ).to(device)
    if fp16:  # Megatron-LM's --fp16: fp16 parameters and activations, fp32 outputs
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(config, model)
    from megatron.core import parallel_state as ps

    n = sum(p.numel() for p in model.parameters())
    print(f" > number of parameters on (tensor, pipeline) model parallel rank "
          f"({ps.get_tensor_model_parallel_rank()}, {ps.get_pipeline_model_parallel_rank()}): {n}", flush=True)
    return model


def prewarm_checkpoint_writer() -> None:
    """Start dist_checkpointing's result-queue manager process now, as a fork of this process.

    The first torch_dist save would spawn a manager interpreter and make it import torch to unpickle the writers'
    results (3-10 s on a busy host, inside the first save). Called before CUDA is initialised, a fork of this
    process, torch already imported, serves the same queue within milliseconds.
    """
    import multiprocessing

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async._results_queue is None and not torch.cuda.is_initialized():
        try:
            filesystem_async._results_queue = multiprocessing.get_context("fork").Manager().Queue()
        except Exception as exc:  # noqa: BLE001 - Megatron starts its own (spawned) queue at the first save
            print(f"WARNING: could not start the checkpoint writer's result queue early ({exc!r}); "
                  "the first save will start it", flush=True)


# ---- the loop ----------------------------------------------------------------------------------------
class Trainer:
    """Megatron's train() loop around a StepEngine: log, evaluate, save, exit."""

    def __init__(self, args):
        self.args = args
        self.t_start = time.time()
        self.phases: dict[str, float] = {}
        self.timings: dict[str, float] = {}  # seconds inside the data phase (summary.json only)
        self._build()
        # --wait-for-load: everything that does not need the checkpoint first (data, CUDA graphs) while the run that
        # saves it still trains, then the wait and the load; otherwise the load first, as Megatron does
        early = bool(args.load and args.wait_for_load)
        self.iteration = args.ckpt_step if early else 0
        self.consumed_valid = 0
        state = self._load() if args.load and not early else None
        self.start_iteration = self.iteration
        self._data()
        rng_at_start = train_ckpt.get_rng_state()
        self._capture()
        if early:
            self._wait_for_checkpoint()
            state = self._load()
        # The capture's warm-up steps drew random numbers (dropout): start the loop as if they had not, so graph
        # and eager runs draw the same masks and a resumed run continues the saved RNG streams.
        loaded_rng = state["rng_state"] if state is not None else None
        train_ckpt.set_rng_state(loaded_rng if loaded_rng is not None else rng_at_start)
        log("done with setup ...")
        self.ms_per_iter: list[float] = []
        self.setup_s = time.time() - self.t_start

    def _build(self) -> None:
        """Distributed init, the arguments block, tokenizer, model and StepEngine."""
        from megatron.core import parallel_state as ps
        from harness.data.tokenizer import MegatronBertTokenizer

        args = self.args
        self.device = init_distributed(args)
        # Megatron's `arguments` block, with its world_size and data_parallel_size: the recipe check and the
        # memory band of the run's layout read it
        for line in format_arguments({**vars(args), **parallel_sizes()}):
            log(line)
        self.rng_states = seed_everything(args, self.device)
        self._phase("megatron is initialized")
        log(f"> building {args.tokenizer_type} tokenizer ...")
        self.tokenizer = MegatronBertTokenizer.from_type(args.tokenizer_type, args.vocab_file)
        vocab = padded_vocab_size(self.tokenizer.vocab_size, args)
        log(f" > padded vocab (size: {self.tokenizer.vocab_size}) with {vocab - self.tokenizer.vocab_size} "
            f"dummy tokens (new size: {vocab})")
        self.model = build_model(args, vocab, self.device)
        self._phase("model is built")
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        if args.global_batch_size % (args.micro_batch_size * self.dp_size):
            raise SystemExit(f"--global-batch-size {args.global_batch_size} is not a multiple of "
                             f"--micro-batch-size {args.micro_batch_size} x data-parallel size {self.dp_size}")
        m = args.global_batch_size // (args.micro_batch_size * self.dp_size)
        self.engine = StepEngine(self.model, args, m, self.device, dp_group=ps.get_data_parallel_group(),
                                 tp_group=ps.get_tensor_model_parallel_group())

    def _load(self) -> dict:
        """--load: the checkpoint copied into the model and engine tensors (captured graphs stay valid), its
        iteration and validation position; returns train_ckpt.load's state (its RNG state is set last)."""
        from harness.evidence.logformat import format_checkpoint_loaded

        state = train_ckpt.load(self.engine, self.model, self.args)
        iteration = int(state["iteration"])
        if self.args.wait_for_load and iteration != self.iteration:  # the data was read from --ckpt-step's batch
            raise RuntimeError(f"--ckpt-step {self.iteration}: the checkpoint loaded from {self.args.load} is of "
                               f"iteration {iteration}")
        self.iteration = iteration
        self.consumed_valid = int(state.get("consumed_valid_samples", 0))
        log(format_checkpoint_loaded(self.iteration, self.args.load))
        return state

    def _data(self) -> None:
        """Datasets, the shared samples and the preloaded training batches from the run's first batch."""
        args = self.args
        counts = SampleCounts.from_args(args)
        cache = args.data_cache_path or str(Path(args.save or ".") / "index-cache")
        args.data_cache_path = cache
        t0 = time.time()
        train_ds, valid_ds, test_ds = build_datasets(args, self.tokenizer, counts, log)
        self.timings["datasets_s"] = round(time.time() - t0, 3)
        stores = [None] * 3
        if args.sample_cache:
            from harness.train.samples import SampleStore

            stores = [SampleStore(ds, BATCH_KEYS, args.sample_cache) for ds in (train_ds, valid_ds, test_ds)]
        self.train, self.valid, self.test = (BatchSource(ds, args, self.dp_rank, self.dp_size, self.device, store)
                                             for ds, store in zip((train_ds, valid_ds, test_ds), stores))
        remaining = args.train_iters - self.iteration
        if args.exit_interval:
            remaining = min(remaining, self._exit_iteration() - self.iteration)
        # the data-position mutant reads from sample 0 again, as if consumed samples were not restored
        first_batch = 0 if args.inject_data_restart else self.iteration
        t0 = time.time()
        if args.sample_cache and not args.stream_samples:
            self._fill_samples(first_batch, max(remaining, 0), counts)
        self.timings["samples_s"] = round(time.time() - t0, 3)
        t0 = time.time()
        if args.sample_cache and args.stream_samples:  # the first batch now, the others as training reaches them
            self.train_batches = self.train.batches(first_batch, max(remaining, 0))
            if len(self.train_batches):
                self.train_batches[0]  # noqa: B018 - loads (or waits for) the first batch now: the capture's input
        else:
            self.train_batches = self.train.preload(first_batch, max(remaining, 0))
        self.timings["preload_s"] = round(time.time() - t0, 3)
        self._phase("dataloaders are built")

    def _capture(self) -> None:
        """The training and evaluation steps as CUDA graphs (capture restores every tensor it changes)."""
        args = self.args
        self.graphs = False
        if args.device == "cuda" and args.cuda_graph != "off" and self.train_batches:
            self.graphs = self.engine.capture(self.train_batches[0], self.rng_states)
            if self.engine.graph_error:
                log(f"WARNING: CUDA graph capture failed, running eagerly: {self.engine.graph_error}")
            self._phase("CUDA graphs are captured")

    def _wait_for_checkpoint(self) -> None:
        """--wait-for-load: set up; now wait for the other run to save --ckpt-step (one line before, one after)."""
        args = self.args
        log(f"{LOAD_WAIT_MARKER}: iteration {args.ckpt_step} in {Path(args.load) / TRACKER_FILE} "
            f"(up to {args.wait_for_load:g} s; {failed_marker(args.load)} ends the wait)")
        started = time.time()
        named = train_ckpt.wait_for_iteration(args.load, args.ckpt_step, args.wait_for_load)
        self.phases["checkpoint wait took"] = waited = round(time.time() - started, 3)
        log(f"{LOAD_READY_MARKER}: the tracker names iteration {named}, after {waited:.2f} s of waiting")

    def _fill_samples(self, first_batch: int, train_batches: int, counts) -> None:
        """Build or wait for every shared sample chunk this run will read: its training batches, then the
        validation and test batches of the whole schedule (a run stopped early reads fewer of them)."""
        from harness.train.samples import default_workers

        gbs = self.args.global_batch_size
        workers = self.args.sample_workers or default_workers()
        self.train.fill(first_batch, train_batches, workers)
        self.valid.fill(0, counts.valid // gbs, workers)
        self.test.fill(0, counts.test // gbs, workers)

    def _phase(self, name: str) -> None:
        """Megatron's `[after ...] datetime:` line, and seconds since start for the summary."""
        self.phases[name] = round(time.time() - self.t_start, 3)
        log(format_datetime_marker(f"after {name}"))

    def _exit_iteration(self) -> int:
        """Megatron's --exit-interval: stop at the first multiple after the start iteration."""
        k = self.args.exit_interval
        return min(self.args.train_iters, (self.iteration // k + 1) * k)

    def run(self) -> int:
        args = self.args
        leak = (torch.empty(args.inject_leak_mib << 20, dtype=torch.uint8, device=self.device)
                if args.inject_leak_mib and self.device.type == "cuda" else None)  # mutant: held to the end of run()
        log("training ...")
        stop_at = self._exit_iteration() if args.exit_interval else args.train_iters
        interval_start = self._sync_time()
        interval_iters = 0
        memory_reported = 0
        first = self.iteration
        while self.iteration < stop_at:
            batch = self.train_batches[self.iteration - first]
            self.iteration += 1
            self.engine.nan_flag.fill_(1.0 if args.inject_nan_at is not None and self.iteration >= args.inject_nan_at
                                        else 0.0)  # diverged from there on: every later step overflows
            self.engine.train_step(batch)
            interval_iters += 1
            if self.iteration % args.log_interval == 0 or self.iteration == 1:
                elapsed = self._sync_time() - interval_start
                self._log_iteration(elapsed * 1000.0 / interval_iters)
                if memory_reported < 2 and self.device.type == "cuda":
                    self._log_memory()
                    memory_reported += 1
                interval_iters = 0
                interval_start = self._sync_time()
            if args.inject_crash_at == self.iteration:
                raise RuntimeError(f"--inject-crash-at {self.iteration}: the trainer crashes here on purpose (mutant)")
            paused = False
            if args.eval_interval and self.iteration % args.eval_interval == 0:
                self._evaluate("periodic", self.valid, advance=True)
                paused = True
            if args.save and args.save_interval and self.iteration % args.save_interval == 0:
                self._save()
                paused = True
            if paused:
                interval_start = self._sync_time()
        if args.save and self.iteration % (args.save_interval or 1) != 0:
            self._save()
        self._phase("training is done")
        if self.iteration >= args.train_iters:
            self._evaluate("validation", self.valid, advance=True)
            self._evaluate("test", self.test, advance=False, start=0)
        return 0

    def _sync_time(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.time()

    def _dp_mean(self, values: list[float]) -> list[float]:
        if self.dp_size == 1:
            return values
        from megatron.core import parallel_state as ps

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, group=ps.get_data_parallel_group())
        return (t / self.dp_size).tolist()

    def _log_iteration(self, ms: float) -> None:
        from harness.evidence.logformat import IterationRecord, format_iteration

        c = self.engine.counters.read()
        lm_sum, sop_sum = self._dp_mean([c["lm_sum"], c["sop_sum"]])
        advanced = max(1.0, c["advanced"])
        lm = lm_sum / advanced if c["advanced"] > 0 else None
        sop = sop_sum / advanced if c["advanced"] > 0 and self.args.bert_binary_head else None
        if self.iteration > 1:
            self.ms_per_iter.append(ms)
        record = IterationRecord(
            iteration=self.iteration, train_iters=self.args.train_iters,
            consumed_samples=self.iteration * self.args.global_batch_size, elapsed_ms=ms, throughput=None,
            learning_rate=self.engine.schedule.lr_host(int(round(float(self.engine.sched_steps)))),
            global_batch_size=self.args.global_batch_size, lm_loss=lm, sop_loss=sop,
            loss_scale=float(self.engine.scaler.scale), grad_norm=c["grad_norm"] if c["last_ok"] > 0 else None,
            skipped=int(c["skipped"]), nan=int(c["nan"]),
        )
        log_last(format_iteration(record))
        if self.iteration % self.args.log_interval == 0:  # Megatron keeps counting across the iteration-1 line
            self.engine.counters.reset()

    def _log_memory(self) -> None:
        from harness.evidence.logformat import format_memory

        mb = 1024 * 1024
        line = format_memory(_rank(), self.iteration, torch.cuda.memory_allocated() / mb,
                             torch.cuda.max_memory_allocated() / mb, torch.cuda.memory_reserved() / mb,
                             torch.cuda.max_memory_reserved() / mb)
        if self.dp_rank == 0:
            _write_line(line)

    def _evaluate(self, split: str, source: BatchSource, advance: bool, start: int | None = None) -> None:
        from harness.evidence.logformat import format_validation_block

        args = self.args
        gbs = args.global_batch_size
        first = (self.consumed_valid // gbs) if start is None else start
        self.engine.eval_sums.zero_()
        for k in range(args.eval_iters):
            batch = source.preload(first + k, 1)[0]
            self.engine.eval_step(batch)
        lm, sop = self._dp_mean((self.engine.eval_sums / args.eval_iters).tolist())
        if advance:
            self.consumed_valid += args.eval_iters * gbs
        sop_value = sop if args.bert_binary_head else None
        log_last(format_validation_block(self.iteration, lm, sop_value, split))

    def _save(self) -> None:
        from harness.evidence.logformat import format_checkpoint_saved, format_checkpoint_saving

        log(format_checkpoint_saving(self.iteration, self.args.save, self.args.ckpt_format))
        started = time.time()
        train_ckpt.save(self.engine, self.model, self.args, self.iteration, self.consumed_valid)
        self.phases[f"save of iteration {self.iteration} took"] = round(time.time() - started, 3)
        log(format_checkpoint_saved(self.iteration, self.args.save))

    def summary(self) -> dict:
        import megatron.core

        steady = self.ms_per_iter[1:] or self.ms_per_iter
        out = {
            "iterations": self.iteration,
            "start_iteration": getattr(self, "start_iteration", 0),  # > 0 after --load: trained = the difference
            "device": self.device.type,
            "gpu": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
            "cuda_graphs": self.graphs,
            "cuda_graph_error": self.engine.graph_error,
            "ms_per_iter_median": statistics.median(steady) if steady else None,
            "ms_per_iter_intervals": self.ms_per_iter,
            "setup_s": round(self.setup_s, 3),
            "phases_s": self.phases,
            "data_timings_s": getattr(self, "timings", {}),
            "total_s": round(time.time() - self.t_start, 3),
            # importing torch._dynamo costs seconds: a fork of the suite's server should never have needed it
            "torch_dynamo_imported": "torch._dynamo" in sys.modules,
            **parallel_sizes(),
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                         "megatron_core": getattr(megatron.core, "__version__", "?"),
                         "python": sys.version.split()[0]},
        }
        if self.device.type == "cuda":
            out["torch_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
            out["torch_max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
        return out


def _write_summary(args, summary: dict) -> None:
    if args.summary_json and _rank() == 0:
        Path(args.summary_json).write_text(json.dumps(summary, indent=2))


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def prepare_samples(args) -> int:
    """--samples-only: this command's datasets built on the CPU, their samples put in the shared cache, no training."""
    from harness.data.tokenizer import MegatronBertTokenizer
    from harness.train.samples import SampleStore, samples_stage_workers

    if not args.sample_cache:
        raise SystemExit("--samples-only needs --sample-cache DIR: the samples are built for other runs to read")
    if not torch.distributed.is_initialized():  # megatron-core's dataset builder asks for the rank
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    tokenizer = MegatronBertTokenizer.from_type(args.tokenizer_type, args.vocab_file)
    counts = SampleCounts.from_args(args)
    started = time.time()
    datasets = build_datasets(args, tokenizer, counts, log)
    workers = args.sample_workers or samples_stage_workers()
    for dataset, n in zip(datasets, (counts.train, counts.valid, counts.test)):
        SampleStore(dataset, BATCH_KEYS, args.sample_cache).fill(range(n), workers)
    log(f"> {counts.train + counts.valid + counts.test} samples ready in {args.sample_cache} "
        f"({time.time() - started:.1f} s, {workers} processes)")
    torch.distributed.destroy_process_group()
    return 0


def run_training(argv: list[str] | None = None) -> int:
    """Train; the summary is written even when setup or the loop fails (with the error), then the error propagates."""
    args = parse_args(argv)
    import_megatron_core()  # a fresh process (torchrun, --no-fork-server): without torch.compile's imports
    if args.samples_only:
        return prepare_samples(args)
    if args.save and args.ckpt_format == "torch_dist":
        prewarm_checkpoint_writer()
    try:
        trainer = Trainer(args)
    except BaseException as exc:
        # init_distributed is the first step of setup: once it ran, the device is the one asked for
        device = args.device if torch.distributed.is_initialized() else None
        _write_summary(args, {"iterations": 0, "device": device, "cuda_graphs": False, "cuda_graph_error": None,
                              "failed_in": "setup", "error": _failure(exc)})
        raise
    try:
        code = trainer.run()
    except BaseException as exc:
        _write_summary(args, {**trainer.summary(), "failed_in": "training", "error": _failure(exc)})
        try:  # no process-group teardown here: a peer may be stuck in a collective; torchrun stops the others
            release_cuda_graphs(trainer.engine)
            stop_checkpoint_writer()
        except Exception:  # noqa: BLE001 - the training error is the one to report
            pass
        raise
    _write_summary(args, trainer.summary())
    steps, mark = {}, time.monotonic()

    def step(name: str) -> None:
        nonlocal mark
        steps[name] = time.monotonic() - mark
        mark = time.monotonic()
    try:
        release_cuda_graphs(trainer.engine)
        step("cuda graphs")
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        step("process group")
    finally:
        stop_checkpoint_writer()
        step("checkpoint writer")
    print("teardown took " + ", ".join(f"{k} {v:.2f} s" for k, v in steps.items()), flush=True)
    return code


def release_cuda_graphs(engine) -> None:
    """Free the captured step graphs before the process group goes.

    A graph that captured an NCCL all-reduce (DP and TP steps) pins the communicator: destroy_process_group()
    then blocks in ncclCommDestroy and the worker never exits (pytorch/pytorch#115388).
    """
    graphs = getattr(engine, "graphs", None) or {}
    for graph in graphs.values():
        graph.reset()
    graphs.clear()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def stop_checkpoint_writer() -> None:
    """Shut down dist_checkpointing's result-queue manager process (prewarmed or started by the first save).

    Otherwise it lives until interpreter exit, where multiprocessing's finalizer stops it (up to 1 s, then a
    terminate); done here, the worker's exit waits on nothing of ours.
    """
    module = sys.modules.get("megatron.core.dist_checkpointing.strategies.filesystem_async")
    queue = getattr(module, "_results_queue", None)
    manager = getattr(queue, "_manager", None)
    if manager is None:
        return
    module._results_queue = None
    try:
        manager.shutdown()
    except (OSError, EOFError, AttributeError):  # already gone: nothing left to stop
        pass
