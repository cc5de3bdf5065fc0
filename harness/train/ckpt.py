"""Checkpoints of the reference trainer, in Megatron's layout so the same inspector judges both.

`DIR/iter_NNNNNNN/` written by megatron-core's dist_checkpointing (torch_dist) or torch.save (torch), then
`DIR/latest_checkpointed_iteration.txt`; `--load DIR` resumes model, optimizer, scaler, schedule, data order and
the RNG states (Megatron's get_rng_state: python, numpy, torch, cuda and the model-parallel RNG tracker).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from harness.evidence.checkpoints.inspector import TRACKER_FILE, failed_marker, tracker_iteration
from harness.base.paths import write_text_atomic

CHECKPOINT_VERSION = 3.0


def iter_dir(save: str, iteration: int) -> Path:
    return Path(save) / f"iter_{iteration:07d}"


def _ranks():
    from megatron.core import parallel_state as ps

    return (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size(),
            ps.get_data_parallel_rank())


def _optimizer_sharded(engine) -> dict:
    """fp32 main params and Adam moments as ShardedTensors: one slice of a global 1-D tensor per TP rank."""
    from megatron.core.dist_checkpointing import ShardedTensor

    tp, tp_size, pp, _, dp = _ranks()
    out = {}
    for name, tensor in _optimizer_tensors(engine).items():
        out[name] = ShardedTensor.from_rank_offsets(
            f"optimizer.pp{pp}.{name}", tensor, (0, tp, tp_size), replica_id=dp)
    return out


def _optimizer_tensors(engine) -> dict:
    """What the optimizer owns: Adam's moments, and for an fp16 model the fp32 main params it is rounded from."""
    out = {"exp_avg": engine.adam.exp_avg, "exp_avg_sq": engine.adam.exp_avg_sq}
    if engine.flat.mixed:
        out["main_params"] = engine.flat.data
    return out


def get_rng_state() -> dict:
    """Every RNG the step draws from, as Megatron's checkpointing.get_rng_state records them.

    With CUDA graphs the tracker's states are torch.Generator objects registered with the graph: their
    seed/offset is saved as a tensor (`Generator.get_state`), never the object itself.
    """
    import random

    import numpy as np
    from megatron.core import tensor_parallel

    tracker = {name: state.get_state() if isinstance(state, torch.Generator) else state.clone()
               for name, state in tensor_parallel.get_cuda_rng_tracker().get_states().items()}
    return {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(),
            "cuda_rng_state": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None,
            "rng_tracker_states": tracker}


def set_rng_state(state: dict) -> None:
    """Restore get_rng_state's record; tracker Generators are set in place, so captured graphs see the change."""
    import random

    import numpy as np
    from megatron.core import tensor_parallel

    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"].cpu())
    if state["cuda_rng_state"] is not None and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda_rng_state"].cpu())
    tracker = tensor_parallel.get_cuda_rng_tracker()
    current, saved = tracker.get_states(), state["rng_tracker_states"]
    if set(current) != set(saved):
        raise RuntimeError(f"checkpoint RNG tracker states {sorted(saved)} do not match this run's {sorted(current)}: "
                           "resume with the same parallel layout, or pass --no-load-rng")
    if all(isinstance(g, torch.Generator) for g in current.values()):
        for name, generator in current.items():
            generator.set_state(saved[name].cpu())
    else:
        tracker.set_states({name: tensor.cpu() for name, tensor in saved.items()})


def _rng_sharded(state: dict):
    """The RNG record as Megatron's ShardedObject: one per (pipeline, tensor) rank, replicated over data parallel."""
    from megatron.core.dist_checkpointing import ShardedObject

    tp, tp_size, pp, pp_size, dp = _ranks()
    return ShardedObject("rng_state", [state], (pp_size, tp_size), (pp, tp), replica_id=dp)


def _common_state(engine, iteration: int, consumed_valid: int, args) -> dict:
    return {
        "iteration": iteration,
        "checkpoint_version": CHECKPOINT_VERSION,
        "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, list, type(None)))},
        "opt_param_scheduler": {"num_steps": float(engine.sched_steps) * args.global_batch_size},
        "grad_scaler": engine.scaler.state_dict(),
        "adam_step": float(engine.adam.step),
        "consumed_train_samples": iteration * args.global_batch_size,
        "consumed_valid_samples": consumed_valid,
    }


def save(engine, model, args, iteration: int, consumed_valid: int) -> Path:
    """Write one checkpoint and then the tracker (the tracker last: a crash never points at half a save)."""
    target = iter_dir(args.save, iteration)
    target.mkdir(parents=True, exist_ok=True)
    common = _common_state(engine, iteration, consumed_valid, args)
    if args.ckpt_format == "torch_dist":
        from megatron.core import dist_checkpointing

        state = {"model": model.sharded_state_dict(), "optimizer": _optimizer_sharded(engine),
                 "rng_state": _rng_sharded(get_rng_state()), **common}
        dist_checkpointing.save(state, str(target))
    else:
        tp, _, pp, pp_size, dp = _ranks()
        if dp == 0:
            sub = f"mp_rank_{tp:02d}" if pp_size == 1 else f"mp_rank_{tp:02d}_{pp:03d}"
            (target / sub).mkdir(exist_ok=True)
            state = {"model": model.state_dict(), "optimizer": _optimizer_tensors(engine),
                     "rng_state": [get_rng_state()], **common}
            torch.save(state, target / sub / "model_optim_rng.pt")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        write_text_atomic(Path(args.save) / TRACKER_FILE, str(iteration))
    return target


def latest_iteration(load: str) -> int:
    tracker = Path(load) / TRACKER_FILE
    if not tracker.is_file():
        raise FileNotFoundError(f"{tracker} not found: --load must name a --save directory of a finished save")
    return int(tracker.read_text().strip())


def wait_for_iteration(load: str, iteration: int, seconds: float, poll_s: float = 0.025) -> int:
    """Wait until LOAD's tracker (written last by a save) names `iteration` or later; return what it names.

    Exits naming LOAD.failed as soon as that appears, or naming the tracker once `seconds` have passed.
    """
    tracker, failed = Path(load) / TRACKER_FILE, failed_marker(load)
    deadline = time.monotonic() + seconds
    while True:
        named = tracker_iteration(load)  # None: not written yet
        if named is not None and named >= iteration:
            return named
        if failed.exists():
            try:
                reason = failed.read_text(errors="replace").strip().splitlines()[0][:300]
            except (OSError, IndexError):
                reason = "no reason given"
            raise SystemExit(f"the run saving to {load} ended without iteration {iteration} ({failed}: {reason}): "
                             "nothing to resume from. Fix: make that run save iteration "
                             f"{iteration} (its own log says why it did not), then resume again")
        if time.monotonic() >= deadline:
            state = "does not exist" if named is None else f"names iteration {named}"
            raise SystemExit(f"{tracker} {state}, not iteration {iteration} or later, after waiting {seconds:g} s "
                             f"(--wait-for-load). Fix: start the run that saves to {load} first, or give it longer "
                             "with a larger --wait-for-load")
        time.sleep(poll_s)


def load_weights(model, weights: dict, source) -> None:
    """model.load_state_dict, non-strict but refusing missing or unexpected keys (besides _extra_state).

    A Float16Module's load_state_dict returns None, so the module it wraps is loaded (same keys).
    """
    from megatron.core.transformer.module import Float16Module

    inner = model.module if isinstance(model, Float16Module) else model
    missing, unexpected = inner.load_state_dict(weights, strict=False)
    real_missing = [k for k in missing if not k.endswith("_extra_state")]
    if real_missing or unexpected:
        raise RuntimeError(f"checkpoint {source} does not fit the model: missing {real_missing[:5]}, "
                           f"unexpected {list(unexpected)[:5]}")


def load(engine, model, args) -> dict:
    """Restore everything `save` wrote but the RNG; returns the common state and `rng_state` (set it with
    set_rng_state once CUDA graphs are captured: the capture's warm-up steps draw random numbers)."""
    iteration = args.ckpt_step if args.ckpt_step is not None else latest_iteration(args.load)
    source = iter_dir(args.load, iteration)
    if not source.is_dir():
        raise FileNotFoundError(f"{source} not found: no checkpoint of iteration {iteration} under --load")
    if args.ckpt_format == "torch_dist":
        from megatron.core import dist_checkpointing

        template = {"model": model.sharded_state_dict(), "optimizer": _optimizer_sharded(engine)}
        if not args.no_load_rng:
            template["rng_state"] = _rng_sharded(get_rng_state())
        try:
            state = dist_checkpointing.load(template, str(source))
        except Exception as exc:  # noqa: BLE001 - re-raised with the fix when the RNG state is what is missing
            if "rng_state" in template and "rng_state" in str(exc):
                raise RuntimeError(f"{source} has no RNG state (saved by an older version of this trainer): "
                                   "resume with --no-load-rng") from exc
            raise
        common = dist_checkpointing.load_common_state_dict(str(source))
        state = {**common, **state}
    else:
        tp, _, pp, pp_size, _ = _ranks()
        sub = f"mp_rank_{tp:02d}" if pp_size == 1 else f"mp_rank_{tp:02d}_{pp:03d}"
        # weights_only=False: our own checkpoint's plain dicts and floats; never used on foreign files.
        state = torch.load(source / sub / "model_optim_rng.pt", map_location=engine.device, weights_only=False)
    load_weights(model, state["model"], source)
    main = None if args.no_load_optim else state["optimizer"].get("main_params")
    engine.flat.data.copy_(engine.flat.model if main is None else main)  # fp32 main params, else the weights
    if not args.no_load_optim:
        engine.adam.exp_avg.copy_(state["optimizer"]["exp_avg"])
        engine.adam.exp_avg_sq.copy_(state["optimizer"]["exp_avg_sq"])
        engine.adam.step.fill_(float(state["adam_step"]))
        engine.scaler.load_state_dict(state["grad_scaler"])
        engine.sched_steps.fill_(state["opt_param_scheduler"]["num_steps"] / args.global_batch_size)
    if args.no_load_rng:
        state["rng_state"] = None
    elif not state.get("rng_state"):
        raise RuntimeError(f"{source} has no RNG state (saved by an older version of this trainer): "
                           "resume with --no-load-rng")
    else:
        state["rng_state"] = state["rng_state"][0]
    return state
